"""Corrupted documents for interchange interventions.

The token at a position (``key_pos`` or ``value_pos``) is replaced by another token of the
*same class* — another key for a key, another value for a value, another terminal for a
terminal — chosen uniformly among the class's tokens that occur nowhere in the document.
Where the class has no such token left (possible in small ATR vocabularies), any other token of
the class is used and ``reused`` flags the example.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from ..errors import MechEvalError
from . import seeding


@dataclasses.dataclass
class Corruption:
    input_ids: np.ndarray    # (B, L) corrupted copy
    positions: np.ndarray    # (B,) corrupted position
    original: np.ndarray     # (B,) token that was there
    replacement: np.ndarray  # (B,) token put there
    reused: np.ndarray       # (B,) bool: the replacement also occurs elsewhere in the document


def corrupt(
    input_ids: np.ndarray,
    positions: np.ndarray,
    token_classes: Mapping[str, range],
    seed: int,
    lengths: np.ndarray | None = None,
    avoid_present: bool = True,
) -> Corruption:
    """Corrupt one position per document.

    input_ids: (B, L) integer tokens, right-padded; ``lengths`` (B,) marks the real tokens
        (default: all L).
    positions: (B,) the position to corrupt in each document.
    token_classes: e.g. ``task.token_classes``; the class is that of the token being replaced.
    """
    ids = np.array(input_ids, dtype=np.int64, copy=True)
    B, L = ids.shape
    positions = np.asarray(positions, dtype=np.int64)
    lengths = np.full(B, L) if lengths is None else np.asarray(lengths)
    if positions.shape != (B,) or (positions < 0).any() or (positions >= lengths).any():
        raise MechEvalError("corruption positions must be one in-document position per example")
    rng = seeding.corruption_rng(seed)
    rows = np.arange(B)
    original = ids[rows, positions]
    replacement = np.empty(B, dtype=np.int64)
    reused = np.zeros(B, dtype=bool)
    found = np.zeros(B, dtype=bool)
    for name, cls in token_classes.items():
        members = (original >= cls.start) & (original < cls.stop)
        found |= members
        if not members.any():
            continue
        sub = np.flatnonzero(members)
        # present[i, c]: class token c occurs in document sub[i]
        present = np.zeros((len(sub), len(cls)), dtype=bool)
        doc_ids = ids[sub]
        in_class = (doc_ids >= cls.start) & (doc_ids < cls.stop) & (np.arange(L)[None, :] < lengths[sub, None])
        r, c = np.nonzero(in_class)
        present[r, doc_ids[r, c] - cls.start] = True
        allowed = ~present if avoid_present else np.ones_like(present)
        allowed[np.arange(len(sub)), original[sub] - cls.start] = False
        none_left = ~allowed.any(axis=1)
        if none_left.any():  # fall back to any other token of the class
            allowed[none_left] = True
            allowed[np.flatnonzero(none_left), original[sub[none_left]] - cls.start] = False
        scores = rng.random(allowed.shape)
        scores[~allowed] = -1.0
        choice = scores.argmax(axis=1)
        reused[sub] = present[np.arange(len(sub)), choice]
        replacement[sub] = choice + cls.start
    if not found.all():
        bad = int(original[~found][0])
        raise MechEvalError(
            f"token {bad} at a corruption position belongs to no token class "
            f"({', '.join(f'{k}: {v.start}..{v.stop - 1}' for k, v in token_classes.items())})"
        )
    ids[rows, positions] = replacement
    return Corruption(ids, positions, original, replacement, reused)
