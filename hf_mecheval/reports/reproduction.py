"""The tables and figures of REPRODUCTION.md, regenerated from the committed ``results/`` folder.

    mecheval report --results results            # figures, report.md files, claims.md from the JSON
    mecheval report --results results --check REPRODUCTION.md   # exit 1 if its tables are stale (writes nothing)

``results/<sweep>/runs.json`` are the rows ``mecheval report`` writes for a sweep's run
directories (``hf_mecheval.reports.report.collect_runs``): one per run, with accuracies,
training time, restoration at every layer's input and at the mixers' inner sites. Every table
below is a pure function of those rows, so the numbers in REPRODUCTION.md can be checked
against the JSON (``check_document``; a test does it). REPRODUCTION.md marks each table as

    <!-- table:claim1 -->
    ...generated markdown...
    <!-- /table:claim1 -->
"""
from __future__ import annotations

import math
import re
from pathlib import Path

from ..errors import MechEvalError
from ..atomic_files import write_text_atomic
from ..inputs import read_json
from ..metrics.mechanism import relabel
from ..runs.files import RESULT_ROWS, format_score, run_seconds
from ..experiments import read_experiment
from .mqar import key_position_table, mqar_table, zoology_table
from .paper_grid import GRID_SWEEPS, grid_figures, grid_tables
from .reference_figures import reference_figures
from .reference_setting import SWEEPS as REFERENCE_SWEEPS, args_label, planned_runs, reference_tables
from .report import figures, further_tables, report_markdown

# each MQAR results folder and the packaged sweep file behind it
MQAR_SWEEPS = {"cpu_mqar": "cpu/mqar", "cpu_mqar_zoology": "cpu/mqar_zoology"}
SWEEPS = ("cpu_ar", "cpu_ablations", "cpu_atr") + REFERENCE_SWEEPS + GRID_SWEEPS + tuple(MQAR_SWEEPS)


def load_results(results_dir: str | Path) -> dict[str, list[dict]]:
    results_dir = Path(results_dir)
    out = {}
    for sweep in SWEEPS:
        path = results_dir / sweep / "runs.json"
        if path.exists():     # labels by the current rule, whenever the rows were written
            out[sweep] = [relabel(row) for row in read_json(path, RESULT_ROWS)]
    if not out:
        raise MechEvalError(f"{results_dir} holds no <sweep>/runs.json (expected one of {', '.join(SWEEPS)})")
    return out


# ---------------------------------------------------------------------------------- helpers
def _mean_sd(values: list[float]) -> tuple[float, float]:
    values = [v for v in values if v is not None and not math.isnan(v)]
    if not values:
        return float("nan"), float("nan")
    mean = sum(values) / len(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1)) if len(values) > 1 else 0.0
    return mean, sd


def _pct(values: list[float]) -> str:
    mean, sd = _mean_sd(values)
    if math.isnan(mean):
        return "n/a"
    return f"{100 * mean:.1f} ± {100 * sd:.1f}" if len(values) > 1 else f"{100 * mean:.1f}"


def _score(values: list) -> str:
    mean, sd = _mean_sd(values)
    if math.isnan(mean):
        return "n/a"
    return f"{format_score(mean)} ± {sd:.2f}" if len(values) > 1 else format_score(mean)


def _mechanisms(rows: list[dict]) -> str:
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.get("mechanism") or "n/a"] = counts.get(r.get("mechanism") or "n/a", 0) + 1
    return ", ".join(f"{m} ×{n}" if n > 1 else m for m, n in sorted(counts.items()))


def _groups(rows: list[dict], task: str | None = None) -> dict[str, list[dict]]:
    """Rows by label (architecture and short-conv width), in a stable order."""
    out: dict[str, list[dict]] = {}
    for r in sorted(rows, key=lambda r: (r["label"], r.get("seed") or 0)):
        if task is None or r["task"] == task:
            out.setdefault(r["label"], []).append(r)
    return out


def _table(head: list[str], lines: list[list[str]]) -> str:
    out = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    out += ["| " + " | ".join(line) + " |" for line in lines]
    return "\n".join(out)


MECHANISM_COLUMNS = ["test accuracy (%)", "@key", "@value", "@query", "mechanism"]


def _mechanism_cells(rows: list[dict]) -> list[str]:
    """Cells of MECHANISM_COLUMNS for a group of runs (mean ± sd over seeds)."""
    return [_pct([r["test_accuracy"] for r in rows])] + [_score([r.get(f"@{p}") for r in rows])
                                                         for p in ("key", "value", "query")] + [_mechanisms(rows)]


def _accuracy_mechanism_table(groups: dict[str, list[dict]]) -> str:
    lines = [[label, str(len(rows))] + _mechanism_cells(rows) for label, rows in groups.items()]
    return _table(["model", "seeds"] + MECHANISM_COLUMNS, lines)


def _width_label(label: str) -> str:
    """Based's default short-conv width (3) is not in its label; the ablation tables show it."""
    return "based (conv 3)" if label == "based" else label


def _conv_order(label: str) -> tuple:
    match = re.search(r"conv (\w+)", label)
    width = match.group(1) if match else "3"
    return (label.split(" ")[0], 99 if width == "long" else int(width))


# ---------------------------------------------------------------------------------- claims
def claim_tables(results: dict[str, list[dict]]) -> dict[str, str]:
    """Markdown table per claim (only those whose sweeps are present)."""
    tables = {}
    ar = results.get("cpu_ar", [])
    atr = results.get("cpu_atr", [])
    if ar:
        groups = _groups(ar)
        lines = [[label, str(len(rows)), _pct([r["validation_accuracy"] for r in rows]),
                  _pct([r["test_accuracy"] for r in rows]),
                  ", ".join(f"{100 * r['test_accuracy']:.1f}" for r in rows)] for label, rows in groups.items()]
        tables["claim1"] = _table(["model", "seeds", "validation accuracy (%)", "test accuracy (%)",
                                   "per seed (%)"], lines)
        tables["claim2"] = _accuracy_mechanism_table(groups)
        mamba = {label: rows for label, rows in groups.items() if label.startswith("mamba")}
        lines = []
        for label, rows in mamba.items():
            n_layers = rows[0]["layers"]
            for layer in range(n_layers):
                for site, name in (("mixer.conv_output", "short-conv output"), ("mixer.state", "SSM state"),
                                   ("mixer_output", "mixer output")):
                    key = f"layers.{layer}.{site}"
                    vals = {p: [r.get("component_scores", {}).get(f"{key}@{p}") for r in rows]
                            for p in ("key", "value", "query")}
                    if all(v is None for v in vals["key"]):
                        continue
                    lines.append([label, str(layer), name] + [_score(vals[p]) for p in ("key", "value", "query")])
        if lines:
            tables["claim4"] = _table(["model", "layer", "site (key corrupted)", "@key", "@value", "@query"], lines)
    ablation_rows = [r for r in ar + results.get("cpu_ablations", []) if r["architecture"] in ("mamba", "based")]
    if results.get("cpu_ablations"):
        groups = _groups(ablation_rows)
        lines = [[_width_label(label), str(len(rows))] + _mechanism_cells(rows)
                 for label, rows in sorted(groups.items(), key=lambda kv: _conv_order(kv[0]))]
        tables["claim3"] = _table(["model (short-conv width)", "seeds"] + MECHANISM_COLUMNS, lines)
    if atr:
        tables["claim5"] = _accuracy_mechanism_table(_groups(atr, "atr_easy"))
        by_task = {task: _groups(atr, task) for task in ("atr_easy", "atr_gen")}
        lines = [[task, label] + _mechanism_cells(rows) for task, groups in by_task.items()
                 for label, rows in groups.items() if label.startswith("mamba")]
        if lines:
            tables["claim6"] = _table(["task", "model"] + MECHANISM_COLUMNS, lines)
        lines = []
        for label, rows in by_task["atr_gen"].items():
            easy = by_task["atr_easy"].get(label, [])
            lines.append([label, _pct([r["validation_accuracy"] for r in rows]), _pct([r["test_accuracy"] for r in rows]),
                          _pct([r["test_accuracy"] for r in easy]) if easy else "n/a"])
        if lines:
            tables["claim8"] = _table(["model", "ATR-gen validation (%)", "ATR-gen test: held-out pairs (%)",
                                       "ATR easy test (%)"], lines)
    delta = {"AR": [r for r in ar if r["architecture"] == "deltanet"],
             "ATR easy": [r for r in atr if r["architecture"] == "deltanet" and r["task"] == "atr_easy"]}
    lines = [[task, str(len(rows))] + _mechanism_cells(rows) for task, rows in delta.items() if rows]
    if lines:
        tables["claim7"] = _table(["task", "seeds"] + MECHANISM_COLUMNS, lines)
    compute = []
    for sweep, rows in results.items():
        seconds = sum(run_seconds(r) or 0 for r in rows)
        compute.append([sweep, str(len(rows)), f"{seconds / 60:.1f}"])
    tables["compute"] = _table(["sweep", "runs", "training wall time (min, 2-core CPU)"], compute)
    if any(sweep in results for sweep in REFERENCE_SWEEPS):
        tables.update(reference_tables(results))
    tables.update(grid_tables(results))
    tables.update(mqar_tables(results))
    return tables


def mqar_tables(results: dict[str, list[dict]]) -> dict[str, str]:
    """Part 3's tables: the MQAR sweep per architecture and width (accuracy per setting, the
    mechanism overall, near and far), and Zoology's Figure 2 settings beside its published
    accuracies with the same per-run table for their mechanisms."""
    tables = {}
    if results.get("cpu_mqar"):
        plan = mqar_plan("cpu_mqar")
        tables["mqar"] = mqar_table(results["cpu_mqar"], plan)
        tables["mqar_key_position"] = key_position_table(results["cpu_mqar"], plan)
    if results.get("cpu_mqar_zoology"):
        rows, plan = results["cpu_mqar_zoology"], mqar_plan("cpu_mqar_zoology")
        tables["mqar_zoology"] = zoology_table(rows, read_experiment("zoology", ["figure2"])["figure2"], plan)
        tables["mqar_zoology_mechanism"] = mqar_table(rows, plan)
    return {name: table for name, table in tables.items() if table}


def mqar_plan(sweep: str) -> dict | None:
    """(task, label, width) -> the (learning rate, seed) runs the MQAR sweep ``sweep`` plans; None
    for any other folder."""
    if sweep not in MQAR_SWEEPS:
        return None
    return planned_runs((MQAR_SWEEPS[sweep],), lambda a: (a["task"], args_label(a), a.get("hidden_size", 64)))


# ---------------------------------------------------------------------------------- outputs
def results_tables(results_dir: str | Path) -> dict[str, str]:
    """The generated tables of a results folder, read from its JSON; nothing is written."""
    return claim_tables(load_results(Path(results_dir)))


def write_results_report(results_dir: str | Path) -> dict:
    """Figures and report.md of every sweep folder, and results/claims.md, all from the committed JSON."""
    results_dir = Path(results_dir)
    results = load_results(results_dir)
    made = []
    for sweep, rows in results.items():
        drawn = figures(rows, results_dir / sweep, mqar_plan(sweep))
        # report.md as `mecheval report` writes it, from the rows: current for sweeps whose run
        # folders are not committed as well (their runs.json is all there is)
        write_text_atomic(results_dir / sweep / "report.md", report_markdown(rows, drawn, further_tables(rows)),
                          overwrite=True)
        made += [str(p) for p in drawn]
    if results.get("cpu_ar"):
        figure = inner_sites_figure(results["cpu_ar"], results_dir / "cpu_ar" / "mamba_inner_sites.png")
        made += [str(figure)] if figure else []
    if results.get("cpu_ablations"):
        rows = [r for r in results.get("cpu_ar", []) + results["cpu_ablations"] if r["architecture"] in ("mamba", "based")]
        made.append(str(conv_width_figure(rows, results_dir / "cpu_ablations" / "claim3_conv_width.png")))
    if any(sweep in results for sweep in REFERENCE_SWEEPS):
        made += [str(p) for p in reference_figures(results, results_dir / "reference_setting")]
    made += [str(p) for p in grid_figures(results, results_dir / "paper_grid")]
    tables = claim_tables(results)                    # as results_tables(results_dir), from what is loaded
    body = ["# Claim tables (generated by `mecheval report --results results`)", ""]
    for name, table in tables.items():
        body += [f"## {name}", "", table, ""]
    write_text_atomic(results_dir / "claims.md", "\n".join(body), overwrite=True)
    return {"figures": made, "tables": tables}


def inner_sites_figure(rows: list[dict], path: Path) -> Path | None:
    """Claim 4: restoration at Mamba's short-conv output, SSM state and mixer output, per layer and
    position (key corrupted), mean over seeds, one panel per Mamba variant."""
    import matplotlib.pyplot as plt

    from .plots import save_figure

    groups = {label: rs for label, rs in _groups(rows).items() if label.startswith("mamba")
              and any(v is not None for r in rs for v in (r.get("component_scores") or {}).values())}
    if not groups:
        return None
    sites = (("mixer.conv_output", "conv out"), ("mixer.state", "state"), ("mixer_output", "mixer out"))
    fig, axes = plt.subplots(1, len(groups), figsize=(6 * len(groups), 4), squeeze=False)
    for ax, (label, rs) in zip(axes[0], groups.items()):
        n_layers = rs[0]["layers"]
        names, offsets, labelled = [], {"key": -0.27, "value": 0.0, "query": 0.27}, set()
        for i, (layer, (site, short)) in enumerate((l, s) for l in range(n_layers) for s in sites):
            names.append(f"L{layer} {short}")
            for p, dx in offsets.items():
                vals = [r.get("component_scores", {}).get(f"layers.{layer}.{site}@{p}") for r in rs]
                mean, sd = _mean_sd(vals)
                if not math.isnan(mean):
                    ax.bar(i + dx, mean, width=0.27, yerr=sd, label=None if p in labelled else f"@{p}",
                           color={"key": "tab:orange", "value": "tab:green", "query": "tab:blue"}[p])
                    labelled.add(p)
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right")
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_ylim(-0.2, 1.15)
        ax.set_title(f"{label}: inside the mixer (key corrupted, {len(rs)} seeds)")
        ax.set_ylabel("restoration")
        ax.legend(fontsize=8)
    return save_figure(fig, path)


def conv_width_figure(rows: list[dict], path: Path) -> Path:
    """Claim 3: test accuracy (mean ± sd over seeds, and each seed) against the short-conv width."""
    import matplotlib.pyplot as plt

    from .plots import save_figure

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for arch, color in (("mamba", "tab:orange"), ("based", "tab:blue")):
        groups = sorted(((_conv_order(_width_label(label)), rs)
                         for label, rs in _groups(rows).items() if label.startswith(arch)), key=lambda g: g[0])
        if not groups:
            continue
        xs = [str(width) if width != 99 else "long" for (_, width), _ in groups]
        means = [100 * _mean_sd([r["test_accuracy"] for r in rs])[0] for _, rs in groups]
        sds = [100 * _mean_sd([r["test_accuracy"] for r in rs])[1] for _, rs in groups]
        ax.errorbar(xs, means, yerr=sds, marker="o", capsize=3, color=color, label=arch)
        for x, (_, rs) in zip(xs, groups):
            ax.scatter([x] * len(rs), [100 * r["test_accuracy"] for r in rs], color=color, alpha=0.35, s=12)
    ax.set_xlabel("short convolution width (Mamba conv_kernel; Based short_conv_kernel)")
    ax.set_ylabel("AR test accuracy (%)")
    ax.set_ylim(0, 105)
    ax.legend()
    ax.set_title("AR accuracy vs short-convolution width (mean ± sd; dots: seeds)")
    return save_figure(fig, path)


def _block(name: str) -> re.Pattern:
    return re.compile(rf"<!-- table:{name} -->\n(.*?)<!-- /table:{name} -->", re.S)


def read_document(path: str | Path) -> str:
    """A document's text; a MechEvalError (one line) where it is not UTF-8."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:          # (OSError: the command line names the path)
        raise MechEvalError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def check_document(document: str | Path, tables: dict[str, str]) -> list[str]:
    """Names of the tables whose block in ``document`` differs from the generated one (or is missing)."""
    text = read_document(document)
    stale = []
    for name, table in tables.items():
        match = _block(name).search(text)
        if match is None or match.group(1).strip() != table.strip():
            stale.append(name)
    return stale


def update_document(document: str | Path, tables: dict[str, str]) -> list[str]:
    """Rewrite the table blocks of ``document`` from ``tables``; returns the names it replaced."""
    path = Path(document)
    text = read_document(path)
    replaced = []
    for name, table in tables.items():
        pattern = _block(name)
        if pattern.search(text):
            text = pattern.sub(lambda m, n=name, t=table: f"<!-- table:{n} -->\n{t}\n<!-- /table:{n} -->", text)
            replaced.append(name)
    write_text_atomic(path, text, overwrite=True)
    return replaced
