"""Trainer callbacks. ``RestorationCallback``: the intervention metric during training, so a user sees *when* a
mechanism appears.

Every ``every_n_steps`` steps (and at the end) it corrupts the key in a few validation documents,
patches the residual stream entering the last layer at the key, value and query positions, and
appends ``{"step", "accuracy", "restoration@key", "restoration@value", "restoration@query"}`` to
the Trainer's log history (so to ``trainer_state.json``); at the end it writes
``restoration_history.json`` in the output directory (``mecheval evaluate`` plots it).
``WallClock``: training wall time across resumed segments (metrics.json's ``train_wall_seconds``).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from transformers import TrainerCallback

from ..interventions.grid import cell, run_grid
from ..io_utils import write_text_atomic


class RestorationCallback(TrainerCallback):
    def __init__(self, task, data, every_n_steps: int = 500):
        self.task, self.data, self.every = task, data, every_n_steps
        self.history: list[dict] = []

    def measure(self, model, step: int) -> dict:
        model = getattr(model, "module", model)          # unwrap DDP
        was_training = model.training
        last = len(model.model.layers) - 1
        site = f"layers.{last}.input"
        result = run_grid(model, self.task, self.data, corruptions=("key",), sites=[site],
                          positions=("key", "value", "query"), n_resamples=0, progress=False,
                          keep_per_example=False)
        model.train(was_training)
        entry = {"step": step, "accuracy": result["corruptions"]["key"]["clean_accuracy"]}
        for p in ("key", "value", "query"):
            entry[f"restoration@{p}"] = cell(result, "key", site, p)["restoration"]
        self.history.append(entry)
        return entry

    def on_train_begin(self, args, state, control, **kwargs):
        # a resumed run: the measurements made before its checkpoint are in the restored log history
        self.history = [entry for entry in state.log_history if "restoration@value" in entry]

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if self.every and state.global_step % self.every == 0 and state.is_world_process_zero:
            state.log_history.append(self.measure(model, state.global_step))

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if not self.history or self.history[-1]["step"] != state.global_step:
            state.log_history.append(self.measure(model, state.global_step))
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_text_atomic(out / "restoration_history.json", json.dumps(self.history, indent=1) + "\n", overwrite=True)


class WallClock(TrainerCallback):
    """Training wall time summed over every segment of a run (an interrupted run resumed from a
    checkpoint keeps the time spent before): each checkpoint gets ``wall_time.json`` with the
    seconds so far, and a resumed run starts from its checkpoint's figure."""

    FILE = "wall_time.json"

    def __init__(self, resumed_from: str | None = None):
        self.before, self.segments = 0.0, 1
        if resumed_from is not None and (Path(resumed_from) / self.FILE).exists():
            try:
                saved = json.loads((Path(resumed_from) / self.FILE).read_text())
                self.before, self.segments = float(saved["seconds"]), int(saved["segments"]) + 1
            except (OSError, ValueError, KeyError, TypeError):   # damaged: the time before is unknown
                self.segments = 2
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.started

    def on_train_begin(self, args, state, control, **kwargs):
        self.started = time.perf_counter()

    def on_save(self, args, state, control, **kwargs):
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            write_text_atomic(checkpoint / self.FILE, json.dumps({"seconds": self.seconds, "segments": self.segments}),
                              overwrite=True)

    def summary(self) -> dict:
        """What metrics.json records: wall seconds of training, the segments it took, the threads."""
        import torch

        return {"train_wall_seconds": round(self.seconds, 1), "train_segments": self.segments,
                "threads": torch.get_num_threads()}
