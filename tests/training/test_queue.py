"""mecheval queue: the order of a queue file, claims between lanes, stacks, stopping, bad files."""
import io
import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest
import yaml

from hf_mecheval.cli import main as mecheval
from hf_mecheval.errors import ConfigError, MechEvalError
from hf_mecheval.runs import RunDir
from hf_mecheval.runs.files import GridSettings
from hf_mecheval.training.queue import (STOP_FILE, UNTIL_MARGIN, estimate_left, next_pick, read_queue, run_queue,
                                        runs_left)

BASE = {"task_config": {"num_kv": 16, "num_pairs": 2}, "train_size": 64, "eval_size": 32, "max_steps": 4,
        "max_position_embeddings": 16, "eval_strategy": "no", "save_strategy": "no"}
GRID = GridSettings(n=8, resamples=10)


def sweep_file(folder, name, **grid):
    path = folder / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, "task": "ar_32", "defaults": {"hidden_size": 64, **BASE},
                                    "grids": [grid]}))
    return str(path)


def queue_file(folder, entries, name="queue.yaml"):
    path = folder / name
    path.write_text(yaml.safe_dump(entries))
    return path


@pytest.fixture
def two_sweeps(tmp_path):
    first = sweep_file(tmp_path, "first", architecture=["transformer"], learning_rate=[0.01, 0.001])
    second = sweep_file(tmp_path, "second", architecture=["based"], learning_rate=[0.01])
    return first, second


def test_runs_are_taken_in_the_queues_order_each_once(tmp_path, two_sweeps):
    first, second = two_sweeps
    # the second sweep first, then one run of the first by pattern, then the whole first (its other run)
    queue = queue_file(tmp_path, [{"sweep": second}, {"sweep": first, "only": ["*_lr1e-03_*"]}, {"sweep": first}])
    out = tmp_path / "out"
    assert list(runs_left(queue, out, GRID)) == ["second/based_s0", "first/transformer_lr1e-03_s0",
                                           "first/transformer_lr0.01_s0"]
    # the first two entries trained (each run a process and its grid: the third is the same again)
    log = tmp_path / "queue.log"
    with open(log, "w") as handle:
        outcome = run_queue(queue_file(tmp_path, [{"sweep": second}, {"sweep": first, "only": ["*_lr1e-03_*"]}],
                                       "two.yaml"), out, grid=GRID, log=handle)
    assert outcome == {"finished": ["second/based_s0", "first/transformer_lr1e-03_s0"], "failed": [], "later": []}
    started = [line.split("queue: ")[1] for line in log.read_text().splitlines() if "finished" not in line]
    assert started == ["second: based_s0", "first: transformer_lr1e-03_s0"]
    for name in outcome["finished"]:
        sweep, run = name.split("/")
        folder = RunDir(out / sweep / "runs" / run)
        assert folder.finished and folder.grid_matches(GRID)
    assert json.loads((out / "first" / "results.json").read_text())["runs"]      # each sweep's results written
    # what is left of the three entries: the run the third names, once
    assert list(runs_left(queue, out, GRID)) == ["first/transformer_lr0.01_s0"]


def test_a_claimed_run_is_left_to_its_lane_and_a_killed_lane_leaves_no_claim(tmp_path, two_sweeps):
    first, _ = two_sweeps
    entries = read_queue(queue_file(tmp_path, [{"sweep": first}]))
    out = tmp_path / "out"
    a = next_pick(entries, out, GRID, set())
    b = next_pick(entries, out, GRID, set())            # a second lane: the next run
    assert [r.name for r in a.runs] == ["transformer_lr0.01_s0"] and [r.name for r in b.runs] == ["transformer_lr1e-03_s0"]
    assert next_pick(entries, out, GRID, set()) is None  # a third: nothing left to take
    a.release()
    again = next_pick(entries, out, GRID, set())
    assert [r.name for r in again.runs] == ["transformer_lr0.01_s0"]
    again.release(), b.release()
    # another process holds a claim, and is killed: its claim goes with it
    lock = out / "first" / "queue" / "transformer_lr0.01_s0.lock"
    holder = subprocess.Popen([sys.executable, "-c", f"""
import fcntl, os, sys, time
fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(600)"""], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert [r.name for r in next_pick(entries, out, GRID, set()).runs] == ["transformer_lr1e-03_s0"]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert [r.name for r in next_pick(entries, out, GRID, set()).runs] == ["transformer_lr0.01_s0"]


def test_small_widths_are_claimed_as_one_stack(tmp_path):
    small = sweep_file(tmp_path, "small", architecture=["mamba"], hidden_size=[16, 64], learning_rate=[0.01, 0.001])
    entries = read_queue(queue_file(tmp_path, [{"sweep": small}]))
    out = tmp_path / "out"
    pick = next_pick(entries, out, GRID, set())
    assert sorted(r.name for r in pick.runs) == ["mamba_d16_lr0.01_s0", "mamba_d16_lr1e-03_s0"]   # trained stacked
    wide = next_pick(entries, out, GRID, set())
    assert [r.name for r in wide.runs] == ["mamba_d64_lr0.01_s0"]                                    # alone


def test_a_stop_file_stops_a_lane_between_runs(tmp_path, two_sweeps):
    first, _ = two_sweeps
    out = tmp_path / "out"
    out.mkdir()
    (out / STOP_FILE).touch()
    assert run_queue(queue_file(tmp_path, [{"sweep": first}]), out, grid=GRID) == {"finished": [], "failed": [], "later": []}
    assert not (out / "first" / "runs").exists()


def test_the_file_is_read_again_before_every_run(tmp_path, two_sweeps, monkeypatch):
    first, second = two_sweeps
    queue = queue_file(tmp_path, [{"sweep": first, "only": ["*_lr0.01_*"]}])
    from hf_mecheval.training import queue as module

    trained = []

    def launch(sweep, out, **kwargs):           # trains nothing; after the first run, the queue file is edited
        trained.append(kwargs["only"])
        queue_file(tmp_path, [{"sweep": second}])
        return {"finished": [], "skipped": [], "in_use": [], "failed": []}
    monkeypatch.setattr(module, "launch", launch)
    monkeypatch.setattr(module, "write_results", lambda sweep, out: None)
    outcome = run_queue(queue, tmp_path / "out", grid=GRID, log=open(os.devnull, "w"))
    assert trained == [["transformer_lr0.01_s0"], ["based_s0"]]
    # neither was trained: each failed in this lane, and is not taken again by it
    assert outcome == {"finished": [], "failed": ["first/transformer_lr0.01_s0", "second/based_s0"], "later": []}


def test_an_edit_saved_half_way_leaves_the_lane_on_the_queue_it_read_before(tmp_path, two_sweeps, monkeypatch):
    first, second = two_sweeps
    queue = queue_file(tmp_path, [{"sweep": first}])
    from hf_mecheval.training import queue as module

    trained = []

    def launch(sweep, out, **kwargs):           # trains nothing; after the first run an editor saves half a line
        trained.append(kwargs["only"])
        queue.write_text(f"- {{sweep: {second}")
        return {"finished": [], "skipped": [], "in_use": [], "failed": []}
    monkeypatch.setattr(module, "launch", launch)
    monkeypatch.setattr(module, "write_results", lambda sweep, out: None)
    log = io.StringIO()
    run_queue(queue, tmp_path / "out", grid=GRID, log=log)
    assert trained == [["transformer_lr0.01_s0"], ["transformer_lr1e-03_s0"]]     # the first file's runs, both
    assert re.search(r"queue\.yaml: not valid YAML: line 1.*; this lane keeps the queue it read before", log.getvalue())


@pytest.mark.parametrize("content, message", [
    ("{sweep: x}", "queue: .* must be a list"),
    ("[]", "queue: .* must be a list"),
    ("- [a]", "sweep: .*entry 1 must be a mapping with the key sweep"),
    ("- {sweep: SWEEP, order: 1}", "order: unknown key in .*entry 1; allowed: sweep, only"),
    ("- {sweep: SWEEP, only: mamba_*}", "only: .*a list of run-name patterns"),
    ("- {sweep: SWEEP, only: [nothing_*]}", "only: 'nothing_\\*' matches no run of sweep first"),
    ("- {sweep: no_such_sweep}", "no sweep file no_such_sweep"),
    ("- {sweep: 3}", "sweep: .*a sweep file or packaged sweep name, got 3"),
    ("- {sweep: SWEEP", "queue.yaml: not valid YAML: line 1, column .*expected ',' or '}'"),
    ("- {sweep: SWEEP}\n  only: [a]", "queue.yaml: not valid YAML: line 2, column"),
])
def test_a_bad_queue_file_is_one_clear_error(tmp_path, two_sweeps, capsys, content, message):
    path = tmp_path / "queue.yaml"
    path.write_text(content.replace("SWEEP", two_sweeps[0]))
    with pytest.raises((ConfigError, MechEvalError), match=message):
        read_queue(path)
    assert mecheval(["queue", str(path), "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_a_persons_file_named_as_a_sweeps_own_stops_the_queue_before_any_run(tmp_path, two_sweeps, capsys):
    queue = queue_file(tmp_path, [{"sweep": two_sweeps[0]}, {"sweep": two_sweeps[1]}])
    (tmp_path / "out" / "second").mkdir(parents=True)
    (tmp_path / "out" / "second" / "results.md").write_text("my notes\n")
    assert mecheval(["queue", str(queue), "--out", str(tmp_path / "out")]) == 2
    assert "out/second holds results.md, which a sweep did not write" in capsys.readouterr().err
    assert not (tmp_path / "out" / "first").exists()
    assert (tmp_path / "out" / "second" / "results.md").read_text() == "my notes\n"


def test_a_persons_file_saved_mid_run_leaves_the_tables_unwritten_not_the_run_failed(tmp_path, two_sweeps,
                                                                                     monkeypatch):
    from hf_mecheval.training import queue as module

    real_launch = module.launch

    def launch(sweep, out, **kwargs):          # the run trains; meanwhile a person saves notes as results.md
        result = real_launch(sweep, out, **kwargs)
        (out / sweep.name / "results.md").write_text("my notes\n")
        return result
    monkeypatch.setattr(module, "launch", launch)
    log = tmp_path / "queue.log"
    out = tmp_path / "out"
    with open(log, "w") as handle:
        outcome = run_queue(queue_file(tmp_path, [{"sweep": two_sweeps[1]}]), out, grid=GRID, log=handle)
    assert outcome == {"finished": ["second/based_s0"], "failed": [], "later": []}
    lines = log.read_text().splitlines()
    assert "its results tables not written" in lines[-2] and "holds results.md, which a sweep did not write" in lines[-2]
    assert lines[-1].endswith("second: 1 finished")
    assert (out / "second" / "results.md").read_text() == "my notes\n"
    assert not (out / "second" / "results.json").exists()


def test_the_repositorys_queue_names_only_runs_that_exist():
    from pathlib import Path

    entries = read_queue(Path(__file__).resolve().parents[2] / "hf_mecheval" / "experiments" / "queue.yaml")
    assert entries[0].sweep.name == "ref_depth" and all(e.runs() for e in entries)


def test_dry_run_lists_what_is_left(tmp_path, two_sweeps, capsys):
    first, second = two_sweeps
    queue = queue_file(tmp_path, [{"sweep": second}, {"sweep": first}])
    assert mecheval(["queue", str(queue), "--out", str(tmp_path / "out"), "--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in printed[:3]] == ["second/based_s0", "first/transformer_lr0.01_s0",
                                                         "first/transformer_lr1e-03_s0"]
    # each sweep's share, in the queue's order, then the whole
    assert printed[3:5] == ["sweep second: 1 run left, none priced (--time-steps times them)",
                            "sweep first: 2 runs left, none priced (--time-steps times them)"]
    assert printed[-1].startswith("3 runs left") and len(printed) == 6


def test_a_run_trained_outside_the_queue_is_left_to_its_process(tmp_path, two_sweeps):
    from hf_mecheval.locks import locked_folder

    first, _ = two_sweeps
    out = tmp_path / "out"
    busy = out / "first" / "runs" / "transformer_lr0.01_s0"
    with locked_folder(busy):                  # as a `mecheval sweep` training it holds it
        busy.joinpath("command.txt").write_text("mecheval train ...")
        outcome = run_queue(queue_file(tmp_path, [{"sweep": first}]), out, grid=GRID, log=open(os.devnull, "w"))
    assert outcome == {"finished": ["first/transformer_lr1e-03_s0"], "failed": [], "later": []}


def test_a_run_refused_with_an_error_is_reported_and_the_lane_goes_on(tmp_path, two_sweeps, monkeypatch):
    from hf_mecheval.training import queue as module

    first, second = two_sweeps
    calls = []

    def launch(sweep, out, **kwargs):
        calls.append(kwargs["only"])
        if len(calls) == 1:
            raise MechEvalError("cannot resume from somewhere: no complete checkpoint")
        return {"finished": [], "skipped": [], "in_use": [], "failed": []}
    monkeypatch.setattr(module, "launch", launch)
    monkeypatch.setattr(module, "write_results", lambda sweep, out: None)
    log = tmp_path / "queue.log"
    with open(log, "w") as handle:
        outcome = run_queue(queue_file(tmp_path, [{"sweep": second}, {"sweep": first, "only": ["*_lr0.01_*"]}]),
                            tmp_path / "out", grid=GRID, log=handle)
    assert calls == [["based_s0"], ["transformer_lr0.01_s0"]]
    assert outcome["failed"] == ["second/based_s0", "first/transformer_lr0.01_s0"]
    assert "failed: based_s0 (cannot resume from somewhere: no complete checkpoint)" in log.read_text()


def test_dry_run_prices_each_run_left_from_finished_runs_like_it(tmp_path, two_sweeps, capsys):
    """A run's CPU hours: the median over finished runs that differ from it only in learning rate
    and seeds (a stacked run counts its share; a failed run and another width count nothing), less
    what its last checkpoint has trained."""
    first, second = two_sweeps
    queue = queue_file(tmp_path, [{"sweep": first}, {"sweep": second}])
    out = tmp_path / "out"
    record = next(r for r in read_queue(queue)[0].runs() if r.name == "transformer_lr1e-03_s0").checked().record

    def finished(name, record, **final):
        folder = out / "elsewhere" / "runs" / name
        folder.mkdir(parents=True)
        (folder / "run.json").write_text(json.dumps(record))
        (folder / "metrics.json").write_text(json.dumps({"final": {"validation_accuracy": 0.5, "test_accuracy": 0.5,
                                                                   **final}}))

    other_seed = {**record, "training": {**record["training"], "seed": 1, "learning_rate": 0.3}}
    wider = {**record, "model": {**record["model"], "hidden_size": 128}}
    finished("alone", record, train_cpu_seconds=7200.0)
    finished("stacked", other_seed, train_cpu_seconds=7200.0, stack_size=2)      # its share: 3600 s
    finished("diverged", record, train_cpu_seconds=60.0, failed="diverged")
    finished("wider", wider, train_cpu_seconds=99999.0)
    # a quarter of transformer_lr0.01_s0 trained already
    checkpoint = out / "first" / "runs" / "transformer_lr0.01_s0" / "checkpoint-1"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 1, "max_steps": 4}))

    rows = {r["run"]: r for r in estimate_left(queue, out, GRID)}
    assert list(rows) == ["first/transformer_lr0.01_s0", "first/transformer_lr1e-03_s0", "second/based_s0"]
    assert rows["first/transformer_lr1e-03_s0"] == {"run": "first/transformer_lr1e-03_s0", "cpu_hours": 1.5,
                                                    "like": 2, "trained": 0.0, "timed": None}
    assert rows["first/transformer_lr0.01_s0"]["cpu_hours"] == pytest.approx(1.5 * 0.75)
    assert rows["second/based_s0"]["cpu_hours"] is None and rows["second/based_s0"]["like"] == 0

    assert mecheval(["queue", str(queue), "--out", str(out), "--dry-run"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].endswith("~1.1 CPU h (median of 2 finished like it, 25 % trained)")
    assert printed[2].endswith("no finished run like it")
    assert printed[3:5] == ["sweep first: 2 runs left, about 2.6 CPU hours",
                            "sweep second: 1 run left, none priced (--time-steps times them)"]
    assert printed[-1] == ("3 runs left: about 2.6 CPU hours for the 2 with a finished run like them "
                           "(lr and seeds aside); 1 without one")


def test_time_steps_prices_the_runs_no_finished_run_is_like(tmp_path, two_sweeps, monkeypatch, capsys):
    """--time-steps: a run without a finished run like it costs its timed step x its steps x the
    scale, the finished kinds' measured CPU seconds over their timed steps; one step timed per kind."""
    from hf_mecheval.training import queue as module

    first, second = two_sweeps
    queue = queue_file(tmp_path, [{"sweep": first}, {"sweep": second}])
    out = tmp_path / "out"
    record = next(r for r in read_queue(queue)[0].runs() if r.name == "transformer_lr1e-03_s0").checked().record
    folder = out / "elsewhere" / "runs" / "alone"
    folder.mkdir(parents=True)
    (folder / "run.json").write_text(json.dumps(record))
    (folder / "metrics.json").write_text(json.dumps({"final": {"validation_accuracy": 0.5, "test_accuracy": 0.5,
                                                               "train_cpu_seconds": 12.0}}))
    timed = []

    def step_seconds(spec):
        timed.append(spec.model.architecture)
        return {"transformer": 2.0, "based": 5.0}[spec.model.architecture]
    monkeypatch.setattr(module, "median_step_seconds", step_seconds)

    rows = {r["run"]: r for r in estimate_left(queue, out, GRID, time_steps=True)}
    assert timed == ["transformer", "based"]               # the two transformer runs are one kind
    # the transformer's kind: 12 CPU s measured over 2 s x 4 steps timed: scale 1.5
    assert rows["first/transformer_lr0.01_s0"]["cpu_hours"] == pytest.approx(12 / 3600)
    assert rows["first/transformer_lr0.01_s0"]["timed"] is None
    assert rows["second/based_s0"]["timed"] == {"step": 5.0, "steps": 4, "scale": 1.5}
    assert rows["second/based_s0"]["cpu_hours"] == pytest.approx(5.0 * 4 * 1.5 / 3600)
    # a kind whose step fails is said and left unpriced; the others are still priced
    def failing(spec):
        if spec.model.architecture == "based":
            raise RuntimeError("out of memory in the step")
        return 2.0
    monkeypatch.setattr(module, "median_step_seconds", failing)
    log = io.StringIO()
    rows = {r["run"]: r for r in estimate_left(queue, out, GRID, time_steps=True, log=log)}
    assert rows["second/based_s0"]["cpu_hours"] is None and rows["second/based_s0"]["timed"] is None
    assert "not timed: out of memory in the step" in log.getvalue()
    monkeypatch.setattr(module, "median_step_seconds", step_seconds)
    # without --time-steps nothing is timed
    timed.clear()
    assert estimate_left(queue, out, GRID)[2]["cpu_hours"] is None and timed == []

    assert mecheval(["queue", str(queue), "--out", str(out), "--dry-run", "--time-steps"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[2].endswith("~0.0 CPU h (timed: 5000 ms a step x 4 steps x 1.50)")
    assert printed[4] == "sweep second: 1 run left, about 0.0 CPU hours"
    assert printed[-1] == ("3 runs left: about 0.0 CPU hours for the 2 with a finished run like them (lr and seeds "
                           "aside), 0.0 for the 1 timed here (their steps x 1.50: what the finished runs took over "
                           "their timed steps)")
    assert mecheval(["queue", str(queue), "--out", str(out), "--time-steps"]) == 2
    assert "--time-steps goes with --dry-run" in capsys.readouterr().err


def test_a_timed_step_is_a_training_step_of_the_runs_own_model_and_task(tmp_path, two_sweeps):
    from hf_mecheval.tasks.presets import CPU_TRAIN
    from hf_mecheval.training.step_timing import median_step_seconds, run_steps, training_batches
    from hf_mecheval.training.spec import RunSpec

    spec = read_queue(queue_file(tmp_path, [{"sweep": two_sweeps[0]}]))[0].runs()[0].checked()
    assert run_steps(spec) == 4                                                   # max_steps
    epochs = RunSpec.from_values({"architecture": "based", "hidden_size": 16, "task": "ar_32", "train_size": 100,
                                  "num_train_epochs": 3, "per_device_train_batch_size": 32})
    assert run_steps(epochs) == 4 * 3                                             # ceil(100 / 32) a epoch
    # MQAR: batches of the preset's training mixture, padded to the longest document of each
    mqar = RunSpec.from_values({"architecture": "based", "hidden_size": 16, "task": "mqar_cpu",
                                "per_device_train_batch_size": 8})
    batches = training_batches(mqar, 6)
    assert len(batches) == 6 and all(b["input_ids"].shape[0] == 8 for b in batches)
    assert {b["input_ids"].shape[1] for b in batches} <= {length for length, _, _ in CPU_TRAIN}     # 64 or 128
    assert all(int((b["labels"] != -100).sum()) >= 8 * 4 for b in batches)       # 4 pairs or more a document
    seconds = median_step_seconds(spec, steps=2, warmup=1)
    assert 0 < seconds < 60


def test_until_starts_only_the_runs_that_end_in_time(tmp_path, two_sweeps, monkeypatch):
    """--until: a run's expected wall time is its steps left x its timed step (once per kind) x
    UNTIL_MARGIN; one that would end after the deadline is left for later and the lane goes on down
    the queue; a run half trained counts its half; the lane stops when nothing left fits."""
    from hf_mecheval.training import queue as module

    first, second = two_sweeps
    timed, trained = [], []

    def step_seconds(spec, threads):
        timed.append((spec.model.architecture, threads))
        return {"transformer": 10.0, "based": 100.0}[spec.model.architecture]

    def launch(sweep, out, **kwargs):
        trained.append(*kwargs["only"])
        return {"finished": [], "skipped": [], "in_use": [], "failed": []}
    monkeypatch.setattr(module, "step_wall_seconds", step_seconds)
    monkeypatch.setattr(module, "launch", launch)
    monkeypatch.setattr(module, "write_results", lambda sweep, out: None)
    # 4 steps each: Based 400 s x margin, the Transformer 40 s x margin; 200 s x margin to the deadline
    monkeypatch.setattr(module, "trained_fraction", lambda path: 0.5 if path.name == "transformer_lr0.01_s0" else 0.0)
    log = io.StringIO()
    until = time.time() + 200 * UNTIL_MARGIN
    outcome = run_queue(queue_file(tmp_path, [{"sweep": second}, {"sweep": first}]), tmp_path / "out", grid=GRID,
                        log=log, until=until)
    assert trained == ["transformer_lr0.01_s0", "transformer_lr1e-03_s0"]      # Based (first in the file) skipped
    assert timed == [("based", 1), ("transformer", 1)]                           # one timing per kind, at --threads
    assert outcome["later"] == ["second/based_s0"]
    assert "based_s0 left for later (~0.2 h expected, 0.1 h to " in log.getvalue()
    # a run started says what it should take, and at its end what it took beside that
    assert "queue: first: transformer_lr0.01_s0 (~0.0 h expected)" in log.getvalue()
    assert re.search(r"queue: first: 0 finished in 0\.00 h of ~0\.01 h expected", log.getvalue())
    pick = next_pick(read_queue(queue_file(tmp_path, [{"sweep": first}])), tmp_path / "out", GRID, set())
    seconds = module.expected_wall_seconds(pick, tmp_path / "out", {}, threads=2)
    pick.release()
    assert seconds == pytest.approx(10.0 * 4 * 0.5 * UNTIL_MARGIN)               # half trained: half its steps
    assert timed[-1] == ("transformer", 2)
    # nothing fits: nothing is trained, everything is left for later
    trained.clear()
    outcome = run_queue(queue_file(tmp_path, [{"sweep": second}, {"sweep": first}]), tmp_path / "out", grid=GRID,
                        log=log, until=time.time() + 1)
    assert trained == [] and len(outcome["later"]) == 3


def test_a_steps_wall_time_at_n_threads_is_its_cpu_seconds_at_n_shared_out(monkeypatch):
    import torch

    from hf_mecheval.training import step_timing

    seen = []

    def cpu_seconds(spec):                       # CPU seconds that grow with the threads, as they do
        seen.append(torch.get_num_threads())
        return 0.1 * torch.get_num_threads() ** 0.5

    monkeypatch.setattr(step_timing, "median_step_seconds", cpu_seconds)
    before = torch.get_num_threads()
    assert step_timing.step_wall_seconds(None, 2) == pytest.approx(0.1 * 2 ** 0.5 / 2)
    assert step_timing.step_wall_seconds(None, 1) == pytest.approx(0.1)
    assert seen == [2, 1] and torch.get_num_threads() == before


def test_until_parses_a_time_of_day_or_a_date_and_refuses_the_past(capsys):
    import datetime as dt

    from hf_mecheval.cli import _until

    now = dt.datetime(2026, 12, 4, 23, 0).timestamp()
    assert _until("23:30", now) == dt.datetime(2026, 12, 4, 23, 30).timestamp()
    assert _until("01:00", now) == dt.datetime(2026, 12, 5, 1, 0).timestamp()      # the next 01:00: tomorrow
    assert _until("2026-12-05T06:55", now) == dt.datetime(2026, 12, 5, 6, 55).timestamp()
    with pytest.raises(Exception, match="already past"):
        _until("2026-12-04T22:00", now)
    for bad in ("7pm", "25:00", "tomorrow"):
        with pytest.raises(Exception, match="expected HH:MM"):
            _until(bad, now)
    with pytest.raises(SystemExit) as stopped:
        mecheval(["queue", "queue.yaml", "--until", "soon"])
    assert stopped.value.code == 2 and "expected HH:MM" in capsys.readouterr().err
    assert mecheval(["queue", "queue.yaml", "--dry-run", "--until", "2999-01-01T00:00"]) == 2
    assert "--until goes without --dry-run" in capsys.readouterr().err
