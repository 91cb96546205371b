"""Trainer callbacks. ``RestorationCallback``: the intervention metric during training, so a user sees *when* a
mechanism appears. ``TrainingClock``: training wall and CPU time across resumed segments (metrics.json's
``train_wall_seconds``, ``train_cpu_seconds``). ``StopWhenDiverged``: a run whose weights turned NaN or
infinite stops there.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from transformers import TrainerCallback

from ..errors import MechEvalError
from ..models import non_finite_parameters
from ..interventions.engine import engine_for
from ..interventions.grid import POSITIONS, cell, run_grid
from ..runs.code_version import code_version
from ..runs.manifest import write_run_file
from ..tasks.corruption import corrupt
from ..tasks.data import TaskData

HISTORY_FILE = "restoration_history.json"
MEASURED_AT = ("key", "value", "query")
MEASURED = ("restoration_accuracy", "restoration@key", "restoration@value", "restoration@query")


class RestorationCallback(TrainerCallback):
    """Every ``every_n_steps`` steps (and at the end) corrupt the key in ``data``'s documents, patch
    the residual stream entering the last layer at the key, value and query positions, and log
    ``restoration@key``, ``restoration@value``, ``restoration@query`` (and the clean accuracy on
    these documents, ``restoration_accuracy``) through ``Trainer.log``: they appear on the
    console, in every ``report_to`` integration and in ``trainer_state.json``'s log history. At
    the end, ``restoration_history.json`` in the output directory holds them all (``mecheval
    evaluate`` plots it). In your own Trainer::

        from hf_mecheval.training.callbacks import RestorationCallback
        from hf_mecheval.training.data import PaddingCollator
        trainer = Trainer(model=model, args=args, train_dataset=ds["train"], data_collator=PaddingCollator())
        trainer.add_callback(RestorationCallback(trainer, "atr_easy", ds["validation"].select(range(256)),
                                                 every_n_steps=200))

    trainer: the Trainer it logs through (as TRL's callbacks take it). task: a preset name or a
    ``Task`` (its token classes define the corruption). data: the documents, a ``datasets.Dataset``
    split as ``mecheval data publish`` and the builders write it, or ``TaskData``; documents with
    one answer per query (MQAR) are read one query at a time, as many queries as documents given
    (those of the first documents: ``TaskData.per_query``). Everything is checked here, not at
    step N: the columns, the token ids against the task and the model.
    """

    def __init__(self, trainer, task, data, every_n_steps: int = 500):
        from ..tasks.presets import build_task

        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise MechEvalError(f"every_n_steps must be a positive integer, got {every_n_steps!r}")
        self.trainer, self.every = trainer, every_n_steps
        self.task = build_task(task)
        self.data = data if isinstance(data, TaskData) else TaskData.from_dataset(data)
        if self.data.multi_query:
            self.data = self.data.per_query(limit=len(self.data))
        self._check(getattr(trainer, "model", None))
        self.history: list[dict] = []

    def _check(self, model) -> None:
        data, task = self.data, self.task
        if len(data) == 0:
            raise MechEvalError("the restoration callback needs at least one document, got none")
        positions = [p for p in POSITIONS if f"{p}_pos" in data.columns]
        for column in [f"{p}_pos" for p in MEASURED_AT] + ["answer"]:
            if column not in data.columns:
                raise MechEvalError(f"the documents have no {column} column (give a split of the task datasets)")
        largest = int(data.tokens.max())
        if largest >= task.vocab_size:
            raise MechEvalError(f"the documents use token id {largest}, outside task {task.name}'s vocabulary of "
                                f"{task.vocab_size}: they belong to another task")
        vocab = getattr(getattr(model, "config", None), "vocab_size", task.vocab_size)
        if vocab != task.vocab_size:
            raise MechEvalError(f"the model's vocabulary has {vocab} tokens but task {task.name}'s has "
                                f"{task.vocab_size}: the model was not built for this task")
        for p in positions:
            if (data.columns[f"{p}_pos"] >= data.lengths).any() or (data.columns[f"{p}_pos"] < 0).any():
                raise MechEvalError(f"a {p}_pos lies outside its document")
        corrupt(data.padded(), data.columns["key_pos"], task.token_classes, seed=0, lengths=data.lengths)   # raises if it cannot

    def measure(self, model, step: int) -> dict:
        model = getattr(model, "module", model)          # unwrap DDP
        was_training = model.training
        last = engine_for(model).num_layers - 1
        site = f"layers.{last}.input"
        result = run_grid(model, self.task, self.data, corruptions=("key",), sites=[site],
                          positions=MEASURED_AT, n_resamples=0, progress=False, keep_per_example=False)
        model.train(was_training)
        entry = {"step": step, "restoration_accuracy": result["corruptions"]["key"]["clean_accuracy"]}
        for p in MEASURED_AT:
            entry[f"restoration@{p}"] = cell(result, "key", site, p)["restoration"]
        self.history.append(entry)
        # a score is None where the corruption left nothing to restore: not logged (reporters want numbers)
        self.trainer.log({k: v for k, v in entry.items() if k != "step" and v is not None})
        return entry

    def on_train_begin(self, args, state, control, **kwargs):
        # a resumed run: the measurements made before its checkpoint are in the restored log history
        self.history = [{"step": e["step"], **{k: e.get(k) for k in MEASURED}}
                        for e in state.log_history if "restoration_accuracy" in e]

    def on_step_end(self, args, state, control, model=None, **kwargs):
        if state.global_step % self.every == 0 and state.is_world_process_zero:
            # Trainer.log clears control.should_log, which the Trainer set for this step's own
            # loss / grad_norm / learning_rate entry: keep it, or that entry is never written
            should_log = control.should_log
            self.measure(model, state.global_step)
            control.should_log = should_log

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not state.is_world_process_zero:
            return
        if not self.history or self.history[-1]["step"] != state.global_step:
            self.measure(model, state.global_step)
        out = Path(args.output_dir)
        out.mkdir(parents=True, exist_ok=True)
        write_run_file(out, HISTORY_FILE, json.dumps(self.history, indent=1) + "\n")


class TrainingClock(TrainerCallback):
    """Training time summed over every segment of a run (an interrupted run resumed from a
    checkpoint keeps the time spent before): wall seconds, and the process's CPU seconds (all of
    its threads), which a paused process (``kill -STOP``) or one waiting for a busy core does not
    accumulate. Each checkpoint gets ``wall_time.json`` with the figures so far, and a resumed run
    starts from its checkpoint's. The code each segment ran (``runs.code_version``) is kept the
    same way: a run resumed with other code says so in metrics.json's ``train_code``. So is each
    segment's own time (``train_segment_times``: its steps, wall and CPU seconds, threads, and the
    CPU it ran on, ``cpu_kernels.cpu_identity``), since
    the segments of one run may train at different thread counts: what a run costs at one
    thread count is read from its segments at that count (``runs.files.run_cost``). The steps a
    segment trained past its run's last checkpoint are lost with it and counted nowhere."""

    FILE = "wall_time.json"

    def __init__(self, resumed_from: str | None = None):
        self.before, self.cpu_before, self.segments, code_before = 0.0, 0.0, 1, []
        self.earlier_segments: list[dict] = []        # the segments before this one (``segment_times``)
        if resumed_from is not None and (Path(resumed_from) / self.FILE).exists():
            try:
                saved = json.loads((Path(resumed_from) / self.FILE).read_text())
                self.before, self.segments = float(saved["seconds"]), int(saved["segments"]) + 1
                # None: a checkpoint from before CPU time was kept, whose CPU time is unknown
                self.cpu_before = None if saved.get("cpu_seconds") is None else float(saved["cpu_seconds"])
                code_before = saved.get("code") if isinstance(saved.get("code"), list) else []
                self.earlier_segments = _earlier_segments(saved, resumed_from, self.segments - 1)
            except (OSError, ValueError, KeyError, TypeError):   # damaged: the time before is unknown
                self.segments, self.cpu_before = 2, None
                self.earlier_segments = [_unknown_segment()]
        # one entry per segment; None for a segment whose code is unknown (a checkpoint from before it was kept)
        code_before = code_before[:self.segments - 1]
        self.code = [None] * (self.segments - 1 - len(code_before)) + code_before + [code_version()]
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self.first_step = self.last_step = None        # this segment's steps: set by the Trainer's callbacks

    @property
    def seconds(self) -> float:
        return self.before + time.perf_counter() - self.started

    @property
    def cpu_seconds(self) -> float | None:
        return None if self.cpu_before is None else self.cpu_before + time.process_time() - self.cpu_started

    def segment_times(self) -> list[dict]:
        """One entry per segment, this one last: {"steps", "wall_seconds", "cpu_seconds", "threads",
        "cpu_model", "cpu_signature"}, None where a segment's figure is unknown (its checkpoint
        predates it)."""
        import torch

        from ..models.cpu_kernels import cpu_identity

        steps = None if self.first_step is None else self.last_step - self.first_step
        this = {"steps": steps, "wall_seconds": round(time.perf_counter() - self.started, 1),
                "cpu_seconds": round(time.process_time() - self.cpu_started, 1), "threads": torch.get_num_threads(),
                **cpu_identity()}
        return [*self.earlier_segments, this]

    def on_train_begin(self, args, state, control, **kwargs):
        self.started, self.cpu_started = time.perf_counter(), time.process_time()
        self.first_step = self.last_step = state.global_step           # a resumed run: its checkpoint's step

    def on_step_end(self, args, state, control, **kwargs):
        self.last_step = state.global_step

    def on_save(self, args, state, control, **kwargs):
        checkpoint = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and checkpoint.is_dir():
            # recorded relative to the run folder (``args.output_dir`` may be relative to the current one)
            write_run_file(args.output_dir, f"{checkpoint.name}/{self.FILE}", json.dumps(
                {"seconds": self.seconds, "cpu_seconds": self.cpu_seconds, "segments": self.segments,
                 "code": self.code, "segment_times": self.segment_times()}))

    def summary(self) -> dict:
        """What metrics.json records: wall and CPU seconds of training (CPU: None when a segment's
        is unknown), the segments it took, the threads, the code and the times of each segment."""
        import torch

        cpu = self.cpu_seconds
        return {"train_wall_seconds": round(self.seconds, 1), "train_cpu_seconds": None if cpu is None else round(cpu, 1),
                "train_segments": self.segments, "threads": torch.get_num_threads(), "train_code": self.code,
                "train_segment_times": self.segment_times()}


SEGMENT_KEYS = ("steps", "wall_seconds", "cpu_seconds", "threads", "cpu_model", "cpu_signature")


def _unknown_segment() -> dict:
    return dict.fromkeys(SEGMENT_KEYS)


def _earlier_segments(saved: dict, checkpoint: str, count: int) -> list[dict]:
    """The ``count`` segments a checkpoint's ``wall_time.json`` (``saved``) covers. A checkpoint
    written before segments were timed one by one: a single segment is its totals, at a thread
    count not recorded, its steps the checkpoint's; of several, each one's share is unknown."""
    times = saved.get("segment_times")
    if isinstance(times, list) and len(times) == count and all(isinstance(t, dict) for t in times):
        return [{key: t.get(key) for key in SEGMENT_KEYS} for t in times]
    if count != 1:
        return [_unknown_segment() for _ in range(count)]
    try:
        steps = int(json.loads((Path(checkpoint) / "trainer_state.json").read_text())["global_step"])
    except (OSError, ValueError, KeyError, TypeError):
        steps = None
    return [{**_unknown_segment(), "steps": steps, "wall_seconds": round(float(saved["seconds"]), 1),
             "cpu_seconds": None if saved.get("cpu_seconds") is None else round(float(saved["cpu_seconds"]), 1)}]


class StopWhenDiverged(TrainerCallback):
    """Stop a run at the first logging step where its weights hold NaN or infinity. Nothing brings
    such weights back (AdamW's update of a NaN is NaN), so the rest of the run would end exactly as
    diverged, only hours later: a width-256 Mamba at 3e-2 turned NaN at step ~20 000 of 50 016.
    ``diverged_at`` is the step it stopped at (metrics.json's ``stopped_diverged_at_step``, and the
    run is failed as diverged); checked every ``logging_steps`` steps (one pass over the weights)."""

    def __init__(self):
        self.diverged_at: int | None = None

    def on_step_end(self, args, state, control, model=None, **kwargs):
        every = max(int(args.logging_steps or 1), 1)
        if model is not None and state.global_step % every == 0 and non_finite_parameters(model):
            self.diverged_at = state.global_step
            control.should_training_stop = True
            control.should_save = False            # a checkpoint of NaN weights resumes nothing
        return control

    def summary(self) -> dict:
        return {} if self.diverged_at is None else {"stopped_diverged_at_step": self.diverged_at}
