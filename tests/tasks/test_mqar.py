"""MQAR documents checked against Zoology's rules one by one, each re-derived from a document's
tokens in plain Python (not from our generator's arrays), and the power law's shape against the
probabilities of successive sampling worked out by hand."""
import math

import numpy as np
import pytest

from hf_mecheval.errors import ConfigError
from hf_mecheval.tasks import build_task
from hf_mecheval.tasks.data import IGNORE_INDEX, TaskData
from hf_mecheval.tasks.mqar import MQARConfig, MQARTask, setting_pattern

V = 8192                          # ids 0-2 special, 3 the blank, keys 4 .. V/2 - 1, values V/2 .. V - 1


def rederive(doc: dict, random_filler: bool = True, vocab: int = V) -> None:
    """Every rule of one document, from its tokens and labels alone."""
    key_ids, value_ids = range(4, vocab // 2), range(vocab // 2, vocab)
    ids, labels = doc["input_ids"], doc["labels"]
    n, seq_len = doc["num_pairs"], doc["seq_len"]
    assert len(ids) == len(labels) == seq_len and seq_len % 2 == 0 and 4 * n <= seq_len
    keys, values = ids[0:2 * n:2], ids[1:2 * n:2]
    # the context: n distinct keys and n distinct values, in their own id ranges
    assert all(k in key_ids for k in keys) and all(v in value_ids for v in values)
    assert len(set(keys)) == n and len(set(values)) == n
    value_of = dict(zip(keys, values))
    # the queries: labelled positions, each right after its key at an even offset of the query region
    answer_positions = [t for t, label in enumerate(labels) if label != IGNORE_INDEX]
    assert len(answer_positions) == n == len(doc["answer"])
    assert answer_positions == doc["answer_pos"] and [t - 1 for t in answer_positions] == doc["query_pos"]
    queried = []
    for q in doc["query_pos"]:
        assert q >= 2 * n and (q - 2 * n) % 2 == 0
        key = ids[q]
        assert key in value_of and labels[q + 1] == value_of[key]
        queried.append(key)
    assert sorted(queried) == sorted(keys)              # every pair queried exactly once
    # the answer and position columns agree with the tokens
    for i, q in enumerate(doc["query_pos"]):
        assert ids[doc["key_pos"][i]] == ids[q] and doc["key_pos"][i] % 2 == 0 and doc["key_pos"][i] < 2 * n
        assert doc["value_pos"][i] == doc["key_pos"][i] + 1 and ids[doc["value_pos"][i]] == doc["answer"][i]
    # filler: every other token of the query region
    filler = [ids[t] for t in range(2 * n, seq_len) if t not in set(doc["query_pos"])]
    assert all(3 <= t < vocab for t in filler) if random_filler else all(t == 3 for t in filler)


def test_standard_mixture_documents_follow_the_rules():
    task = build_task("mqar")
    assert task.vocab_size == 8192
    for split, settings in (("train", [(64, 4), (128, 8), (256, 16), (256, 32), (256, 64)]),
                            ("test", [(64, 4), (64, 8), (64, 16), (128, 32), (256, 64), (512, 128), (1024, 256)])):
        data = task.generate(90 if split == "train" else 70, split, seed=1)
        seen = set()
        for doc in data:
            rederive(doc)
            seen.add((doc["seq_len"], doc["num_pairs"]))
        assert seen == set(settings)


def test_blank_filler_and_a_small_vocabulary():
    task = MQARTask(MQARConfig(vocab_size=64, train_mixture=[[16, 4, 1], [20, 2, 3]], eval_mixture=[[8, 2, 1]],
                               random_filler=False))
    for doc in task.generate(200, "train", seed=0):
        rederive(doc, random_filler=False, vocab=64)
    for doc in task.generate(20, "validation", seed=0):
        rederive(doc, random_filler=False, vocab=64)
        assert doc["seq_len"] == 8


def test_mixture_proportions_follow_the_weights_exactly_per_period():
    # weights 5, 1, 1, 1, 1: every 9 consecutive documents hold 5 of the first setting, 1 of each other
    data = build_task("mqar").generate(900, "train", seed=0)
    settings = list(zip(data.columns["seq_len"].tolist(), data.columns["num_pairs"].tolist()))
    for start in range(0, 900, 9):
        window = settings[start:start + 9]
        assert window.count((64, 4)) == 5
        assert all(window.count(s) == 1 for s in [(128, 8), (256, 16), (256, 32), (256, 64)])
    # across chunks too (chunk size 1024 is no multiple of 9): document i has setting i % 9's
    long = build_task("mqar").generate(2100, "train", seed=0)
    pattern = setting_pattern([5, 1, 1, 1, 1])
    lengths = np.array([64, 128, 256, 256, 256])[pattern[np.arange(2100) % 9]]
    assert np.array_equal(long.lengths, lengths)
    assert sorted(pattern.tolist()) == [0, 0, 0, 0, 0, 1, 2, 3, 4]


def successive_sampling_marginals(p: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """P(first draw = g) and P(second draw = g) when slots are drawn one after the other without
    replacement, each in proportion to p among the free ones: p_g, and sum_h p_h p_g / (1 - p_h)."""
    second = np.array([sum(p[h] * p[g] / (1 - p[h]) for h in range(len(p)) if h != g) for g in range(len(p))])
    return p, second


def test_query_slots_follow_the_power_law():
    # (64 tokens, 4 pairs): 28 slots; slot g (0-based) has weight (g + 1) ** (a - 1), a = 0.01
    slots, a = 28, 0.01
    weights = np.array([(g + 1) ** (a - 1) for g in range(slots)])
    first, second = successive_sampling_marginals(weights / weights.sum())
    setting = [[64, 4, 1]]
    data = MQARTask(MQARConfig(train_mixture=setting, eval_mixture=setting)).generate(40_000, "train", seed=7)
    rows = data.answer_rows()
    pair = rows["key_pos"] // 2                                       # which pair each query asks for
    slot = (rows["query_pos"] - 8) // 2
    for j, expected in ((0, first), (1, second)):
        observed = np.bincount(slot[pair == j], minlength=slots) / np.sum(pair == j)
        # binomial standard errors: every slot's frequency within 4.5 of them (40 000 documents)
        sd = np.sqrt(expected * (1 - expected) / 40_000)
        assert np.all(np.abs(observed - expected) <= 4.5 * sd + 1e-4), (j, observed[:4], expected[:4])
    # the shape: slot 0 is the likeliest for the first pair, far beyond uniform (1 / 28)
    assert first[0] > 0.25 and abs(np.mean(slot[pair == 0] == 0) - first[0]) < 0.01


def test_uniform_power_law_when_a_is_one():
    setting = [[32, 2, 1]]
    data = MQARTask(MQARConfig(train_mixture=setting, eval_mixture=setting, power_a=1.0)).generate(
        20_000, "train", seed=3)
    rows = data.answer_rows()
    slot = (rows["query_pos"][rows["key_pos"] == 0] - 4) // 2          # 14 slots, all equally likely
    counts = np.bincount(slot, minlength=14)
    assert counts.sum() == 20_000
    chi2 = float(((counts - 20_000 / 14) ** 2 / (20_000 / 14)).sum())
    assert chi2 < 36.1          # the 99.9th percentile of chi-square with 13 degrees of freedom


def test_random_filler_is_uniform_over_blank_keys_and_values():
    setting = [[256, 4, 1]]
    data = MQARTask(MQARConfig(vocab_size=64, train_mixture=setting, eval_mixture=setting)).generate(
        400, "train", seed=2)
    mask = np.ones(len(data.tokens), dtype=bool)
    rows = data.answer_rows()
    starts = data.offsets[:-1]
    mask[(starts[:, None] + np.arange(8)).reshape(-1)] = False           # the contexts
    mask[starts[rows["document"]] + rows["query_pos"]] = False            # the queries
    filler = data.tokens[mask]
    counts = np.bincount(filler, minlength=64)
    assert counts[:3].sum() == 0 and counts[3:].min() > 0                # ids 3 .. 63 only, each of them
    expected = len(filler) / 61
    assert float(((counts[3:] - expected) ** 2 / expected).sum()) < 112.3   # chi-square, 60 dof, 99.9 %


def test_determinism_chunks_workers_and_prefixes():
    task = build_task("mqar_cpu")
    a = task.generate(2500, "train", seed=4)
    b = task.generate(2500, "train", seed=4, workers=2)
    c = task.generate(1100, "train", seed=4)
    assert np.array_equal(a.tokens, b.tokens) and np.array_equal(a.query_offsets, b.query_offsets)
    assert np.array_equal(a.head(1100).tokens, c.tokens)
    assert all(np.array_equal(a.head(1100).query_columns[k], c.query_columns[k]) for k in c.query_columns)
    other = task.generate(50, "validation", seed=4)
    assert not np.array_equal(other.tokens[:64], a.tokens[:64])


def test_arrow_round_trip_and_per_query_rows():
    task = build_task("mqar_cpu")
    data = task.generate(30, "test", seed=0)
    back = TaskData.from_dataset(task.dataset(30, "test", seed=0))
    assert np.array_equal(back.tokens, data.tokens) and np.array_equal(back.labels(), data.labels())
    assert all(np.array_equal(back.query_columns[k], data.query_columns[k]) for k in data.query_columns)
    rows = data.per_query(limit=50)
    assert len(rows) == 50 and not rows.multi_query
    for r in range(50):
        doc = data.document(int(rows.columns["document"][r]))
        i = int(rows.columns["query_index"][r])
        row = rows.document(r)
        assert row["input_ids"] == doc["input_ids"]
        for column in ("answer", "key_pos", "value_pos", "query_pos", "answer_pos"):
            assert row[column] == doc[column][i]
        assert row["query_distance"] == doc["query_pos"][i] - doc["key_pos"][i]
        assert sum(label != IGNORE_INDEX for label in row["labels"]) == 1


def test_length_sample_is_the_mixtures_exact_mean():
    task = build_task("mqar")
    mean, longest = task.length_sample()
    assert longest == 1024
    assert math.isclose(mean, (64 * 3 + 128 + 256 + 512 + 1024) / 7)
    assert math.isclose(task.generate(7000, "test", 0).lengths.mean(), mean)


@pytest.mark.parametrize("values, field", [
    ({"train_mixture": [[63, 4, 1]]}, "train_mixture"),            # odd length
    ({"train_mixture": [[64, 17, 1]]}, "train_mixture"),           # 4 x 17 > 64
    ({"eval_mixture": [[64, 4, 1], [64, 4, 2]]}, "eval_mixture"),  # a setting twice
    ({"eval_mixture": []}, "eval_mixture"),
    ({"train_mixture": [[64, 4, 0]]}, "train_mixture weight"),
    ({"vocab_size": 40}, "vocab_size"),                            # 16 keys for up to 256 pairs
    ({"power_a": 0.0}, "power_a"),
    ({"random_filler": "yes"}, "random_filler"),
    ({"num_pairs": 4}, "num_pairs"),                               # not a field of MQAR
])
def test_bad_configurations_name_their_field(values, field):
    with pytest.raises(ConfigError) as info:
        MQARConfig.from_dict(values)
    assert info.value.field == field
