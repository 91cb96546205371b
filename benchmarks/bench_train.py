"""Trainer overhead: median time of a training step inside the full ``Trainer`` loop (data loader,
scheduler, logging, callbacks) vs the bare step (forward, backward, AdamW, scheduler) on the same
batches, for each architecture, in the same run. Target: overhead <= 20 %.

    python benchmarks/bench_train.py [--hidden 64] [--steps 60] [--rounds 3] [--only mamba transformer]
"""
from __future__ import annotations

import argparse
import statistics
import tempfile
import time

import torch
from transformers import Trainer, TrainerCallback, get_cosine_schedule_with_warmup

from hf_mecheval.models import architecture_names, build_model
from hf_mecheval.tasks import build_task
from hf_mecheval.training.arguments import MechEvalTrainingArguments
from hf_mecheval.training.data import PaddedTaskDataset, batch_collator

ARCHS = architecture_names()


class StepTimer(TrainerCallback):
    """Wall time between consecutive step ends: everything the loop does per step, data loading,
    scheduler, logging and callbacks included."""

    def __init__(self):
        self.times, self.last = [], None

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self.last is not None:
            self.times.append(now - self.last)
        self.last = now


def make(arch, d, vocab):
    extra = {"max_position_embeddings": 64} if arch == "transformer" else {}
    torch.manual_seed(0)
    return build_model(arch, vocab_size=vocab, hidden_size=d, kernels="torch", **extra)


def bare_steps(model, data: PaddedTaskDataset, steps: int) -> list[float]:
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    sched = get_cosine_schedule_with_warmup(opt, steps // 10, steps)
    g = torch.Generator().manual_seed(0)
    times = []
    for _ in range(steps):
        idx = torch.randperm(len(data), generator=g)[:32].tolist()
        t0 = time.perf_counter()
        batch = data.__getitems__(idx)
        model(**batch).loss.backward()
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t0)
    return times


def trainer_steps(model, data: PaddedTaskDataset, steps: int, out: str) -> list[float]:
    timer = StepTimer()
    args = MechEvalTrainingArguments(output_dir=out, max_steps=steps, num_train_epochs=1, eval_strategy="no",
                                     save_strategy="no", logging_steps=50, disable_tqdm=True, use_cpu=True)
    Trainer(model=model, args=args, train_dataset=data, data_collator=batch_collator, callbacks=[timer]).train()
    return timer.times


def step_benchmark(description: str, only: list[str], steps: int, threads: int):
    """The flags of a benchmark that times training steps (--hidden --steps --rounds --only
    --threads), read, the threads set, and the AR task with enough batches of 32: (args, task, data)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", default=only)
    parser.add_argument("--threads", type=int, default=threads)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    task = build_task("ar_32")
    return args, task, PaddedTaskDataset(task.generate(32 * args.steps, "train", seed=0))


def main() -> None:
    args, task, data = step_benchmark(__doc__.splitlines()[0], ARCHS, steps=60, threads=2)
    print(f"hidden {args.hidden}, AR (vocabulary {task.vocab_size}, length 37), batch 32, {args.threads} threads; "
          f"median ms per step after 5 warm-up steps, {args.rounds} rounds interleaved")
    print(f"{'architecture':<12} {'bare':>8} {'Trainer':>8} {'overhead':>9} {'examples/s (Trainer)':>21}")
    with tempfile.TemporaryDirectory() as out:
        for arch in args.only:
            bare, full = [], []
            for _ in range(args.rounds):
                bare += bare_steps(make(arch, args.hidden, task.vocab_size), data, args.steps)[5:]
                full += trainer_steps(make(arch, args.hidden, task.vocab_size), data, args.steps, out)[5:]
            b, f = statistics.median(bare) * 1000, statistics.median(full) * 1000
            overhead = f / b - 1
            print(f"{arch:<12} {b:8.1f} {f:8.1f} {100 * overhead:8.1f}% {32000 / f:21.0f}  "
                  f"{'ok' if overhead <= 0.20 else 'MISSED (target <= 20 %)'}")


if __name__ == "__main__":
    main()
