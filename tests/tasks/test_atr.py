"""ATR generation checked against independent re-derivations from each document's kept tree."""

import numpy as np
import pytest

from hf_mecheval.errors import ConfigError
from hf_mecheval.tasks import ATRConfig, ATRTask, build_task
from hf_mecheval.tasks.data import BOS, EOS, IGNORE_INDEX
from hf_mecheval.tasks.grammar import sample_grammar
from hf_mecheval.tasks.seeding import grammar_rng


def sentence_of(doc):
    m = doc["divider_pos"] - 1
    return doc["input_ids"][1 : m + 1], [p - 1 if p >= 0 else -1 for p in doc["tree_parent"][1 : m + 1]]


def check_document(doc, task, relation="parent", head="right"):
    ids = doc["input_ids"]
    words, parent = sentence_of(doc)
    m = len(words)
    cfg = task.config
    assert cfg.min_length <= m <= cfg.max_length
    assert ids[0] == BOS and ids[m + 1] == EOS and ids[-1] == EOS and len(ids) == m + 5
    assert (doc["divider_pos"], doc["query_pos"], doc["answer_pos"]) == (m + 1, m + 2, m + 3)
    assert all(3 <= w < 3 + cfg.num_terminals for w in words)
    # a tree: one root, every chain reaches it, heads on the configured side of their children
    roots = [i for i in range(m) if parent[i] < 0]
    assert roots == ([m - 1] if head == "right" else [0])
    for i in range(m):
        seen, j = 0, i
        while parent[j] >= 0:
            assert (parent[j] > j) if head == "right" else (parent[j] < j)
            j, seen = parent[j], seen + 1
            assert seen <= cfg.max_depth
    # every constituent is a contiguous span with its head at the configured end
    for h in range(m):
        span = {h} | {i for i in range(m) if _ancestor(parent, i, h)}
        assert span == set(range(min(span), max(span) + 1))
        assert h == (max(span) if head == "right" else min(span))
    # the query: rightmost occurrence of its label; the answer from the tree
    k, v = doc["key_pos"] - 1, doc["value_pos"] - 1
    assert ids[doc["query_pos"]] == words[k] and words[k] not in words[k + 1 :]
    if relation == "parent":
        assert parent[k] == v
    else:
        assert parent[k] == parent[v] >= 0 and k != v
    assert ids[doc["answer_pos"]] == words[v] == doc["answer"]
    assert doc["labels"][doc["answer_pos"]] == doc["answer"]
    assert sum(l != IGNORE_INDEX for l in doc["labels"]) == 1
    return words, parent


def _ancestor(parent, i, h):
    while parent[i] >= 0:
        i = parent[i]
        if i == h:
            return True
    return False


def rule_patterns(grammar):
    """Every rule's right-hand side as (terminal id | 'NT', ...)."""
    N = grammar.num_nonterminals
    out = set()
    for rhs, length in zip(grammar.rule_rhs, grammar.rule_len):
        out.add(tuple("NT" if s < N else int(s - N + 3) for s in rhs[:length]))
    return out


@pytest.mark.parametrize("preset", ["atr_easy", "atr_medium", "atr_8192"])
def test_documents_are_derivations_of_the_grammar(preset):
    task = build_task(preset)
    patterns = rule_patterns(task.grammar)
    for doc in task.generate(150, "train", seed=2):
        words, parent = check_document(doc, task)
        has_kids = {p for p in parent if p >= 0}
        # the children of every head, in order, match some rule: a leaf is a terminal symbol,
        # a child with children of its own is a nonterminal's head
        for h in range(len(words)):
            kids = [i for i in range(len(words)) if parent[i] == h]
            if kids:
                shape = tuple("NT" if c in has_kids else words[c] for c in kids)
                assert shape in patterns


def test_head_left_and_sibling_variants():
    left = ATRTask(ATRConfig(head="left"))
    for doc in left.generate(100, "train", seed=0):
        check_document(doc, left, head="left")
    sib = build_task("atr_sibling")
    for doc in sib.generate(200, "train", seed=0):
        check_document(doc, sib, relation="sibling")


def test_parent_first_then_child_sampling_is_uniform():
    """P(chosen parent = root) and P(chosen child = the last eligible child) re-derived from the trees."""
    task = build_task("atr_easy")
    data = task.generate(6000, "train", seed=11)
    root_expected = root_seen = last_expected = last_seen = 0.0
    for doc in data:
        words, parent = sentence_of(doc)
        m = len(words)
        eligible = [i for i in range(m) if parent[i] >= 0 and words[i] not in words[i + 1 :]]
        parents = sorted({parent[i] for i in eligible})
        if m - 1 in parents:
            root_expected += 1 / len(parents)
            root_seen += doc["value_pos"] - 1 == m - 1
        kids = [i for i in eligible if parent[i] == doc["value_pos"] - 1]
        last_expected += 1 / len(kids)
        last_seen += doc["key_pos"] - 1 == kids[-1]
    assert abs(root_seen - root_expected) < 4 * np.sqrt(root_expected)
    assert abs(last_seen - last_expected) < 4 * np.sqrt(last_expected)


def test_atr_gen_heldout_label_pairs_only_in_test():
    task = build_task("atr_gen")
    pairs = {}
    for split in ("train", "validation", "test"):
        data = task.generate(3000, split, seed=0)
        starts = data.offsets[:-1]
        child = data.tokens[starts + data.columns["key_pos"]] - 3
        par = data.tokens[starts + data.columns["value_pos"]] - 3
        pairs[split] = set(zip(par.tolist(), child.tolist()))
        held = task.is_heldout(par, child)
        assert held.all() if split == "test" else not held.any()
    assert not (pairs["train"] | pairs["validation"]) & pairs["test"]
    all_pairs = pairs["train"] | pairs["test"]
    assert 0.1 < len(pairs["test"]) / len(all_pairs) < 0.3


def test_terminal_occurrence_factor_weights_terminals():
    """Each right-hand-side symbol is a terminal with probability f / (f + #allowed nonterminals)."""
    f = 3.0
    g = sample_grammar(grammar_rng(5), 40, 50, 5, 6, 10, terminal_occurrence_factor=f)
    expected, observed = [], []
    owner = np.repeat(np.arange(40), np.diff(g.rule_start))
    for a, rhs, length in zip(owner, g.rule_rhs, g.rule_len):
        allowed = int((g.levels > g.levels[a]).sum())
        for s in rhs[:length]:
            expected.append(f / (f + allowed))
            observed.append(s >= 40)
    n = len(expected)
    assert abs(sum(observed) - sum(expected)) < 4 * np.sqrt(n * 0.25)


def test_grammar_invariants():
    g = build_task("atr_medium").grammar
    N = g.num_nonterminals
    owner = np.repeat(np.arange(N), np.diff(g.rule_start))
    assert ((1 <= np.diff(g.rule_start)) & (np.diff(g.rule_start) <= 5)).all()
    assert ((1 <= g.rule_len) & (g.rule_len <= 9)).all()
    for a, rhs, length in zip(owner, g.rule_rhs, g.rule_len):
        nts = rhs[:length][rhs[:length] < N]
        assert (g.levels[nts] > g.levels[a]).all()        # strictly deeper: acyclic
        assert (rhs[length:] == -1).all()
    sums = np.add.reduceat(g.rule_prob, g.rule_start[:-1])
    assert np.allclose(sums, 1) and np.allclose(g.head_prob.sum(1), 1)


def test_statistics_across_grammars_match_the_reference_generator():
    """Averages over grammar seeds 0-29, 400 test documents each (reference figures in the issue)."""
    for preset, ref, tol in [("atr_easy", (15.0, 2.23, 0.484), (1.0, 0.15, 0.03)),
                             ("atr_medium", (56.0, 3.99, 0.356), (15, 0.3, 0.04))]:
        length, distance, adjacent = [], [], []
        for g in range(30):
            data = build_task(preset, grammar_seed=g).generate(400, "test", seed=0)
            d = data.columns["value_pos"] - data.columns["key_pos"]
            length.append(data.lengths.mean())
            distance.append(d.mean())
            adjacent.append((d == 1).mean())
        got = (np.mean(length), np.mean(distance), np.mean(adjacent))
        for g_, r, t in zip(got, ref, tol):
            assert abs(g_ - r) <= t, (preset, got)


@pytest.mark.parametrize(
    "fields, name",
    [({"max_rhs_len": 1}, "max_rhs_len"), ({"num_terminals": 1}, "num_terminals"),
     ({"relation": "cousin"}, "relation"), ({"head": "middle"}, "head"),
     ({"min_length": 10, "max_length": 5}, "max_length"), ({"terminal_occurrence_factor": 0}, "terminal_occurrence_factor"),
     ({"max_depth": 0}, "max_depth")],
)
def test_invalid_atr_config(fields, name):
    with pytest.raises(ConfigError) as info:
        ATRConfig(**fields)
    assert info.value.field == name


def test_unknown_preset_lists_the_valid_ones():
    with pytest.raises(ConfigError, match="atr_easy"):
        build_task("atr_hard")


def test_rare_lengths_keep_drawing_and_impossible_ones_fail_clearly():
    data = build_task("atr_easy", min_length=40, max_length=60).generate(20, "train", 0)   # most rounds reject all
    lengths = data.columns["divider_pos"] - 1                     # sentence tokens between BOS and EOS
    assert len(data) == 20 and lengths.min() >= 40 and lengths.max() <= 60
    with pytest.raises(ConfigError, match="no usable document"):
        build_task("atr_easy", min_length=500, max_length=600).generate(5, "train", 0)


def test_sibling_queries_have_no_held_out_split():
    with pytest.raises(ConfigError, match="relation 'parent' only"):
        build_task("atr_sibling", heldout_fraction=0.2)
