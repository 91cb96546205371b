"""Task data for the Trainer: padded tensors served a whole batch at a time.

``PaddedTaskDataset`` implements ``__getitems__`` so the DataLoader fetches a batch with one
tensor index instead of building 32 Python dicts and collating them: at these model sizes the
per-example path costs as much as a training step.
"""
from __future__ import annotations

import numpy as np
import torch

from ..tasks.data import IGNORE_INDEX, PAD, TaskData


class PaddedTaskDataset(torch.utils.data.Dataset):
    """input_ids (N, L) right-padded with PAD; labels (N, L) with IGNORE_INDEX except the answer."""

    def __init__(self, data: TaskData):
        self.input_ids = torch.from_numpy(data.padded(PAD))
        self.lengths = torch.from_numpy(data.lengths.astype(np.int64))
        self.labels = torch.from_numpy(data.padded(IGNORE_INDEX, data.labels()))

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])

    def __getitems__(self, indices) -> dict:
        idx = torch.as_tensor(indices)
        width = int(self.lengths[idx].max())       # trim padding common to the whole batch
        return {"input_ids": self.input_ids[idx, :width], "labels": self.labels[idx, :width]}


def batch_collator(batch):
    """The dataset already returns a batch (a dict of tensors), or a list of single-example batches
    when something fetches items one by one."""
    if isinstance(batch, dict):
        return batch
    width = max(b["input_ids"].shape[1] for b in batch)

    def pad(t: torch.Tensor, value: int) -> torch.Tensor:
        return torch.nn.functional.pad(t, (0, width - t.shape[1]), value=value)

    return {"input_ids": torch.cat([pad(b["input_ids"], PAD) for b in batch]),
            "labels": torch.cat([pad(b["labels"], IGNORE_INDEX) for b in batch])}
