"""Command-line / config-file arguments of a training run (``HfArgumentParser`` dataclasses).

Defaults are the reference recipe (SPEC §4): AdamW, weight decay 0, betas (0.9, 0.999), cosine
schedule with 10 % linear warm-up (linear decay for atr_gen and atr_sibling, as the reference:
the preset says so and ``parse`` applies it unless --lr_scheduler_type is given), batch 32, fp32,
answer-only loss, 100 032 training documents, 16 epochs for AR and 32 for ATR, evaluation on
validation every epoch and at the end.
``--recipe quick`` is an explicit smaller CPU recipe (printed when used).
"""
from __future__ import annotations

import dataclasses
import json
from typing import Any

import torch
from transformers import TrainingArguments

from ..errors import ConfigError
from ..typed_config import check_int
from ..models import MODEL_CLASSES
from ..tasks.presets import PRESETS

QUICK_RECIPE = {"train_size": 10_000, "eval_size": 512, "num_train_epochs": 8.0}


@dataclasses.dataclass
class ModelArguments:
    architecture: str = dataclasses.field(
        default="transformer", metadata={"help": f"one of: {', '.join(MODEL_CLASSES)}"})
    hidden_size: int = dataclasses.field(default=64, metadata={"help": "model width"})
    num_hidden_layers: int = dataclasses.field(default=2, metadata={"help": "number of blocks"})
    max_position_embeddings: int | None = dataclasses.field(
        default=None, metadata={"help": "learned positions (0 = none); default: the architecture's "
                                        "(1024 for the Transformer, 0 otherwise)"})
    kernels: str = dataclasses.field(default="auto", metadata={"help": "auto, torch or cuda"})
    model_config: str = dataclasses.field(
        default="{}", metadata={"help": 'JSON object of further config fields, e.g. \'{"conv_kernel": 0}\''})

    def config_fields(self) -> dict[str, Any]:
        if self.architecture not in MODEL_CLASSES:
            raise ConfigError("architecture", f"unknown architecture {self.architecture!r}; choose one of "
                                              f"{', '.join(MODEL_CLASSES)}")
        extra = _json_object("model_config", self.model_config)
        if "vocab_size" in extra:
            raise ConfigError("model_config", "vocab_size comes from the task; set the task's vocabulary instead "
                                              "(--task / --task_config)")
        known = [f for f in MODEL_CLASSES[self.architecture][0].field_names() if f != "vocab_size"]
        unknown = sorted(set(extra) - set(known))
        if unknown:   # a typo would otherwise be kept as an inert attribute of the config
            raise ConfigError("model_config", f"unknown field {unknown[0]!r} for {self.architecture}; its fields: "
                                              f"{', '.join(known)}")
        fields = {"hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
                  "kernels": self.kernels, **extra}
        if self.max_position_embeddings is not None:
            fields["max_position_embeddings"] = self.max_position_embeddings
        return fields


@dataclasses.dataclass
class DataArguments:
    task: str = dataclasses.field(default="ar_32", metadata={"help": f"task preset: {', '.join(PRESETS)}"})
    task_config: str = dataclasses.field(
        default="{}", metadata={"help": 'JSON object overriding task config fields, e.g. \'{"num_kv": 64}\''})
    train_size: int | None = dataclasses.field(default=None, metadata={"help": "training documents (default 100032)"})
    eval_size: int | None = dataclasses.field(default=None, metadata={"help": "validation and test documents each (default 1024)"})
    dataset_seed: int = dataclasses.field(default=0, metadata={"help": "seed of the generated documents"})

    def task_overrides(self) -> dict[str, Any]:
        if self.task not in PRESETS:
            raise ConfigError("task", f"unknown preset {self.task!r}; choose one of {', '.join(PRESETS)}")
        return _json_object("task_config", self.task_config)


@dataclasses.dataclass
class RunArguments:
    recipe: str = dataclasses.field(default="reference", metadata={"help": "reference or quick (10 000 "
                                                                           "training documents, 512 eval, 8 epochs)"})
    resume: bool = dataclasses.field(default=False, metadata={"help": "continue an interrupted run in output_dir"})
    overwrite: bool = dataclasses.field(default=False, metadata={"help": "replace an existing run in output_dir"})
    restoration_every_n_steps: int = dataclasses.field(
        default=0, metadata={"help": "measure restoration at the last layer's input every N steps (0 = never); "
                                     "see restoration_history.json"})
    restoration_examples: int = dataclasses.field(default=64, metadata={"help": "validation documents it uses"})
    test_head_size: int = dataclasses.field(
        default=320, metadata={"help": "also report test accuracy on the first N test documents (the reference "
                                       "reported its first 320); 0 = not"})


@dataclasses.dataclass
class MechEvalTrainingArguments(TrainingArguments):
    """transformers' TrainingArguments with the reference recipe as defaults."""

    output_dir: str | None = dataclasses.field(default=None, metadata={"help": "the run directory"})
    learning_rate: float = 1e-3
    lr_scheduler_type: str = "cosine"
    warmup_steps: float = 0.1
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 256
    num_train_epochs: float | None = dataclasses.field(
        default=None, metadata={"help": "default: 16 for AR, 32 for ATR (the reference)"})
    eval_strategy: str = "epoch"
    save_strategy: str = "epoch"
    save_total_limit: int | None = 2
    logging_steps: float = 50
    report_to: str | None = "none"
    seed: int = 0
    dataloader_drop_last: bool = False
    remove_unused_columns: bool = False   # batches come ready-made from PaddedTaskDataset
    dataloader_pin_memory: bool = dataclasses.field(default_factory=torch.cuda.is_available)


def _json_object(field: str, text: str | dict) -> dict:
    if isinstance(text, dict):
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(field, f"must be a JSON object: {exc.msg}") from None
    if not isinstance(value, dict):
        raise ConfigError(field, f"must be a JSON object, got {text!r}")
    return value


SEED_LIMIT = 2**32 - 1   # transformers.set_seed seeds numpy's legacy global generator


def validate(model: ModelArguments, data: DataArguments, run: RunArguments, training):
    """Everything that can be checked before any work starts (and before an existing run is
    replaced): every argument, the task's and the model's configuration. Returns the task."""
    from ..tasks import build_task

    fields = model.config_fields()                        # checks the architecture's name first
    task = build_task(data.task, **data.task_overrides())
    MODEL_CLASSES[model.architecture][0](vocab_size=task.vocab_size, **fields)
    check_int("seed", training.seed, minimum=0, maximum=SEED_LIMIT)
    check_int("dataset_seed", data.dataset_seed, minimum=0)
    check_int("per_device_train_batch_size", training.per_device_train_batch_size, minimum=1)
    check_int("per_device_eval_batch_size", training.per_device_eval_batch_size, minimum=1)
    check_int("restoration_every_n_steps", run.restoration_every_n_steps, minimum=0)
    check_int("test_head_size", run.test_head_size, minimum=0)
    if run.restoration_every_n_steps > 0:
        check_int("restoration_examples", run.restoration_examples, minimum=1)
    if run.recipe not in ("reference", "quick"):
        raise ConfigError("recipe", f"must be 'reference' or 'quick', got {run.recipe!r}")
    if training.learning_rate <= 0:
        raise ConfigError("learning_rate", f"must be > 0, got {training.learning_rate}")
    if training.num_train_epochs is not None and training.num_train_epochs <= 0:
        raise ConfigError("num_train_epochs", f"must be > 0, got {training.num_train_epochs}")
    for name in ("train_size", "eval_size"):
        value = getattr(data, name)
        if value is not None and value < 1:
            raise ConfigError(name, f"must be >= 1, got {value}")
    if not training.output_dir:
        raise ConfigError("output_dir", "a run directory is required (--output_dir RUN_DIR)")
    if run.resume and run.overwrite:
        raise ConfigError("resume", "--resume and --overwrite exclude each other")
    return task
