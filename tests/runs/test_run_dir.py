"""``RunDir``: a run's own files written whole and read back with their shapes checked."""
import json

import pytest

from hf_mecheval.errors import MechEvalError
from hf_mecheval.runs import RunDir

RECORD = {"model": {"architecture": "mamba", "hidden_size": 16, "num_hidden_layers": 2},
          "task": {"preset": "ar_32", "config": {"num_kv": 16}}, "training": {"learning_rate": 1e-3, "seed": 0}}
METRICS = {"final": {"validation_accuracy": 0.5, "test_accuracy": 0.25}, "history": []}


def test_a_run_is_started_then_finished_and_read_back(tmp_path):
    run = RunDir(tmp_path / "r")
    run.path.mkdir()
    run.start("mecheval train --seed 0", RECORD)
    assert (run.path / "command.txt").read_text() == "mecheval train --seed 0\n"
    assert not run.finished and not run.evaluated
    with pytest.raises(MechEvalError, match=r"is not a finished run: metrics.json is missing"):
        run.finished_run()
    run.finish(METRICS)
    assert run.finished
    assert run.finished_run() == (RECORD, METRICS)
    assert run.interventions() is None
    # no temporaries; the manifest lists what the run wrote
    assert sorted(p.name for p in run.path.iterdir()) == [".mecheval-written.json", "command.txt", "metrics.json",
                                                          "run.json"]
    assert json.loads((run.path / ".mecheval-written.json").read_text())["files"] == ["command.txt", "metrics.json",
                                                                                       "run.json"]


def test_starting_replaces_only_a_run(tmp_path):
    run = RunDir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(MechEvalError, match="notes.txt, which no run writes"):
        run.start("cmd", RECORD)
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_damaged_file_is_named(tmp_path):
    run = RunDir(tmp_path)
    run.start("cmd", RECORD)
    (tmp_path / "metrics.json").write_text(json.dumps({"final": {"validation_accuracy": "high"}}))
    with pytest.raises(MechEvalError, match="metrics.json"):
        run.metrics()
    with pytest.raises(MechEvalError, match="config.json is missing"):
        run.require("config.json", RunDir.RECORD)
