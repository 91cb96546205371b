"""How to spend a CPU on a sweep: one run at a time with all threads, or one run per core with one
thread each? Trains real runs (``python -m hf_mecheval.training.run``, the reference AR recipe's
task and batch) in both layouts, in the same invocation, and prints the training throughput
(steps per second over all processes, from each run's ``train_runtime``) and the ratio.

    python benchmarks/bench_workers.py [--only transformer mamba] [--steps 400] [--hidden 64]

``mecheval sweep --workers auto`` uses the layout this measures as faster on a CPU (one process
per core, one thread each); the figures behind that choice are in docs/training.md.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

def start(arch: str, hidden: int, steps: int, out: Path, threads: int) -> subprocess.Popen:
    flags = ["--task", "ar_32", "--architecture", arch, "--hidden_size", str(hidden), "--train_size", "6400",
             "--eval_size", "32", "--max_steps", str(steps), "--eval_strategy", "no", "--save_strategy", "no",
             "--logging_steps", "100000", "--disable_tqdm", "true", "--output_dir", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, "-m", "hf_mecheval.training.run", *flags], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def runtime(proc: subprocess.Popen, out: Path) -> float:
    _, err = proc.communicate()
    if proc.returncode != 0:
        raise SystemExit(f"training failed:\n{err[-2000:]}")
    history = json.loads((out / "metrics.json").read_text())["history"]
    return next(e["train_runtime"] for e in history if "train_runtime" in e)


def layout(arch: str, hidden: int, steps: int, processes: int, threads: int, tmp: Path) -> float:
    """Steps per second over ``processes`` concurrent runs of ``threads`` threads each."""
    outs = [tmp / f"{arch}-{processes}x{threads}-{i}-{time.monotonic_ns()}" for i in range(processes)]
    procs = [start(arch, hidden, steps, out, threads) for out in outs]
    seconds = [runtime(p, out) for p, out in zip(procs, outs)]
    return processes * steps / max(seconds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from hf_mecheval.models import architecture_names

    parser.add_argument("--only", nargs="+", default=["transformer", "mamba"], choices=architecture_names())
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    print(f"{cores} cores; {args.steps} steps per run, ar_32, batch 32, hidden {args.hidden}; steps/s over all "
          f"processes (median of {args.rounds} rounds, layouts alternated)")
    print(f"{'model':<12} {'1 x ' + str(cores) + ' threads':>16} {str(cores) + ' x 1 thread':>16} {'ratio':>7}")
    with tempfile.TemporaryDirectory() as tmp:
        for arch in args.only:
            one, many = [], []
            for _ in range(args.rounds):
                one.append(layout(arch, args.hidden, args.steps, 1, cores, Path(tmp)))
                many.append(layout(arch, args.hidden, args.steps, cores, 1, Path(tmp)))
            one.sort(), many.sort()
            a, b = one[len(one) // 2], many[len(many) // 2]
            print(f"{arch:<12} {a:>16.1f} {b:>16.1f} {b / a:>6.2f}x", flush=True)


if __name__ == "__main__":
    main()
