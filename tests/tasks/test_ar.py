"""AR generation checked against an independent, per-document re-derivation in plain Python."""
import numpy as np
import pytest

from hf_mecheval.errors import ConfigError
from hf_mecheval.tasks import ARConfig, ARTask, build_task
from hf_mecheval.tasks.data import BOS, EOS, IGNORE_INDEX


def rederive(doc: dict, num_keys: int, value_first: bool) -> None:
    """Assert every property of one AR document from its tokens alone."""
    ids = doc["input_ids"]
    n = (len(ids) - 5) // 2
    assert len(ids) == 2 * n + 5 and doc["num_pairs"] == n
    assert ids[0] == BOS and ids[2 * n + 1] == EOS and ids[-1] == EOS
    keys, values = ids[1 : 2 * n + 1 : 2], ids[2 : 2 * n + 2 : 2]
    assert all(3 <= k < 3 + num_keys for k in keys)
    assert all(3 + num_keys <= v < 3 + 2 * num_keys for v in values)
    assert len(set(keys)) == n and len(set(values)) == n
    pairs = dict(zip(keys, values))
    inverse = dict(zip(values, keys))
    cue, answer = ids[2 * n + 2], ids[2 * n + 3]
    expected = inverse[cue] if value_first else pairs[cue]
    assert answer == expected == doc["answer"]
    assert (doc["divider_pos"], doc["query_pos"], doc["answer_pos"]) == (2 * n + 1, 2 * n + 2, 2 * n + 3)
    assert ids[doc["key_pos"]] == cue and ids[doc["value_pos"]] == answer
    assert doc["key_pos"] < doc["divider_pos"] and doc["value_pos"] < doc["divider_pos"]
    labels = doc["labels"]
    assert labels[doc["answer_pos"]] == answer
    assert sum(l != IGNORE_INDEX for l in labels) == 1


def test_ar_32_documents_match_rederivation():
    task = build_task("ar_32")
    assert task.vocab_size == 8196
    data = task.generate(300, "train", seed=3)
    assert data.lengths.tolist() == [37] * 300
    for doc in data:
        rederive(doc, 4096, value_first=False)
    # the queried pair is uniform over the 16 pairs: every pair index gets queried ...
    pair_index = (data.columns["key_pos"] - 1) // 2
    assert set(pair_index.tolist()) == set(range(16))
    # ... equally often: chi-square over 16 000 documents (1 000 expected per pair) below 37.70,
    # the 99.9 % point of chi-square with 15 degrees of freedom (deterministic: seed 3)
    counts = np.bincount((task.generate(16_000, "train", seed=3).columns["key_pos"] - 1) // 2, minlength=16)
    assert ((counts - 1000) ** 2 / 1000).sum() < 37.70, counts


def test_value_first_answers_the_key():
    task = build_task("ar_32_value_first")
    data = task.generate(200, "validation", seed=1)
    for doc in data:
        rederive(doc, 4096, value_first=True)
        assert doc["value_pos"] == doc["key_pos"] - 1


def test_pair_range_and_small_vocabulary():
    task = ARTask(ARConfig(num_kv=20, num_pairs=(2, 10), vocab_size=40))
    assert task.vocab_size == 40
    data = task.generate(500, "train", seed=0)
    assert set(data.columns["num_pairs"].tolist()) == set(range(2, 11))
    for doc in data:
        rederive(doc, 10, value_first=False)


@pytest.mark.timeout(120)   # the old redrawing never returned: fail, not hang the suite
def test_many_pairs_among_many_keys_are_drawn_without_endless_redraws():
    # 1 000 of 4 096 keys: a row drawn whole is free of repeats once in ~10^53 draws, so redrawing
    # rows until clean never ended; such rows come from a permutation's prefix instead
    data = ARTask(ARConfig(num_pairs=1000)).generate(4, "train", seed=0)
    for doc in data:
        rederive(doc, 4096, value_first=False)
        assert doc["num_pairs"] == 1000


def test_dense_pairs_use_every_key():
    # 10 pairs out of 10 keys: every document is a permutation
    data = ARTask(ARConfig(num_kv=20, num_pairs=10)).generate(50, "train", seed=0)
    for doc in data:
        rederive(doc, 10, value_first=False)


def test_heldout_pairs_only_in_test():
    # 5 keys x 5 values = 25 combinations: small enough to see every one queried
    task = ARTask(ARConfig(num_kv=10, num_pairs=3, heldout_fraction=0.3, heldout_seed=4))
    queried = {}
    for split in ("train", "validation", "test"):
        data = task.generate(3000, split, seed=0)
        tokens = data.tokens.reshape(len(data), -1)
        rows = np.arange(len(data))
        key = tokens[rows, data.columns["key_pos"]] - 3
        value = tokens[rows, data.columns["value_pos"]] - 3 - 5
        queried[split] = set(zip(key.tolist(), value.tolist()))
    assert queried["train"] == queried["validation"]
    assert not queried["train"] & queried["test"]
    assert len(queried["train"] | queried["test"]) == 25       # every combination is queried somewhere
    assert 3 <= len(queried["test"]) <= 13                      # ~30 % of 25
    # held-out combinations still occur as context pairs in training documents
    train = task.generate(3000, "train", seed=0).tokens.reshape(3000, -1)
    context_pairs = {(k - 3, v - 8) for row in train for k, v in zip(row[1:7:2], row[2:8:2])}
    assert queried["test"] <= context_pairs


def test_ar_32_gen_split_semantics():
    task = build_task("ar_32_gen")
    for split, want in (("train", False), ("validation", False), ("test", True)):
        data = task.generate(500, split, seed=0)
        t = data.tokens.reshape(len(data), -1)
        rows = np.arange(len(data))
        held = task.is_heldout(t[rows, data.columns["key_pos"]] - 3, t[rows, data.columns["value_pos"]] - 3 - 4096)
        assert (held == want).all()
    # the held-out set is ~20 % of all combinations
    k, v = np.meshgrid(np.arange(4096), np.arange(0, 4096, 16))
    assert abs(task.is_heldout(k, v).mean() - 0.2) < 0.01


@pytest.mark.parametrize(
    "fields, name",
    [
        ({"num_kv": 7}, "num_kv"),
        ({"num_kv": 8, "num_pairs": 5}, "num_pairs"),
        ({"num_pairs": (5, 3)}, "num_pairs"),
        ({"heldout_fraction": 1.0}, "heldout_fraction"),
        ({"heldout_fraction": -0.1}, "heldout_fraction"),
        ({"vocab_size": 100}, "vocab_size"),
        ({"num_kv": "8"}, "num_kv"),
    ],
)
def test_invalid_config_names_the_field(fields, name):
    with pytest.raises(ConfigError) as info:
        ARConfig(**fields)
    assert info.value.field == name and name in str(info.value)


def test_unknown_field_is_rejected_with_allowed_list():
    with pytest.raises(ConfigError, match="num_kv") as info:
        ARConfig.from_dict({"num_kvs": 8})
    assert info.value.field == "num_kvs"


def test_a_held_out_split_with_nothing_to_query_fails_clearly():
    with pytest.raises(ConfigError, match="heldout_fraction"):
        build_task("ar_32_gen", num_kv=8, num_pairs=2, heldout_fraction=0.01).generate(10, "test", 0)
