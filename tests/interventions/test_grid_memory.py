"""The grid's memory: measured on one document, batches lowered to fit, results unchanged."""
import re

import numpy as np
import pytest
import torch

from hf_mecheval.interventions import run_grid
from hf_mecheval.interventions.memory import SAFE_FRACTION, TensorMemory
from hf_mecheval.models import build_model
from hf_mecheval.resources import memory_available
from hf_mecheval.tasks import ARConfig, ARTask

TASK = ARTask(ARConfig(num_kv=24, num_pairs=4, vocab_size=27))
LOWERED = re.compile(r"interventions: batches of (\d+) documents instead of (\d+)")


def test_tensor_memory_counts_live_storages_once():
    with TensorMemory() as memory:
        a = torch.zeros(1000)                      # 4000 bytes
        view = a[10:]                              # shares a's storage: nothing more
        a.add_(1)                                  # in place: nothing more
        b = a * 2                                  # 4000 more: peak 8000
        del a, view
        assert memory.current == 4000              # a's storage freed with its last view
        c = b + 1                                  # 8000 live again, never more
    assert memory.peak == 8000 and memory.current == 8000
    del b, c


def test_memory_available_stays_within_memory_limit(monkeypatch):
    monkeypatch.setattr("hf_mecheval.resources.memory_limit", lambda: 12345)
    assert memory_available() == 12345


def _h3():
    torch.manual_seed(0)
    # H3 with its state sites, (batch, length, channels, d_state): the largest activation per row
    return build_model("h3", vocab_size=TASK.vocab_size, hidden_size=16, d_state=8, head_dim=2).eval()


def _per_example(result):
    return {c: result["corruptions"][c]["per_example"] for c in result["corruptions"]}


def _documents_bytes(model, data, n=1):
    """What the grid measures: the engine on the first n documents (they are all alike here)."""
    from hf_mecheval.interventions.engine import engine_for
    from hf_mecheval.tasks.corruption import corrupt

    ids = torch.as_tensor(data.padded()[:n]).long()
    broken = torch.as_tensor(corrupt(data.padded(), data.columns["key_pos"], TASK.token_classes, seed=0,
                                     lengths=data.lengths).input_ids[:n]).long()
    col = lambda c: torch.as_tensor(data.columns[c][:n]).long()
    engine = engine_for(model)
    with TensorMemory() as memory:
        engine.run(ids, broken, {p: col(f"{p}_pos") for p in ("key", "value", "divider", "query", "answer")},
                   col("query_pos"), col("answer"), engine.site_names())
    return memory.peak


def test_batch_is_lowered_under_a_small_memory_limit_and_results_do_not_change(monkeypatch, capsys):
    model, data = _h3(), TASK.generate(12, "test", 1)
    assert len(set(data.lengths.tolist())) == 1           # every document costs the same
    full = run_grid(model, TASK, data, batch_size=12, n_resamples=50, progress=False)
    assert not LOWERED.search(capsys.readouterr().err)      # plenty of memory: the batch asked for
    one, two = _documents_bytes(model, data, 1), _documents_bytes(model, data, 2)
    per_document, fixed = two - one, 2 * one - two            # what each document adds; the rest a batch holds
    assert 0 < per_document and 0 <= fixed
    # room for 4.5 lone documents' worth in the grid's share of the (fake) machine: the fixed part
    # once, then as many documents as the rest holds
    monkeypatch.setattr("hf_mecheval.resources.memory_limit", lambda: int(4.5 * one / SAFE_FRACTION))
    lowered = run_grid(model, TASK, data, batch_size=12, n_resamples=50, progress=False)
    found = LOWERED.search(capsys.readouterr().err)
    assert found and int(found.group(2)) == 12
    chosen = int(found.group(1))
    expected = (int(4.5 * one / SAFE_FRACTION * SAFE_FRACTION) - fixed) // per_document
    assert 4 <= chosen and abs(chosen - expected) <= 1, (chosen, expected)
    # restoration is per document: the batch size changes nothing beyond float rounding
    for which, entry in _per_example(full).items():
        other = _per_example(lowered)[which]
        for key in ("p_clean", "p_corrupt"):
            np.testing.assert_allclose(other[key], entry[key], rtol=1e-5, atol=1e-7)
        assert other["p_patched"].keys() == entry["p_patched"].keys()
        for cell, values in entry["p_patched"].items():
            np.testing.assert_allclose(other["p_patched"][cell], values, rtol=1e-5, atol=1e-7, err_msg=cell)
    assert lowered["mechanism"]["label"] == full["mechanism"]["label"]
    # and for a given batch size the results are exactly those of that batch size asked for
    monkeypatch.undo()
    asked = run_grid(model, TASK, data, batch_size=chosen, n_resamples=50, progress=False)
    assert _per_example(asked) == _per_example(lowered)
    assert asked["corruptions"] == lowered["corruptions"]


def test_one_document_that_does_not_fit_is_refused_with_the_estimate(monkeypatch):
    from hf_mecheval.errors import MechEvalError

    model, data = _h3(), TASK.generate(8, "test", 1)
    per_document = _documents_bytes(model, data)
    monkeypatch.setattr("hf_mecheval.resources.memory_limit", lambda: per_document)   # half is free for it
    with pytest.raises(MechEvalError, match=r"the intervention grid \(16 sites, documents of \d+ tokens\) on one "
                                            r"document would need about .* free for it \(50% of the"):
        run_grid(model, TASK, data, n_resamples=50, progress=False)
