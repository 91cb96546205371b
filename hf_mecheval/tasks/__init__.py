"""Synthetic retrieval tasks: associative recall (AR) and associative treecall (ATR).

    from hf_mecheval.tasks import build_task
    task = build_task("atr_easy")                 # a preset = one language
    ds = task.dataset(10_000, split="train", seed=0)   # datasets.Dataset
"""
from .ar import ARConfig, ARTask
from .atr import ATRConfig, ATRTask
from .base import GENERATOR_VERSION, Task
from .corruption import Corruption, corrupt
from .data import BOS, EOS, IGNORE_INDEX, PAD, POSITION_COLUMNS, TaskData
from .presets import PRESETS, Preset, build_task, get_preset, task_from_dict
from .stats import task_statistics

__all__ = [
    "ARConfig", "ARTask", "ATRConfig", "ATRTask", "GENERATOR_VERSION", "Task", "Corruption", "corrupt",
    "BOS", "EOS", "IGNORE_INDEX", "PAD", "POSITION_COLUMNS", "TaskData", "PRESETS", "Preset",
    "build_task", "get_preset", "task_from_dict", "task_statistics",
]
