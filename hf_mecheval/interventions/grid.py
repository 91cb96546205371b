"""The intervention grid: corruption (key, value) x sites x layers x positions
(key, value, divider, query, answer), over a set of documents, with metrics and the mechanism
label.

    result = run_grid(model, task, task.generate(320, "test", seed=0))
    result["corruptions"]["key"]["cells"]      # one entry per (site, position)
    result["mechanism"]                         # induction / direct_query / ... with evidence

Documents with one answer per query (MQAR) are read one query at a time
(``TaskData.per_query``): each example is a document and one of its queries, whose own pair's key
(or value) is corrupted and whose own key, value, query and answer positions are patched (MQAR has
no divider). The model is then labelled per query distance as well (``mechanism_by_distance``:
examples whose query lies at most the median ``query_pos - key_pos`` from its pair are "near",
the others "far"), from the same cells at the last layer's input.

``batch_size`` is an upper bound: the grid measures the memory of one and of two copies of a
document first (what is fixed per batch, what each document adds) and, where
the batch asked for would not fit in half of the memory available, runs smaller batches (saying
so on stderr); where one document does not fit, it refuses with the estimate
(``interventions.memory``). Restoration is per document, so results do not depend on the batch
size beyond float rounding.

JSON schema (``mecheval evaluate`` writes it as ``interventions.json``)::

    {"examples": N, "threshold": t, "sites": [...], "positions": [...],
     "mechanism": {"label", "confidence", "reason", "evidence"},
     "corruptions": {"key" | "value": {
         "clean_accuracy", "corrupt_accuracy", "p_clean_mean", "p_corrupt_mean", "denominator",
         "corruption_reused_fraction",
         "cells": [{"site", "layer", "component", "position", "restoration", "restoration_ci",
                    "normalized_mean", "normalized_ci", "normalized_examples", "p_patched_mean"}],
         "per_example": {"p_clean": [...], "p_corrupt": [...], "p_patched": {"SITE@POSITION": [...]}}}},
     "mechanism_by_distance": {"boundary": b, "site": "layers.L.input", "groups": {"near" | "far": {
         "examples", "distance": [lo, hi], "clean_accuracy", "cells": {"key" | "value" | "query": {...}},
         "mechanism": {...}}}}}        (documents with one answer per query only)

``per_example`` holds float32 probabilities, each written at the shortest decimals that read
back as the same float32: read them as float32 to get the grid's own values. ``mecheval evaluate``
adds ``settings``, ``run`` and ``seconds`` ({"wall", "cpu"}: what the grid took, this process's
CPU time on all its threads).
"""
from __future__ import annotations

import numpy as np
import torch

from ..errors import MechEvalError
from ..metrics.mechanism import classify, classify_by_layer
from ..metrics.restoration import accuracy, near_far, summarize_restoration
from ..tasks.corruption import corrupt
from ..tasks.data import TaskData
from .engine import engine_for, site_layer
from .memory import fitting_batch_size

POSITIONS = ("key", "value", "divider", "query", "answer")
QUERY_POSITIONS = ("key", "value", "query", "answer")     # one query of a multi-query document: no divider
CORRUPTIONS = ("key", "value")


def default_threshold(task) -> float:
    """The reference's denominator thresholds: 0.01 for AR, 0.1 for ATR; MQAR's, with AR's
    vocabulary of thousands of values, AR's."""
    return 0.01 if task.name in ("ar", "mqar") else 0.1


def run_grid(model, task, data: TaskData, corruptions=CORRUPTIONS, sites: list[str] | None = None,
             positions=None, batch_size: int = 64, seed: int = 0, threshold: float | None = None,
             n_resamples: int = 1000, progress: bool = True, keep_per_example: bool = True) -> dict:
    """``positions``: the position names to patch (default ``POSITIONS``, or ``QUERY_POSITIONS``
    for the queries of multi-query documents). Documents with several answers are read one query
    at a time (``data.per_query()``: pass ``data.per_query(n)`` for the first n queries only)."""
    from tqdm.auto import tqdm

    if data.multi_query:
        data = data.per_query()
    if positions is None:
        positions = QUERY_POSITIONS if "query_distance" in data.columns else POSITIONS
    for column in [f"{p}_pos" for p in positions] + ["answer"]:
        if column not in data.columns:
            raise MechEvalError(f"the dataset has no {column} column; interventions need the position "
                                f"columns {', '.join(p + '_pos' for p in POSITIONS)}")
    # an empty set or a zero batch size would otherwise fail far below (numpy's concatenate, range)
    if len(data) == 0:
        raise MechEvalError("the intervention grid needs at least one document, got none")
    if batch_size < 1:
        raise MechEvalError(f"the batch size must be at least 1, got {batch_size}")
    corruptions = list(corruptions)
    engine = engine_for(model)         # ours, or a transformers causal LM through its adapter
    sites = engine.site_names() if sites is None else list(sites)
    threshold = default_threshold(task) if threshold is None else threshold
    device = next(model.parameters()).device
    ids = data.padded()
    lengths = data.lengths
    result = {"examples": len(data), "threshold": threshold, "sites": sites, "positions": list(positions),
              "corruptions": {}}
    broken = {which: corrupt(ids, data.columns[f"{which}_pos"], task.token_classes, seed=seed, lengths=lengths)
              for which in corruptions}

    def run_batch(which: str, sl) -> dict:
        """The engine on documents ``sl`` (a slice, or indices: the memory probe repeats one), cut
        to the longest of them."""
        width = int(lengths[sl].max())
        t = lambda a: torch.as_tensor(np.asarray(a)[sl], device=device).long()
        return engine.run(t(ids)[:, :width], t(broken[which].input_ids)[:, :width],
                          {p: t(data.columns[f"{p}_pos"]) for p in positions},
                          t(data.columns["query_pos"]), t(data.columns["answer"]), sites)

    # A batch's memory grows with its documents and depends on the model's internals: measured on
    # one and two copies of the most expensive document (the longest; then the one with the most
    # positions to patch), the batch is lowered to what fits, or the grid refused with the
    # estimate. The probe's results are dropped: every document is measured in its batch, as asked.
    live = sum((np.asarray(data.columns[f"{p}_pos"]) >= 0).astype(np.int64) for p in positions)    # (N,)
    probe = int(np.lexsort((-live, -np.asarray(lengths)))[0])
    if corruptions:
        batch_size = fitting_batch_size(
            lambda copies: run_batch(corruptions[0], np.full(copies, probe)), batch_size, device,
            f"the intervention grid ({len(sites)} sites, documents of {int(lengths[probe])} tokens) on one document")
    for which in corruptions:
        acc = {k: [] for k in ("p_clean", "p_corrupt", "pred_clean", "pred_corrupt")}
        patched = {(s, p): [] for s in sites for p in positions}
        starts = range(0, len(data), batch_size)
        # disable=None: no bar where the output is not a terminal (a sweep's log)
        for start in tqdm(starts, desc=f"interventions ({which} corrupted)", disable=None if progress else True):
            out = run_batch(which, slice(start, start + batch_size))
            for k in acc:
                acc[k].append(out[k].cpu().numpy())
            for (s, p) in patched:
                patched[(s, p)].append(out["p_patched"][s][p].cpu().numpy())
        acc = {k: np.concatenate(v) for k, v in acc.items()}
        patched = {k: np.concatenate(v) for k, v in patched.items()}
        answers = data.columns["answer"]
        cells = []
        for (s, p), values in patched.items():
            cells.append({"site": s, "layer": site_layer(s), "component": s.split(".", 2)[2], "position": p,
                          **summarize_restoration(acc["p_clean"], acc["p_corrupt"], values, threshold,
                                                  n_resamples, seed)})
        entry = {
            "clean_accuracy": accuracy(acc["pred_clean"], answers),
            "corrupt_accuracy": accuracy(acc["pred_corrupt"], answers),
            "p_clean_mean": float(acc["p_clean"].mean()), "p_corrupt_mean": float(acc["p_corrupt"].mean()),
            "denominator": float(acc["p_clean"].mean() - acc["p_corrupt"].mean()),
            "corruption_reused_fraction": float(broken[which].reused.mean()),
            "cells": cells,
        }
        if keep_per_example:
            entry["per_example"] = {"p_clean": float32_list(acc["p_clean"]), "p_corrupt": float32_list(acc["p_corrupt"]),
                                    "p_patched": {f"{s}@{p}": float32_list(v) for (s, p), v in patched.items()}}
        result["corruptions"][which] = entry
        last = f"layers.{engine.num_layers - 1}.input"
        if which == "key" and "query_distance" in data.columns and last in sites \
                and all(p in positions for p in ("key", "value", "query")):
            at_last = {p: patched[(last, p)] for p in ("key", "value", "query")}
            result["mechanism_by_distance"] = by_distance(data, acc, at_last, last, threshold, n_resamples, seed)
    result["mechanism"] = mechanism_of(result, engine.num_layers).to_dict()
    return result


def float32_list(values: np.ndarray) -> list[float]:
    """``values`` (float32) as floats of the shortest decimals that read back as the same float32:
    the 17 digits a float32 takes as a Python float carry nothing more, and made a grid's
    per-example record (nearly all of interventions.json) twice as large, compressed."""
    return [float(str(v)) for v in np.asarray(values, dtype=np.float32)]


def by_distance(data: TaskData, acc: dict, patched: dict, site: str, threshold: float, n_resamples: int,
                seed: int) -> dict:
    """The mechanism of the near and the far queries (``metrics.restoration.near_far``), each
    from its examples' cells at ``site`` (key corrupted): acc holds the examples' p_clean,
    p_corrupt and predictions, patched their p_patched at the key, value and query positions."""
    distance = data.columns["query_distance"]
    boundary, near = near_far(distance)
    groups = {}
    for name, rows in (("near", near), ("far", ~near)):
        if not rows.any():
            continue
        cells = {p: summarize_restoration(acc["p_clean"][rows], acc["p_corrupt"][rows], values[rows], threshold,
                                          n_resamples, seed) for p, values in patched.items()}
        clean = accuracy(acc["pred_clean"][rows], data.columns["answer"][rows])
        groups[name] = {"examples": int(rows.sum()), "distance": [int(distance[rows].min()), int(distance[rows].max())],
                        "clean_accuracy": clean, "cells": cells, "mechanism": classify(cells, clean).to_dict()}
    return {"boundary": boundary, "site": site, "groups": groups}


def cell(result: dict, corruption: str, site: str, position: str) -> dict | None:
    for c in result["corruptions"].get(corruption, {}).get("cells", []):
        if c["site"] == site and c["position"] == position:
            return c
    return None


def mechanism_of(result: dict, n_layers: int):
    """Classify from the key-corruption cells at the input of each layer (``classify_by_layer``:
    the last layer's, or induction at an earlier one's)."""
    site = f"layers.{n_layers - 1}.input"
    if "key" not in result["corruptions"] or site not in result["sites"]:
        from ..metrics.mechanism import Mechanism
        return Mechanism("failed", "low", f"the grid lacks key corruption at {site}", {})
    cells = {layer: {p: cell(result, "key", f"layers.{layer}.input", p) or {} for p in ("key", "value", "query")}
             for layer in range(n_layers) if f"layers.{layer}.input" in result["sites"]}
    return classify_by_layer(cells, result["corruptions"]["key"]["clean_accuracy"])
