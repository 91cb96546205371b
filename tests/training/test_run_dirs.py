"""Run directories are never lost or mixed: --overwrite replaces only a run, one writer at a time,
a resumed run must be the run asked for and continues from its newest complete checkpoint, a
full disk is one clear error."""
import errno
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from hf_mecheval.training.spec import RunSpec
from hf_mecheval.training.run import main, train

from test_training import SHORT, StopAt, run_args


def one_error(capsys) -> str:
    """The one error line on stderr (saving a model may draw progress bars there too)."""
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "error" in line]
    assert len(err) == 1 and err[0].startswith("mecheval train: error:"), err
    return err[0]


def tree(folder: Path) -> dict:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


QUICK = [*SHORT, "--max_steps", "2"]


def test_overwrite_never_deletes_what_is_not_a_run(tmp_path, capsys, monkeypatch):
    home = tmp_path / "home"
    (home / "photos").mkdir(parents=True)
    (home / "photos" / "a.jpg").write_bytes(b"x")
    before = tree(tmp_path)
    assert main(run_args(home, *QUICK, "--overwrite")) == 2
    assert "replaces only a run directory" in one_error(capsys) and tree(tmp_path) == before
    # a folder that looks like a run but holds something else too
    (home / "run.json").write_text("{}")
    before = tree(tmp_path)
    assert main(run_args(home, *QUICK, "--overwrite")) == 2
    assert "photos/" in one_error(capsys) and tree(tmp_path) == before
    # the current folder and its parents, even when they are runs
    work = home / "photos"
    monkeypatch.chdir(work)
    for target in (".", str(home), str(work)):
        assert main(run_args(target, *QUICK, "--overwrite")) == 2, target
        capsys.readouterr()
    assert tree(tmp_path) == before
    # a file
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("mine")
    assert main(run_args(tmp_path / "notes.txt", *QUICK, "--overwrite")) == 2
    capsys.readouterr()
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_a_stack_member_never_deletes_what_is_not_a_run(tmp_path, capsys):
    home = tmp_path / "home"
    (home / "photos").mkdir(parents=True)
    (home / "photos" / "a.jpg").write_bytes(b"x")
    base = {"task": "ar_32", "task_config": {"num_kv": 16, "num_pairs": 2}, "train_size": 64, "eval_size": 16,
            "max_steps": 2, "hidden_size": 8, "eval_strategy": "no", "save_strategy": "no", "disable_tqdm": True}
    spec = {"stack_dir": str(tmp_path / "stack"),
            "runs": [{"name": "a", "output_dir": str(home), "args": {**base, "learning_rate": 0.001}},
                     {"name": "b", "output_dir": str(tmp_path / "b"), "args": {**base, "learning_rate": 0.01}}]}
    (tmp_path / "stack.json").write_text(json.dumps(spec))
    before = tree(home)
    assert main(["--job", str(tmp_path / "stack.json"), "--overwrite"]) == 2
    assert "replaces only a run directory" in one_error(capsys)
    assert tree(home) == before and not (tmp_path / "b").exists() and not (tmp_path / "stack").exists()


def test_a_second_writer_of_a_run_directory_is_refused(tmp_path, capsys):
    run = tmp_path / "run"
    slow = run_args(run, *SHORT, "--max_steps", "100000", "--save_strategy", "no")
    first = subprocess.Popen([sys.executable, "-m", "hf_mecheval.training.run", *slow], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (run / "run.json").exists():
            assert time.time() < deadline and first.poll() is None
            time.sleep(0.2)
        before = tree(run)
        for extra in ([], ["--overwrite"]):
            assert main(run_args(run, *QUICK, *extra)) == 2
            assert "in use by another mecheval process" in one_error(capsys)
        assert tree(run) == before and first.poll() is None
    finally:
        first.kill()
        first.wait()
    # the lock went with the process: the folder can be taken over
    assert main(run_args(run, *QUICK, "--overwrite")) == 0
    assert json.loads((run / "metrics.json").read_text())["final"]["global_step"] == 2


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory):
    """A run killed after its checkpoint at step 20."""
    run = tmp_path_factory.mktemp("interrupted") / "run"
    with pytest.raises(KeyboardInterrupt):
        train(RunSpec.from_flags(run_args(run, *SHORT)), callbacks=[StopAt(20)])
    return run


@pytest.mark.parametrize("change, field", [(["--learning_rate", "0.01"], "training.learning_rate"),
                                           (["--train_size", "320"], "task.train_size"),
                                           (["--dataset_seed", "1"], "task.dataset_seed"),
                                           (["--hidden_size", "32"], "model.hidden_size")])
def test_resume_refuses_other_arguments_naming_them(tmp_path, capsys, interrupted, change, field):
    shutil.copytree(interrupted, tmp_path / "run")
    before = tree(tmp_path / "run")
    capsys.readouterr()
    assert main(run_args(tmp_path / "run", *SHORT, *change, "--resume")) == 2
    line = one_error(capsys)
    assert "cannot resume" in line and field in line
    assert tree(tmp_path / "run") == before


def test_the_fingerprint_ignores_what_does_not_change_the_result(tmp_path):
    from hf_mecheval.runs.run_dir import differences

    def record(*extra):
        return RunSpec.from_flags(run_args(tmp_path / "x", *SHORT, *extra)).record

    base = record()
    assert differences(base, record("--output_dir", str(tmp_path / "y"), "--logging_steps", "7", "--save_strategy",
                                    "no", "--disable_tqdm", "false", "--report_to", "none", "--eval_strategy",
                                    "epoch", "--per_device_eval_batch_size", "7")) == []
    assert differences(base, record("--max_steps", "41", "--weight_decay", "0.1")) == [
        "training.max_steps: 40 there, 41 asked", "training.weight_decay: 0.0 there, 0.1 asked"]


def test_a_run_written_by_train_has_the_requested_fingerprint(tmp_path):
    from hf_mecheval.runs.run_dir import differences

    run = tmp_path / "run"
    assert main(run_args(run, *QUICK)) == 0
    written = json.loads((run / "run.json").read_text())
    assert differences(written, RunSpec.from_flags(run_args(run, *QUICK)).record) == []
    # the same record, but for what the Trainer's run adds (the process's own fields)
    assert {k: v for k, v in written.items() if k != "training"} == \
        {k: v for k, v in RunSpec.from_flags(run_args(run, *QUICK)).record.items() if k != "training"}


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """The weights of an uninterrupted run, to compare interrupted and resumed ones with."""
    run = tmp_path_factory.mktemp("whole") / "run"
    assert main(run_args(run, *SHORT)) == 0
    return load_file(run / "model.safetensors")


@pytest.mark.parametrize("damage", ["no trainer state", "truncated weights"])
def test_resume_skips_a_checkpoint_cut_short(tmp_path, capsys, whole, damage):
    args = RunSpec.from_flags(run_args(tmp_path / "run", *SHORT))
    with pytest.raises(KeyboardInterrupt):
        train(args, callbacks=[StopAt(40)])
    newest = tmp_path / "run" / "checkpoint-40"
    if damage == "no trainer state":        # the Trainer writes it last: a kill before it
        (newest / "trainer_state.json").unlink()
    else:
        weights = newest / "model.safetensors"
        weights.write_bytes(weights.read_bytes()[:100])
    capsys.readouterr()
    assert main(run_args(tmp_path / "run", *SHORT, "--resume")) == 0
    assert f"removed {newest}" in capsys.readouterr().err
    b = load_file(tmp_path / "run" / "model.safetensors")
    assert max((whole[k] - b[k]).abs().max().item() for k in whole) <= 1e-6


def test_a_full_disk_at_save_is_one_line_and_the_run_resumes(tmp_path, capsys, monkeypatch, whole):
    from transformers import Trainer

    real = Trainer._save_optimizer_and_scheduler

    def full_at_40(self, output_dir):
        if self.state.global_step == 40:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, output_dir)

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", full_at_40)
    capsys.readouterr()
    assert main(run_args(tmp_path / "run", *SHORT)) == 2
    line = one_error(capsys)
    assert "no space left" in line and "checkpoint-40" in line and "--resume" in line
    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", real)
    # checkpoint-40 was cut short: the run continues from checkpoint-20 to the same weights
    assert main(run_args(tmp_path / "run", *SHORT, "--resume")) == 0
    b = load_file(tmp_path / "run" / "model.safetensors")
    assert max((whole[k] - b[k]).abs().max().item() for k in whole) <= 1e-6


def test_a_failed_save_is_one_line(tmp_path, capsys, monkeypatch):
    """torch.save reports a full disk only as a position mismatch (a RuntimeError): still one line."""
    from transformers import Trainer

    def torch_save_on_a_full_disk(self, output_dir):
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 576 vs 534")

    monkeypatch.setattr(Trainer, "_save_optimizer_and_scheduler", torch_save_on_a_full_disk)
    assert main(run_args(tmp_path / "run", *QUICK, "--save_strategy", "steps", "--save_steps", "1")) == 2
    line = one_error(capsys)
    assert "cannot write" in line and "checkpoint-1" in line and "unexpected pos" in line


def test_output_dir_is_required(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = [a for a in run_args("x", *QUICK) if a not in ("--output_dir", "x")]
    assert main(argv) == 2
    assert "output_dir: a run directory is required" in one_error(capsys)
    assert list(tmp_path.iterdir()) == []
