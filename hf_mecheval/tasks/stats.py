"""Statistics of generated data: what a model could exploit."""
from __future__ import annotations

import numpy as np

from .data import TaskData


def task_statistics(data: TaskData) -> dict[str, float]:
    """Summary statistics of ``data`` (any task; tree statistics where ``tree_parent`` exists).

    length:                 tokens per document, including BOS, EOS and the query tokens
    key_value_distance:     value_pos - key_pos (how far the answer is from the cue in the context)
    adjacent_fraction:      fraction of documents with the answer right after the cue
    answer_from_query_acc:  accuracy of the best guess of the answer from the query token alone
                            (majority answer per query token, on this data): > chance means
                            the answer is partly predictable without reading the context
    ATR only — tree_depth (deepest parent chain per sentence), branching (children per node
    that has any), repeated_label_fraction (sentence tokens whose label occurs more than once
    in the sentence), answer_is_root_fraction.
    With several answers per document (MQAR) the answer statistics are over every query, and
    queries_per_document and query_distance (query_pos - key_pos: how far a query is from its
    pair) are added.
    """
    lengths = data.lengths
    rows = data.answer_rows()
    distance = rows["value_pos"] - rows["key_pos"]
    query_token = data.tokens[data.offsets[:-1][rows["document"]] + rows["query_pos"]]
    stats = {
        "documents": float(len(data)),
        "length_mean": float(lengths.mean()),
        "length_min": float(lengths.min()),
        "length_median": float(np.median(lengths)),
        "length_max": float(lengths.max()),
        "key_value_distance_mean": float(distance.mean()),
        "key_value_distance_median": float(np.median(distance)),
        "adjacent_fraction": float((distance == 1).mean()),
        "answer_from_query_acc": _majority_accuracy(query_token, rows["answer"]),
    }
    if data.multi_query:
        far = rows["query_pos"] - rows["key_pos"]
        stats.update(queries_per_document_mean=float(len(far) / len(data)), query_distance_mean=float(far.mean()),
                     query_distance_median=float(np.median(far)), query_distance_max=float(far.max()))
    if "tree_parent" in data.token_columns:
        stats.update(_tree_statistics(data))
    return stats


def _majority_accuracy(inputs: np.ndarray, targets: np.ndarray) -> float:
    """Two-fold cross-fitted accuracy of predicting ``targets`` from ``inputs`` alone: fit the
    most frequent target of each input value on one half of the documents, score on the other
    (unseen inputs get the overall most frequent target), and average the two folds. Fitting and
    scoring on the same documents would reward memorising rare inputs."""
    if len(inputs) < 2:
        return float("nan")
    halves = (np.arange(len(inputs)) % 2 == 0, np.arange(len(inputs)) % 2 == 1)
    correct = 0
    for fit, score in (halves, halves[::-1]):
        (inp, tgt), n = np.unique(np.stack([inputs[fit], targets[fit]]), axis=1, return_counts=True)
        order = np.lexsort((n, inp))          # per input, the most frequent target last
        last = np.append(inp[order][1:] != inp[order][:-1], True)
        best_inp, best_tgt = inp[order][last], tgt[order][last]
        fallback = np.bincount(targets[fit]).argmax()
        idx = np.clip(np.searchsorted(best_inp, inputs[score]), 0, len(best_inp) - 1)
        guess = np.where(best_inp[idx] == inputs[score], best_tgt[idx], fallback)
        correct += int((guess == targets[score]).sum())
    return float(correct / len(inputs))


def _tree_statistics(data: TaskData) -> dict[str, float]:
    lengths = data.lengths
    doc = np.repeat(np.arange(len(data)), lengths)
    start = data.offsets[:-1][doc]
    tp = data.token_columns["tree_parent"]
    parent = np.where(tp >= 0, tp + start, -1)             # global index of each token's parent
    # sentence tokens: between BOS and the divider
    pos = np.arange(len(tp)) - start
    in_sentence = (pos >= 1) & (pos < data.columns["divider_pos"][doc])
    depth = np.zeros(len(tp), dtype=np.int64)
    cur = parent.copy()
    while (cur >= 0).any():                                  # pointer chasing, <= max_depth rounds
        depth += cur >= 0
        cur = np.where(cur >= 0, parent[np.maximum(cur, 0)], -1)
    max_depth = np.zeros(len(data), dtype=np.int64)
    np.maximum.at(max_depth, doc[in_sentence], depth[in_sentence])
    children = np.bincount(parent[parent >= 0], minlength=len(tp))
    has_children = children > 0
    labels = data.tokens.astype(np.int64)
    key = doc[in_sentence] * (labels.max() + 1) + labels[in_sentence]
    _, inverse, counts = np.unique(key, return_inverse=True, return_counts=True)
    root_pos = data.columns["divider_pos"] - 1
    return {
        "tree_depth_mean": float(max_depth.mean()),
        "tree_depth_max": float(max_depth.max()),
        "branching_mean": float(children[has_children].mean()),
        "repeated_label_fraction": float((counts[inverse] > 1).mean()),
        "answer_is_root_fraction": float((data.columns["value_pos"] == root_pos).mean()),
    }


def format_statistics(stats: dict[str, float]) -> str:
    width = max(map(len, stats))
    return "\n".join(f"{k:<{width}}  {v:.4g}" for k, v in stats.items())
