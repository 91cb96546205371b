"""A training step on an idle machine and on a busy one, under each OpenMP setting.

    python benchmarks/bench_busy_machine.py [--steps 25] [--busy 2]

With other work on the cores, OpenMP threads that spin-wait for each other (libgomp's default,
``OMP_WAIT_POLICY`` unset) lose whole scheduler slices to the other processes: a step can take
several times as long. This times the same step (the Transformer at hidden 64, 2 layers, batch 32
of 100 tokens; forward, backward, AdamW) in a fresh process for each setting, first alone, then
beside ``--busy`` 1-thread training loops (the load of a sweep's workers or another test run), and prints median ms per step and each setting's ratio to the default's, idle and
busy side by side. The load average is printed too: an "idle" row measured beside other work is
not idle.
"""
from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time

STEP = r"""
import time, torch
from hf_mecheval.models import build_model
torch.manual_seed(0)
model = build_model("transformer", vocab_size=100, hidden_size=64, num_hidden_layers=2, max_position_embeddings=128)
opt = torch.optim.AdamW(model.parameters(), 1e-3)
ids = torch.randint(0, 100, (32, 100), generator=torch.Generator().manual_seed(0))
times = []
for _ in range(STEPS):
    start = time.perf_counter()
    model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter() - start)
print(" ".join(f"{t:.6f}" for t in times[5:]))
"""

# the other work: a 1-thread training loop, as a sweep's worker or another test process runs
HOG = r"""
import torch
torch.set_num_threads(1)
from hf_mecheval.models import build_model
model = build_model("mamba", vocab_size=100, hidden_size=64, num_hidden_layers=2)
opt = torch.optim.AdamW(model.parameters(), 1e-3)
ids = torch.randint(0, 100, (32, 100))
while True:
    model(ids, labels=ids).loss.backward()
    opt.step()
    opt.zero_grad()
"""

SETTINGS = {
    "default (active wait, all cores)": {},
    "OMP_WAIT_POLICY=PASSIVE (all cores)": {"OMP_WAIT_POLICY": "PASSIVE"},
    "1 thread": {"OMP_NUM_THREADS": "1"},
}


def median_ms(env_extra: dict, steps: int) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "OMP_NUM_THREADS", "GOMP_SPINCOUNT")}
    env.update(env_extra)
    out = subprocess.run([sys.executable, "-c", STEP.replace("STEPS", str(steps))], env=env, check=True,
                         capture_output=True, text=True).stdout.split()
    return 1000 * statistics.median(float(t) for t in out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=25, help="steps per measurement (the first 5 are not timed)")
    parser.add_argument("--busy", type=int, default=os.cpu_count() or 1, help="busy processes beside the step")
    args = parser.parse_args()
    print(f"{os.cpu_count()} cores; load average before: {os.getloadavg()[0]:.2f}")
    idle = {name: median_ms(extra, args.steps) for name, extra in SETTINGS.items()}
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    hogs = [subprocess.Popen([sys.executable, "-c", HOG], env=env) for _ in range(args.busy)]
    try:
        time.sleep(8.0)                   # the hogs import torch and start training
        busy = {name: median_ms(extra, args.steps) for name, extra in SETTINGS.items()}
    finally:
        for hog in hogs:
            hog.kill()
    base_idle, base_busy = idle[next(iter(SETTINGS))], busy[next(iter(SETTINGS))]
    print(f"{'setting':38s} {'idle ms':>8s} {'x default':>9s} {'busy ms':>8s} {'x default':>9s} {'busy/idle':>9s}")
    for name in SETTINGS:
        print(f"{name:38s} {idle[name]:8.1f} {idle[name] / base_idle:9.2f} {busy[name]:8.1f} "
              f"{busy[name] / base_busy:9.2f} {busy[name] / idle[name]:9.2f}")
    print(f"(busy: {args.busy} 1-thread Mamba training loops beside the step)")


if __name__ == "__main__":
    main()
