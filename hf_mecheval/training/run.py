"""One training run: task data -> model -> ``Trainer`` -> a run directory.

    python training/train.py --task ar_32 --architecture mamba --hidden_size 64 --output_dir runs/m64
    accelerate launch training/train.py ...          # several processes / GPUs
    mecheval train CONFIG.yaml [--learning_rate 3e-4 ...]
    python -m hf_mecheval.training.run --job JOB.json [--resume | --overwrite]   # a sweep's job: see jobs.py

Run directory (written by the main process only, which holds a lock on it while it runs; an
existing run is replaced only with --overwrite, and only a folder that is recognisably a run:
see ``runs/run_dir.py``):
    command.txt          the command that trains it again (a sweep's run: the `mecheval train` flags of its values)
    run.json             every resolved argument, task and model configuration
    checkpoint-*/        Trainer checkpoints (--resume continues from the newest complete one,
                         if the run.json there has the fingerprint of the arguments given)
    config.json, model.safetensors   the final model (AutoModelForCausalLM.from_pretrained(RUN_DIR)),
      *.py, generation_config.json   with its own code (trust_remote_code=True without hf-mecheval)
    tokenizer.json, tokenizer_config.json   the task's vocabulary as text (AutoTokenizer, pipelines)
    trainer_state.json   the Trainer's state and log history
    metrics.json         validation history, final validation and test metrics; written last,
                         so its presence marks a finished run
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import sys
from pathlib import Path
from typing import Callable, Sequence

from ..children import follow_parent
from ..errors import MechEvalError
from ..locks import locked_folder
from ..runs import RunDir
from ..runs.run_dir import check_replaceable, check_same_run, holds_files, resume_checkpoint
from ..tasks.tokenizer import build_tokenizer
from .arguments import RunArguments
from .callbacks import StopWhenDiverged, TrainingClock
from .command_line import name_the_command, this_command, values_as_flags
from .data import batch_collator
from .evaluation import compute_answer_metrics, logits_summary_for
from .jobs import Job, read_job_file
from .progress import ProgressFile, progress_path
from .spec import RunSpec
from .stacked import Member, train_stacked
from .trainer import MechEvalTrainer, build_run_model, finish_run, load_task_splits, padded_splits, run_trainer


def _prepare_run_dir(run_dir: Path, run: RunArguments, main_process: bool, requested: dict) -> str | None:
    """Check the run directory against --resume / --overwrite; returns the checkpoint to resume from.
    Only the main process checks the directory (it runs first, holding the directory's lock; the
    others then only look up the checkpoint), so processes never race on it. Nothing is deleted
    here but checkpoints cut short (see ``run_dir.resume_checkpoint``): a run replaced with
    --overwrite is removed by ``RunDir.start`` once the new run's data and model are built."""
    if not main_process:
        return str(resume_checkpoint(run_dir, remove_unusable=False)) if run.resume else None
    exists = holds_files(run_dir)
    if run.resume:
        if not exists:
            raise MechEvalError(f"--resume: {run_dir} holds no run to continue")
        if RunDir(run_dir).finished:
            raise MechEvalError(f"--resume: the run in {run_dir} has already finished")
        check_same_run(run_dir, requested, "resume")
        return str(resume_checkpoint(run_dir))
    if exists and not run.overwrite:
        what = "a run" if (run_dir / "run.json").exists() or (run_dir / "command.txt").exists() else "files"
        raise MechEvalError(f"{run_dir} already holds {what}; pass --resume to continue a run or --overwrite to "
                            "replace it")
    if exists:
        check_replaceable(run_dir)
    return None


def train(spec: RunSpec, callbacks: Sequence = (), command: str | None = None, progress: Path | None = None) -> dict:
    """Train one model; returns the final metrics (also written to ``metrics.json``). ``progress``:
    a progress file to keep while it trains (a sweep's job: ``progress.py``), or None."""
    run_args, training_args = spec.run, spec.training
    run_dir = Path(training_args.output_dir)
    main_process = training_args.process_index == 0
    record = spec.record
    # the main process holds the run directory's lock until the run is written: a second writer
    # (another run given the same --output_dir) is refused instead of mixing its files in
    with locked_folder(run_dir) if main_process else contextlib.nullcontext():
        with training_args.main_process_first(desc="run directory"):
            checkpoint = _prepare_run_dir(run_dir, run_args, main_process, record)

        data = load_task_splits(spec, main_process)
        splits = padded_splits(data, run_args)
        model = build_run_model(spec, training_args.seed, max(int(d.lengths.max()) for d in data.values()))

        with training_args.main_process_first(desc="run directory"):
            if main_process and checkpoint is None:
                RunDir(run_dir).start(command or this_command(), record)   # replaces an old run (allowed above)

        clock, divergence = TrainingClock(checkpoint), StopWhenDiverged()
        callbacks = [clock, divergence, *callbacks]   # first: a callback that stops the run sees the time saved
        trainer = MechEvalTrainer(
            model=model, args=training_args, train_dataset=splits["train"], eval_dataset=splits["validation"],
            processing_class=build_tokenizer(spec.task), data_collator=batch_collator,
            compute_metrics=compute_answer_metrics, answer_summary=logits_summary_for(spec.task),
            callbacks=callbacks,
        )
        if run_args.restoration_every_n_steps > 0:
            from .callbacks import RestorationCallback

            probe = spec.task.generate(run_args.restoration_examples, "validation", spec.data.dataset_seed)
            trainer.add_callback(RestorationCallback(trainer, spec.task, probe, run_args.restoration_every_n_steps))
        if progress is not None and main_process:
            trainer.add_callback(ProgressFile(progress, [run_dir.name], trainer.loss_meter))
        run_trainer(trainer, checkpoint)
        return finish_run(trainer, splits, run_dir, {**clock.summary(), **divergence.summary()})


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Train one run (or the runs of a job file, ``--job``). ``prog``: the command that invoked it,
    as written into ``command.txt`` (``mecheval train`` from the CLI; default: this process's own)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    follow_parent()              # started by a sweep: stop with it
    if prog is not None:
        name_the_command(prog)
    if argv[:1] == ["--job"]:
        return training_command(lambda: train_job_file(*job_arguments(argv)))

    def one_run():
        spec = RunSpec.from_flags(argv)
        return {spec.output_dir: train(spec, command=this_command(argv, prog))}, spec.training.process_index == 0
    return training_command(one_run)


def training_command(training: Callable[[], tuple[dict, bool]]) -> int:
    """Run ``training`` (which returns each run's final metrics by name, and whether this is the
    main process) as a command: its result printed, one line for an error, and the exit code:
    0, 1 where a run failed (diverged, trained no step), 2 for bad input, 130 on Ctrl-C."""
    try:
        result, main_process = training()
    except MechEvalError as exc:
        print(f"mecheval train: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. an unwritable output_dir
        where = f": {str(exc.filename)[:200]}" if exc.filename else ""
        print(f"mecheval train: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:    # Ctrl-C: one line, not a traceback from inside the training loop
        print("mecheval train: interrupted; the run keeps its last checkpoint: the same command with --resume "
              "continues it", file=sys.stderr)
        return 130
    _end_process_group()
    finals = list(result.values())
    if main_process:
        print(json.dumps(finals[0] if len(finals) == 1 else result, indent=2))
    failed = [f["failed"] for f in finals if f.get("failed")]
    if failed:      # the run folder is complete, and its metrics.json says why it failed
        print(f"mecheval train: error: {len(failed)} of {len(finals)} run(s) failed: {failed[0]}", file=sys.stderr)
        return 1
    return 0


def job_arguments(argv: Sequence[str]) -> tuple[Job, str | None]:
    """``--job JOB.json [--resume | --overwrite]``: the job file, read, and how it restarts."""
    rest = list(argv[2:])
    if len(argv) < 2 or any(a not in ("--resume", "--overwrite") for a in rest):
        raise MechEvalError("usage: --job JOB.json [--resume | --overwrite]")
    if {"--resume", "--overwrite"} <= set(rest):
        raise MechEvalError("--resume and --overwrite exclude each other")
    return read_job_file(argv[1]), (rest[0].removeprefix("--") if rest else None)


def train_job_file(job: Job, restart: str | None = None) -> tuple[dict, bool]:
    """Train a job file's runs: one alone, several as one stack (``training/stacked.py``, one
    process); returns each run's final metrics by name, and whether this is the main process.
    ``restart``: "resume", "overwrite" or None. command.txt says how to train the run again: a
    lone run's ``mecheval train`` flags, a stack's job file. Its progress goes to the job's progress
    file (``progress.py``)."""
    progress = progress_path(job.path)
    if job.stack_dir is None:
        (name, spec), = job.runs
        resumed = dataclasses.replace(spec.run, resume=restart == "resume", overwrite=restart == "overwrite")
        command = this_command(values_as_flags(job.values[0]) + ["--output_dir", spec.output_dir],
                               prog="mecheval train")
        return ({name: train(dataclasses.replace(spec, run=resumed), command=command, progress=progress)},
                spec.training.process_index == 0)
    members = [Member(name, spec) for name, spec in job.runs]
    finals = train_stacked(members, job.stack_dir, resume=restart == "resume", overwrite=restart == "overwrite",
                           command=this_command(["--job", str(job.path)], prog="python -m hf_mecheval.training.run"),
                           progress=progress)
    return {m.name: f for m, f in zip(members, finals)}, True


def _end_process_group() -> None:
    """Several processes (accelerate launch): wait for the main one to finish writing, then take
    the process group down. Left to interpreter exit, gloo's threads sometimes abort (SIGABRT)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
