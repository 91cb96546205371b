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
