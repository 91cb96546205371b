"""Small widths on a CPU: which layout trains the most runs per hour. At widths 16 and 32 a lone
run's step is mostly overhead (the vocabulary's embedding and head, the optimizer, per-operator
costs), not arithmetic, so three ways of filling the machine are measured side by side:

* per core: one process per core, one thread each, one run each (``--workers auto``, no stack);
* stacked:  one process with every core's thread, K runs as one stacked model
  (``StackedCausalLM`` + ``StackedAdamW``, as a sweep's ``--stack K`` job trains them);
* both:     one process per core, one thread each, each a stack of K runs.

Each layout's processes run at once, the same number of optimizer steps (the AR setting of
``bench_models.py``: batch 32, length 37, vocabulary 8196, 2 layers, answer-only loss; models as
a run builds them, ``kernels="auto"``); runs per hour = runs trained x 3600 / (the slowest
process's seconds per step x the 50 016 steps of the AR recipe). Beside it, runs per CPU-hour
(the processes' CPU seconds instead of the wall clock): on a machine that other work keeps busy
the wall-clock figure depends on what else runs, while the CPU figure stays what each layout
costs (times the cores, it is what an idle machine would reach). Layouts alternate round by
round; medians over rounds. Threads wait passively (``OMP_WAIT_POLICY=PASSIVE`` unless set),
as a sweep's workers do.

    python benchmarks/bench_small_widths.py [--hidden 16 32 64] [--only transformer mamba] [--copies 4 8] [--rounds 3]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

STEPS_PER_RUN = 50_016          # the AR recipe: 100 032 documents / batch 32 x 16 epochs


def worker(arch: str, d: int, copies: int, steps: int) -> tuple[float, float]:
    """(wall seconds, CPU seconds) per optimizer step of ``copies`` runs (one model, or a stack),
    in this process."""
    import torch

    from bench_models import batches, ours
    from hf_mecheval.models.stacked import StackedCausalLM
    from hf_mecheval.training.stacked import StackedAdamW

    models = []
    for k in range(copies):
        torch.manual_seed(k)
        models.append(ours(arch, d, kernels="auto").train())
    if copies == 1:
        model, opt = models[0], torch.optim.AdamW(models[0].parameters(), lr=1e-3, fused=True)
        forward = lambda ids, labels: model(input_ids=ids, labels=labels).loss       # noqa: E731
    else:
        model = StackedCausalLM(models)
        opt = StackedAdamW(model.named_stacked_parameters(), [1e-3] * copies)
        forward = lambda ids, labels: model(ids, labels).loss                        # noqa: E731
    data = batches(4)

    def step(ids, labels):
        loss = forward(ids, labels)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for ids, labels in data[:2]:                                 # warm-up
        step(ids, labels)
    start, cpu = time.perf_counter(), time.process_time()
    for i in range(steps):
        step(*data[i % len(data)])
    return (time.perf_counter() - start) / steps, (time.process_time() - cpu) / steps


def layout(arch: str, d: int, processes: int, threads: int, copies: int, steps: int) -> tuple[float, float]:
    """(runs per hour, runs per CPU-hour) of ``processes`` concurrent processes of ``threads``
    threads, each training ``copies`` runs."""
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    command = [sys.executable, __file__, "--worker", arch, str(d), str(copies), str(steps)]
    procs = [subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__))) for _ in range(processes)]
    wall, cpu = [], []
    for proc in procs:
        out, err = proc.communicate()
        if proc.returncode != 0:
            raise SystemExit(f"worker failed:\n{err[-2000:]}")
        figures = json.loads(out.splitlines()[-1])
        wall.append(figures["wall_per_step"])
        cpu.append(figures["cpu_per_step"])
    runs = processes * copies
    return runs * 3600 / (max(wall) * STEPS_PER_RUN), runs * 3600 / (sum(cpu) * STEPS_PER_RUN)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        arch, d, copies, steps = sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
        wall, cpu = worker(arch, d, copies, steps)
        print(json.dumps({"wall_per_step": wall, "cpu_per_step": cpu}))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--only", nargs="+", default=["transformer", "mamba"])
    parser.add_argument("--copies", type=int, nargs="+", default=[8], help="stack sizes K")
    parser.add_argument("--steps", type=int, default=20, help="timed optimizer steps per process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args()
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    c = args.cores
    layouts = {"per core": (c, 1, 1)}
    for k in args.copies:
        layouts[f"stacked K={k}"] = (1, c, k)
        layouts[f"both K={k}"] = (c, 1, k)
    print(f"runs per hour of the AR recipe ({STEPS_PER_RUN} steps), {c} cores; (processes x threads x runs): "
          + ", ".join(f"{name} {p}x{t}x{k}" for name, (p, t, k) in layouts.items()))
    print(f"{'model':<12} {'hidden':>6} {'figure':<16}" + " ".join(f"{name:>14}" for name in layouts)
          + "   best / per core")
    for arch in args.only:
        for d in args.hidden:
            samples = {name: [] for name in layouts}
            for _ in range(args.rounds):
                for name, (p, t, k) in layouts.items():
                    samples[name].append(layout(arch, d, p, t, k, args.steps))
            for i, figure in enumerate(("runs/hour", "runs/CPU-hour")):
                rate = {name: statistics.median(s[i] for s in samples[name]) for name in layouts}
                best = max(rate, key=rate.get)
                print(f"{arch:<12} {d:>6} {figure:<16}" + " ".join(f"{rate[name]:14.2f}" for name in layouts)
                      + f"   {best}: {rate[best] / rate['per core']:.2f}x", flush=True)


if __name__ == "__main__":
    main()
