"""``RestorationCallback``: the intervention metric during training, so a user sees *when* a
mechanism appears.

Every ``every_n_steps`` steps (and at the end) it corrupts the key in a few validation documents,
patches the residual stream entering the last layer at the key, value and query positions, and
appends ``{"step", "accuracy", "restoration@key", "restoration@value", "restoration@query"}`` to
the Trainer's log history (so to ``trainer_state.json``); at the end it writes
``restoration_history.json`` in the output directory (``mecheval evaluate`` plots it).
"""
from __future__ import annotations

import json
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
