"""One job of a sweep (or of the quickstart) in one process: train a run or a stack of runs, then
the intervention grid on each of its runs that has finished and has none yet.

    python -m hf_mecheval.sweep_job [--train TRAINING_FLAGS...] --evaluate RUN_DIR... -- [EVALUATE_FLAGS...]

Training and the grid used to be two processes per run; each pays ~8 s here to import torch
and transformers, as much as a short run's grid itself. The run is exactly what ``python -m
hf_mecheval.training.run TRAINING_FLAGS`` makes (and command.txt says so), and the grid what
``mecheval evaluate RUN_DIR EVALUATE_FLAGS`` writes: the grid draws from its own seeded
generators, not from state training leaves behind.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from .children import follow_parent

USAGE = "python -m hf_mecheval.sweep_job [--train FLAGS...] [--evaluate RUN_DIR...] [-- EVALUATE_FLAGS...]"


def split_arguments(argv: Sequence[str]) -> tuple[list[str] | None, list[str], list[str]]:
    """(training flags or None, run directories to evaluate, evaluate flags) from ``argv``:
    everything after ``--train`` up to ``--evaluate`` is the training's; the run directories
    follow ``--evaluate``, and the evaluation's own flags come after ``--``."""
    argv = list(argv)
    grid_flags: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, grid_flags = argv[:at], argv[at + 1:]
    train, run_dirs = None, []
    if "--evaluate" in argv:
        at = argv.index("--evaluate")
        argv, run_dirs = argv[:at], argv[at + 1:]
    if argv[:1] == ["--train"]:
        train, argv = argv[1:], []
    if argv:
        raise ValueError(f"unexpected {argv[0]!r}")
    return train, run_dirs, grid_flags


def main(argv: Sequence[str] | None = None) -> int:
    from .cli import main as cli_main
    from .runs import RunDir
    from .runs.files import GridSettings
    from .training.run import main as train_main

    follow_parent()              # started by a sweep: stop with it
    try:
        train, run_dirs, grid_flags = split_arguments(sys.argv[1:] if argv is None else argv)
    except ValueError as exc:
        print(f"sweep_job: error: {exc}; usage: {USAGE}", file=sys.stderr)
        return 2
    returncode = 0
    if train is not None:
        returncode = train_main(train, prog="python -m hf_mecheval.training.run")
    settings = GridSettings.from_flags(grid_flags)
    for run_dir in run_dirs:
        run = RunDir(run_dir)
        # a grid on every finished run that did not fail (in a stack, one copy may diverge), made
        # again where the run has one made with other settings
        if run.finished and not run.failure and not run.grid_matches(settings):
            again = ["--overwrite"] if run.evaluated else []
            print(f"=== mecheval evaluate {run_dir} {' '.join(grid_flags + again)}", flush=True)
            returncode = cli_main(["evaluate", run_dir, *grid_flags, *again]) or returncode
            if returncode and train is None:     # a grid that failed: the next would too
                break
    return returncode


if __name__ == "__main__":
    sys.exit(main())
