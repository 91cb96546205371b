"""What a run trained alone (``run.py``) and a stacked run (``stacked.py``) share: the Trainer
with our training order, the task's splits and the model built from the run's ``RunSpec``, and
the end of a run (final metrics, the model, metrics.json, the card).
"""
from __future__ import annotations

import contextlib
import copy
import errno
import inspect
import json
import math
import pickle
import shutil
import sys
from pathlib import Path

import torch
from transformers import Trainer, set_seed

from ..adapters.native_config import build_native_model, is_native
from ..errors import MechEvalError
from ..atomic_files import give_new_file_mode
from ..models import model_classes, non_finite_parameters
from ..models.modeling_mecheval import remote_code_files
from ..runs import RunDir
from ..runs.manifest import recording
from ..runs.model_card import write_model_card
from ..tasks.presets import get_preset
from .arguments import RunArguments
from .data import EpochShuffleSampler, PaddedTaskDataset
from .evaluation import AnswerSummary, accuracy_by_length, decoded_example, multi_query_breakdowns
from .progress import RunningLoss


# what ``MechEvalForCausalLM.answer_states`` takes; a batch with anything else goes through the forward
ANSWER_STATES_INPUTS = {"input_ids", "labels", "attention_mask", "inputs_embeds"}


def takes_skip_logits(model) -> bool:
    """Whether ``model``'s forward returns the loss alone when asked (``skip_logits``: ours)."""
    return "skip_logits" in inspect.signature(model.forward).parameters


class MechEvalTrainer(Trainer):
    """transformers' Trainer with the training order of ``data.epoch_order`` (no global RNG), the
    loss of each step kept for a progress line (``loss_meter``, ``progress.py``), and, given an
    ``answer_summary`` (``evaluation.AnswerSummary``), evaluation that keeps of each batch only
    (prediction, answer, p(answer)) per answer, the predictions ``compute_answer_metrics`` reads."""

    def __init__(self, *args, answer_summary: AnswerSummary | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.loss_meter = RunningLoss()
        self.answer_summary = answer_summary
        self._loss_only: dict | None = None       # what a training step adds to its inputs (at the first)

    def training_step(self, model, inputs, num_items_in_batch=None):
        loss = super().training_step(model, inputs, num_items_in_batch)
        # the value transformers adds up for its own loss log (already detached): summed where it
        # lies, never waited for here
        self.loss_meter.add(self.step_losses(loss))
        return loss

    def step_losses(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss of this step as a progress line shows it (a stack: one per copy)."""
        return loss

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        # a training step reads the loss alone: ours skip the logits where they would be a copy
        # (MQAR's (batch, k, vocab)); an evaluation (return_outputs) still gets them
        if not return_outputs:
            if self._loss_only is None:
                self._loss_only = {"skip_logits": True} if takes_skip_logits(self.accelerator.unwrap_model(model)) else {}
            inputs = {**inputs, **self._loss_only}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        return EpochShuffleSampler(len(dataset), data_seed(self.args))

    def prediction_step(self, model, inputs, prediction_loss_only, ignore_keys=None):
        summarize = self.answer_summary is not None and not prediction_loss_only and inputs.get("labels") is not None
        core = self.accelerator.unwrap_model(model)
        if summarize and hasattr(core, "answer_states") and set(inputs) <= ANSWER_STATES_INPUTS:
            # ours: the LM head at the answers alone, in pieces, never (batch, k, vocab) logits
            inputs = self._prepare_inputs(inputs)
            with torch.no_grad(), self.compute_loss_context_manager():
                loss, summary = self.answer_summary.of_model(core, inputs)
            return loss.detach().mean(), summary, inputs["labels"]
        # transformers' own models return their cache beside the logits (ours return none):
        # left in, it would be taken for a second array of predictions
        if ignore_keys is None:
            own = getattr(getattr(model, "config", None), "keys_to_ignore_at_inference", None) or []
            ignore_keys = [*own, "cache", "past_key_values", "cache_params"]
        loss, logits, labels = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys=ignore_keys)
        if summarize:
            logits = self.answer_summary.of_logits(logits, labels)
        return loss, logits, labels

    def floating_point_ops(self, inputs) -> int:
        # transformers' estimate (6 x tokens x non-embedding parameters, for trainer_state's
        # total_flos), with the parameter count taken once: counting the parameters again at every
        # step walks the whole module tree, ~0.6 ms of a ~12 ms step at the quickstart's size
        ids = inputs.get(getattr(self.model, "main_input_name", "input_ids")) if isinstance(inputs, dict) else None
        if ids is None or not hasattr(self.model, "num_parameters"):
            return super().floating_point_ops(inputs)
        if getattr(self, "_parameter_count", None) is None:
            self._parameter_count = self.model.num_parameters(exclude_embeddings=True)
        return 6 * ids.numel() * self._parameter_count

    def _save(self, output_dir: str | None = None, state_dict=None):
        # the model and every checkpoint: safetensors writes its files 0600, whatever the umask
        super()._save(output_dir, state_dict)
        if self.args.should_save:
            give_new_file_mode(Path(output_dir or self.args.output_dir).glob("*.safetensors"))

    def _save_checkpoint(self, model, trial):
        with saving(Path(self.args.output_dir), f"checkpoint-{self.state.global_step}", record=self.args.should_save):
            super()._save_checkpoint(model, trial)


# what the final save (``save_model`` and ``save_state`` into the run folder) may write there, besides
# the model's code: recorded in the run's manifest before the save starts
FINAL_SAVE_FILES = ("model.safetensors", "config.json", "generation_config.json", "tokenizer.json",
                    "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja", "training_args.bin",
                    "trainer_state.json")


@contextlib.contextmanager
def saving(run_dir: Path, into: str | None = None, record: bool = True):
    """A Trainer's save into the run folder ``run_dir``: a checkpoint (``into``: its subfolder) or
    the final model (``into`` None). A failure — typically a full disk, which torch.save reports
    only as a position mismatch — is one clear error, not a traceback. What was cut short is never
    resumed from (``run_dir.resume_checkpoint``). When ``record``, the save is recorded in the
    run's manifest (``runs/manifest.py``) before it starts (the checkpoint's folder marked, the
    final save's names listed) and what it wrote once it ends, so a save stopped by a SIGKILL or a
    full disk is the run's all the same."""
    path = run_dir / into if into else run_dir / "model.safetensors"
    expected = [*FINAL_SAVE_FILES, *(p.name for p in remote_code_files())] if into is None else []
    try:
        with recording(run_dir, saving=into, expected=expected) if record else contextlib.nullcontext():
            yield
    except (OSError, RuntimeError, ValueError, MechEvalError) as exc:
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


def load_task_splits(spec, main_process: bool) -> dict:
    """The task's train / validation / test datasets, at the sizes ``spec`` resolved."""
    preset = get_preset(spec.data.task)
    if spec.run.recipe == "quick" and main_process:
        print(f"recipe quick: {spec.train_size} training documents, {spec.eval_size} validation/test documents, "
              f"{spec.training.num_train_epochs:g} epochs (the reference: {preset.train_size}, {preset.eval_size}, "
              f"{preset.default_epochs:g})", file=sys.stderr)
    return {split: spec.task.generate(n, split, spec.data.dataset_seed)
            for split, n in (("train", spec.train_size), ("validation", spec.eval_size), ("test", spec.eval_size))}


def build_run_model(spec, seed: int, longest: int):
    """A freshly initialised model of ``spec``'s configuration, seeded with ``seed`` (a stacked
    run builds one per copy, each with its own seed)."""
    set_seed(seed)  # model initialisation (transformers' convention)
    config = copy.deepcopy(spec.config)         # the model may write to its config; the spec's stays as asked
    if is_native(spec.model.architecture):      # transformers' own causal LM, as it is
        model = build_native_model(config)
    else:
        model = model_classes(spec.model.architecture)[2](config)
    if 0 < (getattr(model.config, "max_position_embeddings", 0) or 0) < longest:
        raise MechEvalError(f"documents are up to {longest} tokens but the model has "
                            f"{model.config.max_position_embeddings} position embeddings")
    return model


def padded_splits(data: dict, run_args: RunArguments) -> dict:
    """The Trainer's datasets: train / validation / test, ``test_head`` (the first
    ``test_head_size`` test documents) when that is a proper part of the test split, and
    ``train_head``: the first training documents, as many as the validation split has."""
    splits = {split: PaddedTaskDataset(d) for split, d in data.items()}
    if 0 < run_args.test_head_size < len(data["test"]):
        splits["test_head"] = PaddedTaskDataset(data["test"].head(run_args.test_head_size))
    splits["train_head"] = PaddedTaskDataset(data["train"].head(min(len(data["train"]), len(data["validation"]))))
    return splits


def finish_run(trainer: Trainer, splits: dict, run_dir: Path, extra: dict | None = None) -> dict:
    """Final validation and test metrics, then the model, trainer state, metrics.json (last) and card."""
    validation = trainer.evaluate(splits["validation"], metric_key_prefix="eval")   # always at the final step
    # the test split in one prediction pass: its metrics (logged as ``evaluate`` logs them) and, for
    # MQAR, the per-setting breakdowns come from the same per-answer summary
    prediction = trainer.predict(splits["test"], metric_key_prefix="test")
    test = prediction.metrics
    trainer.log(test)
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
    # accuracy on documents it trained on: beside the validation accuracy, it tells a model that
    # memorized its training documents (high here, low there) from one that learned nothing
    seen = trainer.evaluate(splits["train_head"], metric_key_prefix="train_head")
    final.update(train_head_size=len(splits["train_head"]), train_head_accuracy=seen["train_head_accuracy"])
    lengths = splits["test"].lengths.numpy()
    if splits["test"].multi_query:     # MQAR: test accuracy per setting (as Zoology slices it) and by key position
        final.update(multi_query_breakdowns(prediction.predictions, splits["test"]))
    elif lengths.min() < lengths.max():    # ATR: documents of many lengths; AR's are all as long
        final["test_by_length"] = accuracy_by_length(prediction.predictions, lengths)
    failure = run_failure(trainer.model, final)
    if failure:
        final["failed"] = failure
    if trainer.is_world_process_zero():
        if failure:
            print(f"{run_dir.name} failed: {failure}", file=sys.stderr)
        test = splits["test"]
        print(f"{run_dir.name}, test document 0: "
              f"{decoded_example(trainer.model, trainer.processing_class, test.input_ids[0], test.labels[0])}",
              file=sys.stderr)
        with saving(run_dir):
            trainer.save_model(str(run_dir))        # with the tokenizer (the Trainer's processing_class)
            trainer.save_state()
        # a run resumed from its last checkpoint trains no step: it only writes its final metrics
        # again, from the same weights and with today's code (a field metrics.json gained since);
        # the Trainer's summary of that empty segment (train_loss 0.0, runtime 0) is left out
        empty = (final.get("train_segment_times") or [{}])[-1].get("steps") == 0
        history = [dict(entry) for entry in trainer.state.log_history if not (empty and "train_runtime" in entry)]
        RunDir(run_dir).finish({"final": final, "history": history})
        write_model_card(run_dir)
    return final




def run_failure(model: torch.nn.Module, final: dict) -> str | None:
    """Why a run that ran to its end still failed, or None: it trained zero steps, or its loss or
    weights are not finite (it diverged). ``metrics.json`` records the reason as ``final.failed``;
    the training process exits non-zero; sweeps list the run as failed and do not retrain it (the
    same arguments would diverge again)."""
    if not final.get("global_step"):
        return "it trained zero steps"
    if "diverged_at_step" in final:
        return f"it diverged: non-finite gradients from step {final['diverged_at_step']}"
    if "stopped_diverged_at_step" in final:
        return f"it diverged: its weights held NaN or infinity at step {final['stopped_diverged_at_step']}, where it stopped"
    if non_finite_parameters(model):
        return "it diverged: its weights hold NaN or infinity"
    losses = [final[k] for k in ("validation_loss", "test_loss") if isinstance(final.get(k), float)]
    if not all(math.isfinite(v) for v in losses):
        return "it diverged: its final loss is NaN or infinite"
    return None


def run_trainer(trainer: Trainer, checkpoint: str | None) -> None:
    """trainer.train(), with damaged checkpoints reported as such."""
    try:
        trainer.train(resume_from_checkpoint=checkpoint)
    except (OSError, RuntimeError, ValueError, json.JSONDecodeError, pickle.UnpicklingError, EOFError) as exc:
        if checkpoint is None:
            raise
        raise MechEvalError(f"cannot resume from {checkpoint}: {type(exc).__name__}: "
                            f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
