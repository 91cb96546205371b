"""One job of a sweep: a run, or a stack of runs trained together, run as its own process.

``execute`` is what both launchers (``launchers.py``) call for each job: it writes the job file,
starts the process that trains it (``python -m hf_mecheval.training.run --job JOB.json``, or
``python -m hf_mecheval.sweep_job JOB.json``, which then makes the intervention grid the file
asks for), resumes a run a killed worker left with a complete checkpoint, leaves alone a run
folder another process holds, and appends the process's output to the job's log. The process
keeps ``NAME.progress.json`` beside the job file up to date (``progress.py``: what the sweep
shows of the job in flight).

A job file (``NAME.job.json`` beside the job's log)::

    {"runs": [{"name": "mamba_lr1e-03_s0", "output_dir": "runs/mamba_lr1e-03_s0",
               "args": {"architecture": "mamba", "learning_rate": 0.001, "seed": 0, ...}}, ...],
     "stack_dir": "stacks/mamba_lr1e-03_s0+2-0123456789",   # several runs: trained as one stack
     "grid": {"n": 320, "split": "test", "seed": null, "sites": null, "resamples": 1000}}   # or null

Each run's ``args`` are read as ``mecheval train`` reads the same flags (``RunSpec.from_values``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any

from ..children import run_child
from ..errors import ConfigError, MechEvalError
from ..atomic_files import write_text_atomic
from ..inputs import check_path, loads_finite
from ..locks import locked_folder
from ..runs import RunDir
from ..runs.run_dir import checkpoint_problem, checkpoints
from ..runs.files import GridSettings
from .progress import progress_path
from .spec import RunSpec


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    args: dict[str, Any]          # training arguments of this run (no output_dir)
    # the run checked, built from ``args`` once (``Sweep`` builds it as it reads the file): not an
    # argument, so that a Run made with other args (dataclasses.replace) never keeps a stale one
    spec: RunSpec | None = dataclasses.field(default=None, init=False, compare=False, repr=False)

    @staticmethod
    def checked_run(name: str, args: dict[str, Any], spec: RunSpec) -> "Run":
        """A run whose ``spec`` was already built from ``args``."""
        run = Run(name, args)
        object.__setattr__(run, "spec", spec)
        return run

    def checked(self) -> RunSpec:
        if self.spec is None:
            object.__setattr__(self, "spec", RunSpec.from_values(self.args, f"run {self.name}"))
        return self.spec

    def run_names(self) -> list[str]:
        return [self.name]


@dataclasses.dataclass(frozen=True)
class Stack:
    """Runs trained together (``training/stacked.py``); ``name`` depends on exactly its members."""
    name: str
    runs: tuple[Run, ...]

    def run_names(self) -> list[str]:
        return [r.name for r in self.runs]


def resumable(folder: Path) -> bool:
    return any(checkpoint_problem(c) is None for c in checkpoints(folder))


def _restart_flags(checkpoint_dir: Path, *touched: Path) -> list[str]:
    """--resume where a killed worker left a complete checkpoint; --overwrite where it started
    (any of the directories exists) but never completed one: there is nothing to keep."""
    if resumable(checkpoint_dir):
        return ["--resume"]
    return ["--overwrite"] if any(d.exists() for d in (checkpoint_dir, *touched)) else []


@dataclasses.dataclass(frozen=True)
class Job:
    """A job file, read: each run checked (``RunSpec``), as given (``values``) for command.txt."""
    path: Path
    runs: list[tuple[str, RunSpec]]
    values: list[dict]
    stack_dir: Path | None
    grid: GridSettings | None


JOB_KEYS = ("runs", "stack_dir", "grid")


def write_job_file(path: Path, job: Run | Stack, runs_dir: Path, stack_dir: Path | None,
                   grid: GridSettings | None) -> Path:
    # a sweep's runs print no progress bars into their logs, unless a run asks for them
    runs = [{"name": r.name, "output_dir": str(runs_dir / r.name), "args": {"disable_tqdm": True, **r.args}}
            for r in (job.runs if isinstance(job, Stack) else (job,))]
    content = {"runs": runs, "stack_dir": None if stack_dir is None else str(stack_dir),
               "grid": None if grid is None else dataclasses.asdict(grid)}
    write_text_atomic(path, json.dumps(content, indent=2, default=str) + "\n", overwrite=True)
    return path


def read_job_file(path: str | Path) -> Job:
    """A job file (see the module docstring), every run checked as ``mecheval train`` checks it."""
    try:
        content = loads_finite(Path(path).read_text(), str(path))
    except (OSError, ValueError) as exc:          # ValueError: not UTF-8 text, not JSON
        raise MechEvalError(f"cannot read the job file {path}: {(str(exc).splitlines() or [''])[0]}") from None
    if not isinstance(content, dict) or not set(content) <= set(JOB_KEYS) or not isinstance(content.get("runs"), list):
        raise ConfigError("job", f"{path} must be an object with the key runs (a list), and optionally stack_dir "
                                 "and grid")
    stack_dir = content.get("stack_dir")
    if stack_dir is not None and (not isinstance(stack_dir, str) or not stack_dir):
        raise ConfigError("stack_dir", f"{path}: the stack's folder must be a folder name, got {stack_dir!r}")
    if stack_dir is not None:
        check_path("stack_dir", stack_dir)
    if not content["runs"]:
        raise ConfigError("runs", f"{path} lists no runs")
    if stack_dir is None and len(content["runs"]) > 1:
        raise ConfigError("stack_dir", f"{path} lists {len(content['runs'])} runs: several runs train as one stack, "
                                       "which needs a stack_dir")
    runs, values = [], []
    for i, run in enumerate(content["runs"]):
        if not isinstance(run, dict) or set(run) != {"name", "output_dir", "args"}:
            raise ConfigError("runs", f"entry {i} of {path} must have exactly the keys name, output_dir, args")
        for key in ("name", "output_dir"):
            if not isinstance(run[key], str) or not run[key]:
                raise ConfigError(key, f"entry {i} of {path}: {key} must be a non-empty string, got {run[key]!r}")
        check_path("output_dir", run["output_dir"])
        if not isinstance(run["args"], dict):
            raise ConfigError("runs", f"the args of entry {i} of {path} must be an object of argument names to values")
        given = {**run["args"], "output_dir": run["output_dir"]}
        runs.append((run["name"], RunSpec.from_values(given, f"{path}, run {run['name']}")))
        values.append(run["args"])
    grid = content.get("grid")
    try:
        grid = None if grid is None else GridSettings.from_record(grid)
    except (TypeError, ValueError) as exc:
        raise ConfigError("grid", f"{path}: {exc}") from None
    return Job(Path(path), runs, values, None if stack_dir is None else Path(stack_dir), grid)


def job_log(job: Run | Stack, runs_dir: Path) -> Path:
    """A job's log: ``runs/NAME.log``, or for a stack ``stacks/NAME.log`` beside ``runs/``."""
    return (runs_dir.parent / "stacks" if isinstance(job, Stack) else runs_dir) / f"{job.name}.log"


def job_file_path(job: Run | Stack, runs_dir: Path) -> Path:
    """A job's file, beside its log (its progress file too: ``progress.progress_path``)."""
    return job_log(job, runs_dir).with_name(f"{job.name}.job.json")


def execute(job: Run | Stack, runs_dir: str, threads: int, device: str | None = None,
            grid: GridSettings | None = None) -> dict:
    """Run one training process (a run, or a stack of runs) with ``threads`` CPU threads (and only
    GPU ``device`` visible, when given) which, unless ``grid`` is None, then makes the intervention grid on each of its finished runs that has none with
    those settings (``hf_mecheval/sweep_job.py``); returns {"name", "runs", "returncode", "log"}.
    Used by both launchers. The process runs in its own process group and stops when this one
    dies (``children.run_child``); its output is appended to the log, after a line with the time
    and the command."""
    runs_dir = Path(runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    # threads sleep when they wait (unless the environment says otherwise): beside other work, a
    # training whose threads spin for each other loses half its speed (benchmarks/bench_busy_machine.py)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads),
           "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    log = job_log(job, runs_dir)
    if isinstance(job, Stack):
        stack_dir = runs_dir.parent / "stacks" / job.name
        folders = [stack_dir, *(runs_dir / r.name for r in job.runs)]
    else:
        stack_dir, folders = None, [runs_dir / job.name]
    busy = _in_use(folders)
    if busy:    # another process (a second sweep, or one killed before it could stop its children) writes there
        return {"name": job.name, "runs": job.run_names(), "returncode": 2, "in_use": True,
                "log": f"{busy} is in use by another process; its log was left alone"}
    trained = all(RunDir(runs_dir / name).finished for name in job.run_names())   # only its grid is missing
    if trained and grid is None:
        return {"name": job.name, "runs": job.run_names(), "returncode": 0, "log": str(log)}
    log.parent.mkdir(parents=True, exist_ok=True)
    job_file = write_job_file(job_file_path(job, runs_dir), job, runs_dir, stack_dir, grid)
    progress_path(job_file).unlink(missing_ok=True)      # an earlier sweep's: this job has not started yet
    restart = [] if trained else _restart_flags(folders[0], *folders[1:])
    if grid is None:
        cmd = [sys.executable, "-m", "hf_mecheval.training.run", "--job", str(job_file), *restart]
    else:
        # one process trains, then makes the grid (hf_mecheval/sweep_job.py): a second process
        # would import torch and transformers again, ~8 s on a 2-core machine
        cmd = [sys.executable, "-m", "hf_mecheval.sweep_job", str(job_file), *restart]
    started = time.monotonic()
    with open(log, "a") as handle:
        returncode = _logged_child(cmd, handle, env)
    return {"name": job.name, "runs": job.run_names(), "returncode": returncode, "log": str(log),
            "seconds": round(time.monotonic() - started, 1)}


def _logged_child(cmd: list[str], handle, env: dict) -> int:
    """Run ``cmd`` (see ``children.run_child``) with its output appended to the open log
    ``handle``, after a line with the time and the command."""
    handle.write(f"=== {time.strftime('%Y-%m-%d %H:%M:%S')} {shlex.join(cmd)}\n")
    handle.flush()
    return run_child(cmd, handle, env)


def _in_use(folders: list[Path]) -> Path | None:
    """The first of ``folders`` whose lock another process holds, or None."""
    for folder in folders:
        if folder.is_dir():
            try:
                with locked_folder(folder):
                    pass
            except MechEvalError:
                return folder
    return None


def job_record(job: Run | Stack) -> dict:
    """``job`` as JSON-ready data, for a process that runs it elsewhere (``job_from_record``)."""
    if isinstance(job, Stack):
        return {"name": job.name, "runs": [{"name": r.name, "args": r.args} for r in job.runs]}
    return {"name": job.name, "args": job.args}


def job_from_record(record: dict) -> Run | Stack:
    if "runs" in record:
        return Stack(record["name"], tuple(Run(r["name"], r["args"]) for r in record["runs"]))
    return Run(record["name"], record["args"])
