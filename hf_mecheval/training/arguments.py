"""Command-line / config-file arguments of a training run (``HfArgumentParser`` dataclasses).

Defaults are the reference recipe (the paper's training setup): AdamW, weight decay 0, betas (0.9, 0.999), no
gradient clipping, the reference's initialisation (``init_scheme``), cosine
schedule with 10 % linear warm-up (linear decay for atr_gen and atr_sibling, as the reference:
the preset says so and ``parse`` applies it unless --lr_scheduler_type is given), batch 32, fp32,
answer-only loss, 100 032 training documents, 16 epochs for AR and 32 for ATR, evaluation on
validation every epoch and at the end.
``--recipe quick`` is an explicit smaller CPU recipe (printed when used).
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any

import torch
from transformers import TrainingArguments

from ..errors import ConfigError, MechEvalError
from ..inputs import check_path, loads_finite
from ..typed_config import check_int
from ..adapters.native_config import count_native_parameters, is_native, native_config, native_model_type
from ..models import ARCHITECTURES, get_architecture, model_classes
from ..models.configuration_mecheval import FILTER_FORMS, FORM_FIELDS
from ..tasks.presets import PRESETS

QUICK_RECIPE = {"train_size": 10_000, "eval_size": 512, "num_train_epochs": 8.0}


@dataclasses.dataclass
class ModelArguments:
    architecture: str = dataclasses.field(
        default="transformer", metadata={"help": f"one of: {', '.join(ARCHITECTURES)}, or an architecture "
                                                 f"an installed plug-in registers; or hf:<model_type>, "
                                                 "transformers' own causal LM (hf:gpt2, hf:llama, hf:mamba, ...)"})
    hidden_size: int = dataclasses.field(default=64, metadata={"help": "model width"})
    num_hidden_layers: int = dataclasses.field(default=2, metadata={"help": "number of blocks"})
    max_position_embeddings: int | None = dataclasses.field(
        default=None, metadata={"help": "learned positions (0 = none); default: the architecture's "
                                        "(1024 for the Transformer, 0 otherwise)"})
    kernels: str = dataclasses.field(default="auto", metadata={"help": "auto, torch or cuda"})
    init_scheme: str | None = dataclasses.field(
        default=None, metadata={"help": "how new weights are drawn: reference (the paper's code; the default) or "
                                        "normal (every linear weight N(0, 0.02): an ablation)"})
    mixer_forms: str | None = dataclasses.field(
        default=None, metadata={"help": "reference (the default) or mecheval-v1: the form of Hyena's filter "
                                        "(filter_form), of BaseConv's and Based's long convolutions "
                                        "(long_conv_form) and of H3's SSMs (ssm_form), whichever the "
                                        "architecture has"})
    model_config: str = dataclasses.field(
        default="{}", metadata={"help": 'JSON object of further config fields, e.g. \'{"conv_kernel": 0}\''})

    def config_fields(self) -> dict[str, Any]:
        """Our architectures' config fields (for ``hf:`` architectures: see ``build_config``)."""
        spec = get_architecture(self.architecture)         # built-in or a plug-in's; else names the choices
        extra = _json_object("model_config", self.model_config)
        if "vocab_size" in extra:
            raise ConfigError("model_config", "vocab_size comes from the task; set the task's vocabulary instead "
                                              "(--task / --task_config)")
        known = [f for f in spec.config_class.field_names() if f != "vocab_size"]
        unknown = sorted(set(extra) - set(known))
        if unknown:   # a typo would otherwise be kept as an inert attribute of the config
            raise ConfigError("model_config", f"unknown field {unknown[0]!r} for {self.architecture}; its fields: "
                                              f"{', '.join(known)}")
        fields = {"hidden_size": self.hidden_size, "num_hidden_layers": self.num_hidden_layers,
                  "kernels": self.kernels, **extra}
        given = {"init_scheme": self.init_scheme} if self.init_scheme is not None else {}
        if self.mixer_forms is not None:
            if self.mixer_forms not in FILTER_FORMS:      # refused whether or not this architecture has a form
                raise ConfigError("mixer_forms", f"must be one of {', '.join(FILTER_FORMS)}, got {self.mixer_forms!r}")
            given.update({f: self.mixer_forms for f in FORM_FIELDS if f in known})
        for name, value in given.items():
            if name in extra and extra[name] != value:
                flag = "init_scheme" if name == "init_scheme" else "mixer_forms"
                raise ConfigError(flag, f"--{flag} {value} and --model_config's {name} {extra[name]!r} disagree; "
                                        "give one")
            fields[name] = value
        if self.max_position_embeddings is not None:
            fields["max_position_embeddings"] = self.max_position_embeddings
        return fields

    def build_config(self, vocab_size: int):
        """The configuration the run's model is built from: one of ours, or for ``hf:<model_type>``
        transformers' own (``adapters.native_config``; --kernels does not apply to it)."""
        if is_native(self.architecture):
            extra = _json_object("model_config", self.model_config)
            if "vocab_size" in extra:
                raise ConfigError("model_config", "vocab_size comes from the task; set the task's vocabulary "
                                                  "instead (--task / --task_config)")
            for flag in ("init_scheme", "mixer_forms"):
                if getattr(self, flag) is not None:
                    raise ConfigError(flag, f"applies to hf-mecheval's architectures, not to {self.architecture} "
                                            "(transformers' own model is built its own way)")
            return native_config(self.architecture, vocab_size=vocab_size, hidden_size=self.hidden_size,
                                 num_hidden_layers=self.num_hidden_layers,
                                 max_position_embeddings=self.max_position_embeddings, extra=extra)
        return model_classes(self.architecture)[0](vocab_size=vocab_size, **self.config_fields())


@dataclasses.dataclass
class DataArguments:
    task: str = dataclasses.field(default="ar_32", metadata={"help": f"task preset: {', '.join(PRESETS)}"})
    task_config: str = dataclasses.field(
        default="{}", metadata={"help": 'JSON object overriding task config fields, e.g. \'{"num_kv": 64}\''})
    train_size: int | None = dataclasses.field(default=None, metadata={"help": "training documents (default: the preset's, 100032 for AR and ATR)"})
    eval_size: int | None = dataclasses.field(default=None, metadata={"help": "validation and test documents each (default: the preset's, 1024 for AR and ATR)"})
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
    restoration_examples: int = dataclasses.field(
        default=64, metadata={"help": "validation documents it uses (MQAR: as many queries, those of the first documents)"})
    test_head_size: int = dataclasses.field(
        default=320, metadata={"help": "also report test accuracy on the first N test documents (the reference "
                                       "reported its first 320) where the test split has more; 0 = not"})


@dataclasses.dataclass
class MechEvalTrainingArguments(TrainingArguments):
    """transformers' TrainingArguments with the reference recipe as defaults."""

    output_dir: str | None = dataclasses.field(default=None, metadata={"help": "the run directory"})
    learning_rate: float = 1e-3
    lr_scheduler_type: str = "cosine"
    warmup_steps: float = 0.1
    weight_decay: float = 0.0
    max_grad_norm: float = dataclasses.field(
        default=0.0, metadata={"help": "gradient clipping (0 = none, as the reference; transformers' default is 1)"})
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    per_device_train_batch_size: int = 32
    per_device_eval_batch_size: int = 256
    num_train_epochs: float | None = dataclasses.field(
        default=None, metadata={"help": "default: 16 for AR, 32 for ATR (the reference), the preset's for MQAR"})
    eval_strategy: str = "epoch"
    save_strategy: str = "epoch"
    save_total_limit: int | None = 2
    logging_steps: float = 50
    report_to: str | None = "none"
    seed: int = 0
    dataloader_drop_last: bool = False
    remove_unused_columns: bool = False   # batches come ready-made from PaddedTaskDataset
    dataloader_pin_memory: bool = dataclasses.field(default_factory=torch.cuda.is_available)

    def __post_init__(self):
        # transformers puts "trainer_output" in place of a missing output_dir; a run's directory is
        # always chosen, so remember that none was (``validate`` refuses it)
        self.output_dir_given = self.output_dir is not None
        super().__post_init__()


def _json_object(field: str, text: str | dict) -> dict:
    if isinstance(text, dict):
        return text
    try:
        value = loads_finite(text, f"--{field}")
    except ValueError as exc:          # not JSON (json.JSONDecodeError)
        raise ConfigError(field, f"must be a JSON object: {getattr(exc, 'msg', exc)}") from None
    if not isinstance(value, dict):
        raise ConfigError(field, f"must be a JSON object, got {text!r}")
    return value


MAX_INTEGER = 2**53
SEED_LIMIT = 2**32 - 1   # transformers.set_seed seeds numpy's legacy global generator
# activation memory per token, layer and hidden unit (bytes): a generous fp32 bound for these blocks
ACTIVATION_BYTES = 4 * 32


def resolved_sizes(data: DataArguments, run: RunArguments, training) -> tuple[int, int, float]:
    """(training documents, validation/test documents each, epochs) from the flags, the recipe or
    the preset."""
    preset = PRESETS[data.task]
    quick = run.recipe == "quick"
    train_size = data.train_size or (QUICK_RECIPE["train_size"] if quick else preset.train_size)
    eval_size = data.eval_size or (QUICK_RECIPE["eval_size"] if quick else preset.eval_size)
    epochs = training.num_train_epochs
    if epochs is None:
        epochs = QUICK_RECIPE["num_train_epochs"] if quick else preset.default_epochs
    return train_size, eval_size, epochs


def validate(model: ModelArguments, data: DataArguments, run: RunArguments, training):
    """Everything that can be checked before any work starts (and before an existing run is
    replaced): every argument, the task's and the model's configuration, and whether the run fits
    in memory. Returns the task and the model's configuration (``spec.RunSpec`` keeps both)."""
    from ..tasks import build_task

    for group in (model, data, run, training):         # NaN and infinity compare false with every bound
        for field in dataclasses.fields(group):
            value = getattr(group, field.name, None)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(field.name, f"must be a finite number, got {value}")
            # no size, count or step here comes near 2^53; beyond 2^63 torch cannot even hold one
            if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INTEGER \
                    and field.name not in ("seed", "data_seed"):           # their own bounds, below
                raise ConfigError(field.name, f"must be <= {MAX_INTEGER:,}, got {value}")
    if is_native(model.architecture):
        native_model_type(model.architecture)             # checks the architecture's name first
    else:
        model.config_fields()                             # checks the architecture's name first
    task = build_task(data.task, **data.task_overrides())
    config = model.build_config(task.vocab_size)
    check_int("seed", training.seed, minimum=0, maximum=SEED_LIMIT)
    if training.data_seed is not None:                  # torch.Generator takes 64-bit seeds
        check_int("data_seed", training.data_seed, minimum=0, maximum=SEED_LIMIT)
    check_int("dataset_seed", data.dataset_seed, minimum=0)
    check_int("per_device_train_batch_size", training.per_device_train_batch_size, minimum=1)
    check_int("per_device_eval_batch_size", training.per_device_eval_batch_size, minimum=1)
    # a run that would train no step would otherwise be saved as a finished, untrained run
    check_int("gradient_accumulation_steps", training.gradient_accumulation_steps, minimum=1)
    if training.max_steps == 0 or training.max_steps < -1:
        raise ConfigError("max_steps", f"must be >= 1, or -1 for the epochs' steps, got {training.max_steps}")
    # values transformers or torch would take without a word, or fail on deep inside training
    for name in ("adam_beta1", "adam_beta2", "label_smoothing_factor"):
        value = getattr(training, name)
        if not 0 <= value < 1:
            raise ConfigError(name, f"must be in [0, 1), got {value}")
    if training.adam_epsilon <= 0:
        raise ConfigError("adam_epsilon", f"must be > 0 (0 divides by zero where a gradient is 0), got {training.adam_epsilon}")
    if training.weight_decay < 0:
        raise ConfigError("weight_decay", f"must be >= 0, got {training.weight_decay}")
    check_int("dataloader_num_workers", training.dataloader_num_workers, minimum=0, maximum=4 * (os.cpu_count() or 1))
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
    if not training.output_dir or not getattr(training, "output_dir_given", True):
        raise ConfigError("output_dir", "a run directory is required (--output_dir RUN_DIR)")
    check_path("output_dir", training.output_dir)
    if run.resume and run.overwrite:
        raise ConfigError("resume", "--resume and --overwrite exclude each other")
    check_trainer_settings(training)
    check_cuda_kernels(config, training)
    check_run_memory(config, task, data, run, training)
    return task, config


def check_cuda_kernels(config, training) -> None:
    """``--kernels cuda``: every mixer of the model that has fused kernels must find them on the
    device the run trains on, checked here rather than at the first step, after the run's folder
    was written and a corrected command would find it taken."""
    if getattr(config, "kernels", None) != "cuda":
        return
    from ..models.kernels import use_kernels
    from ..models.registry import kernel_packages

    device = torch.device("cuda" if torch.cuda.is_available() and not training.use_cpu else "cpu")
    for mixer in dict.fromkeys(config.layer_mixers()):
        if kernel_packages(mixer):
            use_kernels(mixer, "cuda", device)


# what compute_answer_metrics reports, as the Trainer names them for --metric_for_best_model
RUN_METRICS = ("accuracy", "answer_prob", "loss")


def check_trainer_settings(training) -> None:
    """The Trainer settings transformers would only trip on once training starts (or, for
    ``label_names``, once it ends): optimizers and loggers whose package is missing, a best-model
    rule with no metric, labels under another name."""
    from transformers import Trainer
    from transformers.integrations import get_reporting_integration_callbacks

    if training.label_names not in (None, ["labels"]):
        raise ConfigError("label_names", f"must be 'labels' (the tasks' answer labels), got {training.label_names}")
    best = str(getattr(training.save_strategy, "value", training.save_strategy)) == "best"
    if (best or training.load_best_model_at_end) and not training.metric_for_best_model:
        raise ConfigError("metric_for_best_model", "is needed by --save_strategy best and --load_best_model_at_end; "
                                                   f"one of {', '.join(RUN_METRICS)}")
    if training.metric_for_best_model is not None and \
            training.metric_for_best_model.removeprefix("eval_") not in RUN_METRICS:
        raise ConfigError("metric_for_best_model", f"must be one of {', '.join(RUN_METRICS)}, "
                                                   f"got {training.metric_for_best_model!r}")
    if training.eval_accumulation_steps is not None:      # the evaluation loop takes steps modulo it
        check_int("eval_accumulation_steps", training.eval_accumulation_steps, minimum=1)
    if training.neftune_noise_alpha is not None and not training.neftune_noise_alpha >= 0:
        raise ConfigError("neftune_noise_alpha", f"must be >= 0 (the noise's scale), got {training.neftune_noise_alpha}")
    tpu_only = [str(getattr(d, "value", d)) for d in training.debug or [] if str(getattr(d, "value", d)) != "underflow_overflow"]
    if tpu_only:
        raise ConfigError("debug", f"{tpu_only[0]} is for TPUs (torch_xla), and this runs on "
                                   f"{'a GPU' if torch.cuda.is_available() else 'a CPU'}; underflow_overflow works anywhere")
    if training.dataloader_multiprocessing_context is not None and training.dataloader_num_workers < 1:
        raise ConfigError("dataloader_multiprocessing_context", "starts the data loader's worker processes, and there "
                                                                "are none: give --dataloader_num_workers too")
    if training.fsdp and training.world_size <= 1:
        raise ConfigError("fsdp", "shards the model over several processes, and this is one; start them with "
                                  "accelerate launch, or leave --fsdp out")
    if training.torch_compile:
        from accelerate.utils import DynamoBackend

        backend = str(training.torch_compile_backend or "inductor")
        if backend.upper() not in DynamoBackend.__members__:
            raise ConfigError("torch_compile_backend", f"must be one of {', '.join(sorted(b.lower() for b in DynamoBackend.__members__))}, "
                                                       f"got {backend!r}")
    check_scheduler(training)
    try:
        Trainer.get_optimizer_cls_and_kwargs(training)
    except (ImportError, ValueError, RuntimeError) as exc:        # e.g. bitsandbytes not installed
        raise ConfigError("optim", f"{training.optim.value if hasattr(training.optim, 'value') else training.optim}: "
                                   f"{(str(exc).splitlines() or [''])[0]}") from None
    try:
        for callback in get_reporting_integration_callbacks(training.report_to):
            callback()                   # raises where its package is missing; logs nothing yet
    except (ImportError, RuntimeError, ValueError) as exc:
        raise ConfigError("report_to", f"{(str(exc).splitlines() or [''])[0]}") from None


def check_scheduler(training) -> None:
    """The learning-rate schedule built as the Trainer builds it, on a one-number model: its
    arguments (``lr_scheduler_kwargs``: a JSON object, the ones that schedule takes, those it
    needs) are checked by the schedule itself, before training instead of at its first step."""
    import torch
    from transformers import get_scheduler

    kwargs = training.lr_scheduler_kwargs if training.lr_scheduler_kwargs is not None else {}
    name = getattr(training.lr_scheduler_type, "value", training.lr_scheduler_type)
    if not isinstance(kwargs, dict):
        raise ConfigError("lr_scheduler_kwargs", f"must be a JSON object of the {name} schedule's arguments, got "
                                                 f"{(kwargs if isinstance(kwargs, str) else json.dumps(kwargs))[:80]}")
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=training.learning_rate)
    try:
        get_scheduler(name, optimizer, num_warmup_steps=1, num_training_steps=10, scheduler_specific_kwargs=kwargs)
    except (TypeError, ValueError, KeyError) as exc:
        raise ConfigError("lr_scheduler_kwargs" if kwargs else "lr_scheduler_type",
                          f"the {name} schedule refuses {json.dumps(kwargs)[:80]}: "
                          f"{(str(exc).splitlines() or [''])[0][:200]}") from None


def run_memory(config, task, train_size: int, eval_size: int, run: RunArguments, training) -> dict:
    """A run's memory, estimated generously before it starts: {"parameters": count, "device":
    {part: bytes} (the model with its gradients and AdamW state, activations: what a GPU must
    hold, per copy of a stack), "documents": {part: bytes} (held in the host's memory)}. The one
    estimate both ``check_run_memory`` and a sweep's stacking plan (``sweep.stack_size_that_fits``)
    use."""
    from ..models import MechEvalConfig, count_parameters

    try:
        # transformers' own model is built on the meta device, which also finds its decoder layers
        params = count_parameters(config) if isinstance(config, MechEvalConfig) else count_native_parameters(config)
    except (OverflowError, TypeError) as exc:      # sizes beyond 64-bit integers
        raise MechEvalError(f"the model cannot be built: {(str(exc).splitlines() or [''])[0]}") from None
    width = config.hidden_size * config.num_hidden_layers * ACTIVATION_BYTES
    longest = task.longest_estimate()
    train_batch = min(training.per_device_train_batch_size, train_size)
    eval_batch = min(training.per_device_eval_batch_size, eval_size)
    device = {"model and optimizer state": 16 * params,
              "activations": max(train_batch, eval_batch / 4) * longest * width
              + 4 * training.per_device_eval_batch_size}    # the Trainer's evaluation repeats the loss per row
    documents = {"documents": task.memory_estimate(train_size + 2 * eval_size, padded=True)
                 + (task.memory_estimate(run.restoration_examples) if run.restoration_every_n_steps > 0 else 0)}
    return {"parameters": params, "device": device, "documents": documents}


def check_run_memory(config, task, data: DataArguments, run: RunArguments, training) -> None:
    """Refuse, with the estimate (``run_memory``), a run that cannot fit in memory: the model and
    activations against the GPU's memory where there is one, everything against the host's."""
    from ..resources import check_memory

    train_size, eval_size, _ = resolved_sizes(data, run, training)
    memory = run_memory(config, task, train_size, eval_size, run, training)
    what = f"this run ({memory['parameters']:,} parameters, {train_size:,} training documents)"
    if torch.cuda.is_available():
        check_memory(what, memory["device"], limit=torch.cuda.get_device_properties(0).total_memory)
        check_memory(what, memory["documents"])
    else:
        check_memory(what, {**memory["device"], **memory["documents"]})
