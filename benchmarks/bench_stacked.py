"""Stacked training vs the same runs one after another, every architecture.

Setting (the issue's): AR (vocabulary 8196, length 37), batch 32, answer-only loss, 2 layers,
hidden 64, K = 5 copies with learning rates 1e-4 ... 3e-3. Each timed unit is one optimizer
step of *all K runs*: stacked = one step of ``StackedCausalLM`` + ``StackedAdamW``; sequential
= K steps of the ordinary model + ``torch.optim.AdamW`` (one per run, each its own model). The
two are interleaved round by round in the same process, so machine noise hits both alike.
Prints medians and the throughput ratio sequential / stacked (target >= 2.5x on the 2-core CPU).

A wider check of where the time goes: ``--batch-scaling`` also times one ordinary model at batch
32 and batch 32*K. If K-fold work costs nearly K-fold time in a single model, the step is
compute-bound and stacking cannot buy much on this machine, whatever its implementation.

``--runs-per-hour`` (meant for a GPU) reports runs per hour of the AR recipe at hidden 64 / 128 /
256 for stacks of 1, 2, 4, ... copies, up to ``--max-stack`` or the first that does not fit, and
the best stack's gain over one run at a time.

    python benchmarks/bench_stacked.py [--hidden 64] [--copies 5] [--steps 8] [--rounds 3] [--only mamba]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from hf_mecheval.models import MODEL_CLASSES
from hf_mecheval.models.stacked import StackedCausalLM
from hf_mecheval.training.stacked import StackedAdamW

from bench_models import BATCH, batches, ours

LEARNING_RATES = [1e-4, 3e-4, 1e-3, 2e-3, 3e-3]


def sequential_step(models, optimizers, ids, labels):
    for model, opt in zip(models, optimizers):
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()


def stacked_step(stacked, optimizer, ids, labels):
    loss = stacked(ids, labels).loss
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def timed(fn, data, steps) -> float:
    times = []
    for ids, labels in data[:steps]:
        start = time.perf_counter()
        fn(ids, labels)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def bench(arch: str, d: int, K: int, steps: int, rounds: int, data, device) -> dict:
    lrs = (LEARNING_RATES * K)[:K]
    models = []
    for k in range(K):
        torch.manual_seed(k)
        models.append(ours(arch, d).to(device))
    optimizers = [torch.optim.AdamW(m.parameters(), lr=lr, fused=True) for m, lr in zip(models, lrs)]   # as the Trainer
    stacked = StackedCausalLM(models).to(device)
    stacked_opt = StackedAdamW(stacked.named_stacked_parameters(), lrs)
    data = [(i.to(device), l.to(device)) for i, l in data]
    seq, stk = [], []
    for _ in range(rounds):
        sequential_step(models, optimizers, *data[0])            # warm-up (buffers, allocator)
        seq.append(timed(lambda i, l: sequential_step(models, optimizers, i, l), data, steps))
        stacked_step(stacked, stacked_opt, *data[0])
        stk.append(timed(lambda i, l: stacked_step(stacked, stacked_opt, i, l), data, steps))
    return {"sequential_ms": 1e3 * statistics.median(seq), "stacked_ms": 1e3 * statistics.median(stk)}


def batch_scaling(arch: str, d: int, K: int, steps: int, data) -> float:
    """time(batch 32*K) / time(batch 32) for one ordinary model: K means compute-bound."""
    torch.manual_seed(0)
    model = ours(arch, d)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    big = [(torch.cat([i] * K), torch.cat([l] * K)) for i, l in data]
    step = lambda i, l: sequential_step([model], [opt], i, l)   # noqa: E731
    step(*data[0])
    small_t = timed(step, data, steps)
    step(*big[0])
    return timed(step, big, steps) / small_t


def lone_runs_per_hour(arch: str, d: int, steps: int, data, device) -> float:
    """Runs per hour of the reference AR recipe trained one at a time: the ordinary model (SDPA,
    kernels where present) and fused AdamW, as a lone run trains."""
    torch.manual_seed(0)
    model = ours(arch, d).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
    data = [(i.to(device), l.to(device)) for i, l in data]
    step = lambda i, l: (sequential_step([model], [opt], i, l),                # noqa: E731
                         torch.cuda.synchronize() if device == "cuda" else None)
    step(*data[0])
    return 3600 / (timed(step, data, steps) * STEPS_PER_RUN)


STEPS_PER_RUN = -(-100_032 // BATCH) * 16     # the reference AR recipe: 100 032 documents x 16 epochs


def runs_per_hour(arch: str, d: int, steps: int, data, device, max_stack: int) -> list[tuple[int, float]]:
    """(K, runs per hour of the reference AR recipe) for stacks of K = 1, 2, 4, ... up to
    ``max_stack`` or the first K that does not fit in memory."""
    steps_per_run = STEPS_PER_RUN
    out, K = [], 1
    data = [(i.to(device), l.to(device)) for i, l in data]
    while K <= max_stack:
        try:
            models = []
            for k in range(K):
                torch.manual_seed(k)
                models.append(ours(arch, d).to(device))
            stacked = StackedCausalLM(models).to(device)
            del models
            opt = StackedAdamW(stacked.named_stacked_parameters(), [1e-3] * K)
            step = lambda i, l: stacked_step(stacked, opt, i, l)          # noqa: E731
            step(*data[0])
            if device == "cuda":
                torch.cuda.synchronize()
            seconds = timed(lambda i, l: (step(i, l), torch.cuda.synchronize() if device == "cuda" else None),
                            data, steps)
        except torch.OutOfMemoryError:
            break
        out.append((K, 3600 * K / (seconds * steps_per_run)))
        del stacked, opt
        if device == "cuda":
            torch.cuda.empty_cache()
        K *= 2
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--copies", type=int, default=5)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--only", nargs="*", default=None)
    parser.add_argument("--batch-scaling", action="store_true")
    parser.add_argument("--runs-per-hour", action="store_true",
                        help="runs per hour of the AR recipe at hidden 64/128/256, stacks of 1, 2, 4, ... (GPU)")
    parser.add_argument("--max-stack", type=int, default=64)
    parser.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256], help="--runs-per-hour widths")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = batches(args.steps)
    archs = args.only or list(MODEL_CLASSES)
    if args.runs_per_hour:
        print(f"runs per hour of the AR recipe (50 016 steps of batch {BATCH}), {device}; stack size K")
        for arch in archs:
            for d in args.widths:
                lone = lone_runs_per_hour(arch, d, args.steps, data, device)
                figures = runs_per_hour(arch, d, args.steps, data, device, args.max_stack)
                best = max(figures, key=lambda f: f[1])
                print(f"{arch:<12} hidden {d:>3}: one at a time {lone:.1f}; stacked "
                      + ", ".join(f"K={k}: {r:.1f}" for k, r in figures)
                      + f"  -> K={best[0]} gives {best[1] / lone:.1f}x one run at a time", flush=True)
        return
    print(f"K = {args.copies} runs, hidden {args.hidden}, batch {BATCH}, {device}, {args.threads} threads; "
          f"ms per optimizer step of all K runs (median over {args.rounds} rounds x {args.steps} steps)")
    print(f"{'architecture':<12} {'sequential':>11} {'stacked':>9} {'throughput':>11}"
          + (f" {'batch x' + str(args.copies) + ' cost':>14}" if args.batch_scaling else ""))
    for arch in archs:
        r = bench(arch, args.hidden, args.copies, args.steps, args.rounds, data, device)
        line = (f"{arch:<12} {r['sequential_ms']:>9.1f}ms {r['stacked_ms']:>7.1f}ms "
                f"{r['sequential_ms'] / r['stacked_ms']:>10.2f}x")
        if args.batch_scaling:
            line += f" {batch_scaling(arch, args.hidden, args.copies, args.steps, data):>13.2f}x"
        print(line, flush=True)


if __name__ == "__main__":
    main()
