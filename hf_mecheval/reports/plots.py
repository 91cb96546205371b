"""Figures of intervention results (PNG, matplotlib's Agg backend: no display needed)."""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

from ..atomic_files import atomic_path  # noqa: E402
from .labels import ARCHITECTURE_ORDER, architecture_rank, is_default_configuration  # noqa: E402

RESIDUAL = ("input",)


def architecture_colours(labels) -> dict[str, str]:
    """One colour per architecture in every figure, the same one whichever others are drawn (the
    Transformer C0, Based C1, ... in ``ARCHITECTURE_ORDER``). Where labels share an architecture
    ("based", "based (positions)") its default configuration keeps the colour (else the first
    label, sorted); the others, and labels outside the nine, take in turn the colours no
    architecture drawn here holds."""
    labels = sorted(set(labels), key=lambda label: (not is_default_configuration(label), label))
    colours, rest = {}, []
    for label in labels:
        rank = architecture_rank(label)
        colour = f"C{rank}"
        if rank < len(ARCHITECTURE_ORDER) and colour not in colours.values():
            colours[label] = colour
        else:
            rest.append(label)
    # ten colours, nine architectures: C9 at least is always spare
    spare = [f"C{i}" for i in range(10) if f"C{i}" not in colours.values()]
    colours.update({label: spare[i % len(spare)] for i, label in enumerate(rest)})
    return colours


def broken_line(values: dict[int, float], n: int) -> list[float]:
    """``values`` (axis position -> value) over the positions 0 .. n-1, NaN where a position has
    none: matplotlib breaks a line at NaN, so it never joins two points over a position that line
    has no run at (a short-convolution width it never trained)."""
    return [values.get(x, float("nan")) for x in range(n)]


def _cells(result: dict, corruption: str) -> list[dict]:
    return result["corruptions"][corruption]["cells"]


def residual_heatmap(result: dict, corruption: str, path: str | Path, title: str = "") -> Path:
    """Restoration of the residual stream entering each layer (rows) at each position (columns)."""
    positions = result["positions"]
    layers = sorted({c["layer"] for c in _cells(result, corruption) if c["component"] == "input"})
    grid = np.full((len(layers), len(positions)), np.nan)
    for c in _cells(result, corruption):
        if c["component"] == "input" and c["restoration"] is not None:
            grid[layers.index(c["layer"]), positions.index(c["position"])] = c["restoration"]
    fig, ax = plt.subplots(figsize=(1.3 * len(positions) + 1.5, 0.8 * len(layers) + 1.6))
    image = ax.imshow(grid, vmin=-0.2, vmax=1.0, cmap="viridis", aspect="auto")
    for i in range(len(layers)):
        for j in range(len(positions)):
            text = "n/a" if np.isnan(grid[i, j]) else f"{grid[i, j]:.2f}"
            ax.text(j, i, text, ha="center", va="center", color="white" if np.isnan(grid[i, j]) or grid[i, j] < 0.6
                    else "black", fontsize=10)
    ax.set_xticks(range(len(positions)), [f"@{p}" for p in positions])
    ax.set_yticks(range(len(layers)), [f"layers.{l}.input" for l in layers])
    ax.set_title(title or f"restoration, {corruption} corrupted (residual stream)")
    fig.colorbar(image, ax=ax, label="restoration")
    return save_figure(fig, path)


def component_bars(result: dict, corruption: str, path: str | Path, title: str = "") -> Path:
    """Restoration of every non-residual site (mixer/MLP inputs and outputs, short conv, state),
    one bar per position."""
    positions = [p for p in result["positions"] if p != "answer"]
    sites = [s for s in result["sites"] if s.split(".", 2)[2] not in RESIDUAL]
    values = {(c["site"], c["position"]): c["restoration"] for c in _cells(result, corruption)}
    width = 0.8 / max(1, len(positions))
    fig, ax = plt.subplots(figsize=(max(6.0, 0.9 * len(sites) + 2), 4.2))
    x = np.arange(len(sites))
    for k, p in enumerate(positions):
        heights = [values.get((s, p)) for s in sites]
        ax.bar(x + k * width, [np.nan if h is None else h for h in heights], width, label=f"@{p}")
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(x + width * (len(positions) - 1) / 2, sites, rotation=35, ha="right", fontsize=8)
    ax.set_ylabel("restoration")
    ax.set_ylim(-0.3, 1.1)
    ax.legend(ncol=len(positions), fontsize=8)
    ax.set_title(title or f"restoration by site, {corruption} corrupted")
    return save_figure(fig, path)


def restoration_curves(history: list[dict], path: str | Path, title: str = "") -> Path:
    """Restoration over training steps (from the RestorationCallback)."""
    fig, ax = plt.subplots(figsize=(6.5, 4))
    steps = [h["step"] for h in history]
    for key in sorted({k for h in history for k in h if k.startswith("restoration@")}):
        ax.plot(steps, [h.get(key) if h.get(key) is not None else np.nan for h in history], marker="o", label=key)
    if any("restoration_accuracy" in h for h in history):
        ax.plot(steps, [h.get("restoration_accuracy", np.nan) for h in history], "k--", label="accuracy")
    ax.set_xlabel("training step")
    ax.set_ylabel("restoration")
    ax.set_ylim(-0.3, 1.1)
    ax.legend(fontsize=8)
    ax.set_title(title or "mechanism over training")
    return save_figure(fig, path)


def save_figure(fig, path, layout: bool = True) -> Path:
    """``fig`` as the PNG ``path``, written atomically (a fresh temporary beside it, never a name
    that could already be a link), replacing what is there; laid out tightly first unless the
    caller did (``layout=False``: a figure-level legend placed around the laid-out panels).

    The PNG has a palette of 256 colours, not matplotlib's RGBA: a third of the bytes (the
    figures are committed again with every finished run), and these figures, flat colours on
    white, look the same."""
    path = Path(path)
    if layout:
        fig.tight_layout()
    try:
        rendered = io.BytesIO()
        fig.savefig(rendered, dpi=110, format="png")
    finally:
        plt.close(fig)
    rendered.seek(0)
    with Image.open(rendered) as image:
        palette = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    with atomic_path(path, overwrite=True) as tmp:
        palette.save(tmp, format="PNG", optimize=True)
    return path
