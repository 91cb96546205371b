"""What watching a run costs: the median training step inside ``MechEvalTrainer`` with a job's
progress file (``training/progress.py``: each step's loss added up where it lies, the file
rewritten at most once a second) against the same Trainer without either, on the same batches,
in the same run, rounds interleaved; and, as the worst case, the file rewritten at every step.

    python benchmarks/bench_progress.py [--only deltanet transformer] [--steps 300] [--rounds 3] [--threads 1] [--hidden 64]
"""
from __future__ import annotations

import contextlib
import os
import statistics
import tempfile
from pathlib import Path

from bench_train import StepTimer, make, step_benchmark
from transformers import Trainer

from hf_mecheval.training.arguments import MechEvalTrainingArguments
from hf_mecheval.training.data import batch_collator
from hf_mecheval.training.progress import ProgressFile
from hf_mecheval.training.trainer import MechEvalTrainer


class WithoutProgress(MechEvalTrainer):
    """The peer: ``MechEvalTrainer`` with transformers' own training step (no loss kept)."""

    def training_step(self, model, inputs, num_items_in_batch=None):
        return Trainer.training_step(self, model, inputs, num_items_in_batch)


def steps(trainer_class, model, data, n: int, out: Path, every: float | None) -> list[float]:
    timer = StepTimer()
    args = MechEvalTrainingArguments(output_dir=str(out), max_steps=n, num_train_epochs=1, eval_strategy="no",
                                     save_strategy="no", logging_steps=1000, disable_tqdm=True, use_cpu=True)
    trainer = trainer_class(model=model, args=args, train_dataset=data, data_collator=batch_collator, callbacks=[timer])
    if every is not None:
        trainer.add_callback(ProgressFile(out / "bench.progress.json", ["bench"], trainer.loss_meter, every=every,
                                          log_every=float("inf")))
    with open(os.devnull, "w") as quiet, contextlib.redirect_stdout(quiet):   # the Trainer's and the file's last lines
        trainer.train()
    return timer.times[5:]


def main() -> None:
    args, task, data = step_benchmark(__doc__.splitlines()[0], ["deltanet", "transformer"], steps=300, threads=1)
    print(f"hidden {args.hidden}, AR (vocabulary {task.vocab_size}), batch 32, {args.threads} thread(s), "
          f"{args.steps} steps a round, {args.rounds} rounds interleaved; median ms per step")
    print(f"{'architecture':<12} {'without':>8} {'progress':>9} {'ratio':>6} {'every step':>11} {'ratio':>6}")
    kinds = {"without": (WithoutProgress, None), "progress": (MechEvalTrainer, 1.0), "every step": (MechEvalTrainer, 0.0)}
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.only:
            times: dict[str, list[float]] = {k: [] for k in kinds}
            for _ in range(args.rounds):
                for kind, (cls, every) in kinds.items():
                    times[kind] += steps(cls, make(arch, args.hidden, task.vocab_size), data, args.steps, Path(tmp),
                                         every)
            ms = {k: 1000 * statistics.median(v) for k, v in times.items()}
            print(f"{arch:<12} {ms['without']:8.2f} {ms['progress']:9.2f} {ms['progress'] / ms['without']:6.3f} "
                  f"{ms['every step']:11.2f} {ms['every step'] / ms['without']:6.3f}")


if __name__ == "__main__":
    main()
