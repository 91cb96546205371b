"""Multi-query associative recall (MQAR), the recall task of Zoology (Arora et al. 2023,
arXiv 2312.04927), with the layout and sampling rules of its generator ``multiquery_ar``
(HazyResearch/zoology).

A document of ``seq_len`` tokens with ``P`` pairs (positions 0-based, no BOS)::

    k0 v0 k1 v1 ... k(P-1) v(P-1) | f f kq f f f kq' f ... f
    0  1  ...          2P-1         2P                      seq_len-1
         context (2P tokens)        query region (seq_len - 2P tokens)

* keys are distinct, values are distinct, paired at random (key ids ``4 .. V/2 - 1``, value ids
  ``V/2 .. V - 1``, ``V = vocab_size``; Zoology's keys are ``1 .. V/2 - 1``: ids 0-3 are our
  PAD, BOS, EOS and the blank);
* every pair is queried exactly once: the query region has ``S = seq_len/2 - P`` slots, at its
  even offsets; slot ``g`` (0-based) has weight ``(g + 1) ** (power_a - 1)`` (Zoology's power law,
  ``power_a`` 0.01 by default: early slots far likelier). The slots of pairs 0, 1, ..., P-1 are
  drawn one after the other without replacement, each in proportion to the weights of the slots
  still free (Zoology draws them so, with ``np.random.choice(replace=False, p=...)``), so pair j
  takes the j-th slot drawn and the first pair's slot follows the power law exactly;
* the key of pair j stands at its slot, ``query_pos = 2P + 2 g``; the model answers there, with
  its value: ``answer_pos = query_pos + 1`` carries the label (the value is never shown in the
  query region, as in Zoology);
* every other token of the query region is filler, uniform over the ids ``3 .. V - 1`` (the
  blank, every key and every value: Zoology's ``random_non_queries``, uniform over its whole
  vocabulary), or the blank (id 3) with ``random_filler`` false (Zoology's ``0``).

Per query (lists, one entry per query in the order the queries occur): ``answer``, ``key_pos``
(its pair's key in the context, ``2j``), ``value_pos`` (``2j + 1``), ``query_pos`` and
``answer_pos``; per document ``num_pairs`` and ``seq_len`` (Zoology's slices).

A task mixes settings, as Zoology's data configurations do: ``train_mixture`` for the training
split, ``eval_mixture`` for validation and test, each a list of ``[seq_len, num_pairs, weight]``.
Document i of a split has the setting ``pattern[i % T]``, a fixed interleaving of the settings in
proportion to their (integer) weights, T their sum over their greatest common divisor: any T
consecutive documents hold each setting exactly ``weight / gcd`` times.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from ..errors import ConfigError
from ..typed_config import StrictConfig, check_float, check_int
from . import seeding
from .ar import distinct_rows
from .base import Task
from .data import NUM_SPECIAL, TaskData

BLANK = NUM_SPECIAL            # the filler when fillers are not random (Zoology's 0)
MAX_WEIGHT = 10**6             # a setting's weight; their pattern is at most a few million documents long

# Zoology's standard mixtures (HazyResearch/zoology, zoology/experiments/mqar_example_configs/
# original_mqar_configs.py): 100 000 training documents at (64, 4) and 20 000 at each other setting;
# 1 000 test documents per setting, lengths up to 1 024 and up to 256 pairs.
ZOOLOGY_TRAIN = ((64, 4, 5), (128, 8, 1), (256, 16, 1), (256, 32, 1), (256, 64, 1))
ZOOLOGY_EVAL = ((64, 4, 1), (64, 8, 1), (64, 16, 1), (128, 32, 1), (256, 64, 1), (512, 128, 1), (1024, 256, 1))


def _mixture(field: str, value) -> tuple[tuple[int, int, int], ...]:
    """A mixture as a tuple of (seq_len, num_pairs, weight), every entry checked."""
    if not isinstance(value, (list, tuple)) or not value:
        raise ConfigError(field, f"must be a non-empty list of [seq_len, num_pairs, weight], got {value!r}")
    settings = []
    for entry in value:
        if not isinstance(entry, (list, tuple)) or len(entry) != 3:
            raise ConfigError(field, f"each setting must be [seq_len, num_pairs, weight], got {entry!r}")
        seq_len, pairs, weight = entry
        check_int(f"{field} seq_len", seq_len, minimum=4)
        check_int(f"{field} num_pairs", pairs, minimum=1)
        check_int(f"{field} weight", weight, minimum=1, maximum=MAX_WEIGHT)
        if seq_len % 2:
            raise ConfigError(field, f"seq_len must be even (the query slots are every other token), got {seq_len}")
        if 4 * pairs > seq_len:
            raise ConfigError(field, f"{pairs} pairs need seq_len >= {4 * pairs} (2 tokens per pair in the context, "
                                     f"one free query slot per pair after it), got seq_len {seq_len}")
        settings.append((seq_len, pairs, weight))
    seen = [s[:2] for s in settings]
    repeated = next((s for s in seen if seen.count(s) > 1), None)
    if repeated:
        raise ConfigError(field, f"setting seq_len {repeated[0]}, num_pairs {repeated[1]} is given twice; give it once "
                                 "with the weight of both")
    return tuple(settings)


@dataclasses.dataclass(frozen=True)
class MQARConfig(StrictConfig):
    vocab_size: int = 8192
    """Token ids 0 .. vocab_size - 1: PAD, BOS, EOS, the blank, keys ``4 .. V/2 - 1``, values ``V/2 .. V - 1``."""
    train_mixture: tuple = ZOOLOGY_TRAIN
    """The training split's settings, ``[seq_len, num_pairs, weight]`` each."""
    eval_mixture: tuple = ZOOLOGY_EVAL
    """The validation and test splits' settings."""
    power_a: float = 0.01
    """The power law of the query slots: slot g (0-based) has weight (g + 1) ** (power_a - 1)."""
    random_filler: bool = True
    """Fill the query region between queries with random tokens (else with the blank)."""

    def validate(self) -> None:
        check_int("vocab_size", self.vocab_size, minimum=2 * (BLANK + 1))
        for field in ("train_mixture", "eval_mixture"):
            object.__setattr__(self, field, _mixture(field, getattr(self, field)))
        check_float("power_a", self.power_a, minimum=0.0, exclusive_min=True)
        if not isinstance(self.random_filler, bool):
            raise ConfigError("random_filler", f"must be true or false, got {self.random_filler!r}")
        most = max(p for _, p, _ in self.train_mixture + self.eval_mixture)
        keys = self.vocab_size // 2 - (BLANK + 1)
        if most > keys:
            raise ConfigError("vocab_size", f"{self.vocab_size} leaves {keys} keys (ids {BLANK + 1} .. "
                                            f"{self.vocab_size // 2 - 1}) for documents of up to {most} distinct pairs; "
                                            f"give at least {2 * (most + BLANK + 1)}")

    def to_dict(self) -> dict:
        out = super().to_dict()
        for field in ("train_mixture", "eval_mixture"):
            out[field] = [list(s) for s in getattr(self, field)]
        return out

    def mixture(self, split: str) -> tuple[tuple[int, int, int], ...]:
        return self.train_mixture if split == "train" else self.eval_mixture


def setting_pattern(weights: list[int]) -> np.ndarray:
    """(T,) the setting index of each document in one period: every setting s takes weight[s] / g
    of the T = sum(weights) / g places (g: their gcd), spread evenly: its k-th document sits at
    the time (k + 1/2) / count, and places go by time (ties: by setting)."""
    g = math.gcd(*weights)
    counts = [w // g for w in weights]
    times = [((k + 0.5) / c, s) for s, c in enumerate(counts) for k in range(c)]
    return np.array([s for _, s in sorted(times)], dtype=np.int64)


def slot_weights(slots: int, power_a: float) -> np.ndarray:
    """(slots,) the power law's probabilities of the query slots 0 .. slots-1 (Zoology:
    ``power_a * g ** (power_a - 1)`` for g = 1 .. slots, normalised)."""
    w = np.arange(1, slots + 1, dtype=np.float64) ** (power_a - 1.0)
    return w / w.sum()


class MQARTask(Task):
    name = "mqar"
    token_prefixes = {"key": "k", "value": "v"}
    document_metadata = ("num_pairs", "seq_len")
    token_metadata = ()
    multi_query = True
    chunk_size = 1024

    def __init__(self, config: MQARConfig):
        super().__init__(config)
        self.key_ids = range(BLANK + 1, config.vocab_size // 2)
        self.value_ids = range(config.vocab_size // 2, config.vocab_size)
        self._patterns = {split: setting_pattern([w for _, _, w in config.mixture(split)])
                          for split in ("train", "test")}

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def token_classes(self) -> dict[str, range]:
        return {"key": self.key_ids, "value": self.value_ids}

    def token_names(self) -> list[str]:
        names = super().token_names()
        names[BLANK] = "<blank>"
        return names

    def max_document_length(self) -> int:
        return max(s[0] for s in self.config.train_mixture + self.config.eval_mixture)

    def length_sample(self) -> tuple[float, int]:
        # exact: the mean length of the mixture with the longer documents, and the longest
        means = [sum(L * w for L, _, w in m) / sum(w for _, _, w in m)
                 for m in (self.config.train_mixture, self.config.eval_mixture)]
        return max(means), self.max_document_length()

    def settings_of(self, split: str, first: int, size: int) -> np.ndarray:
        """(size,) the setting index (into the split's mixture) of documents first .. first+size-1."""
        pattern = self._patterns["train" if split == "train" else "test"]
        return pattern[(first + np.arange(size)) % len(pattern)]

    def generate_chunk(self, rng: np.random.Generator, size: int, split: str, first: int = 0) -> TaskData:
        """``size`` documents of ``split``, the first being the split's document ``first`` (which
        fixes the settings: ``settings_of``)."""
        mixture = self.config.mixture(split)
        setting = self.settings_of(split, first, size)
        lengths = np.array([s[0] for s in mixture], dtype=np.int64)[setting]
        pairs = np.array([s[1] for s in mixture], dtype=np.int64)[setting]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        query_offsets = np.concatenate([[0], np.cumsum(pairs)]).astype(np.int64)
        tokens = np.empty(int(offsets[-1]), dtype=np.int32)
        query = {name: np.empty(int(query_offsets[-1]), dtype=np.int32)
                 for name in ("answer", "key_pos", "value_pos", "query_pos", "answer_pos")}
        for s, (seq_len, n, _) in enumerate(mixture):      # a fixed order of draws: setting by setting
            docs = np.flatnonzero(setting == s)
            if len(docs) == 0:
                continue
            block, columns = self._documents(rng, len(docs), seq_len, n)
            tokens[(offsets[docs][:, None] + np.arange(seq_len)).reshape(-1)] = block.reshape(-1)
            where = (query_offsets[docs][:, None] + np.arange(n)).reshape(-1)
            for name, values in columns.items():
                query[name][where] = values.reshape(-1)
        columns = {"num_pairs": pairs.astype(np.int32), "seq_len": lengths.astype(np.int32)}
        return TaskData(tokens, offsets, columns, query_columns=query, query_offsets=query_offsets)

    def _chunk(self, split: str, seed: int, chunk: int) -> TaskData:
        # the settings follow the document's index in its split (``settings_of``)
        return self.generate_chunk(seeding.document_rng(seed, split, chunk), self.chunk_size, split,
                                   first=chunk * self.chunk_size)

    def _documents(self, rng: np.random.Generator, count: int, seq_len: int, n: int) -> tuple[np.ndarray, dict]:
        """``count`` documents of ``seq_len`` tokens with ``n`` pairs: tokens (count, seq_len) and
        the query columns (count, n), each document's queries in the order they occur."""
        keys = distinct_rows(rng, count, n, len(self.key_ids)) + self.key_ids.start        # (count, n)
        values = distinct_rows(rng, count, n, len(self.value_ids)) + self.value_ids.start  # (count, n)
        slots = seq_len // 2 - n
        # successive sampling without replacement in proportion to the weights: exponential races
        # E_g / w_g, the slots in the order they finish (the j-th to finish is the j-th drawn)
        race = rng.exponential(size=(count, slots)) / slot_weights(slots, self.config.power_a)
        gaps = np.argsort(race, axis=1, kind="stable")[:, :n]                                # (count, n) pair j's slot
        if self.config.random_filler:
            region = rng.integers(BLANK, self.config.vocab_size, size=(count, seq_len - 2 * n))
        else:
            region = np.full((count, seq_len - 2 * n), BLANK)
        tokens = np.empty((count, seq_len), dtype=np.int32)
        tokens[:, 0:2 * n:2] = keys
        tokens[:, 1:2 * n:2] = values
        tokens[:, 2 * n:] = region
        rows = np.arange(count)[:, None]
        query_pos = 2 * n + 2 * gaps                                                         # (count, n)
        tokens[rows, query_pos] = keys
        order = np.argsort(query_pos, axis=1)                  # the queries as they occur
        pair = order                                           # (count, n) pair index of each query
        columns = {"answer": values[rows, pair], "key_pos": 2 * pair, "value_pos": 2 * pair + 1,
                   "query_pos": query_pos[rows, order], "answer_pos": query_pos[rows, order] + 1}
        return tokens, columns
