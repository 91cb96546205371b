"""Sweeps: a YAML file of run grids -> one run directory per run -> a results table.

    mecheval sweep ar_main                     # a packaged sweep by name, local; --workers auto
    mecheval sweep ar_main --launcher ray      # several machines
    mecheval sweep my_sweep.yaml               # any sweep file

Sweep file (unknown keys are errors)::

    name: ar_main                 # sweep directory: <out>/<name> (default out: runs/sweeps)
    task: ar_32                   # defaults for every run: any training argument
    defaults: {recipe: reference}
    grids:                        # each grid is a cartesian product; runs = union of the grids
      - architecture: [transformer]
        max_position_embeddings: [1024]
        hidden_size: [64, 128]
        learning_rate: [1e-4, 1e-3]
    seeds: [0, 1, 2]

Stacking (``--stack N`` or ``auto``): runs that differ only in learning rate and seed are
trained together, up to N at a time, as one stacked run (``training/stacked.py``); each still
gets its own run directory. ``auto`` stacks on a GPU as many as fit in half its free memory (at
most 32); on a CPU up to 8 runs of width 32 or less, whose steps are mostly overhead that a stack
shares, and none wider, where a step is compute-bound (``stack_size_that_fits``).
Runs of transformers' own models (``hf:<model_type>``) are never stacked: each trains alone.

Finished runs (``metrics.json`` present) are skipped and a run left with a checkpoint by a killed
worker is resumed — each only if its ``run.json`` has the fingerprint of the run the sweep file
asks for now (``run_dir.fingerprint``): a sweep whose file was edited under the same name is
refused before anything starts, naming the run and the fields that differ. A failed run is
reported and the others go on. Each training process runs in its own process group and stops
when the sweep dies, even by ``kill -9`` (``children.py``); a run directory another process is
writing is left alone (its lock is held) and reported as in use, not failed. The results table picks, for
every configuration (all grid fields but learning rate and seed), the learning rate with the
best mean *validation* accuracy over seeds, and reports *test* accuracy there, mean ± sd.

A sweep writes its record (``sweep.json``) and tables (``results.{json,csv,md}``) into its folder
beside ``runs/``, replacing earlier ones; a file of one of those names there that is not
recognisably a sweep's (``claim_sweep_folder``) is refused before anything starts, unless
``--overwrite``: a person's notes saved as ``results.md`` are never replaced without a word.
"""
from __future__ import annotations

import csv
import dataclasses
import fnmatch
import hashlib
import io
import itertools
import json
import math
import os
import re
import sys
from pathlib import Path
from typing import Any, Sequence


from ..adapters.native_config import is_native
from ..errors import ConfigError, MechEvalError
from ..atomic_files import write_text_atomic
from ..inputs import load_yaml, refuse_non_finite
from ..runs import RunDir
from ..runs.files import GridSettings
from ..runs.run_dir import check_same_run
from .arguments import DataArguments, MechEvalTrainingArguments, ModelArguments, RunArguments, run_memory
from .jobs import Run, Stack, resumable
from .launchers import LAUNCHERS, plan_workers, run_jobs
from .spec import RunSpec

SWEEPS_DIR = Path(__file__).resolve().parent / "sweeps"     # package data: in the wheel too
SWEEP_FILES = ("sweep.json", "results.json", "results.csv", "results.md")      # what a sweep replaces in its folder
# the columns results_table adds after the configuration's fields (results.csv); results.md shows
# the test accuracy's two in one column, last
TABLE_COLUMNS = ["best_learning_rate", "validation_accuracy", "test_accuracy_mean", "test_accuracy_sd", "seeds",
                 "learning_rates_tried"]
TEST_COLUMNS = ("test_accuracy_mean", "test_accuracy_sd")


def sweep_file(name: str | Path) -> Path:
    """A sweep file's path: an existing file as given, else the packaged sweep of that name
    (``ar_main`` -> ``hf_mecheval/training/sweeps/ar_main.yaml``, ``cpu/ar`` -> ``sweeps/cpu/ar.yaml``)."""
    path = Path(name)
    if path.is_file():
        return path
    packaged = SWEEPS_DIR / (str(name) if path.suffix in (".yaml", ".yml") else f"{name}.yaml")
    if packaged.is_file():
        return packaged
    known = sorted(str(f.relative_to(SWEEPS_DIR).with_suffix("")) for f in SWEEPS_DIR.rglob("*.yaml"))
    raise MechEvalError(f"no sweep file {name} and no packaged sweep of that name; packaged: {', '.join(known)}")


RUN_FIELDS = {f.name for cls in (ModelArguments, DataArguments, RunArguments, MechEvalTrainingArguments)
              for f in dataclasses.fields(cls)} - {"output_dir", "resume", "overwrite"}
SELECTION_FIELDS = ("learning_rate", "seed")
SWEEP_KEYS = ("name", "task", "defaults", "grids", "seeds")
MAX_RUNS = 10_000          # more is a typo (or a job for several sweep files): checking them alone takes minutes


@dataclasses.dataclass
class Sweep:
    name: str
    runs: list[Run]
    grid_fields: list[str]

    @staticmethod
    def load(path: str | Path) -> "Sweep":
        """A sweep file, or a packaged sweep by name (``ar_main``, ``cpu/ar``; see ``sweep_file``)."""
        path = sweep_file(path)
        try:
            spec = load_yaml(Path(path).read_text(), str(path))
        except (OSError, UnicodeDecodeError) as exc:
            raise MechEvalError(f"cannot read sweep file {path}: {str(exc).splitlines()[0]}") from None
        return Sweep.from_dict(spec, source=str(path))

    @staticmethod
    def from_dict(spec: Any, source: str = "sweep") -> "Sweep":
        if not isinstance(spec, dict):
            raise ConfigError("sweep", f"{source} must be a mapping with keys {', '.join(SWEEP_KEYS)}")
        refuse_non_finite(spec, source)
        unknown = sorted(set(spec) - set(SWEEP_KEYS))
        if unknown:
            raise ConfigError(unknown[0], f"unknown sweep key in {source}; allowed: {', '.join(SWEEP_KEYS)}")
        name = spec.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise ConfigError("name", f"{source} needs a name made of letters, digits, '.', '_' and '-' (it names "
                                      f"the sweep's directory), got {name!r}")
        defaults = spec.get("defaults") or {}
        if not isinstance(defaults, dict):
            raise ConfigError("defaults", f"must be a mapping from argument names to values, got {defaults!r} (in {source})")
        defaults = dict(defaults)
        if "task" in spec:
            defaults["task"] = spec["task"]
        if spec.get("grids") == []:        # read as one run of the defaults, which is not what the list says
            raise ConfigError("grids", f"an empty list (in {source}); leave it out for one run of the defaults")
        grids = spec.get("grids") or [{}]
        seeds = spec.get("seeds", [0])
        if not isinstance(grids, list) or not all(isinstance(g, dict) for g in grids):
            raise ConfigError("grids", f"must be a list of mappings from argument names to lists of values (in {source})")
        for key in list(defaults) + [k for g in grids for k in g]:
            if key not in RUN_FIELDS:
                raise ConfigError(key, f"not a training argument (in {source}); see `mecheval train --help`")
        expanded, grid_fields = [], []
        grids = [{k: (v if isinstance(v, list) else [v]) for k, v in grid.items()} for grid in grids]
        for grid in grids:
            grid.setdefault("seed", seeds if isinstance(seeds, list) else [seeds])
            for key, values in grid.items():
                if not values:
                    raise ConfigError("seeds" if key == "seed" else key, f"an empty list in {source} gives no runs")
        count = sum(math.prod(len(values) for values in grid.values()) for grid in grids)
        if count > MAX_RUNS:     # counted before anything is expanded: even --dry-run answers at once
            raise ConfigError("grids", f"{source} expands to {count:,} runs, more than the {MAX_RUNS:,} a sweep "
                                       "file may hold; split it into several sweep files")
        for grid in grids:
            grid_fields += [k for k in grid if k not in grid_fields]
            expanded += [{**defaults, **dict(zip(grid, values))} for values in itertools.product(*grid.values())]
        # every run checked as `mecheval train` would check it, before any starts
        specs = []
        for i, args in enumerate(expanded):
            try:
                specs.append(RunSpec.from_values(args))
            except MechEvalError as exc:
                raise MechEvalError(f"{source}: {exc} (run {json.dumps(args, default=str)})") from None
            expanded[i] = _typed_numbers(args, specs[-1])
        # a run's name shows the fields that tell it apart from the other runs of the sweep
        def shown(key):
            values = {json.dumps(args.get(key), sort_keys=True, default=str) for args in expanded}
            return key in ("architecture", "seed") or len(values) > 1
        naming = [k for k in grid_fields if shown(k)]
        runs, seen = [], set()
        for args, run_spec in zip(expanded, specs):
            name = run_name(args, [k for k in naming if k in args])
            if name in seen:
                raise ConfigError("grids", f"two runs would share the directory {name} (in {source})")
            seen.add(name)
            runs.append(Run.checked_run(name, args, run_spec))
        return Sweep(spec["name"], runs, grid_fields)

    def select(self, patterns: Sequence[str] | None) -> list[Run]:
        """The runs whose names match one of the shell-style ``patterns`` (``mamba_*``,
        ``*_lr3e-04_s0``), in the sweep's order; all runs when ``patterns`` is None. A pattern that
        matches no run is refused (a typo would otherwise train nothing, silently)."""
        if patterns is None:
            return list(self.runs)
        for pattern in patterns:
            if not any(fnmatch.fnmatchcase(r.name, pattern) for r in self.runs):
                raise ConfigError("only", f"{pattern!r} matches no run of sweep {self.name}; its runs: "
                                          f"{', '.join(r.name for r in self.runs[:12])}"
                                          f"{', ...' if len(self.runs) > 12 else ''}")
        return [r for r in self.runs if any(fnmatch.fnmatchcase(r.name, p) for p in patterns)]


def _typed_numbers(args: dict, spec: RunSpec) -> dict:
    """``args`` with each number as its argument holds it ("1e-4", as YAML reads that, is 0.0001):
    run names, the results table and the stacking plan compare numbers, not spellings."""
    def typed(key, value):
        held = spec.value(key)
        return held if isinstance(held, (int, float)) and not isinstance(held, bool) else value
    return {key: typed(key, value) for key, value in args.items()}


_SHORT = {"architecture": "", "hidden_size": "d", "num_hidden_layers": "L", "learning_rate": "lr", "seed": "s",
          "max_position_embeddings": "pos", "task": "", "model_config": "", "task_config": ""}


def run_name(args: dict, keys: list[str]) -> str:
    parts = []
    for key in keys:
        value = args[key]
        if isinstance(value, float):
            value = _short_float(value)
        elif isinstance(value, dict):
            value = "-".join(f"{k}{v}" for k, v in sorted(value.items()))
        parts.append(f"{_SHORT.get(key, key)}{value}")
    return "_".join(str(p).replace("/", "-").replace(" ", "") for p in parts) or "run"


def _short_float(value: float) -> str:
    """1e-04, 2.5e-03, 0.03: exact, and as short as that allows (small values in e-notation)."""
    if value == 0 or abs(value) >= 0.01:
        return f"{value:g}" if float(f"{value:g}") == value else repr(value)
    for digits in range(0, 16):
        text = f"{value:.{digits}e}"
        if float(text) == value:
            return text
    return repr(value)


# ---------------------------------------------------------------------------------- stacking
STACK_FREE_FIELDS = ("learning_rate", "seed", "data_seed")


def plan_jobs(todo: list[Run], runs_dir: Path, stack: int | str = "auto") -> list[Run | Stack]:
    """Group runs that may share a stack (equal arguments but learning rate and seeds) into stacks
    of at most ``stack`` runs (``auto``: ``stack_size_that_fits``). Runs left with a checkpoint by
    a killed worker come first and train alone (as does one that wants the restoration callback,
    and one of transformers' own models, which ``StackedCausalLM`` cannot stack); the rest keep
    the sweep file's order, a stack taking the place of its first run."""
    def key(run: Run) -> str:
        return json.dumps({k: v for k, v in run.args.items() if k not in STACK_FREE_FIELDS}, sort_keys=True,
                          default=str)

    started = [r for r in todo if any((runs_dir / r.name).glob("checkpoint-*"))]
    rest = [r for r in todo if r not in started]
    groups: dict[str, list[Run]] = {}
    for run in rest:
        alone = run.args.get("restoration_every_n_steps", 0) or is_native(str(run.args.get("architecture", "")))
        if not alone:
            groups.setdefault(key(run), []).append(run)
    sizes = {k: stack_size_that_fits(runs[0].checked()) if stack == "auto" else int(stack) for k, runs in groups.items()}
    jobs: list[Run | Stack] = list(started)
    for run in rest:
        runs = groups.get(key(run), [])
        if run not in runs or sizes[key(run)] <= 1 or len(runs) == 1:
            jobs.append(run)
        elif run is runs[0]:
            size = sizes[key(run)]
            for i in range(0, len(runs), size):
                chunk = tuple(runs[i:i + size])
                digest = hashlib.sha1("\n".join(r.name for r in chunk).encode()).hexdigest()[:10]
                jobs.append(chunk[0] if len(chunk) == 1 else Stack(f"{chunk[0].name}+{len(chunk) - 1}-{digest}", chunk))
    return jobs


# On a CPU a run of width <= 32 spends its step on overhead (the vocabulary's embedding and head,
# the optimizer, every operator's fixed cost) more than on arithmetic, and a stack pays it once for
# all its copies: one process per core, each a stack of 8 such runs, trained 2.5-3.3x the runs per
# CPU-hour of one lone run per core (Transformer and Mamba at widths 16 and 32,
# benchmarks/bench_small_widths.py). From width 64 on a step is mostly arithmetic, which a stack
# does K times over: there, and on the quickstart's and the reference sweeps' width-64 runs, none.
CPU_STACK_MAX_WIDTH = 32
CPU_STACK_SIZE = 8


def stack_size_that_fits(spec: RunSpec, cap: int = 32) -> int:
    """``auto``: on a GPU, as many copies as fit in half its free memory, each copy costing what
    the run's own memory check estimates for it on the device (``arguments.run_memory``); on a
    CPU, ``CPU_STACK_SIZE`` at widths up to ``CPU_STACK_MAX_WIDTH``, else 1 (no stacking)."""
    import torch

    if not torch.cuda.is_available():
        return CPU_STACK_SIZE if spec.config.hidden_size <= CPU_STACK_MAX_WIDTH else 1
    per_copy = sum(run_memory(spec.config, spec.task, spec.train_size, spec.eval_size, spec.run,
                              spec.training)["device"].values())
    free, _ = torch.cuda.mem_get_info()
    return max(1, min(cap, int(0.5 * free // per_copy)))


# ---------------------------------------------------------------------------------- launching
def launch(sweep: Sweep, out: str | Path, launcher: str = "local", workers: int | str = "auto",
           progress: bool = True, stack: int | str = "auto", grid: GridSettings | None = None,
           only: Sequence[str] | None = None, threads: int | None = None, overwrite: bool = False) -> dict:
    """Run every unfinished run of the sweep (or of those ``only`` selects, see ``Sweep.select``)
    into ``<out>/<sweep name>/runs`` (see ``train_runs``); returns {"finished", "skipped",
    "in_use", "failed"} run names. ``sweep.json`` always records the whole sweep. ``overwrite``:
    replace a person's files among the sweep's own names (``claim_sweep_folder``)."""
    root = Path(out) / sweep.name
    check_launcher(launcher, stack)
    runs = sweep.select(only)
    claim_sweep_folder(root, overwrite)
    check_existing_runs(sweep.runs, root / "runs")      # an edited sweep is refused before its record changes
    write_text_atomic(root / "sweep.json", json.dumps([{"name": r.name, "args": r.args} for r in sweep.runs], indent=2),
                      overwrite=True)
    return train_runs(runs, root / "runs", launcher, workers, progress, stack, grid, threads)


def check_launcher(launcher: str, stack: int | str) -> None:
    if launcher not in LAUNCHERS:
        raise ConfigError("launcher", f"must be 'local' or 'ray', got {launcher!r}")
    if stack != "auto" and (not str(stack).isdigit() or int(stack) < 1):
        raise ConfigError("stack", f"must be 'auto' or a number of runs >= 1, got {stack!r}")


def train_runs(runs: list[Run], runs_dir: Path, launcher: str = "local", workers: int | str = "auto",
               progress: bool = True, stack: int | str = "auto", grid: GridSettings | None = None,
               threads: int | None = None) -> dict:
    """Train every unfinished run into ``runs_dir/<run name>`` (stacked where ``stack`` allows;
    ``workers`` processes at once with ``threads`` each, see ``plan_workers``), each followed by
    its intervention grid with the settings ``grid`` unless that is None;
    returns {"finished", "skipped", "in_use", "failed"} run names: "in_use" are those another
    process was training (a second sweep over the same folder): left to it, not failed."""
    check_launcher(launcher, stack)
    workers, threads, devices = plan_workers(workers, threads)
    check_existing_runs(runs, runs_dir)
    # a grid is made again where the run's was made with other settings (fewer documents, one site)

    todo = [r for r in runs if not run_done(RunDir(runs_dir / r.name), grid)]
    # a run that failed before (it diverged, or trained zero steps) is not trained again (it would
    # fail again), but it stays failed in every summary and exit status until it is retrained
    failed_before = {r.name: RunDir(runs_dir / r.name).failure for r in runs if r not in todo}
    outcome = {"finished": [], "skipped": [name for name, failure in failed_before.items() if not failure],
               "in_use": [], "failed": [f"{name} ({failure}; failed before and not trained again: remove its folder "
                                        "to retrain it)" for name, failure in failed_before.items() if failure]}
    jobs = plan_jobs(todo, runs_dir, stack)
    if progress and jobs:
        print(f"{len(jobs)} jobs, {workers} at a time with {threads} thread(s) each", file=sys.stderr)
    for result in run_jobs(launcher, jobs, runs_dir, threads, devices, progress, grid):
        for name in result["runs"]:
            folder = RunDir(runs_dir / name)
            failure = folder.failure
            if not folder.finished:
                key, text = ("in_use", name) if result.get("in_use") else \
                    ("failed", f"{name} (exit {result['returncode']}, log {result['log']})")
            elif failure:   # diverged or trained zero steps: finished (not retrained: it would fail again) but failed
                key, text = "failed", f"{name} ({failure}; log {result['log']})"
            elif grid is not None and not folder.grid_matches(grid):
                # trained, but the grid asked for failed: the run is kept (the next sweep makes only the grid)
                key, text = "failed", (f"{name} (trained; its intervention grid failed: exit {result['returncode']}, "
                                       f"log {result['log']})")
            else:
                key, text = "finished", name
            outcome[key].append(text)
    return outcome


def run_done(folder: RunDir, grid: GridSettings | None) -> bool:
    """Nothing left to do for a run: it finished, and it failed or needs no grid or has its grid
    made with ``grid`` (one made with other settings is made again)."""
    return folder.finished and (grid is None or folder.failure is not None or folder.grid_matches(grid))


def check_existing_runs(runs: list[Run], runs_dir: Path) -> None:
    """Before anything starts: every finished run the sweep would skip, and every interrupted run
    it would resume, must be the run the sweep file (or the quickstart) asks for (its fingerprint), and a finished
    run's metrics.json must be readable; otherwise one clear error names the run."""
    for run in runs:
        run_dir = runs_dir / run.name
        finished = RunDir(run_dir).finished
        if finished:
            RunDir(run_dir).metrics()
        if finished or ((run_dir / "run.json").exists() and resumable(run_dir)):
            check_same_run(run_dir, run.checked().at(run_dir).record, "reuse" if finished else "resume")


# ---------------------------------------------------------------------------------- results
def collect(sweep: Sweep, out: str | Path) -> list[dict]:
    """One row per finished run: its grid fields and final metrics."""
    rows = []
    for run in sweep.runs:
        run_dir = RunDir(Path(out) / sweep.name / "runs" / run.name)
        if run_dir.finished:
            final = run_dir.metrics()["final"]
            rows.append({"run": run.name, **{k: run.args.get(k) for k in sweep.grid_fields}, **final})
    return rows


def mean_validation_accuracy(rows: list[dict]) -> float:
    return sum(r["validation_accuracy"] for r in rows) / len(rows)


def best_learning_rate(by_lr: dict[float, list[dict]]) -> float:
    """The learning rate whose runs (one per seed) have the best mean validation accuracy; on a
    tie, the smaller one."""
    return max(by_lr, key=lambda lr: (mean_validation_accuracy(by_lr[lr]), -(lr or 0)))


def has_every_planned_run(planned: set[tuple[float, int]], rows: list[dict]) -> bool:
    """Whether ``rows`` (the runs of one configuration) hold every (learning rate, seed) in
    ``planned``: until they do, the best rate among them is only the best so far."""
    return planned <= {(r.get("learning_rate") or 0.0, r.get("seed") or 0) for r in rows}


def results_table(rows: list[dict], grid_fields: list[str]) -> list[dict]:
    """Best learning rate per configuration by mean validation accuracy; test accuracy there."""
    config_fields = [f for f in grid_fields if f not in SELECTION_FIELDS]
    groups: dict[str, dict] = {}
    for row in rows:
        key = json.dumps([row.get(f) for f in config_fields], default=str)
        groups.setdefault(key, {}).setdefault(row.get("learning_rate"), []).append(row)
    table = []
    for key, by_lr in groups.items():
        best = best_learning_rate(by_lr)
        tests = [r["test_accuracy"] for r in by_lr[best]]
        mean = sum(tests) / len(tests)
        sd = math.sqrt(sum((t - mean) ** 2 for t in tests) / (len(tests) - 1)) if len(tests) > 1 else 0.0
        values = [best, mean_validation_accuracy(by_lr[best]), mean, sd, len(tests), len(by_lr)]
        table.append({**dict(zip(config_fields, json.loads(key))), **dict(zip(TABLE_COLUMNS, values))})
    return table


def write_results(sweep: Sweep, out: str | Path, overwrite: bool = False) -> Path:
    """results.json / results.csv / results.md in the sweep directory (checked again as
    ``launch`` does: a person may have saved a file there while the sweep trained)."""
    root = Path(out) / sweep.name
    claim_sweep_folder(root, overwrite)
    rows = collect(sweep, out)
    table = results_table(rows, sweep.grid_fields)
    write_text_atomic(root / "results.json", json.dumps({"runs": rows, "table": table}, indent=2, default=str),
                      overwrite=True)
    if table:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=list(table[0]))
        writer.writeheader()
        writer.writerows(table)
        write_text_atomic(root / "results.csv", buffer.getvalue(), overwrite=True)
    write_text_atomic(root / "results.md", format_table(table), overwrite=True)
    return root


def claim_sweep_folder(root: Path, overwrite: bool = False) -> None:
    """Before a sweep writes ``SWEEP_FILES`` into its folder ``root``: refuse, unless ``overwrite``,
    where one of them there is not recognisably what a sweep writes (``is_sweep_file``). By its
    content, not by a record: two processes of one sweep (the queue's lanes) write these files
    at once, and a record of who wrote them could not be kept without a lock; a file a person
    changed (notes below the table) is no longer a sweep's and is refused. The rest of the folder
    (``runs/``, a person's other files) is never written by the sweep itself."""
    if overwrite:
        return
    foreign = [name for name in SWEEP_FILES if os.path.lexists(root / name) and not is_sweep_file(root / name)]
    if foreign:
        raise MechEvalError(f"{root} holds {', '.join(foreign)}, which a sweep did not write (or which was changed "
                            "since); move them, choose another --out, or pass --overwrite to replace them")


def is_sweep_file(path: Path) -> bool:
    """Whether ``path`` (named as one of ``SWEEP_FILES``) is a regular file of the shape a sweep
    writes under that name: sweep.json a list of {"name", "args"}; results.json {"runs",
    "table"}; results.csv and results.md the table (``results_table``) and nothing else."""
    try:
        if path.is_symlink() or not path.is_file():
            return False
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    if path.suffix == ".json":
        try:
            data = json.loads(text)
        except ValueError:
            return False
        if path.name == "sweep.json":
            return isinstance(data, list) and all(isinstance(r, dict) and set(r) == {"name", "args"} for r in data)
        return isinstance(data, dict) and set(data) == {"runs", "table"}
    if path.name == "results.csv":
        rows = list(csv.reader(io.StringIO(text)))
        return (bool(rows) and rows[0][-len(TABLE_COLUMNS):] == TABLE_COLUMNS
                and all(len(row) == len(rows[0]) for row in rows))
    if text == format_table([]):
        return True
    lines = text.split("\n")
    head = [cell.strip() for cell in lines[0].strip("|").split("|")]
    ours = [c for c in TABLE_COLUMNS if c not in TEST_COLUMNS] + ["test accuracy"]
    return (len(lines) > 2 and lines[-1] == "" and head[-len(ours):] == ours and lines[1] == "|" + "---|" * len(head)
            and all(line.startswith("| ") and line.endswith(" |") for line in lines[2:-1]))


def format_table(table: list[dict]) -> str:
    if not table:
        return "(no finished runs)\n"
    cols = [c for c in table[0] if c not in TEST_COLUMNS]
    head = cols + ["test accuracy"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in table:
        cells = [f"{row[c]:.4g}" if isinstance(row[c], float) else str(row[c]) for c in cols]
        cells.append(f"{100 * row['test_accuracy_mean']:.1f} ± {100 * row['test_accuracy_sd']:.1f} %")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"
