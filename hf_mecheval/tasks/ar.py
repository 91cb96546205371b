"""Associative recall (AR).

Document layout for ``n`` pairs (2n + 5 tokens; positions 0-based)::

    BOS k1 v1 k2 v2 ... kn vn EOS kq vq EOS
    0   1  2  ...          2n+1 2n+2 2n+3 2n+4
                           divider query answer

Keys are ids ``3 .. 2 + num_kv/2``, values the next ``num_kv/2`` ids. Keys in a document are
distinct, values are distinct, paired at random. The queried pair is uniform among the
eligible pairs. ``key_pos`` is the position of the *cue* in the context (the token repeated at
``query_pos``) and ``value_pos`` the position of the answer in the context; in the
value-first variant the cue is a value and the answer its key, so ``value_pos = key_pos - 1``.

Vocabulary: by default ``num_kv + 4`` ids, like the reference (which reserved one id more than
needed, ``8196`` for ``ar_32``); the last id is never generated. ``vocab_size`` may be set to
anything ``>= num_kv + 3``.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from ..errors import ConfigError
from ..typed_config import StrictConfig, check_float, check_int
from . import seeding
from .base import Task
from .data import BOS, EOS, NUM_SPECIAL, TaskData

MAX_REDRAWS = 1000   # rounds of redrawing documents that have nothing to query in their split


@dataclasses.dataclass(frozen=True)
class ARConfig(StrictConfig):
    num_kv: int = 8192
    """Number of key + value token types (even): ``num_kv/2`` keys and ``num_kv/2`` values."""
    num_pairs: int | tuple[int, int] = 16
    """Pairs per document: a fixed number, or an inclusive range ``(min, max)`` drawn uniformly."""
    value_first: bool = False
    """Query a value and answer its key (retrieval backwards in the context)."""
    heldout_fraction: float = 0.0
    """Fraction of all (key, value) combinations never queried in train/validation and the only
    ones queried in test. They still appear as context pairs everywhere."""
    heldout_seed: int = 0
    """Selects which combinations are held out (independent of the data seed)."""
    vocab_size: int | None = None
    """Defaults to ``num_kv + 4`` (reference); must be ``>= num_kv + 3``."""

    def validate(self) -> None:
        check_int("num_kv", self.num_kv, minimum=2)
        if self.num_kv % 2:
            raise ConfigError("num_kv", f"must be even (keys and values split it in half), got {self.num_kv}")
        pairs = self.num_pairs
        if isinstance(pairs, list):
            object.__setattr__(self, "num_pairs", tuple(pairs))
            pairs = self.num_pairs
        if isinstance(pairs, tuple):
            if len(pairs) != 2:
                raise ConfigError("num_pairs", f"a range must be (min, max), got {pairs!r}")
            check_int("num_pairs", pairs[0], minimum=1)
            check_int("num_pairs", pairs[1], minimum=pairs[0])
            largest = pairs[1]
        else:
            check_int("num_pairs", pairs, minimum=1)
            largest = pairs
        if largest > self.num_kv // 2:
            raise ConfigError(
                "num_pairs", f"at most num_kv/2 = {self.num_kv // 2} distinct keys exist, got {largest} pairs"
            )
        if not isinstance(self.value_first, bool):
            raise ConfigError("value_first", f"must be true or false, got {self.value_first!r}")
        check_float("heldout_fraction", self.heldout_fraction, minimum=0.0, maximum=1.0)
        if self.heldout_fraction >= 1.0:
            raise ConfigError("heldout_fraction", "must be < 1 (train/validation need queryable pairs)")
        check_int("heldout_seed", self.heldout_seed, minimum=0)
        if self.vocab_size is not None:
            check_int("vocab_size", self.vocab_size, minimum=self.num_kv + NUM_SPECIAL)

    @property
    def pair_range(self) -> tuple[int, int]:
        p = self.num_pairs
        return (p, p) if isinstance(p, int) else p


class ARTask(Task):
    name = "ar"
    token_prefixes = {"key": "k", "value": "v"}
    document_metadata = ("num_pairs",)
    token_metadata = ()
    chunk_size = 4096

    def __init__(self, config: ARConfig):
        super().__init__(config)
        self.num_keys = config.num_kv // 2
        self.key_ids = range(NUM_SPECIAL, NUM_SPECIAL + self.num_keys)
        self.value_ids = range(NUM_SPECIAL + self.num_keys, NUM_SPECIAL + config.num_kv)
        self._salt = seeding.heldout_salt(config.heldout_seed)

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size or self.config.num_kv + NUM_SPECIAL + 1

    @property
    def token_classes(self) -> dict[str, range]:
        return {"key": self.key_ids, "value": self.value_ids}

    def max_document_length(self) -> int:
        return 2 * self.config.pair_range[1] + 5

    def length_sample(self) -> tuple[float, int]:
        lo, hi = self.config.pair_range      # exact: the number of pairs is uniform in lo..hi
        return float(lo + hi + 5), 2 * hi + 5

    def is_heldout(self, key_index: np.ndarray, value_index: np.ndarray) -> np.ndarray:
        """Whether (key, value) combinations (0-based indices) are held out for test."""
        if self.config.heldout_fraction == 0.0:
            return np.zeros(np.shape(key_index), dtype=bool)
        u = seeding.pair_uniform(key_index, value_index, self.num_keys, self._salt)
        return u < self.config.heldout_fraction

    def generate_chunk(self, rng: np.random.Generator, size: int, split: str) -> TaskData:
        lo, hi = self.config.pair_range
        pairs_per_doc = np.full(size, lo) if lo == hi else rng.integers(lo, hi + 1, size)
        parts, order = [], []
        for n in np.unique(pairs_per_doc):  # ascending: a fixed order of draws
            rows = np.flatnonzero(pairs_per_doc == n)
            parts.append(self._documents_with(int(n), len(rows), rng, split))
            order.append(rows)
        data = TaskData.concatenate(parts)
        if len(parts) > 1:  # put documents back in their drawn order
            data = _reorder(data, np.argsort(np.concatenate(order), kind="stable"))
        return data

    def _documents_with(self, n: int, count: int, rng: np.random.Generator, split: str) -> TaskData:
        """``count`` documents of ``n`` pairs."""
        keys = distinct_rows(rng, count, n, self.num_keys)    # (count, n) key indices
        values = distinct_rows(rng, count, n, self.num_keys)  # (count, n) value indices
        eligible = self._eligible(keys, values, split)
        missing = ~eligible.any(axis=1)
        rounds = 0
        while missing.any():  # held-out splits: redraw documents with nothing to query
            rounds += 1
            if rounds > MAX_REDRAWS:   # a few rounds suffice unless (almost) nothing is queryable
                raise ConfigError("heldout_fraction", f"{self.config.heldout_fraction} leaves (almost) no "
                                  f"{'held-out' if split == 'test' else 'queryable'} (key, value) combination among "
                                  f"{self.num_keys} x {self.num_keys} for the {split} split; use more keys or another "
                                  "fraction")
            m = int(missing.sum())
            keys[missing] = distinct_rows(rng, m, n, self.num_keys)
            values[missing] = distinct_rows(rng, m, n, self.num_keys)
            eligible[missing] = self._eligible(keys[missing], values[missing], split)
            missing = ~eligible.any(axis=1)
        scores = rng.random((count, n))
        scores[~eligible] = -1.0
        q = scores.argmax(axis=1)  # (count,) queried pair, uniform among eligible

        length = 2 * n + 5
        tokens = np.empty((count, length), dtype=np.int32)
        tokens[:, 0] = BOS
        tokens[:, 1 : 2 * n + 1 : 2] = keys + self.key_ids.start
        tokens[:, 2 : 2 * n + 2 : 2] = values + self.value_ids.start
        tokens[:, 2 * n + 1] = EOS
        tokens[:, 2 * n + 4] = EOS
        rows = np.arange(count)
        key_in_context = 1 + 2 * q
        value_in_context = 2 + 2 * q
        if self.config.value_first:
            cue_pos, answer_src = value_in_context, key_in_context
        else:
            cue_pos, answer_src = key_in_context, value_in_context
        tokens[:, 2 * n + 2] = tokens[rows, cue_pos]
        tokens[:, 2 * n + 3] = tokens[rows, answer_src]

        def const(v: int) -> np.ndarray:
            return np.full(count, v, dtype=np.int32)

        columns = {
            "answer": tokens[:, 2 * n + 3].copy(),
            "key_pos": cue_pos.astype(np.int32),
            "value_pos": answer_src.astype(np.int32),
            "divider_pos": const(2 * n + 1),
            "query_pos": const(2 * n + 2),
            "answer_pos": const(2 * n + 3),
            "num_pairs": const(n),
        }
        offsets = np.arange(count + 1, dtype=np.int64) * length
        return TaskData(tokens.reshape(-1), offsets, columns)

    def _eligible(self, keys: np.ndarray, values: np.ndarray, split: str) -> np.ndarray:
        held = self.is_heldout(keys, values)
        if self.config.heldout_fraction == 0.0:
            return ~held
        return held if split == "test" else ~held


def distinct_rows(rng: np.random.Generator, rows: int, n: int, m: int) -> np.ndarray:
    """(rows, n) int64: each row ``n`` distinct integers from ``[0, m)``, in random order.

    Drawing a row whole and redrawing it on a repeat is cheap while repeats are rare; a row comes
    out clean with probability about exp(-n * n / 2m), so the redraws grow exponentially past
    n * n = m and never end for a few hundred keys (1 000 among 4 096: one clean row in 10^53).
    Past n * n = m, as where n is a quarter of m or more, a random permutation's prefix is drawn."""
    if 4 * n > m or n * n > m:  # dense: a random permutation prefix
        return np.argsort(rng.random((rows, m)), axis=1)[:, :n]
    out = rng.integers(0, m, size=(rows, n))
    bad = np.arange(rows)
    while len(bad):  # sparse: redraw the few rows that drew a duplicate
        s = np.sort(out[bad], axis=1)
        bad = bad[(s[:, 1:] == s[:, :-1]).any(axis=1)]
        if len(bad):
            out[bad] = rng.integers(0, m, size=(len(bad), n))
    return out


def _reorder(data: TaskData, perm: np.ndarray) -> TaskData:
    """Documents ``perm[0], perm[1], ...`` of ``data``."""
    lengths = data.lengths[perm]
    starts = data.offsets[:-1][perm]
    idx = np.repeat(starts - np.concatenate([[0], np.cumsum(lengths)[:-1]]), lengths) + np.arange(lengths.sum())
    return TaskData(
        tokens=data.tokens[idx],
        offsets=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
        columns={k: v[perm] for k, v in data.columns.items()},
        token_columns={k: v[idx] for k, v in data.token_columns.items()},
    )
