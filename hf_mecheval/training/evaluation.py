"""Answer accuracy and probability for the Trainer's evaluation loop.

The model returns logits only at the position that predicts the answer ((batch, 1, vocab));
``preprocess_logits_for_metrics`` reduces them right away to (prediction, answer, p(answer)) so
no full-vocabulary logits are accumulated over the evaluation set.
"""
from __future__ import annotations

import numpy as np
import torch

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


def compute_answer_metrics(prediction) -> dict[str, float]:
    """``compute_metrics`` for the Trainer: accuracy and mean answer probability."""
    summary = np.asarray(prediction.predictions).reshape(-1, 3)
    return {"accuracy": float((summary[:, 0] == summary[:, 1]).mean()),
            "answer_prob": float(summary[:, 2].mean())}


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
