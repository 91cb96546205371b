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


def test_an_output_folder_is_claimed_only_where_it_is_a_folder_of_our_files(tmp_path):
    from hf_mecheval.runs.manifest import add_written, claim_output_folder

    claim_output_folder(tmp_path / "new", overwrite=False)          # not there yet: the command creates it
    (tmp_path / "a_file").write_text("mine")
    for overwrite in (False, True):         # no flag turns a file into a folder
        with pytest.raises(MechEvalError, match="cannot write to .*a_file: it is a file, not a folder"):
            claim_output_folder(tmp_path / "a_file", overwrite)
    out = tmp_path / "out"
    out.mkdir()
    add_written(out, ["report.md"])
    (out / "report.md").write_text("ours")
    claim_output_folder(out, overwrite=False)
    (out / "notes.md").write_text("a person's")
    with pytest.raises(MechEvalError, match=r"did not write there \(notes\.md\)"):
        claim_output_folder(out, overwrite=False)
    claim_output_folder(out, overwrite=True)
