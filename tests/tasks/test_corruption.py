import numpy as np
import pytest

from hf_mecheval.errors import MechEvalError
from hf_mecheval.tasks import build_task, corrupt


@pytest.mark.parametrize("preset, column, cls", [("ar_32", "key_pos", "key"), ("ar_32", "value_pos", "value"),
                                                 ("atr_easy", "key_pos", "terminal"),
                                                 ("atr_easy", "value_pos", "terminal")])
def test_same_class_absent_token_at_one_position(preset, column, cls):
    task = build_task(preset)
    data = task.generate(300, "test", seed=0)
    ids, lengths = data.padded(), data.lengths
    pos = data.columns[column]
    out = corrupt(ids, pos, task.token_classes, seed=7, lengths=lengths)
    rows = np.arange(len(data))
    klass = task.token_classes[cls]
    assert np.array_equal(out.original, ids[rows, pos])
    assert all(t in klass for t in out.replacement)             # a value for a value, not a key
    assert (out.replacement != out.original).all()
    changed = out.input_ids != ids
    assert (changed.sum(axis=1) == 1).all() and changed[rows, pos].all()
    for i in range(len(data)):
        doc = ids[i, : lengths[i]]
        assert (out.replacement[i] in doc) == bool(out.reused[i])
    assert out.reused.mean() < 0.05
    # deterministic given the seed, different with another seed
    again = corrupt(ids, pos, task.token_classes, seed=7, lengths=lengths)
    assert np.array_equal(again.input_ids, out.input_ids)
    other = corrupt(ids, pos, task.token_classes, seed=8, lengths=lengths)
    assert not np.array_equal(other.replacement, out.replacement)


def test_uniform_over_absent_tokens():
    # class {3..7}; the document holds 3 and 4, so 5, 6, 7 are the only choices, each ~1/3
    ids = np.array([[1, 3, 4, 2]] * 3000)
    out = corrupt(ids, np.full(3000, 1), {"t": range(3, 8)}, seed=0)
    counts = np.bincount(out.replacement, minlength=8)[3:]
    assert counts[0] == counts[1] == 0
    assert all(abs(c - 1000) < 120 for c in counts[2:])


def test_exhausted_class_falls_back_and_flags():
    ids = np.array([[1, 3, 4, 5, 2]])
    out = corrupt(ids, np.array([2]), {"t": range(3, 6)}, seed=0)
    assert out.replacement[0] in (3, 5) and out.reused[0]


def test_padding_is_not_part_of_the_document():
    ids = np.array([[1, 3, 2, 4, 4]])                      # tokens after length 3 are padding
    out = corrupt(ids, np.array([1]), {"t": range(3, 5)}, seed=0, lengths=np.array([3]))
    assert out.replacement[0] == 4 and not out.reused[0]


def test_bad_positions_and_classless_tokens():
    ids = np.array([[1, 3, 2]])
    with pytest.raises(MechEvalError):
        corrupt(ids, np.array([5]), {"t": range(3, 5)}, seed=0)
    with pytest.raises(MechEvalError, match="no token class"):
        corrupt(ids, np.array([0]), {"t": range(3, 5)}, seed=0)
