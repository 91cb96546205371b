import numpy as np

from hf_mecheval.tasks import TaskData, build_task, task_statistics
from hf_mecheval.tasks.stats import format_statistics


def test_arrow_round_trip_and_padding():
    data = build_task("atr_easy").generate(50, "train", seed=0)
    table = data.to_arrow()
    assert table.column_names[:8] == ["input_ids", "labels", "answer", "key_pos", "value_pos", "divider_pos",
                                      "query_pos", "answer_pos"]
    back = TaskData.from_arrow(table)
    assert np.array_equal(back.tokens, data.tokens) and np.array_equal(back.offsets, data.offsets)
    assert all(np.array_equal(back.columns[k], v) for k, v in data.columns.items())
    assert np.array_equal(back.token_columns["tree_parent"], data.token_columns["tree_parent"])
    padded = data.padded(pad_id=0)
    for i, doc in enumerate(data):
        n = len(doc["input_ids"])
        assert padded[i, :n].tolist() == doc["input_ids"] and (padded[i, n:] == 0).all()
    assert table.column("labels").to_pylist() == [d["labels"] for d in data]


def test_hand_computed_statistics():
    # two hand-made ATR documents:
    #  doc 0: BOS a b c EOS b c EOS  ; tree: a->c, b->c, c root; query b (pos 2) -> c (pos 3)
    #  doc 1: BOS a a EOS a a EOS    ; tree: a(1)->a(2), a(2) root; query a (pos 1) -> a (pos 2)
    tokens = np.array([1, 3, 4, 5, 2, 4, 5, 2, 1, 3, 3, 2, 3, 3, 2], dtype=np.int32)
    offsets = np.array([0, 8, 15])
    columns = {
        "answer": np.array([5, 3]), "key_pos": np.array([2, 1]), "value_pos": np.array([3, 2]),
        "divider_pos": np.array([4, 3]), "query_pos": np.array([5, 4]), "answer_pos": np.array([6, 5]),
    }
    tree = np.array([-1, 3, 3, -1, -1, -1, -1, -1, -1, 2, -1, -1, -1, -1, -1], dtype=np.int32)
    stats = task_statistics(TaskData(tokens, offsets, columns, {"tree_parent": tree}))
    assert stats["length_mean"] == 7.5
    assert stats["key_value_distance_mean"] == 1.0 and stats["adjacent_fraction"] == 1.0
    assert stats["tree_depth_mean"] == 1.0
    assert stats["branching_mean"] == 1.5             # c has 2 children, a(2) has 1
    assert stats["repeated_label_fraction"] == 2 / 5  # the two a's of doc 1 out of 5 sentence tokens
    assert stats["answer_is_root_fraction"] == 1.0
    assert "length_mean" in format_statistics(stats)


def test_answer_from_query_is_chance_on_ar_and_informative_on_gen():
    ar = task_statistics(build_task("ar_32").generate(4000, "test"))
    assert ar["answer_from_query_acc"] < 0.01
    # atr_gen's test split only asks held-out label pairs: fewer (query, answer) combinations
    gen = task_statistics(build_task("atr_gen").generate(4000, "test"))
    easy = task_statistics(build_task("atr_easy").generate(4000, "test"))
    assert gen["answer_from_query_acc"] > easy["answer_from_query_acc"]
