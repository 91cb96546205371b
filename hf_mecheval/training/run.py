"""One training run: task data -> model -> ``Trainer`` -> a run directory.

    python training/train.py --task ar_32 --architecture mamba --hidden_size 64 --output_dir runs/m64
    accelerate launch training/train.py ...          # several processes / GPUs
    mecheval train CONFIG.yaml [--learning_rate 3e-4 ...]

Run directory (written by the main process only, which holds a lock on it while it runs; an
existing run is replaced only with --overwrite, and only a folder that is recognisably a run:
see ``run_dir.py``):
    command.txt          the exact command
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

import argparse
import contextlib
import errno
import functools
import json
import os
import pickle
import shlex
import shutil
import sys
from pathlib import Path
from typing import Sequence

import yaml
from transformers import HfArgumentParser, Trainer, set_seed
from transformers.trainer_utils import SchedulerType

from ..children import follow_parent
from ..errors import MechEvalError
from ..io_utils import loads_finite, locked_folder, refuse_non_finite, write_text_atomic
from ..adapters.native_config import build_native_model, is_native
from ..models import build_model
from ..tasks.presets import PRESETS, get_preset
from ..tasks.tokenizer import build_tokenizer
from .arguments import (DataArguments, MechEvalTrainingArguments, ModelArguments, RunArguments, resolved_sizes,
                        validate)
from .callbacks import WallClock
from .data import EpochShuffleSampler, PaddedTaskDataset, batch_collator
from .evaluation import answer_logits_summary, compute_answer_metrics, decoded_example
from .run_dir import (check_replaceable, check_same_run, checkpoint_problem, checkpoints, clear_run_dir, holds_files,
                      resume_checkpoint)

METRICS_FILE = "metrics.json"
ARGUMENT_TYPES = (ModelArguments, DataArguments, RunArguments, MechEvalTrainingArguments)


def is_finished(run_dir: str | os.PathLike) -> bool:
    return (Path(run_dir) / METRICS_FILE).exists()


def _prepare_run_dir(run_dir: Path, run: RunArguments, main_process: bool, requested: dict) -> str | None:
    """Check the run directory against --resume / --overwrite; returns the checkpoint to resume from.
    Only the main process checks the directory (it runs first, holding the directory's lock; the
    others then only look up the checkpoint), so processes never race on it. Nothing is deleted
    here but checkpoints cut short (see ``run_dir.resume_checkpoint``): a run replaced with
    --overwrite is removed by ``_start_run_dir`` once the new run's data and model are built."""
    if not main_process:
        return str(resume_checkpoint(run_dir, remove_unusable=False)) if run.resume else None
    exists = holds_files(run_dir)
    if run.resume:
        if not exists:
            raise MechEvalError(f"--resume: {run_dir} holds no run to continue")
        if is_finished(run_dir):
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


def _start_run_dir(run_dir: Path, command: str, record: dict) -> None:
    """A fresh run directory (replacing an old run, which ``_prepare_run_dir`` allowed) with the
    command and the resolved arguments."""
    clear_run_dir(run_dir)
    write_text_atomic(run_dir / "command.txt", command + "\n")
    write_text_atomic(run_dir / "run.json", json.dumps(record, indent=2, default=str) + "\n")


def _check_checkpoint(path: Path) -> None:
    """Read a checkpoint's model and state before resuming, so a damaged one fails clearly."""
    problem = checkpoint_problem(path)
    if problem:
        raise MechEvalError(f"cannot resume from {path}: {problem}")


class MechEvalTrainer(Trainer):
    """transformers' Trainer with the training order of ``data.epoch_order`` (no global RNG)."""

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return EpochShuffleSampler(len(dataset), data_seed(self.args))

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        # transformers' own models return their cache beside the logits (ours return none):
        # left in, it would be taken for a second array of predictions
        if ignore_keys is None:
            own = getattr(getattr(model, "config", None), "keys_to_ignore_at_inference", None) or []
            ignore_keys = [*own, "cache", "past_key_values", "cache_params"]
        return super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)

    def _save_checkpoint(self, model, trial):
        with saving(Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"):
            super()._save_checkpoint(model, trial)


@contextlib.contextmanager
def saving(path: Path):
    """Writing ``path`` (a checkpoint, the final model): a failure — typically a full disk, which
    torch.save reports only as a position mismatch — is one clear error, not a traceback. What
    was cut short is never resumed from (``run_dir.resume_checkpoint``)."""
    try:
        yield
    except (OSError, RuntimeError, ValueError) as exc:
        try:
            free = shutil.disk_usage(path.parent).free
        except OSError:
            free = None
        text = str(exc)
        if getattr(exc, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "os error 28" in text \
                or "No space left" in text:
            reason = "no space left on the device"
        elif free is not None and free < 16 * 2**20:
            reason = f"no space left on the device ({free / 2**20:.1f} MiB free)"
        else:
            reason = f"{type(exc).__name__}: {(text.splitlines() or [''])[0]}"
        raise MechEvalError(f"cannot write {path}: {reason}; free some space, then continue the run with "
                            "--resume") from None


def data_seed(training_args) -> int:
    return training_args.data_seed if training_args.data_seed is not None else training_args.seed


def resolve_sizes(data_args: DataArguments, run_args: RunArguments, training_args) -> tuple[int, int]:
    """The run's training and evaluation sizes (``arguments.resolved_sizes``); the number of
    epochs is set on ``training_args`` when not given."""
    train_size, eval_size, training_args.num_train_epochs = resolved_sizes(data_args, run_args, training_args)
    return train_size, eval_size


def load_task_splits(task, data_args: DataArguments, run_args: RunArguments, training_args, main_process: bool):
    """The task's train / validation / test datasets (and the recipe's sizes and epochs); ``task``
    as ``validate`` built it."""
    preset = get_preset(data_args.task)
    train_size, eval_size = resolve_sizes(data_args, run_args, training_args)
    if run_args.recipe == "quick" and main_process:
        print(f"recipe quick: {train_size} training documents, {eval_size} validation/test documents, "
              f"{training_args.num_train_epochs:g} epochs (the reference: {preset.train_size}, {preset.eval_size}, "
              f"{16 if preset.task == 'ar' else 32})", file=sys.stderr)
    data = {split: task.generate(n, split, data_args.dataset_seed)
            for split, n in (("train", train_size), ("validation", eval_size), ("test", eval_size))}
    return data, train_size, eval_size


def build_run_model(model_args: ModelArguments, task, seed: int, longest: int):
    set_seed(seed)  # model initialisation (transformers' convention)
    if is_native(model_args.architecture):      # transformers' own causal LM, as it is
        model = build_native_model(model_args.build_config(task.vocab_size))
    else:
        model = build_model(model_args.architecture, vocab_size=task.vocab_size, **model_args.config_fields())
    if 0 < (getattr(model.config, "max_position_embeddings", 0) or 0) < longest:
        raise MechEvalError(f"documents are up to {longest} tokens but the model has "
                            f"{model.config.max_position_embeddings} position embeddings")
    return model


def run_record(config, model_args, data_args, run_args, training_args, task, train_size, eval_size) -> dict:
    """What run.json holds: every resolved argument, the task and the model configuration
    (``config``: the model's, or the one it would be built from: they are equal)."""
    sizes = {}
    if is_native(model_args.architecture):   # under the common names too (GPT-2 calls them n_embd, n_layer)
        sizes = {"hidden_size": config.hidden_size, "num_hidden_layers": config.num_hidden_layers}
    return {"model": {"architecture": model_args.architecture, **sizes, **config.to_diff_dict()},
            "task": {"preset": data_args.task, "config": task.config.to_dict(), "train_size": train_size,
                     "eval_size": eval_size, "dataset_seed": data_args.dataset_seed},
            "recipe": run_args.recipe,
            "training": json.loads(training_args.to_json_string())}


def requested_record(model_args, data_args, run_args, training_args, task) -> dict:
    """The run.json that these (validated) arguments would write, without building data or model:
    what a finished or interrupted run must match to be reused or resumed (``run_dir.fingerprint``)."""
    train_size, eval_size = resolve_sizes(data_args, run_args, training_args)
    config = model_args.build_config(task.vocab_size)
    return json.loads(json.dumps(run_record(config, model_args, data_args, run_args, training_args, task,
                                            train_size, eval_size), default=str))


def padded_splits(data: dict, run_args: RunArguments) -> dict:
    """The Trainer's datasets: train / validation / test, and ``test_head`` (the first
    ``test_head_size`` test documents) when that is a proper part of the test split."""
    splits = {split: PaddedTaskDataset(d) for split, d in data.items()}
    if 0 < run_args.test_head_size < len(data["test"]):
        splits["test_head"] = PaddedTaskDataset(data["test"].head(run_args.test_head_size))
    return splits


def finish_run(trainer: Trainer, splits: dict, run_dir: Path, extra: dict | None = None) -> dict:
    """Final validation and test metrics, then the model, trainer state, metrics.json (last) and card."""
    validation = trainer.evaluate(splits["validation"], metric_key_prefix="eval")   # always at the final step
    test = trainer.evaluate(splits["test"], metric_key_prefix="test")
    final = {
        "validation_accuracy": validation["eval_accuracy"], "validation_answer_prob": validation["eval_answer_prob"],
        "validation_loss": validation["eval_loss"], "test_accuracy": test["test_accuracy"],
        "test_answer_prob": test["test_answer_prob"], "test_loss": test["test_loss"],
        "global_step": trainer.state.global_step, "epochs": trainer.state.epoch,
        "world_size": trainer.args.world_size, **(extra or {}),
    }
    if "test_head" in splits:
        head = trainer.evaluate(splits["test_head"], metric_key_prefix="test_head")
        final.update(test_head_size=len(splits["test_head"]), test_head_accuracy=head["test_head_accuracy"])
    if trainer.is_world_process_zero():
        test = splits["test"]
        print(f"{run_dir.name}, test document 0: "
              f"{decoded_example(trainer.model, trainer.processing_class, test.input_ids[0], test.labels[0])}",
              file=sys.stderr)
        with saving(run_dir / "model.safetensors"):
            trainer.save_model(str(run_dir))        # with the tokenizer (the Trainer's processing_class)
            trainer.save_state()
        history = [{k: v for k, v in entry.items()} for entry in trainer.state.log_history]
        metrics = {"final": final, "history": history}
        write_text_atomic(run_dir / METRICS_FILE, json.dumps(metrics, indent=2) + "\n", overwrite=True)
        from ..reports.model_card import write_model_card

        write_model_card(run_dir)
    return final


def train(model_args: ModelArguments, data_args: DataArguments, run_args: RunArguments,
          training_args: MechEvalTrainingArguments, callbacks: Sequence = (), command: str | None = None) -> dict:
    """Train one model; returns the final metrics (also written to ``metrics.json``)."""
    task = validate(model_args, data_args, run_args, training_args)
    run_dir = Path(training_args.output_dir)
    main_process = training_args.process_index == 0
    record = requested_record(model_args, data_args, run_args, training_args, task)
    # the main process holds the run directory's lock until the run is written: a second writer
    # (another run given the same --output_dir) is refused instead of mixing its files in
    with locked_folder(run_dir) if main_process else contextlib.nullcontext():
        with training_args.main_process_first(desc="run directory"):
            checkpoint = _prepare_run_dir(run_dir, run_args, main_process, record)

        data, train_size, eval_size = load_task_splits(task, data_args, run_args, training_args, main_process)
        splits = padded_splits(data, run_args)
        model = build_run_model(model_args, task, training_args.seed, max(int(d.lengths.max()) for d in data.values()))

        with training_args.main_process_first(desc="run directory"):
            if main_process and checkpoint is None:
                _start_run_dir(run_dir, command or this_command(), record)

        clock = WallClock(checkpoint)
        callbacks = [clock, *callbacks]         # first: a callback that stops the run sees the time saved
        trainer = MechEvalTrainer(
            model=model, args=training_args, train_dataset=splits["train"], eval_dataset=splits["validation"],
            processing_class=build_tokenizer(task), data_collator=batch_collator,
            compute_metrics=compute_answer_metrics, preprocess_logits_for_metrics=answer_logits_summary,
            callbacks=callbacks,
        )
        if run_args.restoration_every_n_steps > 0:
            from .callbacks import RestorationCallback

            probe = task.generate(run_args.restoration_examples, "validation", data_args.dataset_seed)
            trainer.add_callback(RestorationCallback(trainer, task, probe, run_args.restoration_every_n_steps))
        run_trainer(trainer, checkpoint)
        return finish_run(trainer, splits, run_dir, clock.summary())


def run_trainer(trainer: Trainer, checkpoint: str | None) -> None:
    """trainer.train(), with damaged checkpoints reported as such."""
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    except (OSError, RuntimeError, ValueError, json.JSONDecodeError, pickle.UnpicklingError, EOFError) as exc:
        if checkpoint is None:
            raise
        raise MechEvalError(f"cannot resume from {checkpoint}: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}") from None


@functools.lru_cache(maxsize=1)
def _parser() -> HfArgumentParser:
    # built once: building it is most of the cost of checking a sweep's runs (~25 ms each)
    return HfArgumentParser(
        ARGUMENT_TYPES, allow_abbrev=False, exit_on_error=False,
        description="Train one model into a run directory. A stacked run (several runs that differ only in "
                    "learning rate and seed, trained together) is started instead with: --stack STACK.json "
                    "[--resume | --overwrite]; see hf_mecheval/training/stacked.py.")


def parse(argv: Sequence[str]):
    """Arguments from the command line; a leading .yaml/.json file supplies defaults that later
    flags override. Unknown keys in the file or on the command line are errors, and so are NaN
    and infinite numbers in the file."""
    parser = _parser()
    argv = list(argv)
    if argv and argv[0].endswith((".yaml", ".yml", ".json")):
        path = Path(argv.pop(0))
        try:
            text = path.read_text()
            values = yaml.safe_load(text) if path.suffix != ".json" else loads_finite(text, str(path))
        except (OSError, yaml.YAMLError, ValueError) as exc:     # ValueError: not UTF-8 text, not JSON
            raise MechEvalError(f"cannot read the run config {path}: {(str(exc).splitlines() or [''])[0]}") from None
        if not isinstance(values, dict):
            raise MechEvalError(f"the run config {path} must be a mapping of argument names to values")
        refuse_non_finite(values, str(path))
        argv = as_flags(values) + argv
    try:
        model_args, data_args, run_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    except argparse.ArgumentError as exc:    # a value of the wrong type or not among the choices
        raise MechEvalError(str(exc)) from None
    except ValueError as exc:                # unknown keys in a config file or on the command line
        raise MechEvalError(str(exc).splitlines()[0]) from None
    # the reference decays linearly on some tasks (ATR-gen, ATR-sibling): their default, unless
    # the schedule was chosen explicitly
    chosen = any(a.split("=")[0] in ("--lr_scheduler_type", "--lr-scheduler-type") for a in argv)
    if not chosen and data_args.task in PRESETS:
        training_args.lr_scheduler_type = SchedulerType(get_preset(data_args.task).lr_scheduler)
    return model_args, data_args, run_args, training_args


def resolve_run_args(args: dict) -> dict:
    """A run's arguments (as in a sweep file) checked like ``mecheval train`` would check them
    (parsed, then ``validate``), before any run starts; numbers given as strings ("1e-4", as YAML
    reads that) come back as numbers."""
    parsed = parse(as_flags(args) + ["--output_dir", "."])
    validate(*parsed)
    resolved = {}
    for key, value in args.items():
        typed = next(getattr(group, key) for group in parsed if hasattr(group, key))
        numeric = isinstance(typed, (int, float)) and not isinstance(typed, bool)
        resolved[key] = typed if numeric else value
    return resolved


def as_flags(values: dict) -> list[str]:
    """Command-line flags for a mapping of training arguments (dicts and lists as JSON)."""
    flags = []
    for key, value in values.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def invocation() -> str:
    """How this process was started, as a command to type: ``python -m MODULE`` or ``python
    SCRIPT``, under ``accelerate launch`` with its process count, CPU and precision flags."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        target = f"-m {spec.name.removesuffix('.__main__')}"
    else:
        target = shlex.quote(sys.argv[0])
    if "ACCELERATE_MIXED_PRECISION" not in os.environ:          # set in every process accelerate launches
        return f"python {target}"
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    flags = (["--multi_gpu"] if processes > 1 else []) + [f"--num_processes {processes}"]
    flags += ["--cpu"] if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" else []
    precision = os.environ["ACCELERATE_MIXED_PRECISION"]
    flags += [f"--mixed_precision {precision}"] if precision != "no" else []
    return " ".join(["accelerate launch", *flags, target])


def this_command(argv: Sequence[str] | None = None, prog: str | None = None) -> str:
    """The command that started this training, to be typed again (command.txt): ``prog`` (e.g.
    ``mecheval train``, default: how this process was started) and the arguments (default: sys.argv's)."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join([prog or invocation(), *map(shlex.quote, argv)])


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Train one run (or a stack with ``--stack``). ``prog``: the command that invoked it, as
    written into ``command.txt`` (``mecheval train`` from the CLI; default: this process's own)."""
    argv = sys.argv[1:] if argv is None else list(argv)
    follow_parent()              # started by a sweep: stop with it
    command = this_command(argv, prog)
    try:
        if argv[:1] == ["--stack"]:
            result, main_process = _train_stack(argv, command), True
        else:
            model_args, data_args, run_args, training_args = parse(argv)
            result = train(model_args, data_args, run_args, training_args, command=command)
            main_process = training_args.process_index == 0
    except MechEvalError as exc:
        print(f"mecheval train: error: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # e.g. an unwritable output_dir
        where = f": {exc.filename}" if exc.filename else ""
        print(f"mecheval train: error: {exc.strerror or exc}{where}", file=sys.stderr)
        return 2
    _end_process_group()
    if main_process:
        print(json.dumps(result, indent=2))
    return 0


def _train_stack(argv: list[str], command: str) -> dict:
    """--stack STACK.json [--resume | --overwrite]: a stacked run (see training/stacked.py);
    returns each run's final metrics by name."""
    from .stacked import load_stack_file, train_stacked

    rest = argv[2:]
    if len(argv) < 2 or any(a not in ("--resume", "--overwrite") for a in rest):
        raise MechEvalError("usage: --stack STACK.json [--resume | --overwrite]")
    if {"--resume", "--overwrite"} <= set(rest):
        raise MechEvalError("--resume and --overwrite exclude each other")
    stack_dir, members = load_stack_file(argv[1], parse)
    finals = train_stacked(members, stack_dir, resume="--resume" in rest, overwrite="--overwrite" in rest,
                           command=command)
    return {m.name: f for m, f in zip(members, finals)}


def _end_process_group() -> None:
    """Several processes (accelerate launch): wait for the main one to finish writing, then take
    the process group down. Left to interpreter exit, gloo's threads sometimes abort (SIGABRT)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
