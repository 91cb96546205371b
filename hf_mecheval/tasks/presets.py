"""Named task presets. A preset fixes the task configuration — for ATR the
grammar too, so a preset is one language — and the reference dataset sizes."""
from __future__ import annotations

import dataclasses
from typing import Any

from ..errors import ConfigError
from .ar import ARConfig, ARTask
from .atr import ATRConfig, ATRTask
from .base import Task

TASK_TYPES: dict[str, tuple[type, type]] = {"ar": (ARConfig, ARTask), "atr": (ATRConfig, ATRTask)}


@dataclasses.dataclass(frozen=True)
class Preset:
    name: str
    task: str                 # "ar" or "atr"
    config: Any               # ARConfig or ATRConfig
    description: str
    train_size: int = 100_032
    eval_size: int = 1_024    # validation and test each
    lr_scheduler: str = "cosine"   # the reference's schedule shape for this task


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
