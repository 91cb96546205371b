"""Sweep files, both launchers, skipping and resuming, and the results table."""
import dataclasses
import importlib.util
import json
import os
import re
import shlex
import sys
import threading
import time
from pathlib import Path

import pytest
import yaml

from hf_mecheval.cli import main as mecheval
from hf_mecheval.errors import ConfigError, MechEvalError
from hf_mecheval.runs import RunDir
from hf_mecheval.runs.files import GridSettings
from hf_mecheval.runs.run_dir import differences
from hf_mecheval.sweep_job import main as sweep_job_main
from hf_mecheval.training.command_line import values_as_flags
from hf_mecheval.training.jobs import Run, write_job_file
from hf_mecheval.training.run import train
from hf_mecheval.training.spec import RunSpec
from hf_mecheval.training.sweep import SWEEP_FILES, Sweep, is_sweep_file, launch, results_table, write_results

from test_training import StopAt

BASE = {"task_config": {"num_kv": 16, "num_pairs": 2}, "train_size": 64, "eval_size": 32, "max_steps": 6,
        "hidden_size": 16, "max_position_embeddings": 16, "eval_strategy": "no", "save_strategy": "steps",
        "save_steps": 3}


def tiny_sweep(**grid):
    return Sweep.from_dict({"name": "tiny", "task": "ar_32", "defaults": BASE,
                            "grids": [grid or {"architecture": ["transformer"], "learning_rate": [0.001, 0.01]}]})


def test_expansion_names_and_errors():
    sweep = Sweep.from_dict({"name": "s", "task": "ar_32",
                             "grids": [{"architecture": ["mamba"], "hidden_size": [16, 32],
                                        "learning_rate": [1e-3, 3e-4], "model_config": [{"conv_kernel": 0}, {}]},
                                       {"architecture": "transformer", "learning_rate": "1e-3"}],
                             "seeds": [0, 1]})
    assert len(sweep.runs) == 2 * 2 * 2 * 2 + 2
    assert len({r.name for r in sweep.runs}) == len(sweep.runs)
    assert "mamba_d16_lr1e-03_conv_kernel0_s0" in {r.name for r in sweep.runs}
    # "1e-3" is how YAML reads 1e-3 (a string): checked and typed like `mecheval train` would
    assert [r.args["learning_rate"] for r in sweep.runs if r.name.startswith("transformer")] == [1e-3, 1e-3]
    with pytest.raises(ConfigError, match="learning_rat"):
        Sweep.from_dict({"name": "s", "grids": [{"learning_rat": [1]}]})
    with pytest.raises(ConfigError, match="allowed: name"):
        Sweep.from_dict({"name": "s", "grid": []})


@pytest.mark.parametrize("spec, message", [
    ({"grids": [{"hidden_size": ["abc"]}]}, "hidden_size: invalid int value: 'abc'"),
    ({"grids": [{"hidden_size": [-4]}]}, "hidden_size: must be >= 1"),
    ({"grids": [{"architecture": ["h3"], "model_config": [{"conv_kernel": 0}]}]}, "unknown field 'conv_kernel' for h3"),
    ({"grids": [{"hidden_size": []}]}, "hidden_size: an empty list"),
    ({"grids": []}, "grids: an empty list"),
    ({"seeds": []}, "seeds: an empty list"),
    ({"seeds": "abc"}, "seed: invalid int value: 'abc'"),
    ({"defaults": [1, 2]}, "defaults: must be a mapping"),
    ({"name": "../../x"}, "name:"),
    ({"name": "/abs/path"}, "name:"),
])
def test_sweep_values_are_checked_when_the_sweep_loads(spec, message):
    with pytest.raises(MechEvalError, match=re.escape(message)):
        Sweep.from_dict({"name": "s", "task": "ar_32", **spec})


def test_learning_rates_name_runs_exactly():
    sweep = Sweep.from_dict({"name": "s", "task": "ar_32",
                             "grids": [{"learning_rate": [2.0e-3, 2.4e-3, 2.5e-3, 0.03, 0.01234561]}]})
    assert [r.name.split("_")[0] for r in sweep.runs] == ["lr2e-03", "lr2.4e-03", "lr2.5e-03", "lr0.03", "lr0.01234561"]


def test_results_table_picks_learning_rate_on_validation():
    rows = [  # lr 1e-3 wins on validation (mean .9 vs .8) although its test accuracy is lower
        {"architecture": "a", "learning_rate": 1e-3, "seed": 0, "validation_accuracy": 0.9, "test_accuracy": 0.70},
        {"architecture": "a", "learning_rate": 1e-3, "seed": 1, "validation_accuracy": 0.9, "test_accuracy": 0.80},
        {"architecture": "a", "learning_rate": 1e-2, "seed": 0, "validation_accuracy": 0.8, "test_accuracy": 0.99},
        {"architecture": "a", "learning_rate": 1e-2, "seed": 1, "validation_accuracy": 0.8, "test_accuracy": 0.99},
        {"architecture": "b", "learning_rate": 1e-2, "seed": 0, "validation_accuracy": 0.5, "test_accuracy": 0.4},
    ]
    table = {r["architecture"]: r for r in results_table(rows, ["architecture", "learning_rate", "seed"])}
    assert table["a"]["best_learning_rate"] == 1e-3
    assert table["a"]["test_accuracy_mean"] == pytest.approx(0.75)
    assert table["a"]["test_accuracy_sd"] == pytest.approx(0.0707107, rel=1e-5)   # sample sd of .7, .8
    assert table["a"]["seeds"] == 2 and table["a"]["learning_rates_tried"] == 2
    assert table["b"]["test_accuracy_sd"] == 0.0


def test_local_launcher_skips_finished_resumes_killed_and_reports_failures(tmp_path):
    sweep = tiny_sweep(architecture=["transformer"], learning_rate=[0.001, 0.01])
    # a run killed after its first checkpoint, as a dead worker leaves it
    killed = sweep.runs[1]
    run_dir = tmp_path / "tiny" / "runs" / killed.name
    with pytest.raises(KeyboardInterrupt):
        train(killed.checked().at(run_dir), callbacks=[StopAt(3)])
    outcome = launch(sweep, tmp_path, progress=False)
    assert sorted(outcome["finished"]) == sorted(r.name for r in sweep.runs) and not outcome["failed"]
    state = json.loads((run_dir / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    # resumed from its checkpoint, not trained again from the first step: two segments of training
    assert json.loads((run_dir / "metrics.json").read_text())["final"]["train_segments"] == 2
    again = launch(sweep, tmp_path, progress=False)
    assert again["finished"] == [] and sorted(again["skipped"]) == sorted(r.name for r in sweep.runs)
    root = write_results(sweep, tmp_path)
    table = json.loads((root / "results.json").read_text())["table"]
    assert len(table) == 1 and table[0]["learning_rates_tried"] == 2
    assert (root / "results.csv").exists() and "test accuracy" in (root / "results.md").read_text()
    assert all(is_sweep_file(root / name) for name in SWEEP_FILES)      # what it wrote, recognised as a sweep's
    # a person's note below the table makes results.md theirs: refused, kept, replaced only with overwrite
    noted = (root / "results.md").read_text() + "\nlr 1e-2: loss spikes at step 4, see the log\n"
    (root / "results.md").write_text(noted)
    with pytest.raises(MechEvalError, match=r"holds results\.md, which a sweep did not write.*--overwrite"):
        write_results(sweep, tmp_path)
    assert (root / "results.md").read_text() == noted
    write_results(sweep, tmp_path, overwrite=True)
    assert is_sweep_file(root / "results.md")
    # a run that fails once started (its documents are longer than its position table) fails alone
    bad = Sweep.from_dict({"name": "tiny", "task": "ar_32", "defaults": BASE,
                           "grids": [{"architecture": ["transformer"]},
                                     {"architecture": ["mamba"], "max_position_embeddings": [4]}]})
    outcome = launch(bad, tmp_path / "bad", progress=False)
    assert len(outcome["failed"]) == 1 and "mamba" in outcome["failed"][0]
    assert len(outcome["finished"]) == 1


@pytest.mark.parametrize("name, content", [
    ("results.md", "# my notes on this sweep\n"),
    ("results.csv", "architecture,accuracy\ntransformer,0.9\n"),
    ("results.json", '{"runs": [], "table": [], "mine": 1}'),
    ("sweep.json", '[{"name": "a", "args": {}, "note": "tried twice"}]'),
    ("sweep.json", None),         # a link, to a person's file elsewhere
])
def test_a_persons_file_named_as_a_sweeps_own_is_refused_before_any_run(tmp_path, capsys, name, content):
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "task": "ar_32", "defaults": BASE,
                                    "grids": [{"architecture": ["transformer"]}]}))
    root = tmp_path / "out" / "tiny"
    root.mkdir(parents=True)
    (root / "notes.txt").write_text("mine, beside the sweep's files\n")
    if content is None:
        (tmp_path / "elsewhere.json").write_text("[]")
        (root / name).symlink_to(tmp_path / "elsewhere.json")
    else:
        (root / name).write_text(content)
    before = {p.name: p.read_text() for p in root.iterdir()}
    assert mecheval(["sweep", str(path), "--out", str(tmp_path / "out"), "--workers", "1"]) == 2
    err = capsys.readouterr().err
    assert f"holds {name}, which a sweep did not write" in err and "--overwrite" in err and err.count("\n") == 1
    assert {p.name: p.read_text() for p in root.iterdir()} == before       # nothing trained, nothing replaced
    if content is None:
        assert (tmp_path / "elsewhere.json").read_text() == "[]"


def test_each_run_is_evaluated_as_soon_as_it_finishes(tmp_path):
    sweep = tiny_sweep(architecture=["transformer", "mamba"], learning_rate=[0.01])
    outcome = launch(sweep, tmp_path, progress=False, grid=GridSettings(n=8, resamples=10), workers=1)
    assert len(outcome["finished"]) == 2 and not outcome["failed"]
    for run in sweep.runs:
        run_dir = tmp_path / "tiny" / "runs" / run.name
        result = json.loads((run_dir / "interventions" / "interventions.json").read_text())
        assert result["examples"] == 8 and result["mechanism"]["label"]
        # training and the grid in one process (hf_mecheval/sweep_job.py), which says what it ran
        log = (tmp_path / "tiny" / "runs" / f"{run.name}.log").read_text()
        assert log.count("\n=== ") + log.startswith("=== ") == 2, log[:2000]
        assert f"-m hf_mecheval.sweep_job {tmp_path / 'tiny' / 'runs' / run.name}.job.json" in log
        assert f"=== mecheval evaluate {run_dir} -n 8" in log
        assert "interventions (key corrupted)" not in log      # no progress bars in a log file
        # command.txt names the `mecheval train` command that trains the same run again
        command = shlex.split((run_dir / "command.txt").read_text())
        assert command[:2] == ["mecheval", "train"]
        assert differences(json.loads((run_dir / "run.json").read_text()), RunSpec.from_flags(command[2:]).record) == []
        # the grid does not depend on what training left in the process: a separate
        # `mecheval evaluate` writes the same results
        assert mecheval(["evaluate", str(run_dir), "-n", "8", "--resamples", "10", "--out",
                         str(tmp_path / run.name)]) == 0
        alone = json.loads((tmp_path / run.name / "interventions.json").read_text())
        where_and_cost = {"run", "seconds"}         # where it ran and the clock's reading differ by nature
        assert ({k: v for k, v in alone.items() if k not in where_and_cost}
                == {k: v for k, v in result.items() if k not in where_and_cost})
    # the grid records its settings: the same ones reuse it, others make it again
    grids = [tmp_path / "tiny" / "runs" / r.name / "interventions" / "interventions.json" for r in sweep.runs]
    assert json.loads(grids[0].read_text())["settings"] == {"n": 8, "split": "test", "seed": 0, "sites": None,
                                                            "resamples": 10}
    made = [g.stat().st_mtime_ns for g in grids]
    outcome = launch(sweep, tmp_path, progress=False, grid=GridSettings(n=8, resamples=10), workers=1)
    assert outcome["skipped"] == [r.name for r in sweep.runs] and [g.stat().st_mtime_ns for g in grids] == made
    outcome = launch(sweep, tmp_path, progress=False, grid=GridSettings(n=12, resamples=10), workers=1)
    assert not outcome["failed"] and all(json.loads(g.read_text())["examples"] == 12 for g in grids)


def test_mecheval_sweep_makes_the_grid_only_when_asked(tmp_path, capsys):
    file = tmp_path / "tiny.yaml"
    file.write_text(yaml.safe_dump({"name": "tiny", "task": "ar_32", "defaults": BASE,
                                    "grids": [{"architecture": ["transformer"], "learning_rate": [0.01]}]}))
    flags = ["--workers", "1", "--out", str(tmp_path / "out")]
    run_dir = tmp_path / "out" / "tiny" / "runs" / "transformer_s0"
    assert mecheval(["sweep", str(file), *flags]) == 0
    assert RunDir(run_dir).finished and not (run_dir / "interventions").exists()
    assert mecheval(["sweep", str(file), "-n", "8", *flags]) == 2          # -n alone asks for nothing
    assert "-n goes with --grid" in capsys.readouterr().err
    # --grid evaluates the run trained before it, without training it again
    assert mecheval(["sweep", str(file), "--grid", "-n", "8", *flags]) == 0
    result = json.loads((run_dir / "interventions" / "interventions.json").read_text())
    assert result["examples"] == 8 and result["settings"]["n"] == 8 and result["mechanism"]["label"]
    assert json.loads((run_dir / "trainer_state.json").read_text())["global_step"] == BASE["max_steps"]


def test_sweep_job_arguments(tmp_path, capsys):
    assert sweep_job_main(["--oops"]) == 2
    assert "usage: python -m hf_mecheval.sweep_job JOB.json" in capsys.readouterr().err
    job = write_job_file(tmp_path / "a.job.json", Run("a", {"task": "ar_32"}), tmp_path, None, None)
    assert sweep_job_main([str(job), "--resume", "--overwrite"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_sweep_job_runs_no_grid_after_a_failed_training(tmp_path, capsys):
    args = {**BASE, "task": "ar_32", "architecture": "transformer", "max_position_embeddings": 4}   # too few positions
    job = write_job_file(tmp_path / "r.job.json", Run("r", args), tmp_path, None, GridSettings(n=8))
    assert sweep_job_main([str(job)]) == 2
    captured = capsys.readouterr()
    assert "position embeddings" in captured.err and "=== mecheval evaluate" not in captured.out


def test_a_job_file_is_checked_before_anything_starts(tmp_path, capsys):
    from hf_mecheval.training.run import main as train_main

    good = {"name": "a", "output_dir": str(tmp_path / "a"), "args": {"task": "ar_32"}}
    for content, message in [
            ({"runs": []}, "lists no runs"),
            ({"runs": [good], "extra": 1}, "must be an object with the key runs"),
            ({"runs": [good, {**good, "name": "b"}]}, "needs a stack_dir"),
            ({"runs": [{**good, "args": {"architecture": "no_such_mixer"}}]}, "run a: architecture"),
            ({"runs": [good], "grid": {"n": -1}}, "grid"),
            ({"runs": [{**good, "args": {"learning_rat": 1}}]}, "did you mean 'learning_rate'")]:
        path = tmp_path / "job.json"
        path.write_text(json.dumps(content))
        assert train_main(["--job", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err, (content, err)
    assert not (tmp_path / "a").exists()


def test_sweep_command(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(json.dumps({"name": "cli", "task": "ar_32", "defaults": BASE,
                                "grids": [{"architecture": ["mamba"], "learning_rate": [0.01, 0.001]}]}))
    assert mecheval(["sweep", str(path), "--out", str(tmp_path), "--dry-run"]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "2 runs"
    # --only picks runs by name; --threads sets the threads of each training process
    assert mecheval(["sweep", str(path), "--out", str(tmp_path), "--dry-run", "--only", "*_lr0.01_*"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "mamba_lr0.01_s0 " + " ".join(values_as_flags(Sweep.load(path).runs[0].args)), "1 runs"]
    assert mecheval(["sweep", str(path), "--out", str(tmp_path), "--only", "mamba_lr0.01_s0", "--workers", "1",
                     "--threads", "1"]) == 0
    assert "1 runs finished, 0 already done, 0 failed" in capsys.readouterr().out
    runs = tmp_path / "cli" / "runs"
    assert json.loads((runs / "mamba_lr0.01_s0" / "metrics.json").read_text())["final"]["threads"] == 1
    assert not (runs / "mamba_lr1e-03_s0").exists()
    assert len(json.loads((tmp_path / "cli" / "sweep.json").read_text())) == 2     # the record: the whole sweep
    # a pattern that matches nothing is refused, naming the flag, before anything starts
    assert mecheval(["sweep", str(path), "--out", str(tmp_path), "--only", "mamba_lr1e-04_*"]) == 2
    assert "only: 'mamba_lr1e-04_*' matches no run of sweep cli" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mecheval(["sweep", str(path), "--threads", "0"])


def _ray_servers() -> dict[int, str]:
    """pid -> command of the Ray cluster's server processes running now (GCS and raylet)."""
    found = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            argv0 = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0].decode()
        except OSError:
            continue
        if Path(argv0).name in ("gcs_server", "raylet"):
            found[int(pid)] = Path(argv0).name
    return found


def _listening_socket_inodes() -> set[str]:
    """Inodes of the TCP sockets listening in this process's network namespace (any address)."""
    inodes = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":                    # TCP_LISTEN
                inodes.add(fields[9])
    return inodes


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        target = os.readlink(fd)
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    return inodes


@pytest.mark.skipif(importlib.util.find_spec("ray") is None or not sys.platform.startswith("linux"),
                    reason="Ray is not installed (the [ray] extra); the local launcher is tested above")
def test_ray_launcher_runs_a_two_run_sweep_closed_to_the_network(tmp_path):
    """A local Ray cluster listens on every interface whatever it is told; the launcher starts it
    in a loopback-only network namespace. Watched from here while the sweep runs, its servers
    listen on nothing this machine's network reaches, and see no interface but loopback."""
    from hf_mecheval import closed_network

    sweep = tiny_sweep(architecture=["mamba"], learning_rate=[0.001, 0.01])
    problem = closed_network.unavailable()
    if problem:      # user namespaces disabled: refused, naming the ways round it, before anything runs
        with pytest.raises(MechEvalError, match="--launcher local.*RAY_ADDRESS"):
            launch(sweep, tmp_path, launcher="ray", workers=2, progress=False)
        assert not (tmp_path / "tiny" / "runs" / sweep.runs[0].name).exists()
        return
    seen, done = {}, threading.Event()

    def watch():
        while not done.is_set():
            listening = _listening_socket_inodes()
            for pid, name in _ray_servers().items():
                try:
                    seen.setdefault((pid, name), set())
                    seen[(pid, name)] |= {"lo" if closed_network.interfaces(pid) == ["lo"] else "network"}
                    if _socket_inodes(pid) & listening:
                        seen[(pid, name)].add("listens here")
                except OSError:      # it ended meanwhile
                    pass
            time.sleep(0.1)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        outcome = launch(sweep, tmp_path, launcher="ray", workers=2, progress=False)
    finally:
        done.set()
        watcher.join()
    assert sorted(outcome["finished"]) == sorted(r.name for r in sweep.runs), outcome
    assert {name for _, name in seen} == {"gcs_server", "raylet"}, seen
    assert all(states == {"lo"} for states in seen.values()), seen
    root = write_results(sweep, tmp_path)
    table = json.loads((root / "results.json").read_text())["table"]
    assert len(table) == 1 and table[0]["learning_rates_tried"] == 2 and table[0]["seeds"] == 1


def test_the_reference_sweep_files_are_valid():
    from pathlib import Path

    files = sorted((Path(__file__).resolve().parents[2] / "hf_mecheval" / "training" / "sweeps").rglob("*.yaml"))
    assert len(files) >= 11
    for path in files:
        sweep = Sweep.load(path)
        assert sweep.runs and len({r.name for r in sweep.runs}) == len(sweep.runs)


def test_workers_auto_is_one_single_threaded_process_per_core_on_a_cpu(monkeypatch):
    import os

    from hf_mecheval.training.launchers import plan_workers

    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    real_sysconf = os.sysconf

    def free_gib(gib):          # what is free on this machine right now must not decide the test
        monkeypatch.setattr(os, "sysconf", lambda name: gib * 2**18 if name == "SC_AVPHYS_PAGES" else
                            (4096 if name == "SC_PAGE_SIZE" else real_sysconf(name)))

    free_gib(64)
    assert plan_workers("auto") == (4, 1, [None] * 4)
    assert plan_workers(2) == (2, 2, [None, None])
    assert plan_workers(8) == (8, 1, [None] * 8)
    # memory bounds auto: 7 GiB free holds two processes of PROCESS_MEMORY_GIB = 3
    free_gib(7)
    assert plan_workers("auto") == (2, 2, [None, None])
    for bad in (0, -1, "3", 1.5, True):
        with pytest.raises(ConfigError, match="workers"):
            plan_workers(bad)
    # threads given: as many per process, whatever the cores
    assert plan_workers(1, threads=1) == (1, 1, [None])
    assert plan_workers(2, threads=3) == (2, 3, [None, None])
    for bad in (0, 1.5, True):
        with pytest.raises(ConfigError, match="threads"):
            plan_workers(1, threads=bad)


def test_workers_flag_takes_auto_or_a_positive_number(capsys):
    for bad in ("many", "0"):
        with pytest.raises(SystemExit) as exit_:
            mecheval(["sweep", "nowhere.yaml", "--workers", bad])
        assert exit_.value.code == 2
        assert "expected 'auto' or a positive integer" in capsys.readouterr().err


def test_a_sweep_edited_under_the_same_name_refuses_its_old_runs(tmp_path):
    sweep = tiny_sweep(architecture=["mamba"], learning_rate=[0.01])
    assert not launch(sweep, tmp_path, progress=False, workers=1)["failed"]
    run_dir = tmp_path / "tiny" / "runs" / sweep.runs[0].name
    finished = (run_dir / "metrics.json").read_text()
    edited = Sweep.from_dict({"name": "tiny", "task": "ar_32", "defaults": {**BASE, "train_size": 96},
                              "grids": [{"architecture": ["mamba"], "learning_rate": [0.01]}]})
    with pytest.raises(MechEvalError, match=r"cannot reuse .*task.train_size: 64 there, 96 asked"):
        launch(edited, tmp_path, progress=False, workers=1)
    assert (run_dir / "metrics.json").read_text() == finished
    # a damaged metrics.json is named before anything starts, not met when the table is written
    (run_dir / "metrics.json").write_text(finished[:30])
    with pytest.raises(MechEvalError, match="metrics.json is not valid JSON"):
        launch(sweep, tmp_path, progress=False, workers=1)


def test_a_run_directory_in_use_is_left_alone_with_its_log(tmp_path):
    import fcntl
    import os

    from hf_mecheval.training.jobs import execute

    run = tiny_sweep().runs[0]
    runs_dir = tmp_path / "runs"
    (runs_dir / run.name).mkdir(parents=True)
    (runs_dir / f"{run.name}.log").write_text("the running child's log\n")
    fd = os.open(runs_dir / run.name, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)          # a training child of a killed sweep, still at work
        result = execute(run, str(runs_dir), threads=1)
    finally:
        os.close(fd)
    assert result["returncode"] != 0 and "in use" in result["log"] and result["in_use"]
    assert (runs_dir / f"{run.name}.log").read_text() == "the running child's log\n"
    assert list((runs_dir / run.name).iterdir()) == []


def test_a_sweep_leaves_runs_in_use_to_their_process_and_says_so(tmp_path, capsys):
    # two sweeps over one folder (e.g. one more process on a free core): the second one reports
    # the run the first is training as left to it, not as failed, and exits 0
    import yaml

    from hf_mecheval.cli import main
    from hf_mecheval.locks import locked_folder

    sweep_file = tmp_path / "s.yaml"
    sweep_file.write_text(yaml.safe_dump({"name": "tiny", "task": "ar_32", "defaults": BASE,
                                          "grids": [{"architecture": "transformer", "learning_rate": [1e-3, 1e-2]}]}))
    run = Sweep.load(sweep_file).runs[0]
    with locked_folder(tmp_path / "out" / "tiny" / "runs" / run.name):    # the first sweep's training child
        code = main(["sweep", str(sweep_file), "--out", str(tmp_path / "out"), "--workers", "1",
                     "--only", run.name])
    out, err = capsys.readouterr()
    assert code == 0
    assert "0 runs finished, 0 already done, 1 left to another process training them, 0 failed" in out
    assert f"in use: {run.name} is being trained by another process" in err and "failed:" not in err


@pytest.mark.skipif(not __import__("sys").platform.startswith("linux"), reason="reads /proc")
def test_a_sweep_killed_with_sigkill_takes_its_training_down(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    spec = {"name": "slow", "task": "ar_32", "defaults": {**BASE, "max_steps": 100000, "save_strategy": "no"},
            "grids": [{"architecture": ["transformer"]}]}
    (tmp_path / "s.yaml").write_text(json.dumps(spec))
    sweep = subprocess.Popen([sys.executable, "-m", "hf_mecheval.cli", "sweep", str(tmp_path / "s.yaml"), "--out",
                              str(tmp_path), "--workers", "1"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = str(tmp_path / "slow" / "runs")

    def trainings():
        found = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = open(f"/proc/{pid}/cmdline", "rb").read().decode(errors="replace")
                state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if "hf_mecheval.training.run" in cmdline and marker in cmdline and state != "Z":
                found.append(int(pid))
        return found

    try:
        deadline = time.time() + 120
        while not list((tmp_path / "slow" / "runs").glob("*/run.json")):
            assert time.time() < deadline and sweep.poll() is None
            time.sleep(0.2)
        assert trainings()
        sweep.send_signal(signal.SIGKILL)
        sweep.wait()
        deadline = time.time() + 30
        while trainings() and time.time() < deadline:
            time.sleep(0.2)
        assert not trainings()
    finally:
        sweep.kill()
        for pid in trainings():
            os.kill(pid, signal.SIGKILL)


def test_an_absurd_sweep_is_refused_at_once_even_for_a_dry_run(tmp_path, capsys):
    import time

    path = tmp_path / "huge.yaml"
    path.write_text(json.dumps({"name": "huge", "task": "ar_32", "grids": [{"learning_rate": [1e-4 * (i + 1) for i in
                                                                                           range(1000)]}],
                                "seeds": list(range(1000))}))
    started = time.perf_counter()
    assert mecheval(["sweep", str(path), "--dry-run"]) == 2
    assert "1,000,000 runs" in capsys.readouterr().err and time.perf_counter() - started < 10
    path.write_text("name: n\ntask: ar_32\ngrids:\n  - learning_rate: [.nan]\n")
    assert mecheval(["sweep", str(path), "--dry-run"]) == 2
    assert "learning_rate[0] is not a finite number" in capsys.readouterr().err
    path.write_bytes(bytes(range(256)))
    assert mecheval(["sweep", str(path), "--dry-run"]) == 2
    assert "cannot read sweep file" in capsys.readouterr().err


@pytest.mark.parametrize("sweep, folder", [("reference/ar", "ref_ar"), ("reference/ar_ablations", "ref_ablations"),
                                           ("reference/atr", "ref_atr")])
def test_the_earlier_reference_sweeps_still_ask_for_their_committed_runs(sweep, folder):
    """The committed reference runs were made under hf-mecheval's earlier rule (N(0, 0.02) init,
    clipping at 1, Hyena's and BaseConv's first long convolutions) before the fields that now
    choose it existed; their sweep files pin that rule, so a resumed sweep reuses every finished
    run. Without the pins it refuses, naming what differs."""
    from pathlib import Path

    from hf_mecheval.training.sweep import check_existing_runs

    runs_dir = Path(__file__).resolve().parents[2] / "results" / "reference" / folder / "runs"
    loaded = Sweep.load(sweep)
    finished = [r for r in loaded.runs if (runs_dir / r.name / "metrics.json").exists()]
    assert len(finished) >= 8
    check_existing_runs(loaded.runs, runs_dir)
    for pin, why in (("mixer_forms", "form"), ("init_scheme", "init_scheme"), ("max_grad_norm", "max_grad_norm")):
        unpinned = [dataclasses.replace(r, args={k: v for k, v in r.args.items() if k != pin}) for r in finished]
        if pin == "mixer_forms" and not any(r.args["architecture"] in ("hyena", "baseconv", "based") for r in finished):
            continue
        with pytest.raises(MechEvalError, match=f"trained with other arguments — .*{why}"):
            check_existing_runs(unpinned, runs_dir)


def test_a_sweep_file_anchor_bomb_is_refused_before_it_is_walked(tmp_path):
    from hostile_inputs import BOMB

    path = tmp_path / "bomb.yaml"
    path.write_text("name: bomb\ntask: ar_32\n" + BOMB.replace("a:", "x_a:", 1).replace("\nb:", "\nx_b:"))
    started = time.monotonic()
    with pytest.raises(MechEvalError, match="more than 100,000 values"):
        Sweep.load(path)
    assert time.monotonic() - started < 30


def test_a_run_whose_grid_fails_is_reported_failed_and_keeps_its_training(tmp_path):
    sweep = tiny_sweep(architecture=["transformer"], learning_rate=[0.01])
    grid = GridSettings(n=8, resamples=10, sites=("layers.9.no_such_site",))
    outcome = launch(sweep, tmp_path, progress=False, grid=grid, workers=1)
    (name,) = [r.name for r in sweep.runs]
    assert outcome["finished"] == [] and len(outcome["failed"]) == 1
    assert outcome["failed"][0].startswith(f"{name} (trained; its intervention grid failed: exit 2")
    assert (tmp_path / "tiny" / "runs" / name / "metrics.json").exists()


def test_a_run_that_failed_stays_failed_in_every_later_summary(tmp_path, capsys):
    """A diverged run is not trained again (it would diverge again), and a sweep run again still
    reports it failed and exits 1, until its folder is removed and it is retrained."""
    sweep = tiny_sweep(architecture=["transformer"], learning_rate=[0.001])
    run_dir = tmp_path / "tiny" / "runs" / sweep.runs[0].name
    assert launch(sweep, tmp_path, progress=False)["finished"]
    metrics = json.loads((run_dir / "metrics.json").read_text())
    metrics["final"]["failed"] = "it diverged: non-finite gradients from step 3"
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    for _ in range(2):
        outcome = launch(sweep, tmp_path, progress=False)
        assert not outcome["skipped"] and not outcome["finished"]
        assert len(outcome["failed"]) == 1 and "diverged" in outcome["failed"][0], outcome
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"name": "tiny", "task": "ar_32", "defaults": BASE,
                                    "grids": [{"architecture": ["transformer"], "learning_rate": [0.001]}]}))
    capsys.readouterr()
    assert mecheval(["sweep", str(path), "--out", str(tmp_path)]) == 1
    assert "1 failed" in capsys.readouterr().out
