"""MQAR's tables and figures, as a reader of Zoology expects them: accuracy against the number of
pairs and against sequence length (one line per architecture, one panel per width), the mechanism
per architecture overall and for near and far queries, and our accuracies beside Zoology's
Figure 2 (``experiments/zoology.yaml``).

Every function is a pure function of ``mecheval report``'s rows (``report.collect_runs``: an MQAR
run's row holds ``test_by_setting`` and, once evaluated, ``by_distance``), so the same code draws a
sweep's report and REPRODUCTION.md's figures from ``results/<sweep>/runs.json``. For each
architecture and width the learning rate is the one with the best mean *validation* accuracy over
seeds, and what is shown is that rate's runs (accuracies their mean where seeds are several,
mechanisms the first seed's). Given the sweep file's ``plan`` ((task, label, width) -> the
(learning rate, seed) runs it plans), a cell is shown only once all of them have finished, as
REPRODUCTION.md's are; a sweep's own report shows every cell as it stands.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from ..runs.files import format_score  # noqa: E402
from ..training.sweep import best_learning_rate, has_every_planned_run  # noqa: E402
from .labels import architecture_rank  # noqa: E402
from .plots import architecture_colours, save_figure  # noqa: E402


def mqar_rows(rows: list[dict]) -> list[dict]:
    """The rows of MQAR runs (those with accuracy per setting)."""
    return [r for r in rows if isinstance(r.get("test_by_setting"), list) and r["test_by_setting"]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def chosen_runs(rows: list[dict], plan: dict | None = None) -> dict[tuple[str, str, int], list[dict]]:
    """(task, label, width) -> the runs at the learning rate whose mean validation accuracy over
    seeds is best (ties: the lower rate), in a stable order of tasks, labels and widths; with a
    ``plan``, only the cells every planned run of which has finished (a cell part-way through
    would show its best rate so far as its best)."""
    by_rate: dict[tuple, dict[float, list[dict]]] = {}
    for r in rows:
        key = (r["task"], r["label"], r["hidden_size"])
        by_rate.setdefault(key, {}).setdefault(r.get("learning_rate") or 0.0, []).append(r)
    if plan is not None:
        by_rate = {key: rates for key, rates in by_rate.items()
                   if has_every_planned_run(plan.get(key, set()), [r for runs in rates.values() for r in runs])}
    return {key: by_rate[key][best_learning_rate(by_rate[key])] for key in sorted(by_rate)}


def setting_accuracy(runs: list[dict]) -> dict[tuple[int, int], float]:
    """(seq_len, num_pairs) -> test accuracy, the mean over the runs (seeds)."""
    values: dict[tuple[int, int], list[float]] = {}
    for r in runs:
        for s in r["test_by_setting"]:
            values.setdefault((s["seq_len"], s["num_pairs"]), []).append(s["accuracy"])
    return {k: _mean(v) for k, v in values.items()}


def key_position_accuracy(runs: list[dict]) -> dict[tuple[int, int], float]:
    """(first, one past the last key position) -> the share of test queries answered right whose
    key stands there (``test_by_key_position``), the mean over the runs (seeds) that recorded it."""
    values: dict[tuple[int, int], list[float]] = {}
    for r in runs:
        for b in r.get("test_by_key_position") or []:
            values.setdefault((b["key_from"], b["key_to"]), []).append(b["accuracy"])
    return {k: _mean(v) for k, v in values.items()}


def _by_key_position(chosen: dict) -> tuple[dict, list[tuple[int, int]]]:
    """``key_position_accuracy`` of each chosen cell that recorded it, and the buckets of key
    positions among them (ascending); nothing where every key falls in one bucket (Zoology's
    settings, 4-8 pairs: keys within the first 16 tokens), whose one column would repeat the test
    accuracy."""
    by_position = {k: a for k, a in ((k, key_position_accuracy(v)) for k, v in chosen.items()) if a}
    buckets = sorted(set().union(*by_position.values())) if by_position else []
    return (by_position, buckets) if len(buckets) > 1 else ({}, [])


def _axis_settings(settings: set[tuple[int, int]]) -> tuple[int, list[int], int, list[int]]:
    """The length with the most pair counts and those counts; the pair count found at the most
    lengths (ties: the larger) and those lengths: the two slices a figure draws."""
    lengths = sorted({L for L, _ in settings})
    length = max(lengths, key=lambda L: (sum(1 for l, _ in settings if l == L), L))
    pair_counts = sorted({p for l, p in settings if l == length})
    pairs = max({p for _, p in settings}, key=lambda p: (sum(1 for _, q in settings if q == p), p))
    return length, pair_counts, pairs, sorted({L for L, p in settings if p == pairs})


def mqar_figures(rows: list[dict], out: Path, plan: dict | None = None, published: dict | None = None) -> list[Path]:
    """mqar_pairs.png (accuracy against the number of pairs at one length) and mqar_length.png
    (against the length at one number of pairs), of the task that mixes settings; where grids were
    run, mqar_near_far.png (restoration @value against @key + @query of near and far queries:
    induction against direct retrieval, wherever a model retrieves from; not where that group
    fails the task, whose scores mean nothing); where runs recorded it and their keys stand in
    more than one bucket, mqar_key_position.png (accuracy against where the query's key stands);
    and, given Zoology's Figure 2 values (``published``: zoology.yaml's ``figure2``) and runs of
    its settings, mqar_zoology.png. A panel per width, and per task where the rows hold several
    (Zoology's settings are one task each). ``plan``: as ``chosen_runs``."""
    rows = mqar_rows(rows)
    chosen = chosen_runs(rows, plan)
    if not chosen:
        return []
    accuracy = {k: setting_accuracy(v) for k, v in chosen.items()}
    colour = architecture_colours(label for _, label, _ in chosen)
    made = []
    # accuracy against pairs and length: a task with one setting (Zoology's) has no line to draw
    mixtures = [r for r in rows if len({(s["seq_len"], s["num_pairs"]) for s in r["test_by_setting"]}) > 1]
    mixed = {k: a for k, a in accuracy.items() if mixtures and k[0] == _main_task(mixtures)}
    if mixed:
        length, pair_counts, pairs, lengths = _axis_settings(set().union(*(a.keys() for a in mixed.values())))
        for name, xs, point, xlabel, title in (
                ("mqar_pairs.png", pair_counts, lambda x: (length, x), "key-value pairs", f"sequence length {length}"),
                ("mqar_length.png", lengths, lambda x: (x, pairs), "sequence length", f"{pairs} pairs")):
            curves = {key: [(x, acc[point(x)]) for x in xs if point(x) in acc] for key, acc in mixed.items()}
            made.append(_accuracy_panels(curves, colour, (xs, [str(x) for x in xs]), xlabel, f", {title}",
                                         out / name, log2=True))
    evaluated = {k: v[0]["by_distance"] for k, v in chosen.items() if isinstance(v[0].get("by_distance"), dict)
                 and {"near", "far"} <= set(v[0]["by_distance"])}
    planes = {k: (_plane_point(g["near"]), _plane_point(g["far"])) for k, g in evaluated.items()
              if "failed" not in (g["near"].get("mechanism"), g["far"].get("mechanism"))}
    planes = {k: v for k, v in planes.items() if None not in v}
    if planes:
        fig, axes = _panels(planes, 4.6, 4.2)
        # models by one mechanism meet at one corner: each later one drawn smaller, on top, so that
        # every model there still shows as a ring around the next
        size = {label: max(16, 120 - 13 * i) for i, label in enumerate(sorted({l for _, l, _ in planes}))}
        xs, ys = [x for v in planes.values() for x, _ in v], [y for v in planes.values() for _, y in v]
        for (task, label, width), (near, far) in sorted(planes.items(), key=lambda kv: kv[0][1]):
            ax = axes[task, width]
            ax.plot([near[0], far[0]], [near[1], far[1]], lw=1, color=colour[label])
            ax.scatter([near[0]], [near[1]], marker="o", s=size[label], color=colour[label], label=label)
            ax.scatter([far[0]], [far[1]], marker="s", s=size[label], color=colour[label])
        for (task, width), ax in axes.items():
            # restoration is 0-1 up to noise; @key + @query may pass 1 where both positions restore
            ax.set_xlim(min(-0.2, min(xs) - 0.05), max(1.2, max(xs) + 0.1))
            ax.set_ylim(min(-0.2, min(ys) - 0.05), max(1.2, max(ys) + 0.1))
            ax.set_xlabel("restoration @value (last layer's input)")
            if _first_column(axes, width):
                ax.set_ylabel("restoration @key + @query")
            ax.set_title(f"{_panel_title(axes, task, width)}: near (o) and far (s) queries")
            ax.grid(alpha=0.3)
        _legend(fig, list(axes.values()))
        made.append(save_figure(fig, out / "mqar_near_far.png"))
    by_position, buckets = _by_key_position(chosen)
    if by_position:
        curves = {key: [(i, acc[b]) for i, b in enumerate(buckets) if b in acc] for key, acc in by_position.items()}
        made.append(_accuracy_panels(curves, colour, (range(len(buckets)), [f"{lo}-{hi - 1}" for lo, hi in buckets]),
                                     "position of the query's key", "", out / "mqar_key_position.png"))
    if published:
        theirs = {task: by_width for task, by_width in published.items() if any(k[0] == task for k in chosen)}
        if theirs:
            made.append(zoology_figure(chosen, theirs, colour, out / "mqar_zoology.png"))
    return made


def zoology_figure(chosen: dict[tuple[str, str, int], list[dict]], published: dict, colour: dict, path: Path) -> Path:
    """Zoology's Figure 2 as its reader knows it: MQAR accuracy against model width (log2 axis), a
    panel per setting, a line per architecture; ours (``chosen``: as ``chosen_runs``) solid and
    filled, Zoology's (``published``: setting -> width -> model -> accuracy) dashed and hollow in
    the same colour. The two are different statistics (the table beside it says how)."""
    fig, axes = plt.subplots(1, len(published), figsize=(4.0 * len(published) + 2.2, 3.8), squeeze=False, sharey=True)
    widths = sorted({int(w) for by_width in published.values() for w in by_width} | {w for _, _, w in chosen})
    for ax, (task, by_width) in zip(axes[0], published.items()):
        models = sorted((m for m in colour if any(k[0] == task and k[1] == m for k in chosen)),
                        key=lambda m: (architecture_rank(m), m))
        for model in models:
            ours = sorted((w, _mean([r["test_accuracy"] for r in runs])) for (t, m, w), runs in chosen.items()
                          if t == task and m == model)
            paper = sorted((int(w), values[model]) for w, values in by_width.items() if model in values)
            ax.plot([w for w, _ in ours], [a for _, a in ours], marker="o", color=colour[model], label=model)
            if paper:
                ax.plot([w for w, _ in paper], [a for _, a in paper], marker="o", linestyle="--",
                        markerfacecolor="white", color=colour[model])
        settings = {(s["seq_len"], s["num_pairs"]) for (t, _, _), runs in chosen.items() if t == task
                    for s in runs[0]["test_by_setting"]}
        title = ", ".join(f"{length} tokens, {pairs} pairs" for length, pairs in sorted(settings))
        ax.set_title(f"{task}: {title}" if title else task, fontsize=10)
        ax.set_xscale("log", base=2)
        ax.set_xticks(widths, [str(w) for w in widths])
        ax.set_xlim(widths[0] / 1.3, widths[-1] * 1.3)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel("model width")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("MQAR accuracy")
    axes[0][-1].plot([], [], color="grey", marker="o", label="ours (test, rate chosen on validation)")
    axes[0][-1].plot([], [], color="grey", marker="o", linestyle="--", markerfacecolor="white",
                     label="Zoology, Figure 2 (best of 4 rates on test)")
    _legend(fig, axes[0])
    return save_figure(fig, path)


def _panels(keys, width: float, height: float):
    """A figure with a panel per (task, width) of ``keys`` ((task, label, width) triples): a row
    per task, a column per width; returns (figure, {(task, width): axes})."""
    tasks = sorted({t for t, _, _ in keys})
    widths = sorted({w for _, _, w in keys})
    fig, grid = plt.subplots(len(tasks), len(widths), figsize=(width * len(widths) + 1.8, height * len(tasks)),
                             squeeze=False, sharey="row")
    return fig, {(t, w): grid[i][j] for i, t in enumerate(tasks) for j, w in enumerate(widths)}


def _first_column(axes: dict, width: int) -> bool:
    return width == min(w for _, w in axes)


def _panel_title(axes: dict, task: str, width: int) -> str:
    """"width 64", or "mqar_64_4, width 64" where the panels span several tasks."""
    several = len({t for t, _ in axes}) > 1
    return f"{task}, width {width}" if several else f"width {width}"


def _accuracy_panels(curves: dict[tuple[str, str, int], list[tuple[float, float]]], colour: dict,
                     ticks: tuple, xlabel: str, title: str, path: Path, log2: bool = False) -> Path:
    """MQAR test accuracy, a panel per task and width and a line per architecture (``curves``:
    (task, label, width) -> its (x, accuracy) points); ``ticks``: (positions, labels) of the x axis."""
    fig, axes = _panels(curves, 4.2, 3.6)
    for (task, label, width), points in curves.items():
        axes[task, width].plot([x for x, _ in points], [y for _, y in points], marker="o", label=label,
                               color=colour[label])
    for (task, width), ax in axes.items():
        if log2:
            ax.set_xscale("log", base=2)
        ax.set_xticks(*ticks)
        ax.set_ylim(-0.02, 1.02)
        ax.set_xlabel(xlabel)
        if _first_column(axes, width):
            ax.set_ylabel("MQAR test accuracy")
        ax.set_title(f"{_panel_title(axes, task, width)}{title}")
        ax.grid(alpha=0.3)
    _legend(fig, list(axes.values()))
    return save_figure(fig, path)


def _plane_point(group: dict) -> tuple[float, float] | None:
    """(@value, @key + @query) of a near or far group: induction against direct retrieval from
    either position (Mamba on MQAR reads the key at its own position, Hyena at the query); None
    where one was not measured."""
    value, key, query = group.get("@value"), group.get("@key"), group.get("@query")
    return None if None in (value, key, query) else (value, key + query)


def _legend(fig, axes) -> None:
    """One legend for the panels, right of the last one: each label once, whichever panel drew it."""
    handles: dict[str, object] = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            handles.setdefault(label, handle)
    axes[-1].legend(list(handles.values()), list(handles), fontsize=8, loc="center left", bbox_to_anchor=(1.02, 0.5))


def _main_task(rows: list[dict]) -> str:
    """The task most rows share (a report of one sweep has one)."""
    tasks = [r["task"] for r in rows]
    return max(sorted(set(tasks)), key=tasks.count)


def mqar_table(rows: list[dict], plan: dict | None = None) -> str:
    """Markdown: per task, architecture and width (the chosen rate), test accuracy, accuracy in
    each setting, and the mechanism overall and for near and far queries. ``plan``: as
    ``chosen_runs``."""
    rows = mqar_rows(rows)
    chosen = chosen_runs(rows, plan)
    if not chosen:
        return ""
    settings = sorted(set().union(*(setting_accuracy(v).keys() for v in chosen.values())))
    head = ["task", "model", "width", "lr", "test"] + [f"{L}x{p}" for L, p in settings] + ["mechanism", "near", "far"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (task, label, width), runs in chosen.items():
        acc = setting_accuracy(runs)
        by = runs[0].get("by_distance") or {}
        cells = [task, label, str(width), f"{runs[0].get('learning_rate') or 0:g}",
                 f"{100 * _mean([r['test_accuracy'] for r in runs]):.1f}"]
        cells += [f"{100 * acc[s]:.1f}" if s in acc else "" for s in settings]
        if runs[0].get("failed"):                   # no grid runs on a failed run
            cells += [f"the run failed: {runs[0]['failed']}", "—", "—"]
        elif not runs[0].get("mechanism"):
            cells += ["grid not run yet", "—", "—"]
        else:
            cells.append(_label(runs[0]))
            cells += [_label(by[g]) if g in by else "n/a" for g in ("near", "far")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def key_position_table(rows: list[dict], plan: dict | None = None) -> str:
    """Markdown: per task, architecture and width (the chosen rate), the share of test queries
    answered right by where their key stands (``test_by_key_position``: keys at 0-15, 16-31,
    32-63, ...), for the runs that recorded it; empty where every key falls in one bucket.
    ``plan``: as ``chosen_runs``."""
    chosen = chosen_runs(mqar_rows(rows), plan)
    by_position, buckets = _by_key_position(chosen)
    if not by_position:
        return ""
    head = ["task", "model", "width", "lr"] + [f"keys {lo}-{hi - 1}" for lo, hi in buckets]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (task, label, width), acc in by_position.items():
        cells = [task, label, str(width), f"{chosen[task, label, width][0].get('learning_rate') or 0:g}"]
        cells += [f"{100 * acc[b]:.1f}" if b in acc else "" for b in buckets]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _label(entry: dict) -> str:
    """A mechanism with its restoration @key / @value / @query, as a table cell."""
    if not entry.get("mechanism"):
        return "n/a"
    return (f"{entry['mechanism']} ({format_score(entry.get('@key'))} / {format_score(entry.get('@value'))} / "
            f"{format_score(entry.get('@query'))})")


def zoology_table(rows: list[dict], published: dict, plan: dict | None = None) -> str:
    """Markdown: our test accuracy on Zoology's Figure 2 settings beside the figure's, per setting,
    width and architecture (``published``: zoology.yaml's ``figure2``); rows of other tasks or
    architectures are left out. The two columns are different statistics, and the header says
    so: theirs the best of four rates chosen on the test documents, read off the figure; ours at
    the better of the sweep's rates on validation documents. ``plan``: as ``chosen_runs``."""
    chosen = chosen_runs(mqar_rows(rows), plan)
    lines = ["| setting | width | model | Zoology, Figure 2 (best of 4 rates on test; read off the figure, ±3) "
             "| ours (test, at the rate best on validation) | ours, lr |", "|---|---|---|---|---|---|"]
    count = 0
    for task, by_width in published.items():
        for width, models in by_width.items():
            for model, theirs in models.items():
                runs = chosen.get((task, model, int(width)))
                if runs is None:
                    continue
                count += 1
                ours = _mean([r["test_accuracy"] for r in runs])
                lines.append(f"| {task} | {width} | {model} | {100 * theirs:.0f} | {100 * ours:.1f} | "
                             f"{runs[0].get('learning_rate') or 0:g} |")
    return "\n".join(lines) + "\n" if count else ""
