"""Task data for the Trainer: padded tensors served a whole batch at a time, in an order that
depends only on the run's data seed and the epoch.

``PaddedTaskDataset`` implements ``__getitems__`` so the DataLoader fetches a batch with one
tensor index instead of building 32 Python dicts and collating them: at these model sizes the
per-example path costs as much as a training step.

Training order: epoch e visits the documents in ``epoch_order(n, seed, e)`` (``seed`` = the run's
``data_seed``, else its ``seed``). This is the order transformers + accelerate produce by default
(their seedable sampler: ``torch.randperm`` from a generator seeded with seed + epoch), made
explicit here so that it does not depend on the global RNG and so that a stacked run can give each
of its copies exactly the batches that copy would have seen alone (``StackedBatchSampler``).
"""
from __future__ import annotations

import numpy as np
import torch

from ..tasks.data import IGNORE_INDEX, PAD, TaskData


class PaddedTaskDataset(torch.utils.data.Dataset):
    """input_ids (N, L) right-padded with PAD; labels (N, L) with IGNORE_INDEX except the answers;
    ``document_columns``: the documents' own columns (numpy, (N,) each: MQAR's settings); with
    several answers per document, ``query_key_positions`` (N, k): each query's key position in the
    order the queries occur, -1 past a document's last query."""

    def __init__(self, data: TaskData):
        self.input_ids = torch.from_numpy(data.padded(PAD))
        self.lengths = torch.from_numpy(data.lengths.astype(np.int64))
        self.labels = torch.from_numpy(data.padded(IGNORE_INDEX, data.labels()))
        self.document_columns = data.columns
        self.multi_query = data.multi_query
        self.query_key_positions = data.query_rows("key_pos") if data.multi_query else None

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, index: int) -> dict:
        return self.__getitems__([index])

    def __getitems__(self, indices) -> dict:
        # indices: (b,) or any shape, e.g. (K, b) for stacked runs -> tensors (*shape, width)
        idx = torch.as_tensor(indices)
        width = int(self.lengths[idx].max())       # trim padding common to the whole batch
        return {"input_ids": self.input_ids[idx, :width], "labels": self.labels[idx, :width]}


def epoch_order(n: int, seed: int, epoch: int) -> torch.Tensor:
    """The permutation of range(n) that epoch ``epoch`` of a run with data seed ``seed`` visits."""
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))


class EpochShuffleSampler(torch.utils.data.Sampler):
    """A fresh ``epoch_order`` every epoch; the Trainer calls ``set_epoch`` before each one."""

    def __init__(self, n: int, seed: int):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        yield from epoch_order(self.n, self.seed, self.epoch).tolist()


class StackedBatchSampler(torch.utils.data.Sampler):
    """Batches for K copies trained together: step i of an epoch yields the K batches (each of
    ``batch_size`` indices, the last one possibly shorter) that each copy's ``epoch_order`` gives
    it, flattened into one list of K * b indices; the dataset's ``__getitems__`` reshapes it."""

    def __init__(self, n: int, seeds: list[int], batch_size: int, drop_last: bool = False):
        self.n, self.seeds, self.batch_size, self.drop_last = n, list(seeds), batch_size, drop_last
        self.epoch = 0
        self.sampler = self         # where accelerate's DataLoaderShard looks for set_epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n // self.batch_size if self.drop_last else -(-self.n // self.batch_size)

    def __iter__(self):
        orders = torch.stack([epoch_order(self.n, s, self.epoch) for s in self.seeds])   # (K, n)
        for i in range(len(self)):
            yield orders[:, i * self.batch_size:(i + 1) * self.batch_size].flatten().tolist()


class StackedTaskDataset(PaddedTaskDataset):
    """``__getitems__`` of K * b indices (from ``StackedBatchSampler``) -> input_ids, labels (K, b, width),
    or (b, width) when every copy got the same batch (copies sharing a data seed)."""

    def __init__(self, data: TaskData, num_copies: int):
        super().__init__(data)
        self.num_copies = num_copies

    def __getitems__(self, indices) -> dict:
        idx = torch.as_tensor(indices).view(self.num_copies, -1)                   # (K, b)
        return super().__getitems__(idx[0] if bool((idx == idx[0]).all()) else idx)


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


class PaddingCollator:
    """``data_collator`` for a Trainer over the task datasets as ``datasets`` gives them (``mecheval
    data publish``, the builders), whose documents differ in length (ATR): each batch's
    ``input_ids`` right-padded with PAD, ``labels`` with IGNORE_INDEX, and the ``attention_mask``.
    (The Trainer drops the other columns: the model's forward does not take them.)"""

    def __call__(self, features: list[dict]) -> dict[str, torch.Tensor]:
        width = max(len(f["input_ids"]) for f in features)

        def pad(key: str, value: int) -> torch.Tensor:
            return torch.tensor([list(f[key]) + [value] * (width - len(f[key])) for f in features])

        batch = {"input_ids": pad("input_ids", PAD),
                 "attention_mask": torch.tensor([[1] * len(f["input_ids"]) + [0] * (width - len(f["input_ids"]))
                                                 for f in features])}
        if "labels" in features[0]:
            batch["labels"] = pad("labels", IGNORE_INDEX)
        return batch
