"""One job of a sweep: a run, or a stack of runs trained together, run as its own process.

``execute`` is what both launchers (``launchers.py``) call for each job: it builds the training
command (``python -m hf_mecheval.training.run``, followed by the intervention grid through
``hf_mecheval/sweep_job.py`` when asked), resumes a run a killed worker left with a complete
checkpoint, leaves alone a run folder another process holds, and appends the process's output to
the job's log.
"""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from ..children import run_child
from ..errors import MechEvalError
from ..io_utils import locked_folder, write_text_atomic
from ..runs import RunDir
from ..runs.run_dir import checkpoint_problem, checkpoints
from .command_line import as_flags


@dataclasses.dataclass(frozen=True)
class Run:
    name: str
    args: dict[str, Any]          # training arguments of this run (no output_dir)

    def flags(self) -> list[str]:
        return as_flags(self.args)

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


def _training_flags(run: Run, run_dir: Path) -> list[str]:
    """``python -m hf_mecheval.training.run``'s flags for ``run``."""
    return [*run.flags(), "--output_dir", str(run_dir), "--disable_tqdm", "true", *_restart_flags(run_dir)]


def _stack_flags(stack: Stack, runs_dir: Path, stack_dir: Path) -> list[str]:
    """``python -m hf_mecheval.training.run``'s flags for ``stack`` (its spec file, written here)."""
    spec = {"output_dir": str(stack_dir),
            "runs": [{"name": r.name, "output_dir": str(runs_dir / r.name), "args": r.args} for r in stack.runs]}
    spec_path = stack_dir.parent / f"{stack.name}.json"
    write_text_atomic(spec_path, json.dumps(spec, indent=2, default=str) + "\n", overwrite=True)
    return ["--stack", str(spec_path), *_restart_flags(stack_dir, *(runs_dir / r.name for r in stack.runs))]


def execute(job: Run | Stack, runs_dir: str, threads: int, device: str | None = None,
            evaluate: Sequence[str] | None = None) -> dict:
    """Run one training process (a run, or a stack of runs) with ``threads`` CPU threads (and only
    GPU ``device`` visible, when given) which, unless ``evaluate`` is None, then runs the
    intervention grid (``mecheval evaluate RUN *evaluate``) on each of its finished runs that has
    none yet (``hf_mecheval/sweep_job.py``); returns {"name", "runs", "returncode", "log"}. Used
    by both launchers. The process runs in its own process group and stops when this one dies
    (``children.run_child``); its output is appended to the log, after a line with the time and
    the command."""
    runs_dir = Path(runs_dir)
    runs_dir.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    if device is not None:
        env["CUDA_VISIBLE_DEVICES"] = device
    if isinstance(job, Stack):
        stack_dir = runs_dir.parent / "stacks" / job.name
        folders = [stack_dir, *(runs_dir / r.name for r in job.runs)]
        log = runs_dir.parent / "stacks" / f"{job.name}.log"
    else:
        folders, log = [runs_dir / job.name], runs_dir / f"{job.name}.log"
    busy = _in_use(folders)
    if busy:    # another process (a second sweep, or one killed before it could stop its children) writes there
        return {"name": job.name, "runs": job.run_names(), "returncode": 2, "in_use": True,
                "log": f"{busy} is in use by another process; its log was left alone"}
    trained = all(RunDir(runs_dir / name).finished for name in job.run_names())   # only its grid is missing
    if trained:
        train = None
    elif isinstance(job, Stack):
        train = _stack_flags(job, runs_dir, folders[0])
    else:
        train = _training_flags(job, folders[0])
    if evaluate is None:
        cmd = [] if train is None else [sys.executable, "-m", "hf_mecheval.training.run", *train]
    else:
        # one process trains, then runs the grid (hf_mecheval/sweep_job.py): a second process
        # would import torch and transformers again, ~8 s on a 2-core machine
        cmd = [sys.executable, "-m", "hf_mecheval.sweep_job", *(["--train", *train] if train else []),
               "--evaluate", *(str(runs_dir / name) for name in job.run_names()), "--", *evaluate]
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a") as handle:
        returncode = _logged_child(cmd, handle, env) if cmd else 0
    return {"name": job.name, "runs": job.run_names(), "returncode": returncode, "log": str(log)}


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
        return {"name": job.name, "runs": [dataclasses.asdict(r) for r in job.runs]}
    return {"name": job.name, "args": job.args}


def job_from_record(record: dict) -> Run | Stack:
    if "runs" in record:
        return Stack(record["name"], tuple(Run(r["name"], r["args"]) for r in record["runs"]))
    return Run(record["name"], record["args"])
