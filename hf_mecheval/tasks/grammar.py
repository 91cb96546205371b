"""Random leveled PCFGs and vectorised sentence generation with the dependency tree.

Symbols are encoded in one integer space: ``0 .. N-1`` are nonterminals, ``N + t`` is terminal
``t`` (``0 <= t < T``).

Grammar sampling (all from one generator):
* each nonterminal gets a level uniform in ``1..max_depth``; a rule of a nonterminal may only
  use nonterminals of strictly deeper (larger) level, so derivations are acyclic and at most
  ``max_depth`` deep;
* each nonterminal has ``1..max_rules`` rules (uniform); a right-hand side has
  ``1..max_rhs_len-1`` symbols (uniform) drawn with replacement, uniformly from the allowed
  nonterminals and all terminals — or, with ``terminal_occurrence_factor f``, from the allowed
  nonterminals (weight 1 each) and one terminal placeholder (weight f), each placeholder then
  filled with a uniform terminal;
* rule probabilities and each nonterminal's head-terminal distribution are Dirichlet(1).

Sentence generation: a start nonterminal is uniform. Expanding nonterminal X emits its
right-hand side and X's *head* terminal, after it (``head="right"``) or before it
(``head="left"``). The head of X is the tree parent of X's terminal children and of the heads
of X's child constituents; the root's head has no parent.
"""
from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass(frozen=True)
class Grammar:
    num_nonterminals: int
    num_terminals: int
    levels: np.ndarray          # (N,) level of each nonterminal, 1..max_depth
    rule_start: np.ndarray      # (N + 1,) rules of nonterminal a are rule_start[a]:rule_start[a+1]
    rule_rhs: np.ndarray        # (R, max_rhs_len - 1) symbols, -1 padded
    rule_len: np.ndarray        # (R,) right-hand side lengths
    rule_prob: np.ndarray       # (R,) probabilities, summing to 1 within each nonterminal
    head_prob: np.ndarray       # (N, T) head-terminal distribution of each nonterminal

    def __post_init__(self) -> None:
        # Global monotone CDFs for vectorised categorical draws: the CDF of nonterminal a is
        # shifted by a, so one searchsorted(cdf, a + u) serves every nonterminal at once.
        owner = np.repeat(np.arange(self.num_nonterminals), np.diff(self.rule_start))
        rule_cdf = owner + _grouped_cumsum(self.rule_prob, self.rule_start)
        head_cdf = (np.arange(self.num_nonterminals)[:, None] + np.cumsum(self.head_prob, axis=1)).ravel()
        object.__setattr__(self, "_rule_cdf", rule_cdf)
        object.__setattr__(self, "_head_cdf", head_cdf)

    # ------------------------------------------------------------------ vectorised draws
    def sample_rules(self, nonterminals: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        u = nonterminals + rng.random(len(nonterminals))
        idx = np.searchsorted(self._rule_cdf, u, side="right")
        return np.clip(idx, self.rule_start[nonterminals], self.rule_start[nonterminals + 1] - 1)

    def sample_heads(self, nonterminals: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        T = self.num_terminals
        u = nonterminals + rng.random(len(nonterminals))
        idx = np.searchsorted(self._head_cdf, u, side="right")
        return np.clip(idx - nonterminals * T, 0, T - 1)

    def describe(self) -> dict:
        return {
            "num_nonterminals": self.num_nonterminals,
            "num_terminals": self.num_terminals,
            "num_rules": int(len(self.rule_len)),
            "mean_rhs_len": float(self.rule_len.mean()),
            "levels_used": int(len(np.unique(self.levels))),
        }


def _grouped_cumsum(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    c = np.cumsum(values)
    before = np.concatenate([[0.0], c])[starts[:-1]]
    return c - np.repeat(before, np.diff(starts))


def sample_grammar(
    rng: np.random.Generator,
    num_nonterminals: int,
    num_terminals: int,
    max_rules: int,
    max_rhs_len: int,
    max_depth: int,
    terminal_occurrence_factor: float | None = None,
) -> Grammar:
    N, T = num_nonterminals, num_terminals
    levels = rng.integers(1, max_depth + 1, size=N)
    rhs_rows, lens, probs, starts = [], [], [], [0]
    for a in range(N):
        allowed = np.flatnonzero(levels > levels[a])  # strictly deeper nonterminals
        num_rules = int(rng.integers(1, max_rules + 1))
        for _ in range(num_rules):
            length = int(rng.integers(1, max_rhs_len))  # 1 .. max_rhs_len - 1
            if terminal_occurrence_factor is None:
                pick = rng.integers(0, len(allowed) + T, size=length)
                symbols = N + pick - len(allowed)  # terminals ...
                is_nt = pick < len(allowed)
                symbols[is_nt] = allowed[pick[is_nt]]  # ... unless a nonterminal was picked
            else:
                weights = np.concatenate([np.ones(len(allowed)), [terminal_occurrence_factor]])
                pick = rng.choice(len(allowed) + 1, size=length, p=weights / weights.sum())
                is_terminal = pick == len(allowed)
                symbols = np.empty(length, dtype=np.int64)
                symbols[~is_terminal] = allowed[pick[~is_terminal]]
                symbols[is_terminal] = N + rng.integers(0, T, size=int(is_terminal.sum()))
            row = np.full(max_rhs_len - 1, -1, dtype=np.int64)
            row[:length] = symbols
            rhs_rows.append(row)
            lens.append(length)
        probs.append(rng.dirichlet(np.ones(num_rules)))
        starts.append(starts[-1] + num_rules)
    head_prob = rng.dirichlet(np.ones(T), size=N)
    return Grammar(
        num_nonterminals=N,
        num_terminals=T,
        levels=levels,
        rule_start=np.asarray(starts, dtype=np.int64),
        rule_rhs=np.stack(rhs_rows),
        rule_len=np.asarray(lens, dtype=np.int64),
        rule_prob=np.concatenate(probs),
        head_prob=head_prob,
    )


@dataclasses.dataclass
class Sentences:
    """Generated sentences, flat.

    terminals: (total,) terminal index 0..T-1 of each token.
    offsets:   (n + 1,) sentence i is ``terminals[offsets[i]:offsets[i+1]]``.
    parent:    (total,) position *within its sentence* of each token's tree parent, -1 for the root.
    """

    terminals: np.ndarray
    offsets: np.ndarray
    parent: np.ndarray


def generate_sentences(
    grammar: Grammar,
    rng: np.random.Generator,
    count: int,
    min_length: int,
    max_length: int,
    head: str = "right",
) -> Sentences:
    """Expand ``count`` start symbols breadth-first, all sentences at once; drop sentences outside
    ``[min_length, max_length]`` (so fewer than ``count`` may come back)."""
    N = grammar.num_nonterminals
    # One element per symbol of the current derivation, all documents concatenated in order.
    sym = rng.integers(0, N, size=count)        # start symbols
    doc = np.arange(count)                       # document of each element
    uid = np.arange(count)                       # node id: a nonterminal hands it to its head
    parent_uid = np.full(count, -1)              # node id of the tree parent
    next_uid = count
    width = grammar.rule_rhs.shape[1]
    while True:
        is_nt = sym < N
        if not is_nt.any():
            break
        nt = sym[is_nt]
        rules = grammar.sample_rules(nt, rng)
        heads = grammar.sample_heads(nt, rng)
        rhs_len = grammar.rule_len[rules]
        out_len = np.ones(len(sym), dtype=np.int64)
        out_len[is_nt] = rhs_len + 1
        start = np.cumsum(out_len) - out_len     # where each element's expansion begins
        total = int(out_len.sum())
        new_sym = np.empty(total, dtype=np.int64)
        new_doc = np.empty(total, dtype=np.int64)
        new_uid = np.empty(total, dtype=np.int64)
        new_parent = np.empty(total, dtype=np.int64)
        # terminals are copied
        t_at = start[~is_nt]
        new_sym[t_at] = sym[~is_nt]
        new_doc[t_at] = doc[~is_nt]
        new_uid[t_at] = uid[~is_nt]
        new_parent[t_at] = parent_uid[~is_nt]
        # a nonterminal becomes its right-hand side plus its head terminal
        nt_start, nt_uid, nt_doc = start[is_nt], uid[is_nt], doc[is_nt]
        head_at = nt_start + rhs_len if head == "right" else nt_start
        rhs_first = nt_start if head == "right" else nt_start + 1
        new_sym[head_at] = N + heads
        new_doc[head_at] = nt_doc
        new_uid[head_at] = nt_uid                 # the head *is* the constituent's node
        new_parent[head_at] = parent_uid[is_nt]
        slot = np.arange(width)
        in_rhs = slot[None, :] < rhs_len[:, None]                     # (m, width)
        rhs_at = (rhs_first[:, None] + slot[None, :])[in_rhs]
        n_children = len(rhs_at)
        new_sym[rhs_at] = grammar.rule_rhs[rules][in_rhs]
        new_doc[rhs_at] = np.broadcast_to(nt_doc[:, None], in_rhs.shape)[in_rhs]
        new_uid[rhs_at] = next_uid + np.arange(n_children)
        new_parent[rhs_at] = np.broadcast_to(nt_uid[:, None], in_rhs.shape)[in_rhs]
        next_uid += n_children
        sym, doc, uid, parent_uid = new_sym, new_doc, new_uid, new_parent
        # Every pending nonterminal still yields >= 2 tokens: drop documents already too long.
        min_final = np.bincount(doc, weights=np.where(sym < N, 2, 1), minlength=count)
        too_long = min_final > max_length
        if too_long.any():
            keep = ~too_long[doc]
            sym, doc, uid, parent_uid = sym[keep], doc[keep], uid[keep], parent_uid[keep]

    lengths = np.bincount(doc, minlength=count)
    ok = (lengths >= min_length) & (lengths <= max_length)
    keep = ok[doc]
    sym, doc, uid, parent_uid = sym[keep], doc[keep], uid[keep], parent_uid[keep]
    lengths = lengths[ok]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    position_of_uid = np.full(next_uid, -1, dtype=np.int64)
    position_of_uid[uid] = np.arange(len(uid))
    doc_start = np.repeat(offsets[:-1], lengths)
    parent = np.where(parent_uid >= 0, position_of_uid[np.maximum(parent_uid, 0)] - doc_start, -1)
    return Sentences(terminals=(sym - N).astype(np.int32), offsets=offsets, parent=parent.astype(np.int32))
