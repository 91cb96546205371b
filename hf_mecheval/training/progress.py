"""Progress a person can watch: each job of a sweep (or of the quickstart) in flight — its step,
epoch, loss and time left — and, at the end, the wall time of each.

Two halves, joined by one small file per job, ``NAME.progress.json`` beside the job's file
``NAME.job.json`` and its log ``NAME.log`` (``jobs.py``)::

    {"runs": ["mamba_conv4"], "phase": "training", "step": 4200, "max_steps": 9000,
     "epoch": 5.6, "epochs": 12, "loss": [0.412], "seconds": 95.2, "seconds_left": 108.4,
     "time": 1767772800.0}

* In the training process, ``ProgressFile`` (a Trainer callback) rewrites that file at most once
  a second from what the Trainer already has (its state, and the loss of each step, which
  ``MechEvalTrainer`` adds up in a ``RunningLoss`` without waiting for the device), and writes a
  line into the job's log every half minute. ``phase`` then moves on to "evaluating" (the final
  validation, test and save) and, in ``sweep_job.py``, to "interventions".
* In the process that launched the jobs, ``ProgressBoard`` reads the files of the jobs in flight
  and shows one line each: on a terminal redrawn in place every second, in a log file (or any
  stream that is not a terminal) printed every 30 seconds; a line for each job as it ends; and at
  the end the wall time of every job beside each run's training time.

No extra process, no extra pass over the data: a run computes exactly what it computes without it.
"""
from __future__ import annotations

import json
import math
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from transformers import TrainerCallback

from ..atomic_files import write_text_atomic
from ..errors import MechEvalError

JOB_SUFFIX, PROGRESS_SUFFIX = ".job.json", ".progress.json"
WRITE_EVERY, LOG_EVERY = 1.0, 30.0       # seconds between two writes of the file, two lines in the job's log


def progress_path(job_file: str | Path) -> Path:
    """The progress file of the job file ``runs/NAME.job.json``: ``runs/NAME.progress.json``."""
    job_file = Path(job_file)
    stem = job_file.name[:-len(JOB_SUFFIX)] if job_file.name.endswith(JOB_SUFFIX) else job_file.stem
    return job_file.with_name(stem + PROGRESS_SUFFIX)


def write_progress(path: Path, record: dict) -> None:
    """``record`` (see the module docstring), stamped with the time, as the job's progress file.
    Progress is a courtesy: a file that cannot be written (a full disk) is skipped, never an error."""
    try:
        write_text_atomic(path, json.dumps({**record, "time": time.time()}) + "\n", overwrite=True)
    except (OSError, MechEvalError):
        pass


def read_progress(path: Path) -> dict | None:
    """A progress file, or None when there is none yet (or it is not one: the board shows the job
    without figures rather than stopping the sweep)."""
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


# ---------------------------------------------------------------------------------- the training side
class RunningLoss:
    """The training loss of each step since it was last taken, summed where it lies (a () tensor,
    or (K,) for a stack's copies): adding never waits for the device; ``take`` does, once."""

    def __init__(self):
        self.total, self.steps = None, 0

    def add(self, loss) -> None:
        loss = loss.detach()
        self.total = loss if self.total is None else self.total + loss
        self.steps += 1

    def take(self) -> list[float] | None:
        """The mean loss per step since the last ``take`` (one value per copy), or None."""
        if self.total is None:
            return None
        mean = (self.total.float() / self.steps).reshape(-1).tolist()
        self.total, self.steps = None, 0
        return mean


class ProgressFile(TrainerCallback):
    """Writes a job's progress file while it trains (every ``every`` seconds at most, and at the
    first and last step) and a progress line into its log (stdout) every ``log_every`` seconds.
    ``runs``: the names of the runs the job trains (one, or a stack's). ``loss``: the Trainer's
    ``RunningLoss``."""

    def __init__(self, path: str | Path, runs: list[str], loss: RunningLoss, every: float | None = None,
                 log_every: float | None = None, clock=time.monotonic):
        self.path, self.runs, self.loss = Path(path), list(runs), loss
        self.every = WRITE_EVERY if every is None else every
        self.log_every = LOG_EVERY if log_every is None else log_every
        self.clock = clock
        self.last_loss: list[float] | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        self.started = self.written = self.logged = self.clock()
        self.first_step = state.global_step                # a resumed run starts at its checkpoint's
        self._write(state, "training")

    def on_step_end(self, args, state, control, **kwargs):
        if not state.is_world_process_zero:
            return
        now = self.clock()
        last = state.global_step >= state.max_steps
        if now - self.written >= self.every or last or state.global_step == self.first_step + 1:
            record = self._write(state, "training")
            self.written = now
            if now - self.logged >= self.log_every:
                print(progress_line(record), flush=True)
                self.logged = now

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero:
            print(progress_line(self._write(state, "evaluating")), flush=True)

    def _write(self, state, phase: str) -> dict:
        taken = self.loss.take()
        self.last_loss = taken if taken is not None else self.last_loss
        seconds = self.clock() - self.started
        done = state.global_step - self.first_step
        left = (state.max_steps - state.global_step) * seconds / done if done > 0 else None
        record = {"runs": self.runs, "phase": phase, "step": state.global_step, "max_steps": state.max_steps,
                  "epoch": state.epoch or 0.0, "epochs": state.num_train_epochs, "loss": self.last_loss,
                  "seconds": round(seconds, 1), "seconds_left": None if left is None else round(left, 1)}
        write_progress(self.path, record)
        return record


# ---------------------------------------------------------------------------------- lines
def clock_time(seconds: float | None) -> str:
    """1:05, 12:40, 1:02:03 (hours, minutes, seconds)."""
    if seconds is None or not math.isfinite(seconds):
        return "?"
    seconds = max(0, round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def progress_line(record: dict) -> str:
    """What a progress file says, in one line (without the job's name)."""
    phase = record.get("phase")
    if phase == "interventions":
        return f"intervention grid of {record.get('run', '?')}"
    step, max_steps = record.get("step", 0), record.get("max_steps") or 0
    epochs = record.get("epochs")
    parts = [f"step {step}/{max_steps}", f"epoch {record.get('epoch', 0.0):.1f}/{epochs if epochs else '?'}"]
    loss = record.get("loss")
    if loss:
        parts.append("loss " + " ".join(f"{v:.3g}" for v in loss))      # 2.08, 0.0213, 4.1e-05
    if phase == "evaluating":
        return ", ".join(parts) + f"; trained in {clock_time(record.get('seconds'))}: final evaluation and save"
    parts.append(f"{clock_time(record.get('seconds'))} in, ~{clock_time(record.get('seconds_left'))} left")
    return ", ".join(parts)


# ---------------------------------------------------------------------------------- the launching side
class ProgressBoard:
    """Shows the jobs a launcher runs: one line per job in flight (from its progress file), a
    line for each job that ends, and the wall time of each at the end (``close``).

    ``jobs``: (name, job file) of every job, in order. ``stream``: where to write (None: nothing
    at all). On a terminal the lines in flight are redrawn in place every ``every`` seconds
    (default 1); elsewhere — a log file, a pipe — they are printed as they are every ``every``
    seconds (default 30), so that ``tail -f`` reads the same as the screen. The launcher calls
    ``started`` (where it knows when a job starts), ``ended`` with each job's result, and ``tick``
    as often as it likes."""

    def __init__(self, jobs: list[tuple[str, Path]], stream=sys.stderr, every: float | None = None,
                 clock=time.time):
        self.files = {name: progress_path(job_file) for name, job_file in jobs}
        self.stream, self.clock = stream, clock
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.every = every if every is not None else (1.0 if self.tty else 30.0)
        self.opened = self.clock()
        self.last_drawn = self.opened
        self.starts: dict[str, float] = {}
        self.results: list[dict] = []
        self.shown = 0                    # lines of the board on a terminal now
        self.lock = threading.Lock()      # ``started`` comes from the launcher's threads

    def started(self, name: str) -> None:
        with self.lock:
            self.starts.setdefault(name, self.clock())

    def in_flight(self) -> list[tuple[str, str]]:
        """(job name, its line) of every job started and not ended, in the jobs' order. A job the
        launcher did not say it started counts from its first progress file written since the
        board opened (a file left by an earlier sweep is not this one's)."""
        ended = {r["name"] for r in self.results}
        present: set[str] = set()          # one listing per folder, not an attempt per job (sweeps of thousands)
        for folder in {path.parent for path in self.files.values()}:
            try:
                present |= {entry.name for entry in os.scandir(folder)}
            except OSError:
                pass
        lines = []
        for name, path in self.files.items():
            if name in ended:
                continue
            record = read_progress(path) if path.name in present else None
            if record is not None and record.get("time", 0) < self.opened:
                record = None
            with self.lock:
                start = self.starts.get(name)
            if record is None and start is None:
                continue
            if record is None:
                lines.append((name, f"starting ({clock_time(self.clock() - start)})"))
                continue
            try:
                lines.append((name, progress_line(record)))
            except (TypeError, ValueError):      # a file of another shape: the sweep goes on without its figures
                lines.append((name, "in flight (its progress file is not one this version reads)"))
        return lines

    def ended(self, result: dict) -> None:
        """A job's result (``jobs.execute``'s): a line saying how it ended and how long it took."""
        self.results.append(result)
        if self.stream is None:
            return
        how = "in use by another process" if result.get("in_use") else \
            ("done" if result.get("returncode") == 0 else f"failed (exit {result.get('returncode')}, log {result.get('log')})")
        took = f" in {clock_time(result['seconds'])}" if result.get("seconds") is not None else ""
        self._clear()
        self._write([f"[{len(self.results)}/{len(self.files)}] {result['name']}: {how}{took}"])
        self._draw()

    def tick(self) -> None:
        if self.stream is None or self.clock() - self.last_drawn < self.every:
            return
        self.last_drawn = self.clock()
        if self.tty:
            self._clear()
            self._draw()
        else:
            self._write(self._board_lines())

    def close(self, run_seconds: dict[str, float | None] | None = None) -> None:
        """The board's lines away; the wall time of every job that ran, with each run's training
        time where ``run_seconds`` (run name -> seconds) gives it."""
        if self.stream is None:
            return
        self._clear()
        ran = [r for r in self.results if r.get("seconds") is not None]
        if not ran:
            return
        run_seconds = run_seconds or {}
        width = max(len(r["name"]) for r in ran)
        lines = ["wall time of each job (its process: training, then the intervention grid where asked):"]
        for r in ran:
            trained = [run_seconds.get(n) for n in r.get("runs", [])]
            known = [s for s in trained if s is not None]
            extra = f"  (training {clock_time(max(known))})" if known else ""
            lines.append(f"  {r['name']:<{width}}  {clock_time(r['seconds']):>8}{extra}")
        self._write(lines)

    # ------------------------------------------------------------------ output
    def _board_lines(self) -> list[str]:
        flying = self.in_flight()
        head = (f"jobs: {len(self.results)}/{len(self.files)} ended, {len(flying)} in flight, "
                f"{clock_time(self.clock() - self.opened)} so far")
        if not flying:
            return [head]
        width = max(len(name) for name, _ in flying)
        return [head] + [f"  {name:<{width}}  {line}" for name, line in flying]

    def _draw(self) -> None:
        if not self.tty:
            return
        columns = shutil.get_terminal_size((120, 24)).columns
        lines = [line[:columns - 1] for line in self._board_lines()]   # a wrapped line would break the redraw
        self._write(lines)
        self.shown = len(lines)

    def _clear(self) -> None:
        if self.tty and self.shown:
            self.stream.write(f"\x1b[{self.shown}F\x1b[J")     # up to the board's first line, erase below
            self.shown = 0

    def _write(self, lines: list[str]) -> None:
        self.stream.write("".join(line + "\n" for line in lines))
        self.stream.flush()
