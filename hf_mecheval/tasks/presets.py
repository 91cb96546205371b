"""Named task presets. A preset fixes the task configuration — for ATR the
grammar too, so a preset is one language — and the reference dataset sizes."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import ConfigError
from .ar import ARConfig, ARTask
from .atr import ATRConfig, ATRTask
from .base import Task
from .mqar import MQARConfig, MQARTask

TASK_TYPES: dict[str, tuple[type, type]] = {"ar": (ARConfig, ARTask), "atr": (ATRConfig, ATRTask),
                                             "mqar": (MQARConfig, MQARTask)}


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    task: str                 # "ar", "atr" or "mqar"
    config: Any               # ARConfig, ATRConfig or MQARConfig
    description: str
    train_size: int = 100_032
    eval_size: int = 1_024    # validation and test each
    lr_scheduler: str = "cosine"   # the reference's schedule shape for this task
    epochs: float | None = None    # the recipe's epochs: None for the paper's (16 for AR, 32 for ATR)

    @property
    def default_epochs(self) -> float:
        return self.epochs if self.epochs is not None else (16.0 if self.task == "ar" else 32.0)


# The CPU-sized MQAR mixture (hf_mecheval/training/sweeps/cpu/mqar.yaml says why these settings):
# training at lengths 64 and 128 with 4 to 16 pairs; validation and test at lengths 64, 128 and 256
# with up to a quarter of the length in pairs, so that accuracy reads against the number of pairs
# at length 128 (4 ... 32) and against the length at 16 pairs (64, 128, 256)
CPU_TRAIN = ((64, 4, 1), (64, 8, 1), (128, 8, 1), (128, 16, 1))
CPU_EVAL = ((64, 4, 1), (64, 8, 1), (64, 16, 1), (128, 4, 1), (128, 8, 1), (128, 16, 1), (128, 32, 1),
            (256, 16, 1), (256, 32, 1), (256, 64, 1))


def _zoology_figure2(seq_len: int, pairs: int) -> "Preset":
    """One setting of Zoology's Figure 2 (its configs: HazyResearch/zoology, zoology/experiments/
    paper_configs/iclr24_zoology_figure2): 100 000 training and 3 000 test documents of one length
    and number of pairs, blank filler (random_non_queries=False), 64 epochs."""
    setting = ((seq_len, pairs, 1),)
    return Preset(f"mqar_{seq_len}_{pairs}", "mqar",
                  MQARConfig(train_mixture=setting, eval_mixture=setting, random_filler=False),
                  f"MQAR as in Zoology's Figure 2: {seq_len} tokens, {pairs} pairs, blank filler.",
                  train_size=100_000, eval_size=3_000, epochs=64.0)


PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset("ar_32", "ar", ARConfig(),
               "AR, 4096 keys and 4096 values, 16 pairs per document (37 tokens)."),
        Preset("ar_32_value_first", "ar", ARConfig(value_first=True),
               "ar_32, but the query is a value and the answer its key."),
        Preset("ar_32_gen", "ar", ARConfig(heldout_fraction=0.2),
               "ar_32 with 20% of (key, value) combinations queried only in test."),
        Preset("atr_easy", "atr", ATRConfig(num_terminals=20, max_rhs_len=5),
               "ATR, 20 terminals, right-hand sides of 1-4 symbols."),
        Preset("atr_medium", "atr", ATRConfig(num_terminals=20, max_rhs_len=10),
               "ATR, 20 terminals, right-hand sides of 1-9 symbols."),
        Preset("atr_8192", "atr", ATRConfig(num_terminals=8192, max_rhs_len=5, terminal_occurrence_factor=20.0),
               "ATR, 8192 terminals, right-hand sides of 1-4 symbols, terminal occurrence factor 20."),
        Preset("atr_gen", "atr", ATRConfig(num_terminals=20, max_rhs_len=5, heldout_fraction=0.2),
               "atr_easy's language with 20% of (parent, child) label pairs queried only in test.",
               lr_scheduler="linear"),
        Preset("atr_sibling", "atr", ATRConfig(num_terminals=20, max_rhs_len=5, relation="sibling"),
               "atr_easy's language; the query asks for a sibling instead of the parent.", lr_scheduler="linear"),
        Preset("mqar", "mqar", MQARConfig(),
               "MQAR with Zoology's standard mixtures: training at (64 tokens, 4 pairs) x5, (128, 8), (256, 16), "
               "(256, 32), (256, 64); validation and test at (64, 4), (64, 8), (64, 16), (128, 32), (256, 64), "
               "(512, 128), (1024, 256); vocabulary 8192, random filler.",
               train_size=180_000, eval_size=7_000, epochs=32.0),
        Preset("mqar_cpu", "mqar", MQARConfig(train_mixture=CPU_TRAIN, eval_mixture=CPU_EVAL),
               "MQAR at CPU scale: training at (64 tokens, 4 pairs), (64, 8), (128, 8), (128, 16); validation and test "
               "at 64 tokens with 4-16 pairs, 128 with 4-32, 256 with 16-64; vocabulary 8192, random filler.",
               train_size=40_000, eval_size=2_000, epochs=16.0),
        _zoology_figure2(64, 4),
        _zoology_figure2(128, 8),
        _zoology_figure2(256, 16),
    ]
}


def get_preset(name: str) -> Preset:
    if name not in PRESETS:
        raise ConfigError("preset", f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def build_task(preset: str | Preset | Task, **overrides: Any) -> Task:
    """A task from a preset name, with config fields overridden (e.g. ``grammar_seed=3``)."""
    if isinstance(preset, Task):
        if overrides:
            return type(preset)(preset.config.replace(**overrides))
        return preset
    p = get_preset(preset) if isinstance(preset, str) else preset
    config_cls, task_cls = TASK_TYPES[p.task]
    config = p.config.replace(**overrides) if overrides else p.config
    assert isinstance(config, config_cls)
    return task_cls(config)


def task_from_dict(kind: str, values: dict) -> Task:
    """A task from its type name and a config mapping (unknown fields are rejected)."""
    if kind not in TASK_TYPES:
        raise ConfigError("task", f"unknown task type {kind!r}; choose one of {', '.join(TASK_TYPES)}")
    config_cls, task_cls = TASK_TYPES[kind]
    return task_cls(config_cls.from_dict(values))
