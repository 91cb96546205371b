"""``mecheval queue FILE``: train the runs of several sweeps in a priority order, each followed by
its intervention grid; start it once per core for lanes that share the work.

The queue file (YAML) lists sweep files, first to last, each with optional run-name patterns
(``Sweep.select``'s shell-style patterns):

    - {sweep: reference/width_ar, only: ["mamba_d256_*"]}
    - {sweep: cpu/mqar_zoology}
    - {sweep: reference/width_ar}          # the rest of it, later

Before every pick the file and its sweep files are read again, so an edited order, or a run added
to a sweep file, counts from the next run on (an edit that cannot be read is said in the log, and
the lane goes on with the queue it read before). A process takes the first run, in the file's order,
that is not done (trained, and with its grid unless it failed) and that no other process holds: it
claims it with a lock on ``<out>/<sweep>/queue/<run>.lock`` (``flock``: the lock goes with the
process, so a lane that is killed leaves no claim behind) and trains it with ``launch`` (from its
last checkpoint where it has one). Runs that ``launch`` would stack (width 32 or less on a CPU,
differing only in learning rate and seed) are claimed and trained together. A run that fails in a
process (diverged, crashed, or refused with an error, which the lane prints and goes on), or that
another process trains outside the queue (a ``mecheval sweep`` over the same folder), is not
picked again by that process. After every run the sweep's tables (``results.md``, ``.csv``,
``.json``) are written again; where a person saved a file of that name meanwhile they are not (the
lane says so), and the run still counts as finished. It stops when nothing is left that it could take, or
when the file ``<out>/queue.stop`` exists (checked between runs: the run in flight finishes).

``--dry-run`` lists what is left, each run with the CPU hours it should take: the median of the
finished runs under ``<out>`` that differ from it in nothing but learning rate and seeds (a stacked
run counts its share of its stack), less the part it has trained already (its last checkpoint).
With ``--time-steps`` a run that no finished run is like is priced by timing a few of its training
steps here (``step_timing.py``), scaled by what the finished runs took beyond their timed steps;
the last lines give each sweep's share and the whole.

``--until TIME`` starts only runs expected to end before TIME, for a machine lent until then whose
unfinished runs would be lost with it: a run's expected wall time is its training steps left
times its step timed here, at the moment it would start (``step_timing.py``, once per kind and
lane), times ``UNTIL_MARGIN``. A run that would not end in time is left for later and the lane
looks further down the queue; it stops when nothing left fits.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

from ..errors import ConfigError, MechEvalError
from ..inputs import load_yaml, refuse_non_finite
from ..locks import try_lock_file
from ..runs import RunDir
from ..runs.files import GridSettings, run_seconds
from ..runs.run_dir import checkpoints, fingerprint
from .jobs import Run
from .launchers import plan_workers
from .step_timing import median_step_seconds, run_steps, step_wall_seconds
from .sweep import Sweep, claim_sweep_folder, launch, plan_jobs, run_done, write_results

ENTRY_KEYS = ("sweep", "only")
STOP_FILE = "queue.stop"
# --until: a run's wall time over its timed steps (CPU seconds, at the lane's threads): what the
# steps leave out (evaluation, checkpoints, the intervention grid), a second lane beside it, and a
# timing's own noise. Measured: Based at width 256 trained at 155 ms a step of wall time in its
# lane (a second lane and a test run beside it) where its step timed 94-104 ms of CPU beside the
# same (1.5-1.65x); one kind timed ten minutes apart differed by up to 1.5x. Too short an estimate
# loses a run with the machine, too long one only starts a shorter run instead: the margin leans long.
# A lane whose threads take every core (`--threads 2` on two cores) has no second lane beside it,
# but any other work stalls it more, each step waiting for its slowest thread: Hyena at width 256,
# timed at 75 ms a step with 2 threads (another day), trained at 100-104 ms in such a lane with
# nothing beside it (ten minutes) and at 163 ms beside a test run (one thread, at nice 19). The
# same margin serves both.
UNTIL_MARGIN = 1.8


@dataclasses.dataclass(frozen=True)
class Entry:
    sweep: Sweep
    only: tuple[str, ...] | None

    def runs(self) -> list[Run]:
        return self.sweep.select(list(self.only) if self.only else None)


def read_queue(path: str | Path) -> list[Entry]:
    """The queue file's entries, each sweep loaded and each pattern checked (one that matches no run
    of its sweep is refused, as ``--only`` refuses it)."""
    try:
        spec = load_yaml(Path(path).read_text(), str(path))
    except (OSError, UnicodeDecodeError) as exc:
        raise MechEvalError(f"cannot read the queue file {path}: {str(exc).splitlines()[0]}") from None
    if not isinstance(spec, list) or not spec:
        raise ConfigError("queue", f"{path} must be a list of entries like {{sweep: cpu/ar, only: ['mamba_*']}}")
    refuse_non_finite(spec, str(path))
    entries = []
    for i, item in enumerate(spec):
        where = f"{path}, entry {i + 1}"
        if not isinstance(item, dict) or "sweep" not in item:
            raise ConfigError("sweep", f"{where} must be a mapping with the key sweep (and optionally only), got {item!r}")
        unknown = sorted(set(item) - set(ENTRY_KEYS))
        if unknown:
            raise ConfigError(unknown[0], f"unknown key in {where}; allowed: {', '.join(ENTRY_KEYS)}")
        if not isinstance(item["sweep"], str):
            raise ConfigError("sweep", f"{where}: a sweep file or packaged sweep name, got {item['sweep']!r}")
        only = item.get("only")
        if only is not None and (not isinstance(only, list) or not only or not all(isinstance(p, str) for p in only)):
            raise ConfigError("only", f"{where}: a list of run-name patterns, got {only!r}")
        entry = Entry(Sweep.load(item["sweep"]), tuple(only) if only else None)
        entry.runs()                       # a pattern that matches no run: refused here, naming it
        entries.append(entry)
    return entries


def run_folder(out: str | Path, sweep_name: str, run_name: str) -> RunDir:
    """A queue run's folder: ``<out>/<sweep>/runs/<run>``, as ``launch`` makes it."""
    return RunDir(Path(out) / sweep_name / "runs" / run_name)


def runs_left(path: str | Path, out: str | Path, grid: GridSettings = GridSettings()) -> dict[str, Run]:
    """``sweep/run`` -> run, of every run of the queue not done yet (its grid made with ``grid``),
    in the order the lanes take them."""
    left: dict[str, Run] = {}
    for e in read_queue(path):
        for r in e.runs():
            if not run_done(run_folder(out, e.sweep.name, r.name), grid):
                left.setdefault(f"{e.sweep.name}/{r.name}", r)   # a run two entries name: at its first
    return left


# what a run's training costs does not depend on: its learning rate and its seeds
COST_FREE_FIELDS = ("training.learning_rate", "training.seed", "training.data_seed", "task.dataset_seed")


def cost_key(record: dict) -> str:
    """A run.json record's fingerprint (``run_dir.fingerprint``) but for ``COST_FREE_FIELDS``: runs
    with the same key train the same steps on the same shapes."""
    return json.dumps({k: v for k, v in fingerprint(record).items() if k not in COST_FREE_FIELDS}, sort_keys=True)


def measured_cpu_seconds(out: str | Path) -> dict[str, list[float]]:
    """``cost_key`` -> the training CPU seconds of every run under ``out`` (``<sweep>/runs/<run>``)
    that finished without failing and recorded them (a stacked run: its share of its stack)."""
    costs: dict[str, list[float]] = {}
    for metrics in sorted(Path(out).glob("*/runs/*/metrics.json")):
        run = RunDir(metrics.parent)
        try:
            final = run.metrics()["final"]
            seconds = run_seconds(final, "train_cpu_seconds")
            if final.get("failed") or not seconds:
                continue
            costs.setdefault(cost_key(run.record()), []).append(seconds)
        except MechEvalError:              # a damaged or foreign folder prices nothing
            continue
    return costs


def trained_fraction(run_dir: Path) -> float:
    """The share of its steps a run has trained: its newest checkpoint's step over its max_steps (0
    without a readable checkpoint)."""
    for checkpoint in checkpoints(run_dir):
        try:
            state = json.loads((checkpoint / "trainer_state.json").read_text())
            return min(1.0, state["global_step"] / state["max_steps"])
        except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
            continue
    return 0.0


def estimate_left(path: str | Path, out: str | Path, grid: GridSettings = GridSettings(),
                  time_steps: bool = False, log=None) -> list[dict]:
    """The runs left (``runs_left``), each {"run": sweep/run, "cpu_hours": expected CPU hours to
    finish it, or None where nothing prices it, "like": how many finished runs the figure is the
    median of, "trained": the share already trained, "timed": None, or where the figure comes from
    timing steps {"step": seconds, "steps": the run's steps, "scale": the factor applied}}.

    With ``time_steps`` the runs no finished run is like are priced by timing a few training steps
    of one run per kind (``step_timing.median_step_seconds``, at this process's thread count) times
    the run's steps, scaled by what the Trainer adds around the steps: the median, over the kinds
    left that finished runs do price, of their measured CPU seconds over their timed steps (1 where
    there is none). ``log``: where to say which kind is being timed."""
    measured = measured_cpu_seconds(out)
    left = {name: (run.checked(), cost_key(run.checked().record)) for name, run in runs_left(path, out, grid).items()}
    step, scale = {}, 1.0
    if time_steps:
        step, scale = _timed_steps(left, measured, log)
    rows = []
    for name, (spec, key) in left.items():
        like = measured.get(key, [])
        trained = trained_fraction(run_folder(out, *name.split("/", 1)).path)       # name: sweep/run
        hours, timed = None, None
        if like:
            hours = statistics.median(like) * (1 - trained) / 3600
        elif key in step:
            timed = {"step": step[key], "steps": run_steps(spec), "scale": scale}
            hours = step[key] * timed["steps"] * scale * (1 - trained) / 3600
        rows.append({"run": name, "cpu_hours": hours, "like": len(like), "trained": trained, "timed": timed})
    return rows


def _timed_steps(left: dict, measured: dict, log) -> tuple[dict[str, float], float]:
    """One run of every kind (``cost_key``) left timed: {key: median step seconds}, and the scale:
    the median over the timed kinds with finished runs of (their median CPU seconds) / (their
    step x their steps). A kind whose step fails (it would fail in training too) is said in
    ``log`` and left unpriced."""
    kinds: dict[str, object] = {}
    for spec, key in left.values():
        kinds.setdefault(key, spec)
    step, ratios = {}, []
    for i, (key, spec) in enumerate(kinds.items(), 1):
        if log is not None:
            print(f"timing {i}/{len(kinds)}: {spec.model.architecture}, width {spec.config.hidden_size}, "
                  f"{spec.data.task}", file=log, flush=True)
        try:
            step[key] = median_step_seconds(spec)
        except (MechEvalError, RuntimeError, ValueError, MemoryError) as exc:   # best effort: left unpriced
            if log is not None:
                print(f"  not timed: {exc}", file=log, flush=True)
            continue
        if measured.get(key):
            ratios.append(statistics.median(measured[key]) / (step[key] * run_steps(spec)))
    return step, (statistics.median(ratios) if ratios else 1.0)


@dataclasses.dataclass
class Pick:
    entry: Entry
    runs: list[Run]
    locks: list[int]                      # open descriptors holding the claims

    def release(self) -> None:
        for fd in self.locks:
            with contextlib.suppress(OSError):
                os.close(fd)


def claim_path(out: Path, sweep: Sweep, run: Run) -> Path:
    return out / sweep.name / "queue" / f"{run.name}.lock"


def next_pick(entries: list[Entry], out: Path, grid: GridSettings, skip: set[str]) -> Pick | None:
    """The first run, in the queue's order, that is not done, not in ``skip`` and not claimed by
    another process, claimed, with the runs ``launch`` would train in one stack with it; or None."""
    for entry in entries:
        candidates = entry.runs()
        for run in candidates:
            key = f"{entry.sweep.name}/{run.name}"
            if key in skip or run_done(run_folder(out, entry.sweep.name, run.name), grid):
                continue
            fd = try_lock_file(claim_path(out, entry.sweep, run))
            if fd is None:
                continue                  # another lane has it
            pick = Pick(entry, [run], [fd])
            # its stack: the job plan_jobs would make of it with the candidates left to do
            todo = [r for r in candidates if r is run or (
                f"{entry.sweep.name}/{r.name}" not in skip
                and not run_done(run_folder(out, entry.sweep.name, r.name), grid))]
            job = next(j for j in plan_jobs(todo, out / entry.sweep.name / "runs") if run.name in j.run_names())
            for other in todo:
                if other is not run and other.name in job.run_names():
                    fd = try_lock_file(claim_path(out, entry.sweep, other))
                    if fd is not None:
                        pick.runs.append(other)
                        pick.locks.append(fd)
            return pick
    return None


def expected_wall_seconds(pick: Pick, out: Path, steps: dict[str, float | None], threads: int = 1) -> float | None:
    """What a pick should take from its start to its end, for ``--until``: each run's training steps
    left times its step timed here at the lane's ``threads`` (``step_wall_seconds``; ``steps``
    caches one per kind, None for a kind whose step fails to run) times ``UNTIL_MARGIN``; the runs
    of a stack counted as if trained one after another (stacked, they take less). None where a
    step could not be timed."""
    total = 0.0
    for run in pick.runs:
        spec = run.checked()
        key = cost_key(spec.record)
        if key not in steps:
            try:
                steps[key] = step_wall_seconds(spec, threads)
            except (MechEvalError, RuntimeError, ValueError, MemoryError):
                steps[key] = None
        if steps[key] is None:
            return None
        trained = trained_fraction(run_folder(out, pick.entry.sweep.name, run.name).path)
        total += steps[key] * run_steps(spec) * (1 - trained)
    return total * UNTIL_MARGIN


def run_queue(path: str | Path, out: str | Path, threads: int | None = 1, grid: GridSettings = GridSettings(),
              log=sys.stderr, until: float | None = None) -> dict:
    """Train the queue's runs until none is left for this process (see the module docstring);
    returns {"finished": [...], "failed": [...], "later": [...]} of the runs this process took, or
    left because they would not end before ``until`` (a ``time.time()``), as ``sweep/run`` names
    (failed: diverged, or not trained: the log named in the line printed says why)."""
    out = Path(out)
    outcome: dict[str, list[str]] = {"finished": [], "failed": [], "later": []}
    tried: set[str] = set()
    steps: dict[str, float | None] = {}
    lane_threads = plan_workers(1, threads)[1]          # what each training here runs at (None: every core)

    def say(line: str) -> None:                         # a line of the lane's log, stamped
        print(f"{time.strftime('%Y-%m-%d %H:%M:%S')} queue: {line}", file=log, flush=True)

    entries = read_queue(path)                          # a file that cannot be read is refused here
    for entry in entries:             # as is a person's file named as a sweep's own (results.md), before any run
        claim_sweep_folder(out / entry.sweep.name)
    while not (out / STOP_FILE).exists():
        try:                  # read again before every run: an edit counts from the next run on
            entries = read_queue(path)
        except MechEvalError as exc:      # an edit saved half-way must not stop the lanes between runs
            say(f"{exc}; this lane keeps the queue it read before")
        pick = next_pick(entries, out, grid, tried | set(outcome["later"]))
        if pick is None:
            break
        sweep, names = pick.entry.sweep, [r.name for r in pick.runs]
        seconds = None
        if until is not None:
            seconds = expected_wall_seconds(pick, out, steps, lane_threads)
            if seconds is None or time.time() + seconds > until:
                pick.release()
                outcome["later"] += [f"{sweep.name}/{name}" for name in names]
                expected = "its step could not be timed" if seconds is None else f"~{seconds / 3600:.1f} h expected"
                say(f"{sweep.name}: {' '.join(names)} left for later ({expected}, "
                    f"{max(0.0, until - time.time()) / 3600:.1f} h to {time.strftime('%H:%M', time.localtime(until))})")
                continue
        say(f"{sweep.name}: {' '.join(names)}" + ("" if seconds is None else f" (~{seconds / 3600:.1f} h expected)"))
        started = time.time()
        try:
            result = launch(sweep, out, workers=1, threads=threads, grid=grid, only=names)
        except MechEvalError as exc:       # this run refused (a damaged checkpoint, a folder not a run's): the next
            result = {"finished": [], "in_use": [], "failed": [f"{' '.join(names)} ({exc})"]}
        finally:
            pick.release()
        try:                  # the sweep's tables: a person's file saved there meanwhile fails them, not the runs
            write_results(sweep, out)
        except MechEvalError as exc:
            say(f"{sweep.name}: its results tables not written: {exc}")
        for name in names:
            tried.add(f"{sweep.name}/{name}")
            folder = run_folder(out, sweep.name, name)
            if name in result["in_use"]:          # another process trains it (a sweep outside the queue): its own
                continue
            ok = run_done(folder, grid) and folder.failure is None       # diverged runs are done, and failed
            outcome["finished" if ok else "failed"].append(f"{sweep.name}/{name}")
        # beside the expectation, what it took: the record that calibrates UNTIL_MARGIN
        took = "" if seconds is None else f" in {(time.time() - started) / 3600:.2f} h of ~{seconds / 3600:.2f} h expected"
        say(f"{sweep.name}: {len(result['finished'])} finished{took}"
            + "".join(f"; failed: {line}" for line in result["failed"])
            + "".join(f"; in use: {name}" for name in result["in_use"]))
    return outcome
