"""The shapes of a run directory's JSON files and of a results folder's, so a damaged or foreign
file is one clear error naming it (``inputs.read_json``; ``RunDir`` reads a run's files with them).

Only the keys something reads without a default are required; everything else is optional. The
summary of a run's intervention grid that tables, cards and the command line show is here too
(``last_layer_summary``, ``format_score``).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from ..errors import MechEvalError
from ..inputs import FRACTION, NUMBER, OPTIONAL_NUMBER, maybe, read_json

# run.json, written by `mecheval train` (training.spec.RunSpec.record); what the reports tabulate and
# plot must have its type, or one run of another type would break a table or a figure
RUN_RECORD = {"model": {"architecture": maybe(str), "hidden_size": int, "num_hidden_layers": int,
                        "conv_kernel": maybe((int, str)), "short_conv_kernel": maybe((int, str))},
              "task": {"preset": str, "config": dict},
              "training": {"learning_rate": maybe(NUMBER), "seed": maybe(int)}}
# metrics.json, written last by `mecheval train`: its presence marks a finished run
METRICS = {"final": {"validation_accuracy": FRACTION, "test_accuracy": FRACTION}}
# interventions/interventions.json, written by `mecheval evaluate` (schema in interventions.grid)
INTERVENTIONS = {
    "corruptions": {"key": {"clean_accuracy": NUMBER,
                            "cells": [{"site": str, "layer": int, "position": str, "restoration": OPTIONAL_NUMBER,
                                       "restoration_ci": object}]}},
    "mechanism": {"label": str, "confidence": str, "reason": str},
}
# restoration_history.json, written during training by the RestorationCallback
RESTORATION_HISTORY = [{"step": int}]
# results/<sweep>/runs.json: the rows of `mecheval report` (report.collect_runs)
RESULT_ROWS = [{"label": str, "architecture": (str, type(None)), "task": str, "hidden_size": int, "layers": int,
                "conv_kernel": object, "validation_accuracy": FRACTION, "test_accuracy": FRACTION}]


def run_seconds(row: dict, key: str = "train_wall_seconds") -> float | None:
    """A run's own share of a training time (``key``: train_wall_seconds or train_cpu_seconds; the
    wall time falls back to the Trainer's train_seconds): a run trained in a stack of K shows its
    stack's time (``stack_size`` K in its metrics), of which it is one K-th."""
    seconds = row.get(key) or (row.get("train_seconds") if key == "train_wall_seconds" else None)
    return None if not seconds else seconds / (row.get("stack_size") or 1)


def run_cost(row: dict, threads: int) -> tuple[float, float] | None:
    """What training the whole run took at ``threads`` threads, as (wall, CPU) seconds, its own
    share where it trained in a stack (``run_seconds``): from its segments at that thread count
    (``train_segment_times``, ``training.callbacks.TrainingClock``), at their own rate over all
    its steps where other segments trained at another count or unknown ones; None where those
    segments trained less than half its steps. A run from before segments were timed one by one
    counts where it trained in one segment at ``threads``: its totals."""
    times, total = row.get("train_segment_times"), row.get("global_step")
    if not isinstance(times, list):
        if row.get("threads") == threads and row.get("train_segments") == 1 and row.get("train_cpu_seconds"):
            return run_seconds(row), run_seconds(row, "train_cpu_seconds")
        return None
    known = [t for t in times if isinstance(t, dict) and t.get("threads") == threads
             and all(isinstance(t.get(k), (int, float)) and t[k] > 0 for k in ("steps", "wall_seconds", "cpu_seconds"))]
    steps = sum(t["steps"] for t in known)
    if not isinstance(total, int) or total <= 0 or 2 * steps < total:
        return None
    scale = total / steps / (row.get("stack_size") or 1)
    return sum(t["wall_seconds"] for t in known) * scale, sum(t["cpu_seconds"] for t in known) * scale


MAX_LAYERS = 10_000       # far beyond any model here; a larger layer index in a grid is a damaged file


def read_interventions(path: str | Path) -> dict:
    """interventions.json, its shape checked, and each cell's layer a real one: from 0 (to
    ``MAX_LAYERS``), the layer its site names (``layers.<layer>.``)."""
    grid = read_json(path, INTERVENTIONS)
    for name, corruption in grid["corruptions"].items():
        for cell in corruption["cells"]:
            layer = cell["layer"]
            if isinstance(layer, bool) or not 0 <= layer < MAX_LAYERS or not cell["site"].startswith(f"layers.{layer}."):
                raise MechEvalError(f"{path}: a {name}-corrupted cell has layer {layer!r} for site {cell['site']!r} "
                                    f"(a layer from 0 to {MAX_LAYERS - 1}, the one its site names)")
    return grid


def format_score(value) -> str:
    """A restoration score for tables and text: two decimals, or n/a."""
    return "n/a" if value is None else f"{value:.2f}"


def last_layer_summary(result: dict) -> dict:
    """@key/@value/@query (and their intervals) at the input of the last layer, key corrupted,
    and the mechanism (label, confidence, reason). The mechanism is classified again from the
    stored cells by the current rule (``metrics.mechanism.classify_by_layer``), so that runs evaluated
    before a change of the rule read the same as new ones; the grid's own ``mechanism`` entry
    keeps what the rule said when it was written."""
    from ..interventions.grid import cell, mechanism_of

    last = max(c["layer"] for c in result["corruptions"]["key"]["cells"])
    site = f"layers.{last}.input"
    row = {"accuracy": result["corruptions"]["key"]["clean_accuracy"]}
    for p in ("key", "value", "query"):
        c = cell(result, "key", site, p)
        row[f"@{p}"] = c["restoration"] if c else None
        row[f"@{p}_ci"] = c["restoration_ci"] if c else None
    mechanism = mechanism_of(result, last + 1)
    row.update(mechanism=mechanism.label, confidence=mechanism.confidence, reason=mechanism.reason)
    return row


def distance_summary(result: dict) -> dict[str, dict]:
    """For a grid on multi-query documents (``mechanism_by_distance``): per group ("near", "far")
    its examples, distance range (as text), clean accuracy, @key/@value/@query at the last layer's
    input and the mechanism classified again by the current rule; {} for other grids."""
    from ..metrics.mechanism import classify

    by = result.get("mechanism_by_distance")
    if not isinstance(by, dict):
        return {}
    out = {}
    groups = by.get("groups")
    for name, group in (groups.items() if isinstance(groups, dict) else ()):
        try:
            mechanism = classify(group["cells"], group["clean_accuracy"])
            lo, hi = group["distance"]
            out[name] = {"examples": group["examples"], "accuracy": group["clean_accuracy"],
                         "distance": f"distance {lo}-{hi}" if lo != hi else f"distance {lo}",
                         **{f"@{p}": group["cells"][p]["restoration"] for p in ("key", "value", "query")},
                         "mechanism": mechanism.label, "confidence": mechanism.confidence}
        except (KeyError, TypeError, ValueError, AttributeError):     # a damaged group is left out, not a traceback
            continue
    return out


# ---------------------------------------------------------------------------------- grid settings
@dataclasses.dataclass(frozen=True)
class GridSettings:
    """What an intervention grid is made with: the ``mecheval evaluate`` flags that change its
    result. interventions.json records them (``settings``); a sweep or the quickstart reuses a
    run's grid only when they match what it asks for now (``matches``), and makes it again
    otherwise."""
    n: int = 320
    split: str = "test"
    seed: int | None = None                  # None: the run's dataset seed
    sites: tuple[str, ...] | None = None     # None: every site
    resamples: int = 1000

    def flags(self) -> list[str]:
        """The ``mecheval evaluate`` flags that ask for these settings (a log says what it ran)."""
        out = ["-n", str(self.n), "--split", self.split, "--resamples", str(self.resamples)]
        if self.seed is not None:
            out += ["--seed", str(self.seed)]
        return out + (["--sites", *self.sites] if self.sites else [])

    @staticmethod
    def from_record(values: dict) -> "GridSettings":
        """Settings as a job file holds them (``dataclasses.asdict``); a field missing, unknown or
        of the wrong type is a ``TypeError`` or ``ValueError`` naming it."""
        names = [f.name for f in dataclasses.fields(GridSettings)]
        if not isinstance(values, dict) or set(values) != set(names):
            raise ValueError(f"grid settings must have exactly the keys {', '.join(names)}, got {values!r}")
        for name in ("n", "resamples") + (("seed",) if values["seed"] is not None else ()):
            if not isinstance(values[name], int) or isinstance(values[name], bool) or values[name] < 0:
                raise ValueError(f"grid setting {name} must be a whole number >= 0, got {values[name]!r}")
        sites = values["sites"]
        if sites is not None and not (isinstance(sites, list) and all(isinstance(s, str) for s in sites)):
            raise ValueError(f"grid setting sites must be a list of site names or null, got {sites!r}")
        return GridSettings(values["n"], str(values["split"]), values["seed"], tuple(sites) if sites else None,
                            values["resamples"])

    def record(self, dataset_seed: int) -> dict:
        """As interventions.json records them: the seed resolved to the one used."""
        return {"n": self.n, "split": self.split, "seed": dataset_seed if self.seed is None else self.seed,
                "sites": list(self.sites) if self.sites else None, "resamples": self.resamples}

    def matches(self, grid: dict, dataset_seed: int) -> bool:
        """Whether ``grid`` (interventions.json) was made with these settings: its recorded
        settings must be whole (every key, none other) and equal; settings that cannot be read as
        a whole (another type, a key lost or added) match nothing, so the grid is made again. A
        grid from before settings were recorded is compared on what it shows (documents, split
        and seed), each of which must be there."""
        wanted = self.record(dataset_seed)
        if "settings" in grid:
            made = grid["settings"]
            return isinstance(made, dict) and made == wanted
        run = grid.get("run") if isinstance(grid.get("run"), dict) else {}
        shown = {"n": grid.get("examples"), "split": run.get("split"), "seed": run.get("dataset_seed")}
        return all(value is not None and wanted[key] == value for key, value in shown.items())
