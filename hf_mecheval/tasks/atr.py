"""Associative treecall (ATR).

A preset is one *language*: a grammar sampled from ``grammar_seed`` (see :mod:`.grammar`);
the data seed varies the documents only. Layout, exactly parallel to AR::

    BOS t1 ... tm EOS child parent EOS      (m + 5 tokens)

``key_pos`` is the queried child's position in the sentence, ``value_pos`` its parent's.
Eligible (child, parent) pairs: the child is the rightmost occurrence of its terminal in the
sentence (so the query token names one position) and has a parent. The *parent* is drawn
uniformly among the distinct eligible parent positions, then the child among that parent's
eligible children. Sentences with nothing eligible are redrawn.

``relation="sibling"`` asks for a sibling instead (another child of the same parent; the
answer may then be ambiguous given the query, as in the reference's appendix variant).
Held-out (``heldout_fraction``): a fraction of all (answer label, query label) pairs is never
queried in train/validation and is the only one queried in test.

Terminal ``t`` has token id ``3 + t``; vocabulary ``T + 3``. Each document also carries
``tree_parent`` (per token: position of its tree parent in the document, -1 for the root and
the special/query tokens) so that anything derived from the tree can be recomputed.
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from ..errors import ConfigError
from ..resources import check_memory
from ..typed_config import StrictConfig, check_choice, check_float, check_int
from . import seeding
from .base import Task, random_member_per_group
from .data import BOS, EOS, NUM_SPECIAL, TaskData
from .grammar import Grammar, Sentences, generate_sentences, sample_grammar

MAX_EMPTY_ROUNDS = 50   # consecutive rounds of sentences that gave no document before giving up
# sampling a grammar takes time quadratic in its nonterminals (each one's deeper ones are looked
# up): 10^5 take seconds, 10^7 would take days
MAX_NONTERMINALS = 100_000


@dataclasses.dataclass(frozen=True)
class ATRConfig(StrictConfig):
    num_terminals: int = 20
    num_nonterminals: int = 40
    max_rules: int = 5
    """At most this many rules per nonterminal (R_max)."""
    max_rhs_len: int = 5
    """L_max: a right-hand side has 1 .. L_max-1 symbols."""
    max_depth: int = 10
    terminal_occurrence_factor: float | None = None
    min_length: int = 3
    """Sentences (terminals only, without the 5 special/query tokens) shorter than this are redrawn."""
    max_length: int = 1024
    """Sentences longer than this are redrawn (the reference's limit)."""
    head: str = "right"
    relation: str = "parent"
    heldout_fraction: float = 0.0
    grammar_seed: int = 0
    heldout_seed: int = 0

    def validate(self) -> None:
        check_int("num_terminals", self.num_terminals, minimum=2)
        check_int("num_nonterminals", self.num_nonterminals, minimum=1, maximum=MAX_NONTERMINALS)
        check_int("max_rules", self.max_rules, minimum=1)
        check_int("max_rhs_len", self.max_rhs_len, minimum=2)
        check_int("max_depth", self.max_depth, minimum=1)
        if self.terminal_occurrence_factor is not None:
            check_float("terminal_occurrence_factor", self.terminal_occurrence_factor, minimum=0.0,
                        exclusive_min=True)
        check_int("min_length", self.min_length, minimum=2)
        check_int("max_length", self.max_length, minimum=self.min_length)
        check_choice("head", self.head, ("right", "left"))
        check_choice("relation", self.relation, ("parent", "sibling"))
        if self.relation == "sibling" and self.heldout_fraction:
            raise ConfigError("heldout_fraction", "held-out pairs are defined for relation 'parent' only")
        check_float("heldout_fraction", self.heldout_fraction, minimum=0.0, maximum=1.0)
        if self.heldout_fraction >= 1.0:
            raise ConfigError("heldout_fraction", "must be < 1 (train/validation need queryable pairs)")
        check_int("grammar_seed", self.grammar_seed, minimum=0)
        check_int("heldout_seed", self.heldout_seed, minimum=0)
        # each nonterminal's distribution over head terminals, with its CDF (float64), and the rules
        grammar = self.num_nonterminals * (self.num_terminals * 3 * 8 + self.max_rules * (self.max_rhs_len + 2) * 8)
        check_memory("this ATR grammar", {"grammar": grammar})


class ATRTask(Task):
    name = "atr"
    token_prefixes = {"terminal": "t"}
    document_metadata = ()
    token_metadata = ("tree_parent",)
    chunk_size = 1024

    def __init__(self, config: ATRConfig):
        super().__init__(config)
        self.terminal_ids = range(NUM_SPECIAL, NUM_SPECIAL + config.num_terminals)
        self._salt = seeding.heldout_salt(config.heldout_seed)

    @functools.cached_property
    def grammar(self) -> Grammar:
        c = self.config
        return sample_grammar(
            seeding.grammar_rng(c.grammar_seed), c.num_nonterminals, c.num_terminals, c.max_rules,
            c.max_rhs_len, c.max_depth, c.terminal_occurrence_factor,
        )

    @property
    def vocab_size(self) -> int:
        return self.config.num_terminals + NUM_SPECIAL

    @property
    def token_classes(self) -> dict[str, range]:
        return {"terminal": self.terminal_ids}

    def max_document_length(self) -> int:
        return self.config.max_length + 5

    def is_heldout(self, answer_label: np.ndarray, query_label: np.ndarray) -> np.ndarray:
        """Whether (answer label, query label) pairs (terminal indices) are held out for test."""
        if self.config.heldout_fraction == 0.0:
            return np.zeros(np.shape(answer_label), dtype=bool)
        u = seeding.pair_uniform(answer_label, query_label, self.config.num_terminals, self._salt)
        return u < self.config.heldout_fraction

    def generate_chunk(self, rng: np.random.Generator, size: int, split: str) -> TaskData:
        parts, have, empty = [], 0, 0
        while have < size:
            sentences = generate_sentences(
                self.grammar, rng, size, self.config.min_length, self.config.max_length, self.config.head
            )
            part = self._with_queries(sentences, rng, split) if len(sentences.offsets) > 1 else None
            if part is None or len(part) == 0:
                # every sentence rejected (length) or none with a pair to query in this split
                empty += 1
                if empty >= MAX_EMPTY_ROUNDS:
                    c = self.config
                    raise ConfigError("max_length", f"this grammar gave no usable document in {empty} rounds of "
                                      f"{size} sentences: none of length {c.min_length}..{c.max_length}"
                                      + (f", or none with a pair {'held out' if split == 'test' else 'not held out'}"
                                         f" (heldout_fraction {c.heldout_fraction})" if c.heldout_fraction else "")
                                      + "; change the lengths, the grammar seed or the fraction")
                continue
            empty = 0
            parts.append(part)
            have += len(part)
        return TaskData.concatenate(parts).head(size)

    # ------------------------------------------------------------------------- queries
    def _with_queries(self, s: Sentences, rng: np.random.Generator, split: str) -> TaskData:
        lengths = np.diff(s.offsets)
        doc = np.repeat(np.arange(len(lengths)), lengths)           # (total,)
        start = s.offsets[:-1]
        pos = np.arange(len(s.terminals)) - start[doc]              # position in the sentence
        T = self.config.num_terminals

        # rightmost occurrence of each (sentence, label)
        key = doc * T + s.terminals
        order = np.lexsort((pos, key))
        rightmost = np.zeros(len(key), dtype=bool)
        k_sorted = key[order]
        rightmost[order[np.append(k_sorted[1:] != k_sorted[:-1], True)]] = True

        has_parent = s.parent >= 0
        parent_global = np.where(has_parent, start[doc] + s.parent, -1)
        if self.config.relation == "parent":
            query, target = self._parent_pairs(s, rightmost, has_parent, parent_global, rng, split)
        else:
            query, target = self._sibling_pairs(s, doc, rightmost, has_parent, parent_global, rng)
        docs = doc[query]                                           # sentences that got a query
        return self._layout(s, docs, pos[query], pos[target], s.terminals[target])

    def _parent_pairs(self, s, rightmost, has_parent, parent_global, rng, split):
        eligible = rightmost & has_parent
        if self.config.heldout_fraction > 0.0:
            child = np.flatnonzero(eligible)
            held = self.is_heldout(s.terminals[parent_global[child]], s.terminals[child])
            queryable = held if split == "test" else ~held
            eligible[child[~queryable]] = False
        children = np.flatnonzero(eligible)                         # global token indices
        parents_of = parent_global[children]
        # parent first: uniform over distinct eligible parent positions (one sentence each) ...
        distinct_parents = np.unique(parents_of)
        doc_of_parent = np.searchsorted(s.offsets, distinct_parents, side="right") - 1
        _, pick = random_member_per_group(doc_of_parent, rng)
        chosen_parent = distinct_parents[pick]                      # ascending = sentence order
        # ... then uniform over that parent's eligible children
        is_child_of_chosen = np.isin(parents_of, chosen_parent)
        candidates = children[is_child_of_chosen]
        groups, pick = random_member_per_group(parents_of[is_child_of_chosen], rng)
        return candidates[pick], groups

    def _sibling_pairs(self, s, doc, rightmost, has_parent, parent_global, rng):
        # a query must be the rightmost occurrence of its label; a target is another child of
        # the query's parent. Target first (uniform), then the query among the eligible ones.
        is_query = rightmost & has_parent
        n_queries_under = np.bincount(parent_global[is_query], minlength=len(s.terminals))
        others = n_queries_under[np.maximum(parent_global, 0)] - is_query
        targets = np.flatnonzero(has_parent & (others >= 1))
        _, pick = random_member_per_group(doc[targets], rng)
        target = targets[pick]
        # candidate queries: eligible children of a chosen target's parent, other than the target
        queries = np.flatnonzero(is_query & np.isin(parent_global, parent_global[target]))
        queries = queries[~np.isin(queries, target)]
        # each sentence has one target, so a parent position identifies the target it serves
        by_parent = np.argsort(parent_global[target])
        serves = by_parent[np.searchsorted(parent_global[target][by_parent], parent_global[queries])]
        groups, pick = random_member_per_group(serves, rng)
        return queries[pick], target[groups]

    def _layout(self, s: Sentences, docs, key_in_sentence, value_in_sentence, answer_terminal) -> TaskData:
        """BOS t1..tm EOS child answer EOS for the sentences ``docs``."""
        m = np.diff(s.offsets)[docs]
        new_len = m + 5
        offsets = np.concatenate([[0], np.cumsum(new_len)]).astype(np.int64)
        tokens = np.empty(int(offsets[-1]), dtype=np.int32)
        tree_parent = np.full(len(tokens), -1, dtype=np.int32)
        # copy sentence bodies: token j of sentence docs[i] goes to new position 1 + j
        j = np.arange(int(m.sum())) - np.repeat(np.cumsum(m) - m, m)
        src = np.repeat(s.offsets[:-1][docs], m) + j
        dst = np.repeat(offsets[:-1] + 1, m) + j
        tokens[dst] = s.terminals[src] + NUM_SPECIAL
        body_parent = s.parent[src]
        tree_parent[dst] = np.where(body_parent >= 0, body_parent + 1, -1)
        base = offsets[:-1]
        tokens[base] = BOS
        tokens[base + m + 1] = EOS
        key_pos = (key_in_sentence + 1).astype(np.int32)
        value_pos = (value_in_sentence + 1).astype(np.int32)
        tokens[base + m + 2] = tokens[base + key_pos]
        tokens[base + m + 3] = answer_terminal + NUM_SPECIAL
        tokens[base + m + 4] = EOS
        columns = {
            "answer": (answer_terminal + NUM_SPECIAL).astype(np.int32),
            "key_pos": key_pos,
            "value_pos": value_pos,
            "divider_pos": (m + 1).astype(np.int32),
            "query_pos": (m + 2).astype(np.int32),
            "answer_pos": (m + 3).astype(np.int32),
        }
        return TaskData(tokens, offsets, columns, {"tree_parent": tree_parent})
