"""Answer accuracy and probability for the Trainer's evaluation loop.

The model returns logits only at the positions that predict an answer ((batch, 1, vocab), or
(batch, k, vocab) with one answer per query: MQAR); ``preprocess_logits_for_metrics`` reduces them
right away to (prediction, answer, p(answer)) per answer so no full-vocabulary logits are
accumulated over the evaluation set. Accuracy is the mean over documents of the share of a
document's answers that are right (Zoology's ``valid/accuracy``); with one answer per document,
the share of documents answered right.
"""
from __future__ import annotations

import numpy as np
import torch

from ..models.modeling_mecheval import scored_positions
from ..tasks.data import IGNORE_INDEX


def answer_logits_summary(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits: (B, 1, V) at the answer-predicting position, or (B, L, V); labels: (B, L) with one
    label per row. Returns (B, 3) float: argmax over the full vocabulary, answer, p(answer)."""
    targets = labels[:, 1:]
    pos = (targets != IGNORE_INDEX).float().argmax(1)                  # (B,)
    answer = targets.gather(1, pos[:, None])[:, 0]
    if logits.shape[1] != 1:
        logits = logits[torch.arange(len(pos)), pos][:, None]
    probs = torch.softmax(logits[:, 0].float(), dim=-1)
    return torch.stack([probs.argmax(-1).float(), answer.float(), probs.gather(1, answer[:, None])[:, 0]], dim=1)


def query_logits_summary(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same for documents with one answer per query: logits (B, k, V) at each row's scored
    positions (the model's order, ``scored_positions``) or (B, L, V); labels (B, L). Returns
    (B, k, 3) float, rows with fewer answers padded with IGNORE_INDEX (as the Trainer pads
    batches of another k when it joins them)."""
    positions, answers = scored_positions(labels[:, 1:])                # (B, k) each
    if logits.shape[1] != positions.shape[1]:
        logits = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))
    probs = torch.softmax(logits.float(), dim=-1)                       # (B, k, V)
    valid = answers != IGNORE_INDEX
    p = probs.gather(-1, answers.clamp(min=0)[..., None])[..., 0]
    summary = torch.stack([probs.argmax(-1).float(), answers.float(), p], dim=-1)
    return torch.where(valid[..., None], summary, torch.full_like(summary, IGNORE_INDEX))


def logits_summary_for(task):
    """``preprocess_logits_for_metrics`` for the task's documents: one answer or one per query."""
    return query_logits_summary if getattr(task, "multi_query", False) else answer_logits_summary


def per_document(summary: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """summary (N, 3) or (N, k, 3) as the two functions above give it -> (N,) each document's share
    of right answers and mean p(answer)."""
    summary = np.asarray(summary, dtype=np.float64)
    if summary.ndim == 2:
        return (summary[:, 0] == summary[:, 1]).astype(np.float64), summary[:, 2]
    valid = summary[..., 1] != IGNORE_INDEX
    count = np.maximum(valid.sum(1), 1)
    right = ((summary[..., 0] == summary[..., 1]) & valid).sum(1) / count
    return right, np.where(valid, summary[..., 2], 0.0).sum(1) / count


def compute_answer_metrics(prediction) -> dict[str, float]:
    """``compute_metrics`` for the Trainer: accuracy and mean answer probability (means over
    documents: see the module's docstring)."""
    summary = np.asarray(prediction.predictions)
    if summary.ndim <= 2 or summary.shape[-2:] == (1, 3):
        summary = summary.reshape(-1, 3)
        return {"accuracy": float((summary[:, 0] == summary[:, 1]).mean()),
                "answer_prob": float(summary[:, 2].mean())}
    right, prob = per_document(summary)
    return {"accuracy": float(right.mean()), "answer_prob": float(prob.mean())}


def multi_query_breakdowns(trainer, dataset) -> dict[str, list[dict]]:
    """From one prediction pass of ``trainer`` over ``dataset`` (a multi-query
    ``PaddedTaskDataset``, in order): ``test_by_setting`` (``accuracy_by_setting``) and
    ``test_by_key_position`` (``accuracy_by_key_position``)."""
    summary = trainer.predict(dataset, metric_key_prefix="by_setting").predictions
    return {"test_by_setting": accuracy_by_setting(summary, dataset.document_columns),
            "test_by_key_position": accuracy_by_key_position(summary, dataset.query_key_positions)}


def accuracy_by_setting(summary: np.ndarray, columns: dict[str, np.ndarray]) -> list[dict]:
    """Accuracy per setting of a mixture of documents (MQAR: each ``seq_len`` and ``num_pairs``,
    Zoology's slices), the mean over its documents of their share of right answers: summary
    (N, k, 3) as ``query_logits_summary`` gives it; columns: the documents' ``seq_len`` and
    ``num_pairs`` (N,) -> ``[{"seq_len", "num_pairs", "documents", "accuracy"}, ...]``."""
    right, _ = per_document(summary)
    seq_len, pairs = columns["seq_len"], columns["num_pairs"]
    out = []
    for length, n in sorted(set(zip(seq_len.tolist(), pairs.tolist()))):
        rows = (seq_len == length) & (pairs == n)
        out.append({"seq_len": length, "num_pairs": n, "documents": int(rows.sum()),
                    "accuracy": float(right[rows].mean())})
    return out


def accuracy_by_key_position(summary: np.ndarray, key_pos: np.ndarray) -> list[dict]:
    """The share of queries answered right, by where the query's key stands in its document: in
    [0, 16), then [16, 32), [32, 64), ... (a model that never saw a key past some position may not
    find one there, whatever the setting). summary (N, k, 3) as ``query_logits_summary`` gives it;
    key_pos (N, k) each query's key position in the same order, -1 where a row has fewer queries
    -> ``[{"key_from", "key_to", "queries", "accuracy"}, ...]`` (key_to exclusive), the buckets
    that hold a query."""
    summary = np.asarray(summary, dtype=np.float64)
    valid = key_pos >= 0
    right = (summary[..., 0] == summary[..., 1])[valid]
    where = key_pos[valid]
    bucket = np.maximum(0, np.floor(np.log2(np.maximum(where, 1) / 16)).astype(np.int64) + 1)   # 0: [0, 16), 1: [16, 32)
    out = []
    for b in sorted(set(bucket.tolist())):
        rows = bucket == b
        out.append({"key_from": 0 if b == 0 else 16 << (b - 1), "key_to": 16 << b, "queries": int(rows.sum()),
                    "accuracy": float(right[rows].mean())})
    return out


def decoded_example(model, tokenizer, input_ids, labels, longest: int = 48) -> str:
    """One document as text with the model's answer, e.g. ``<bos> k8 v1 k3 v6 <eos> k3 -> v6
    (answer v6: right)``: the document up to the query, then the token ``generate()`` adds.
    input_ids, labels: (L,) one document, as the task datasets give them. Documents longer than
    ``longest`` tokens are shown by their beginning and end."""
    input_ids, labels = torch.as_tensor(input_ids), torch.as_tensor(labels)
    answer_pos = int((labels != IGNORE_INDEX).nonzero()[0, 0])
    prompt = input_ids[:answer_pos]
    device = next(model.parameters()).device
    predicted = int(model.generate(prompt[None].to(device), max_new_tokens=1, do_sample=False)[0, -1])
    words = tokenizer.convert_ids_to_tokens(prompt.tolist())
    if len(words) > longest:
        words = words[: longest // 2] + ["…"] + words[-longest // 4:]
    answer = int(labels[answer_pos])
    name = tokenizer.convert_ids_to_tokens
    return (f"{' '.join(words)} -> {name(predicted)} (answer {name(answer)}: "
            f"{'right' if predicted == answer else 'wrong'})")
