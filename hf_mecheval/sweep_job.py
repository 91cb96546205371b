"""One job of a sweep (or of the quickstart) in one process: train the runs of a job file (one run,
or a stack), then make the intervention grid the file asks for on each of them that has finished
and has none with those settings.

    python -m hf_mecheval.sweep_job JOB.json [--resume | --overwrite]

The job file is ``training/jobs.py``'s. Training and the grid used to be two processes per run;
each pays ~8 s here to import torch and transformers, as much as a short run's grid itself. The
runs are exactly what ``python -m hf_mecheval.training.run --job JOB.json`` makes, and each grid
what ``mecheval evaluate RUN_DIR`` writes with the same settings: the grid draws from its own
seeded generators, not from state training leaves behind.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence

from .children import follow_parent

USAGE = "python -m hf_mecheval.sweep_job JOB.json [--resume | --overwrite]"


def main(argv: Sequence[str] | None = None) -> int:
    from .errors import MechEvalError
    from .reports.evaluate_run import evaluate_run, summary_lines
    from .runs import RunDir
    from .training.progress import progress_path, write_progress
    from .training.run import job_arguments, train_job_file, training_command

    follow_parent()              # started by a sweep: stop with it
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        job, restart = job_arguments(["--job", *argv])
    except MechEvalError as exc:
        print(f"sweep_job: error: {exc}; usage: {USAGE}", file=sys.stderr)
        return 2
    returncode = 0
    if not all(RunDir(spec.output_dir).finished for _, spec in job.runs):
        # errors and exit codes as `python -m hf_mecheval.training.run --job JOB.json` has them
        returncode = training_command(lambda: train_job_file(job, restart))
    if job.grid is None:
        return returncode
    for _, spec in job.runs:
        run = RunDir(spec.output_dir)
        # a grid on every finished run that did not fail (in a stack, one copy may diverge), made
        # again where the run has one made with other settings
        if not run.finished or run.failure or run.grid_matches(job.grid):
            continue
        print(f"=== mecheval evaluate {spec.output_dir} {' '.join(job.grid.flags())}"
              f"{' --overwrite' if run.evaluated else ''}", flush=True)
        write_progress(progress_path(job.path), {"runs": [name for name, _ in job.runs], "phase": "interventions",
                                                 "run": run.path.name})
        grid = job.grid
        try:
            result = evaluate_run(spec.output_dir, n=grid.n, split=grid.split, seed=grid.seed,
                                  sites=list(grid.sites) if grid.sites else None, n_resamples=grid.resamples,
                                  overwrite=run.evaluated)
        except (MechEvalError, OSError) as exc:
            print(f"mecheval evaluate: error: {exc}", file=sys.stderr)
            returncode = returncode or 2
            continue
        print("\n".join(summary_lines(result)), flush=True)
    return returncode


if __name__ == "__main__":
    sys.exit(main())
