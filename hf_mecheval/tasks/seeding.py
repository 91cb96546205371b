"""Seed streams. Every random draw in the tasks comes from a local ``numpy.random.Generator``
built here from a ``SeedSequence``; nothing touches global RNG state.

Streams are separated by the ``spawn_key``: documents of each split, chunk by chunk; the
grammar of an ATR language; the held-out pair set; corruption. Two different keys give
statistically independent streams, so the splits never share documents by construction
of the seed (they can still share a document by chance, as any two samples can).
"""
from __future__ import annotations

import numpy as np

SPLITS = ("train", "validation", "test")

# First element of every spawn key: which kind of stream it is.
_DOCUMENTS = 0x0D0C
_GRAMMAR = 0x06A3
_HELDOUT = 0x4E1D
_CORRUPTION = 0xC0AA


def split_index(split: str) -> int:
    from ..errors import ConfigError

    if split not in SPLITS:
        raise ConfigError("split", f"must be one of {', '.join(SPLITS)}, got {split!r}")
    return SPLITS.index(split)


def document_rng(seed: int, split: str, chunk: int) -> np.random.Generator:
    """Generator for chunk ``chunk`` of the documents of ``split``."""
    return np.random.default_rng(
        np.random.SeedSequence(entropy=seed, spawn_key=(_DOCUMENTS, split_index(split), chunk))
    )


def grammar_rng(grammar_seed: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(entropy=grammar_seed, spawn_key=(_GRAMMAR,)))


def heldout_salt(heldout_seed: int) -> np.uint64:
    """A 64-bit salt for the held-out pair hash (see :func:`pair_uniform`)."""
    ss = np.random.SeedSequence(entropy=heldout_seed, spawn_key=(_HELDOUT,))
    return np.uint64(ss.generate_state(1, dtype=np.uint64)[0])


def corruption_rng(seed: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(_CORRUPTION,)))


def pair_uniform(first: np.ndarray, second: np.ndarray, num_second: int, salt: np.uint64) -> np.ndarray:
    """A fixed pseudo-random number in [0, 1) for each (first, second) pair of ids.

    Used to hold out a fraction of all pairs (``pair_uniform(...) < fraction``) without
    materialising the pair table: the split of pairs is a pure function of the pair and the
    salt, identical in every split and every process. SplitMix64 finaliser.
    """
    x = first.astype(np.uint64) * np.uint64(num_second) + second.astype(np.uint64)
    x = x ^ salt
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x = x ^ (x >> np.uint64(31))
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
