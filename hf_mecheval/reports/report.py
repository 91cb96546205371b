"""``mecheval report RUN...``: tables and paper-style figures from run directories.

Each run directory holds ``run.json`` and ``metrics.json`` (from ``mecheval train``) and, when
``mecheval evaluate`` ran, ``interventions/interventions.json``. Outputs (``--out``):

* ``runs.csv`` / ``runs.json`` — one row per run: architecture, label, width, layers, task,
  learning rate, seed, accuracies, training time, restoration @key/@value/@query at the last
  layer's input (key corrupted), mechanism label and confidence (runs.json also: restoration at
  every layer's input and at the mixers' inner sites);
* ``accuracy.png`` — test accuracy per run, or against width when several widths exist;
* ``scatter_value_query.png`` / ``scatter_query_key.png`` — the mechanism plane of the paper;
* ``layers.png`` — restoration at every layer's input (rows: runs; columns: layer x position);
* ``conv_kernel.png`` — accuracy against the short-convolution width, one line per architecture
  and learning rate through the mean over seeds (each seed a small point), when runs vary it;
* MQAR runs: ``mqar_pairs.png``, ``mqar_length.png``, ``mqar_near_far.png``,
  ``mqar_key_position.png`` and their table, with Zoology's Figure 2 beside runs of its settings
  (``reports/mqar.py``);
* ``report.md`` — the table and the figures;
* ``report.html`` — all of it on one self-contained page, with each run's mechanism grid as a
  heatmap of restoration by site and position (``html_report.py``).
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..errors import MechEvalError  # noqa: E402
from ..atomic_files import write_text_atomic  # noqa: E402
from ..runs.manifest import claim_output_folder, recording
from ..runs import RunDir  # noqa: E402
from ..runs.files import distance_summary, format_score, last_layer_summary  # noqa: E402
from ..runs.run_dir import init_scheme_of  # noqa: E402
from ..experiments import read_experiment  # noqa: E402
from .html_report import html_page  # noqa: E402
from .mqar import key_position_table, mqar_figures, mqar_rows, mqar_table, zoology_table  # noqa: E402
from .labels import run_label  # noqa: E402
from .plots import architecture_colours, broken_line, save_figure  # noqa: E402
from ..training.sweep import best_learning_rate  # noqa: E402

POSITIONS = ("key", "value", "query")
COMPONENTS = ("mixer.conv_output", "mixer.state", "mixer_output")
# in runs.json, not runs.csv
NESTED = ("layer_scores", "component_scores", "test_by_setting", "test_by_key_position", "test_by_length", "by_distance")


def _train_seconds(metrics: dict) -> float | None:
    """Wall time of training (the Trainer's train_runtime; a stacked copy shows its stack's)."""
    history = metrics.get("history")
    entries = history if isinstance(history, list) else []     # optional: a missing or odd one is no time
    times = [e["train_runtime"] for e in entries if isinstance(e, dict) and "train_runtime" in e]
    return times[-1] if times else None


def collect_runs(run_dirs: list[str | Path]) -> list[dict]:
    return [row for row, _ in collect_runs_and_grids(run_dirs)]


def collect_runs_and_grids(run_dirs: list[str | Path]) -> list[tuple[dict, dict | None]]:
    """Each run's row (``runs.json``), with its interventions.json (None before ``mecheval evaluate``)."""
    out = []
    for run_dir in map(RunDir, run_dirs):
        record, metrics = run_dir.finished_run()
        final, model = metrics["final"], record["model"]
        row = {"run": run_dir.path.resolve().name, "label": run_label(record), "architecture": model.get("architecture"),
               "hidden_size": model.get("hidden_size"), "layers": model.get("num_hidden_layers"),
               "conv_kernel": model.get("conv_kernel", model.get("short_conv_kernel")),
               "task": record["task"]["preset"], "learning_rate": record["training"].get("learning_rate"),
               "seed": record["training"].get("seed"),
               "init_scheme": init_scheme_of(model), "max_grad_norm": record["training"].get("max_grad_norm"),
               "validation_accuracy": final["validation_accuracy"], "test_accuracy": final["test_accuracy"],
               "train_seconds": _train_seconds(metrics)}
        if final.get("failed"):                          # why it failed (diverged, trained no step): no grid will run
            row["failed"] = final["failed"]
        # written by runs since the wall clock and the test head exist (training.callbacks.TrainingClock)
        for key in ("epochs", "test_head_size", "test_head_accuracy", "train_head_size", "train_head_accuracy",
                    "train_wall_seconds", "train_cpu_seconds", "train_segments", "train_segment_times",
                    "threads", "stack_size", "global_step",
                    "test_by_setting", "test_by_key_position", "test_by_length"):
            if key in final:
                row[key] = final[key]
        result = run_dir.interventions()
        if result is not None:
            summary = last_layer_summary(result)
            del summary["accuracy"], summary["reason"]   # the grid documents' clean accuracy; the label's why
            row.update(summary)
            by_distance = distance_summary(result)       # MQAR: the label of near and of far queries
            if by_distance:
                row["by_distance"] = by_distance
            by = {(c["site"], c["position"]): c for c in result["corruptions"]["key"]["cells"]}
            n_layers = max(c["layer"] for c in result["corruptions"]["key"]["cells"]) + 1
            row["layer_scores"] = {f"layers.{l}.input@{p}": by[(f"layers.{l}.input", p)]["restoration"]
                                   for l in range(n_layers) for p in POSITIONS if (f"layers.{l}.input", p) in by}
            # inside the mixer (short-conv output, recurrent state, mixer output), key corrupted
            row["component_scores"] = {f"{site}@{p}": c["restoration"] for (site, p), c in by.items()
                                       if p in POSITIONS and site.split(".", 2)[2] in COMPONENTS}
        out.append((row, result))
    return out


def markdown_table(rows: list[dict]) -> str:
    """One line per run: its model and width, named apart from the others as the figures name it
    (the task where the rows hold several, the rate and seed where a model repeats), its test
    accuracy and restoration at the last layer's input."""
    head = ["run", "accuracy", "@key", "@value", "@query", "mechanism"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    names = run_tick_labels([{**r, "label": f"{r['label']} (d={r['hidden_size']})"} for r in rows])
    for r, name in zip(rows, names):
        mech = f"{r.get('mechanism', 'n/a')} ({r['confidence']})" if r.get("mechanism") else "n/a"
        lines.append(f"| {name} | {100 * r['test_accuracy']:.1f} % | "
                     f"{format_score(r.get('@key'))} | {format_score(r.get('@value'))} | {format_score(r.get('@query'))} | {mech} |")
    return "\n".join(lines) + "\n"


def figure_labels(rows: list[dict]) -> list[str]:
    """Each run's model in a figure of these rows: its label, with its number of layers where the
    rows hold several depths (a depth sweep's 1-layer Mamba beside 2-layer ones) and its task
    where they hold several tasks."""
    several_depths = len({r.get("layers") for r in rows}) > 1
    several_tasks = len({r.get("task") for r in rows}) > 1
    out = []
    for r in rows:
        label = r["label"]
        if several_depths:
            label = f"{label}, {r.get('layers')} layer{'' if r.get('layers') == 1 else 's'}"
        out.append(f"{r.get('task')}: {label}" if several_tasks else label)
    return out


def run_tick_labels(rows: list[dict]) -> list[str]:
    """Each run's model (``figure_labels``), with its learning rate and seed where runs would
    otherwise share one."""
    rows = [{**r, "label": label} for r, label in zip(rows, figure_labels(rows))]
    labels = [r["label"] for r in rows]
    out = []
    for r, label in zip(rows, labels):
        if labels.count(label) > 1:
            extra = [f"lr {r['learning_rate']:g}"] if r.get("learning_rate") is not None else []
            same_rate = [x for x in rows if x["label"] == label and x.get("learning_rate") == r.get("learning_rate")]
            extra += [f"s{r.get('seed') or 0}"] if len(same_rate) > 1 else []
            label = f"{label}, {', '.join(extra)}" if extra else label
        out.append(label)
    return out


def in_run_order(rows: list[dict]) -> list[dict]:
    """Rows by task, model, width, then learning rate and seed as numbers (run names, sorted as
    text, put 1e-04 after 0.01)."""
    return sorted(rows, key=lambda r: (str(r.get("task") or ""), r["label"], r["hidden_size"],
                                       r.get("learning_rate") or 0, r.get("seed") or 0))


SCATTER_MARKERS = "osD^vP*Xh<>p"


def _mechanism_plane(rows: list[dict], x: str, y: str, path: Path) -> Path:
    """Restoration @x against @y of every run: one colour (its architecture's, as in every figure;
    ``architecture_colours``) and one hollow marker shape per model (``figure_labels``: per task and
    depth where the rows hold several), named once in a legend beside the axes with its number of
    runs. Text beside each point ran into its neighbours wherever runs sat close
    together; a legend cannot, and hollow shapes of different forms stay visible on one spot (the
    width sweep puts four models at (@query 1, @key 0)). Where the rows hold several tasks, the
    shape is the task's, so one architecture's runs on every task share its colour and each
    task's runs one shape (a shape per model would reuse shapes past twelve models, and two of
    one architecture would then look alike). Marker size: test accuracy."""
    rows = [r for r in rows if r.get(f"@{x}") is not None and r.get(f"@{y}") is not None]
    several_tasks = len({r.get("task") for r in rows}) > 1
    names = figure_labels(rows)
    models = sorted(set(names))
    if several_tasks:       # names read "task: model"
        tasks = sorted({str(r.get("task")) for r in rows})
        task_of = {name: str(r.get("task")) for r, name in zip(rows, names)}
        model_of = {name: name.split(": ", 1)[1] for name in models}
        model_colours = architecture_colours(model_of.values())
        colours = {name: model_colours[model_of[name]] for name in models}
        shapes = {name: SCATTER_MARKERS[tasks.index(task_of[name]) % len(SCATTER_MARKERS)] for name in models}
    else:
        colours = architecture_colours(models)
        shapes = {name: SCATTER_MARKERS[i % len(SCATTER_MARKERS)] for i, name in enumerate(models)}
    fig, ax = plt.subplots(figsize=(7.6, 5))
    if not rows:      # an empty plane says why it is empty
        ax.text(0.5, 0.5, f"no run has a restoration score @{x} and @{y}", ha="center", va="center",
                transform=ax.transAxes)
    for model in models:
        mine = [r for r, name in zip(rows, names) if name == model]
        ax.scatter([r[f"@{x}"] for r in mine], [r[f"@{y}"] for r in mine], s=[40 + 120 * r["test_accuracy"] for r in mine],
                   marker=shapes[model], facecolors="none", edgecolors=colours[model],
                   linewidths=1.6, label=model if len(mine) == 1 else f"{model} ×{len(mine)}")
    # the paper's plane is [0, 1]^2 with a margin; a run beyond it (a Transformer's @value 1.3) widens it
    xs, ys = [r[f"@{x}"] for r in rows] or [0.0], [r[f"@{y}"] for r in rows] or [0.0]
    ax.set_xlim(min(-0.2, min(xs) - 0.05), max(1.2, max(xs) + 0.05))
    ax.set_ylim(min(-0.2, min(ys) - 0.05), max(1.2, max(ys) + 0.05))
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_xlabel(f"restoration @{x} (last layer's input, key corrupted)")
    ax.set_ylabel(f"restoration @{y}")
    ax.set_title(f"@{x} vs @{y} (marker size: accuracy)")
    if rows:
        legend = ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5),
                           title="task: model (runs)" if several_tasks else "model (runs)", title_fontsize=8)
        for handle in legend.legend_handles:              # one size in the legend, whatever the accuracy
            handle.set_sizes([70])
    return save_figure(fig, path)


def figures(rows: list[dict], out: Path, mqar_plan: dict | None = None) -> list[Path]:
    """A sweep's figures (accuracy, the mechanism planes, restoration by layer, the short
    convolutions, MQAR's); ``mqar_plan``: the MQAR sweep's plan, where its figures are to show only
    the cells whose planned runs have all finished (``mqar.chosen_runs``)."""
    made = []
    # accuracy: against width where widths vary, else one bar per run
    widths = sorted({r["hidden_size"] for r in rows})
    many = len(widths) == 1 and len(rows) > 10       # one bar per run, too many to label side by side
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.26 * len(rows)) if many else (7, 4))
    if len(widths) > 1:
        # every run a faint point; the line through each width's chosen rate (best mean validation
        # accuracy, as the results tables choose it), at the mean test accuracy over its seeds
        colours = architecture_colours(r["label"] for r in rows)
        for label in sorted(colours):
            mine, color = [r for r in rows if r["label"] == label], colours[label]
            ax.scatter([r["hidden_size"] for r in mine], [100 * r["test_accuracy"] for r in mine], s=14,
                       color=color, alpha=0.35)
            line = []
            for width in sorted({r["hidden_size"] for r in mine}):
                by_lr: dict = {}
                for r in mine:
                    if r["hidden_size"] == width:
                        by_lr.setdefault(r.get("learning_rate"), []).append(r)
                chosen = by_lr[best_learning_rate(by_lr)]
                line.append((width, 100 * sum(r["test_accuracy"] for r in chosen) / len(chosen)))
            ax.plot([p[0] for p in line], [p[1] for p in line], marker="o", color=color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("hidden size (line: the rate chosen on validation; dots: every run)")
        ax.legend(fontsize=8)
    elif many:                                        # a row per run, its label read across
        ax.barh(range(len(rows)), [100 * r["test_accuracy"] for r in rows], color="tab:blue")
        ax.set_yticks(range(len(rows)), run_tick_labels(rows), fontsize=8)
        ax.invert_yaxis()
    else:
        ax.bar(range(len(rows)), [100 * r["test_accuracy"] for r in rows], color="tab:blue")
        ax.set_xticks(range(len(rows)), run_tick_labels(rows), rotation=30, ha="right")
    if many:
        ax.set_xlabel("test accuracy (%)")
        ax.set_xlim(0, 105)
    else:
        ax.set_ylabel("test accuracy (%)")
        ax.set_ylim(0, 105)
    tasks = sorted({str(r.get("task")) for r in rows if r.get("task")})
    ax.set_title(f"test accuracy, {', '.join(tasks)}" if 0 < len(tasks) <= 3 else "test accuracy")
    made.append(save_figure(fig, out / "accuracy.png"))
    with_iv = [r for r in rows if r.get("mechanism")]
    for x, y, name in (("value", "query", "scatter_value_query.png"), ("query", "key", "scatter_query_key.png")):
        if with_iv:
            made.append(_mechanism_plane(with_iv, x, y, out / name))
    if with_iv:
        with_iv = in_run_order(with_iv)
        present = {k for r in with_iv for k in r.get("layer_scores", {})}
        n_layers = 1 + max(int(k.split(".")[1]) for k in present)
        cols = [f"layers.{l}.input@{p}" for l in range(n_layers) for p in POSITIONS if f"layers.{l}.input@{p}" in present]
        fig, ax = plt.subplots(figsize=(1.0 * len(cols) + 3, 0.45 * len(with_iv) + 1.8))
        grid = [[(r["layer_scores"].get(c) if r["layer_scores"].get(c) is not None else float("nan")) for c in cols]
                for r in with_iv]
        image = ax.imshow(grid, vmin=-0.2, vmax=1, cmap="viridis", aspect="auto")
        for i, (r, row) in enumerate(zip(with_iv, grid)):
            # a row with nothing measured says so instead of standing blank (a blank cell on its own
            # is a layer the model does not have): mostly a model that fails the task
            if all(math.isnan(v) for v in row):
                why = " (the model fails the task)" if r["mechanism"] == "failed" else ""
                ax.text((len(cols) - 1) / 2, i, f"no restoration measured{why}", ha="center", va="center",
                        fontsize=8, color="grey")
        ax.set_xticks(range(len(cols)), [c.replace(".input", "") for c in cols], rotation=45, ha="right", fontsize=8)
        # each row named apart from the others: the rate and seed where a model and width repeat
        names = run_tick_labels([{**r, "label": f"{r['label']} d={r['hidden_size']}"} for r in with_iv])
        ax.set_yticks(range(len(with_iv)), names, fontsize=8)
        # a narrow bar: the default (15 % of the panel) crowds its label off a tall figure
        fig.colorbar(image, ax=ax, label="restoration (key corrupted)", fraction=0.04, pad=0.03)
        ax.set_title("restoration at each layer's input")
        made.append(save_figure(fig, out / "layers.png"))
    kernels = [r for r in rows if r["architecture"] in ("mamba", "based") and r["conv_kernel"] is not None]
    if len({(r["architecture"], r["conv_kernel"]) for r in kernels}) > 2:
        # one line per architecture and learning rate: a line never joins runs at different rates
        widths = sorted({str(r["conv_kernel"]) for r in kernels}, key=lambda w: (not w.isdigit(), int(w) if w.isdigit() else 0, w))
        fig, ax = plt.subplots(figsize=(6.5, 4))
        markers = "osD^vP*X"
        colours = architecture_colours(r["architecture"] for r in kernels)
        for arch in sorted(colours):           # one colour per architecture, one marker per rate
            rates = sorted({r.get("learning_rate") or 0 for r in kernels if r["architecture"] == arch})
            color = colours[arch]
            for i, rate in enumerate(rates):
                by_width: dict[int, list[float]] = {}
                for r in kernels:
                    if r["architecture"] == arch and (r.get("learning_rate") or 0) == rate:
                        by_width.setdefault(widths.index(str(r["conv_kernel"])), []).append(100 * r["test_accuracy"])
                xs = sorted(by_width)
                # the line joins the mean over seeds at each width, broken where this rate has no
                # run; each seed is a small point
                ax.plot(range(len(widths)), broken_line({x: sum(v) / len(v) for x, v in by_width.items()}, len(widths)),
                        marker=markers[i % len(markers)], color=color, label=f"{arch}, lr {rate:g}")
                seeds = [(x, v) for x in xs if len(by_width[x]) > 1 for v in by_width[x]]
                if seeds:
                    ax.scatter([x for x, _ in seeds], [v for _, v in seeds], s=12, color=color, alpha=0.5)
        ax.set_xticks(range(len(widths)), widths)
        ax.set_xlabel("short convolution width")
        ax.set_ylabel("test accuracy (%)")
        ax.legend(fontsize=8)
        made.append(save_figure(fig, out / "conv_kernel.png"))
    return made + mqar_figures(rows, out, mqar_plan, read_experiment("zoology", ["figure2"])["figure2"])


def write_report(run_dirs: list[str | Path], out: str | Path, title: str = "hf-mecheval report",
                 preamble: str = "", overwrite: bool = False, verdicts: list[dict] | None = None,
                 verdicts_title: str = "Verdicts") -> dict:
    """report.md, report.html, runs.csv/json and the figures of ``run_dirs`` in the folder ``out``,
    which must hold only files hf-mecheval wrote there (``claim_output_folder``) unless
    ``overwrite``. ``verdicts``: claims checked on these runs ({"claim", "holds", "figures"}),
    listed under ``verdicts_title``."""
    out = Path(out)
    collected = collect_runs_and_grids(run_dirs)
    if not collected:
        raise MechEvalError("no runs to report")
    claim_output_folder(out, overwrite)
    with recording(out):
        return _write_report(collected, out, title, preamble, verdicts or [], verdicts_title)


def further_tables(rows: list[dict]) -> list[str]:
    """The Markdown tables after the runs table, in report.md and report.html: for MQAR runs the
    accuracy per setting, near and far, by key position, and Zoology's Figure 2 beside its settings."""
    if not mqar_rows(rows):
        return []
    return [t for t in (mqar_table(rows), key_position_table(rows),
                        zoology_table(rows, read_experiment("zoology", ["figure2"])["figure2"])) if t]


def report_markdown(rows: list[dict], figures_made: list[Path], tables: list[str], title: str = "hf-mecheval report",
                    preamble: str = "", verdicts: list[dict] | None = None, verdicts_title: str = "Verdicts") -> str:
    """report.md of ``rows`` (runs.json's): the verdicts, the runs table, the further ``tables``
    (``further_tables``) and the figures ``figures_made`` (``figures``) by file name. From the rows
    alone, so that ``mecheval report --results`` writes it again for sweeps whose run folders are
    not committed."""
    body = [f"# {title}", "", preamble, ""]
    if verdicts:
        body += [f"## {verdicts_title}", ""]
        body += [f"- {'**reproduced**' if v['holds'] else '**not reproduced**'}: {v['claim']} — {v['figures']}"
                 for v in verdicts]
        body += [""]
    body += [markdown_table(rows), ""]
    if tables:
        body += ["## MQAR", "", *tables, ""]
    body += [f"![{p.stem}]({p.name})" for p in figures_made]
    return "\n".join(body) + "\n"


def _write_report(collected: list[tuple[dict, dict | None]], out: Path, title: str, preamble: str,
                  verdicts: list[dict], verdicts_title: str) -> dict:
    rows = [row for row, _ in collected]
    made = figures(rows, out)
    flat = [{k: v for k, v in r.items() if k not in NESTED} for r in rows]
    buffer = io.StringIO()
    columns = list(dict.fromkeys(k for r in flat for k in r))      # rows of older runs lack some keys
    writer = csv.DictWriter(buffer, fieldnames=columns)
    writer.writeheader()
    writer.writerows(flat)
    write_text_atomic(out / "runs.csv", buffer.getvalue(), overwrite=True)
    write_text_atomic(out / "runs.json", json.dumps(rows, indent=1) + "\n", overwrite=True)
    tables = further_tables(rows)
    write_text_atomic(out / "report.md", report_markdown(rows, made, tables, title, preamble, verdicts, verdicts_title),
                      overwrite=True)
    page = html_page(title, preamble, rows, [grid for _, grid in collected], made, verdicts, verdicts_title,
                     sections=[("MQAR", tables)] if tables else [])
    write_text_atomic(out / "report.html", page, overwrite=True)
    return {"rows": rows, "figures": [str(p) for p in made], "out": str(out)}
