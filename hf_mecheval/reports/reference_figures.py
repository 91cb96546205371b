"""Figures of REPRODUCTION.md's reference setting, from the same rows as its tables
(``reference_setting``): each configuration under each recipe, the paper's figure beside ours.

* ``accuracy_<table>.png`` — test accuracy per configuration: every run a point (filled: the
  seeds at the rate chosen on validation; hollow: the other rates), the two recipes side by side,
  the paper's figure (width 256) as a black bar.
* ``scatter_value_query.png`` / ``scatter_query_key.png`` — restoration at the last layer's input
  (key corrupted) of each configuration's runs at its chosen rate, with their bootstrap intervals;
  each configuration has its own marker and colour, named in the legend (no text on the plot,
  so no label can cover another).
* ``conv_width.png`` — the short-convolution ablation, one panel per architecture.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from .plots import broken_line, save_figure  # noqa: E402
from .reference_setting import (EARLIER_RECIPE, PAPER_AR_WIDTH_256, PAPER_MAMBA_CONV_WIDTH_256,  # noqa: E402
                                REFERENCE_RECIPE, Selection, _recipe_order, _side_by_side, _width, table_rows)

RECIPE_COLOURS = {REFERENCE_RECIPE: "tab:blue", EARLIER_RECIPE: "tab:orange"}
MARKERS = "osD^vP*Xh<>p"


def _colour(name: str) -> str:
    return RECIPE_COLOURS.get(name, "tab:grey")


def accuracy_figure(found: list[tuple[str, str, Selection]], path: Path, title: str,
                    paper: dict | None = None) -> Path:
    """found: (label, recipe, selection) as ``_side_by_side`` gives them."""
    labels = list(dict.fromkeys(label for label, _, _ in found))
    recipes = sorted({name for _, name, _ in found}, key=_recipe_order)
    step = 0.7 / max(1, len(recipes))
    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(labels) + 2.5), 4.6))
    shown = set()
    for label, name, sel in found:
        x = labels.index(label) - 0.35 + step * (recipes.index(name) + 0.5)
        colour = _colour(name)
        for lr, runs in sel.by_lr.items():
            chosen = lr == sel.best_lr
            for k, r in enumerate(runs):
                dx = (k - (len(runs) - 1) / 2) * 0.04
                ax.scatter(x + dx, 100 * r["test_accuracy"], s=36 if chosen else 22, zorder=3,
                           facecolors=colour if chosen else "none", edgecolors=colour,
                           label=None if (name, chosen) in shown else
                           f"{name}: {'chosen rate (each seed)' if chosen else 'other rates'}")
                shown.add((name, chosen))
    if paper:
        xs = [labels.index(l) for l in labels if l in paper]
        ax.scatter(xs, [paper[l] for l in labels if l in paper], marker="_", s=700, color="black", zorder=2,
                   label="paper, width 256")
    ax.set_xticks(range(len(labels)), labels, rotation=20, ha="right")
    ax.set_ylabel("test accuracy (%)")
    ax.set_ylim(-3, 105)
    ax.grid(axis="y", alpha=0.3)
    handles, names = ax.get_legend_handles_labels()         # by recipe, the chosen rate first
    order = sorted(range(len(names)), key=lambda i: (_recipe_order(names[i].split(":")[0]), "other" in names[i]))
    ax.legend([handles[i] for i in order], [names[i] for i in order], fontsize=8, loc="center left",
              bbox_to_anchor=(1.0, 0.5))
    ax.set_title(title)
    return save_figure(fig, path)


def scatter_figure(found: list[tuple[str, str, Selection]], x: str, y: str, path: Path, title: str) -> Path:
    """Restoration @x against @y of the chosen rate's runs, each with its bootstrap intervals."""
    fig, ax = plt.subplots(figsize=(8.2, 5.2))
    plotted = 0
    for i, (label, name, sel) in enumerate(found):
        runs = [r for r in sel.best if r.get(f"@{x}") is not None and r.get(f"@{y}") is not None]
        if not runs:
            continue
        marker, colour = MARKERS[i % len(MARKERS)], plt.cm.tab10(i % 10)
        for k, r in enumerate(runs):
            lo_x, hi_x = r.get(f"@{x}_ci") or (r[f"@{x}"],) * 2
            lo_y, hi_y = r.get(f"@{y}_ci") or (r[f"@{y}"],) * 2
            ax.errorbar(r[f"@{x}"], r[f"@{y}"], xerr=[[r[f"@{x}"] - lo_x], [hi_x - r[f"@{x}"]]],
                        yerr=[[r[f"@{y}"] - lo_y], [hi_y - r[f"@{y}"]]], fmt=marker, color=colour,
                        markersize=9, capsize=2,
                        markerfacecolor=colour if name == REFERENCE_RECIPE else "none", alpha=0.85,
                        label=None if k else f"{label} · {name} ({100 * sel.accuracy():.0f} %)")
        plotted += 1
    ax.axhline(0, color="grey", lw=0.5)
    ax.axvline(0, color="grey", lw=0.5)
    ax.set_xlim(-0.2, 1.25)
    ax.set_ylim(-0.2, 1.25)
    ax.set_xlabel(f"restoration @{x} (last layer's input, key corrupted)")
    ax.set_ylabel(f"restoration @{y}")
    if plotted:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5), title="model · recipe (test acc.)",
                  title_fontsize=7)
    ax.set_title(title)
    return save_figure(fig, path)


def conv_width_figure(found: list[tuple[str, str, Selection]], path: Path) -> Path:
    """Test accuracy against the short-convolution width, one panel per architecture, each
    recipe a line through the chosen rate's mean (its seeds as points), the paper's figure for
    Mamba as black bars."""
    panels = {}
    for arch in ("mamba", "based"):
        mine = [(label, name, sel) for label, name, sel in found if label.startswith(arch)]
        if mine:
            panels[arch] = [(name, _colour(name), [(_width(label), sel) for label, n, sel in mine if n == name])
                            for name in sorted({n for _, n, _ in mine}, key=_recipe_order)]
    return conv_width_panels(panels, path)


def conv_width_panels(panels: dict[str, list[tuple[str, str, list[tuple[int, Selection]]]]], path: Path) -> Path:
    """One panel per architecture (``panels``: arch -> lines of (name, colour, [(short-conv width,
    selection)])): each line through the chosen rate's mean accuracy by short-convolution width
    (99 = "long"), its seeds as points, the paper's width-256 figures for Mamba as black bars. A line
    is broken where it has no run at a width on the axis (``broken_line``)."""
    fig, axes = plt.subplots(1, max(1, len(panels)), figsize=(5.4 * max(1, len(panels)), 4.2), squeeze=False)
    for ax, (arch, lines) in zip(axes[0], panels.items()):
        widths = sorted({w for _, _, pts in lines for w, _ in pts})
        for name, colour, pts in lines:
            pts = sorted((widths.index(w), sel) for w, sel in pts)
            ax.plot(range(len(widths)), broken_line({p: 100 * s.accuracy() for p, s in pts}, len(widths)),
                    marker="o", color=colour, label=name)
            for p, s in pts:
                ax.scatter([p] * len(s.best), [100 * r["test_accuracy"] for r in s.best], color=colour, alpha=0.4, s=14)
        if arch == "mamba":
            paper = [(i, PAPER_MAMBA_CONV_WIDTH_256[w]) for i, w in enumerate(widths) if w in PAPER_MAMBA_CONV_WIDTH_256]
            ax.scatter([i for i, _ in paper], [v for _, v in paper], marker="_", s=500, color="black",
                       label="paper, width 256")
        ax.set_xticks(range(len(widths)), ["long" if w == 99 else str(w) for w in widths])
        ax.set_xlabel("short-convolution width" + (" (Mamba conv_kernel)" if arch == "mamba" else " (Based)"))
        ax.set_ylabel("AR test accuracy (%)")
        ax.set_ylim(-3, 105)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=8)
        ax.set_title(f"{arch}: AR accuracy by short-convolution width")
    return save_figure(fig, path)


def reference_figures(results: dict[str, list[dict]], out: Path) -> list[Path]:
    """Every figure whose rows are present, into ``out``."""
    rows = table_rows(results)
    made = []
    if rows["ar"]:
        found = _side_by_side(rows["ar"])
        made.append(accuracy_figure(found, out / "accuracy_ar.png",
                                    "AR (ar_32) at width 64: test accuracy by model and recipe", PAPER_AR_WIDTH_256))
        made.append(scatter_figure(found, "value", "query", out / "scatter_value_query.png",
                                   "AR: induction (@value) against direct retrieval (@query)"))
        made.append(scatter_figure(found, "query", "key", out / "scatter_query_key.png",
                                   "AR: where direct retrieval reads the key"))
    if rows["atr"]:
        for task in sorted({r["task"] for r in rows["atr"]}):
            made.append(accuracy_figure(_side_by_side(rows["atr"], task), out / f"accuracy_{task}.png",
                                        f"{task} at width 64: test accuracy by model and recipe"))
    if rows["ablations"]:
        made.append(conv_width_figure(_side_by_side(rows["widths"]), out / "conv_width.png"))
    return made
