"""The task contract shared by AR, ATR and MQAR.

A task turns ``(config, split, n, seed)`` into :class:`TaskData`. Documents are produced in
fixed-size chunks, chunk ``c`` of a split drawing only from its own seed stream
(:func:`seeding.document_rng`). Hence the data are byte-identical whatever the number of
worker processes, and the first ``k`` documents of a larger request equal a smaller request.
The chunk size is part of the generator version.
"""
from __future__ import annotations

import abc
import concurrent.futures as futures
import multiprocessing

import numpy as np

from ..errors import ConfigError
from ..resources import check_memory
from . import seeding
from .data import BOS, EOS, PAD, TaskData

GENERATOR_VERSION = "1.0"
# memory per token: generated (tokens, labels and per-token metadata as int32, the chunks and their
# concatenation, the Arrow copy) and, for training, padded (input_ids and labels as int64)
GENERATED_BYTES_PER_TOKEN = 24
PADDED_BYTES_PER_TOKEN = 16


_LENGTH_SAMPLES: dict[tuple, tuple[float, int]] = {}     # Task.length_sample's, per configuration


class Task(abc.ABC):
    """Base class; subclasses implement :meth:`generate_chunk`."""

    name: str
    chunk_size: int = 1024
    document_metadata: tuple[str, ...] = ()   # extra per-document int32 columns
    token_metadata: tuple[str, ...] = ()      # extra per-token int32 list columns
    multi_query: bool = False                 # several answers per document (``TaskData.query_columns``)

    def __init__(self, config):
        self.config = config

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @property
    @abc.abstractmethod
    def token_classes(self) -> dict[str, range]:
        """Token classes by name (e.g. ``{"key": range(3, 4099), ...}``), used for corruption."""

    @abc.abstractmethod
    def generate_chunk(self, rng: np.random.Generator, size: int, split: str) -> TaskData:
        """Exactly ``size`` documents of ``split``, drawn from ``rng`` only."""

    def features(self):
        """Typed ``datasets.Features`` of this task's datasets."""
        from .data import features_for

        return features_for(list(self.document_metadata), list(self.token_metadata), self.multi_query)

    def dataset(self, n: int, split: str = "train", seed: int = 0, workers: int = 1):
        """``n`` documents as a ``datasets.Dataset`` (built from Arrow directly: fast)."""
        import datasets

        data = self.generate(n, split, seed, workers)
        info = datasets.DatasetInfo(description=self.describe(), features=self.features())
        return data.to_dataset(info=info)

    def describe(self) -> str:
        return f"{self.name} {self.config.to_dict()} (generator {GENERATOR_VERSION})"

    @abc.abstractmethod
    def max_document_length(self) -> int:
        """The longest document this task's configuration allows (tokens)."""

    def length_sample(self) -> tuple[float, int]:
        """Mean and longest length of one chunk of validation documents (data seed 0): what
        documents are like where the configured bound says little. Remembered per task
        configuration: a sweep file's runs each build their task (an ATR chunk takes ~60 ms)."""
        key = (type(self), self.describe())
        if key not in _LENGTH_SAMPLES:
            if len(_LENGTH_SAMPLES) >= 1024:
                _LENGTH_SAMPLES.clear()
            lengths = self._chunk("validation", 0, 0).lengths
            _LENGTH_SAMPLES[key] = (float(lengths.mean()), int(lengths.max()))
        return _LENGTH_SAMPLES[key]

    def longest_estimate(self) -> int:
        """The longest document to plan memory for (training pads to it): the configured bound, or,
        where that bound is far beyond what documents reach (over 4096 tokens), twice the longest
        of a sample."""
        bound = self.max_document_length()
        return bound if bound <= 4096 else min(bound, 2 * self.length_sample()[1])

    def memory_estimate(self, n: int, padded: bool = False) -> int:
        """Bytes that ``n`` documents take (``padded``: as training pads them too)."""
        per_token = GENERATED_BYTES_PER_TOKEN + (PADDED_BYTES_PER_TOKEN if padded else 0)
        bound = n * self.max_document_length() * per_token
        if bound <= 2**30:                  # small whatever the documents are like
            return bound
        mean = self.length_sample()[0]
        return int(n * (mean * GENERATED_BYTES_PER_TOKEN + (self.longest_estimate() * PADDED_BYTES_PER_TOKEN
                                                             if padded else 0)))

    def check_size(self, n: int) -> None:
        """Refuse, with the estimate, a number of documents that cannot fit in memory."""
        check_memory(f"{n:,} documents of {self.name}", {"documents": self.memory_estimate(n)})

    token_prefixes: dict[str, str] = {}
    """How each token class is written as text (``{"key": "k"}``: key 12 is ``k12``)."""

    def token_names(self) -> list[str]:
        """The text of every token id 0 .. vocab_size - 1 (a tokenizer's vocabulary): ``<pad>``,
        ``<bos>``, ``<eos>``, then each class's tokens numbered from 0 (AR ``k0``…, ``v0``…; ATR
        ``t0``…), and ``<unused0>``… for ids that no document uses."""
        names = [None] * self.vocab_size
        names[PAD], names[BOS], names[EOS] = "<pad>", "<bos>", "<eos>"
        for name, ids in self.token_classes.items():
            for i, token in enumerate(ids):
                names[token] = f"{self.token_prefixes[name]}{i}"
        unused = (i for i in range(self.vocab_size))
        return [n if n is not None else f"<unused{next(unused)}>" for n in names]

    def token_class_of(self, token_id: int) -> tuple[str, range]:
        for name, ids in self.token_classes.items():
            if token_id in ids:
                return name, ids
        raise ValueError(f"token id {token_id} belongs to no token class of task {self.name}")

    def generate(self, n: int, split: str = "train", seed: int = 0, workers: int = 1) -> TaskData:
        """``n`` documents of ``split``. ``workers > 1`` spreads chunks over processes."""
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 0:
            raise ConfigError("n", f"must be a non-negative integer, got {n!r}")
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ConfigError("seed", f"must be a non-negative integer, got {seed!r}")
        seeding.split_index(split)
        self.check_size(n)
        num_chunks = -(-n // self.chunk_size)
        if n == 0:
            return self._chunk(split, seed, 0).head(0)
        if workers > 1 and num_chunks > 1:
            ctx = multiprocessing.get_context("fork")
            with futures.ProcessPoolExecutor(min(workers, num_chunks), mp_context=ctx) as pool:
                parts = list(pool.map(self._chunk, [split] * num_chunks, [seed] * num_chunks,
                                      range(num_chunks)))
        else:
            parts = [self._chunk(split, seed, c) for c in range(num_chunks)]
        return TaskData.concatenate(parts).head(n)

    def _chunk(self, split: str, seed: int, chunk: int) -> TaskData:
        return self.generate_chunk(seeding.document_rng(seed, split, chunk), self.chunk_size, split)


def random_member_per_group(groups: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Choose one element uniformly at random in every group.

    groups: (m,) integer group id of each element.
    Returns (group_ids, chosen) — the distinct groups in ascending order and, for each, the
    index (into ``groups``) of its chosen element.
    """
    keys = rng.random(len(groups))
    order = np.lexsort((keys, groups))  # by group, then by random key
    sorted_groups = groups[order]
    last = np.ones(len(order), dtype=bool)
    last[:-1] = sorted_groups[1:] != sorted_groups[:-1]
    return sorted_groups[last], order[last]
