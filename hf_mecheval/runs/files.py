"""The shapes of a run directory's JSON files and of a results folder's, so a damaged or foreign
file is one clear error naming it (``io_utils.read_json``; ``RunDir`` reads a run's files with them).

Only the keys something reads without a default are required; everything else is optional. The
summary of a run's intervention grid that tables, cards and the command line show is here too
(``last_layer_summary``, ``format_score``).
"""
from __future__ import annotations

from pathlib import Path

from ..io_utils import FRACTION, NUMBER, OPTIONAL_NUMBER, maybe, read_json

# run.json, written by `mecheval train` (training.trainer.run_record); what the reports tabulate and
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


def read_interventions(path: str | Path) -> dict:
    return read_json(path, INTERVENTIONS)


def format_score(value) -> str:
    """A restoration score for tables and text: two decimals, or n/a."""
    return "n/a" if value is None else f"{value:.2f}"


def last_layer_summary(result: dict) -> dict:
    """@key/@value/@query (and their intervals) at the input of the last layer, key corrupted,
    and the mechanism (label, confidence, reason). The mechanism is classified again from the
    stored cells by the current rule (``metrics.mechanism.classify``), so that runs evaluated
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
