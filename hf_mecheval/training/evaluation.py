"""Answer accuracy and probability for the Trainer's evaluation loop.

Evaluation keeps of each batch only (prediction, answer, p(answer)) per answer (``AnswerSummary``),
so no full-vocabulary logits are accumulated over the evaluation set. From our models it takes
the LM head at the answers alone (``MechEvalForCausalLM.answer_states``); from any other model,
its logits at the answer-predicting positions ((batch, 1, vocab), (batch, k, vocab) with one
answer per query: MQAR, or (batch, length, vocab)). Accuracy is the mean over documents of the
share of a document's answers that are right (Zoology's ``valid/accuracy``); with one answer per
document, the share of documents answered right.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..models.modeling_mecheval import scored_positions
from ..tasks.data import IGNORE_INDEX


# the LM head runs over this many logits at a time (16 MiB in float32): ~3x faster than all of a
# 256-document MQAR batch's at once on a CPU, whose caches the whole (answers, vocab) block overflows
HEAD_CHUNK_LOGITS = 1 << 22


def summary_rows(logits: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """logits (n, V) of n answer-predicting positions, answers (n,) -> ((n, 3) float: the
    prediction (argmax over the full vocabulary, as greedy ``generate()`` picks it), the answer,
    p(answer); (n,) each answer's cross entropy)."""
    logits = logits.to(torch.promote_types(logits.dtype, torch.float32))     # half precision summed in float32
    answer_logit = logits.gather(1, answers[:, None])[:, 0]                # (n,)
    nll = torch.logsumexp(logits, dim=-1) - answer_logit                  # -log p(answer)
    return torch.stack([logits.argmax(-1).float(), answers.float(), torch.exp(-nll)], dim=1), nll


def head_summary(lm_head, h: torch.Tensor, answers: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``summary_rows`` of ``lm_head(h)``, h (n, D), run in pieces of ``HEAD_CHUNK_LOGITS``
    logits -> (rows (n, 3), the mean cross entropy)."""
    step = max(1, HEAD_CHUNK_LOGITS // lm_head.out_features)
    pieces = [summary_rows(lm_head(h[i:i + step]), answers[i:i + step]) for i in range(0, len(h), step)]
    if not pieces:                 # no answer in the batch: no rows, and a NaN loss as the forward's
        return h.new_zeros(0, 3), h.new_full((), float("nan"))
    return torch.cat([rows for rows, _ in pieces]), torch.cat([nll for _, nll in pieces]).mean()


def slots_summary(rows: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """rows (n, 3) of the n True slots of slots (B, k), row-major -> (B, k, 3), IGNORE_INDEX in
    the empty slots (as the Trainer pads batches of another k when it joins them)."""
    summary = torch.full((*slots.shape, 3), float(IGNORE_INDEX), dtype=rows.dtype, device=rows.device)
    summary[slots] = rows
    return summary


def answer_logits_summary(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """logits: (B, 1, V) at the answer-predicting position, or (B, L, V); labels: (B, L) with one
    label per row. Returns (B, 3) float: prediction, answer, p(answer) (``summary_rows``)."""
    targets = labels[:, 1:]
    pos = (targets != IGNORE_INDEX).float().argmax(1)                  # (B,)
    answer = targets.gather(1, pos[:, None])[:, 0]
    if logits.shape[1] != 1:
        logits = logits[torch.arange(len(pos)), pos][:, None]
    return summary_rows(logits[:, 0], answer)[0]


def query_logits_summary(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The same for documents with one answer per query: logits (B, k, V) at each row's scored
    positions (the model's order, ``scored_positions``) or (B, L, V); labels (B, L). Returns
    (B, k, 3) float, rows with fewer answers padded with IGNORE_INDEX (``slots_summary``)."""
    positions, answers = scored_positions(labels[:, 1:])                # (B, k) each
    if logits.shape[1] != positions.shape[1]:
        logits = logits.gather(1, positions[..., None].expand(-1, -1, logits.shape[-1]))
    slots = answers != IGNORE_INDEX
    return slots_summary(summary_rows(logits[slots], answers[slots])[0], slots)


@dataclass(frozen=True)
class AnswerSummary:
    """What evaluation keeps of a batch, for a task's documents: one answer per document ((B, 3),
    ``answer_logits_summary``) or one per query ((B, k, 3), ``query_logits_summary``)."""
    multi_query: bool

    def of_logits(self, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        """From a model's logits (any model's: see the two functions)."""
        return (query_logits_summary if self.multi_query else answer_logits_summary)(logits, labels)

    @torch.no_grad()
    def of_model(self, model, inputs: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """From a model with ``answer_states`` (ours): the LM head at the answers alone, in pieces
        (``head_summary``) -> (the mean cross entropy over the answers, as the forward's loss;
        the same summary as ``of_logits`` of the forward's logits)."""
        h, slots, answers = model.answer_states(**inputs)                   # (n, D), (B, k), (B, k)
        rows, loss = head_summary(model.get_output_embeddings(), h, answers[slots])
        summary = slots_summary(rows, slots)                                 # (B, k, 3)
        return loss, summary if self.multi_query else summary[:, 0]


def logits_summary_for(task) -> AnswerSummary:
    """The ``AnswerSummary`` for the task's documents: one answer or one per query."""
    return AnswerSummary(multi_query=bool(getattr(task, "multi_query", False)))


def per_document(summary: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """summary (N, 3) or (N, k, 3) as ``AnswerSummary`` gives it -> (N,) each document's share
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


def multi_query_breakdowns(summary: np.ndarray, dataset) -> dict[str, list[dict]]:
    """From a prediction pass over ``dataset`` (a multi-query ``PaddedTaskDataset``, in order):
    summary (N, k, 3) as ``AnswerSummary`` gives it -> ``test_by_setting``
    (``accuracy_by_setting``) and ``test_by_key_position`` (``accuracy_by_key_position``)."""
    return {"test_by_setting": accuracy_by_setting(summary, dataset.document_columns),
            "test_by_key_position": accuracy_by_key_position(summary, dataset.query_key_positions)}


def accuracy_by_setting(summary: np.ndarray, columns: dict[str, np.ndarray]) -> list[dict]:
    """Accuracy per setting of a mixture of documents (MQAR: each ``seq_len`` and ``num_pairs``,
    Zoology's slices), the mean over its documents of their share of right answers: summary
    (N, k, 3) as ``AnswerSummary`` gives it; columns: the documents' ``seq_len`` and
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
    find one there, whatever the setting). summary (N, k, 3) as ``AnswerSummary`` gives it;
    key_pos (N, k) each query's key position in the same order, -1 where a row has fewer queries
    -> ``[{"key_from", "key_to", "queries", "accuracy"}, ...]`` (key_to exclusive), the buckets
    that hold a query."""
    summary = np.asarray(summary, dtype=np.float64)
    valid = key_pos >= 0
    right = (summary[..., 0] == summary[..., 1])[valid]
    return [{"key_from": lo, "key_to": hi, "queries": count, "accuracy": accuracy}
            for lo, hi, count, accuracy in _by_doubling_buckets(key_pos[valid], right)]


def accuracy_by_length(summary: np.ndarray, lengths: np.ndarray) -> list[dict]:
    """The share of documents answered right by their length in tokens, in [0, 16), then [16, 32),
    [32, 64), ... (ATR's trees run from a few tokens to hundreds: a model may answer the short ones
    and lose the long). summary (N, 3) or (N, 1, 3) as ``AnswerSummary`` gives it for one answer
    per document; lengths (N,) -> ``[{"length_from", "length_to", "documents", "accuracy"}, ...]``
    (length_to exclusive), the buckets that hold a document."""
    summary = np.asarray(summary, dtype=np.float64).reshape(len(lengths), 3)
    right = summary[:, 0] == summary[:, 1]
    return [{"length_from": lo, "length_to": hi, "documents": count, "accuracy": accuracy}
            for lo, hi, count, accuracy in _by_doubling_buckets(np.asarray(lengths), right)]


def _by_doubling_buckets(values: np.ndarray, right: np.ndarray) -> list[tuple[int, int, int, float]]:
    """(from, to, count, share right) of the buckets [0, 16), [16, 32), [32, 64), ... that hold a
    value; values and right (M,)."""
    bucket = np.maximum(0, np.floor(np.log2(np.maximum(values, 1) / 16)).astype(np.int64) + 1)   # 0: [0, 16), 1: [16, 32)
    out = []
    for b in sorted(set(bucket.tolist())):
        rows = bucket == b
        out.append((0 if b == 0 else 16 << (b - 1), 16 << b, int(rows.sum()), float(right[rows].mean())))
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
