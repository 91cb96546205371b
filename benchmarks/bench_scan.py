"""Mamba's selective scan alone, at the reference AR setting's sizes (batch 32, length 37, width 64
so E = 128 channels, state 16): forward + backward, median ms, of the PyTorch forms
(``ops_selective_scan``: the whole sequence, and the answer position only) against the compiled
C++ scan (``cpu_kernels``), interleaved in the same run so they share the machine's noise.

    python benchmarks/bench_scan.py [--threads 1] [--rounds 40] [--hidden 64]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from hf_mecheval.models import cpu_kernels
from hf_mecheval.models.ops_selective_scan import ScanWorkspace, selective_scan, selective_scan_at

BATCH, LENGTH, STATE = 32, 37, 16


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--hidden", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if not cpu_kernels.available():
        raise SystemExit("no C++ compiler: the compiled scan could not be built")
    g = torch.Generator().manual_seed(0)
    E = 2 * args.hidden
    x = torch.randn(BATCH, LENGTH, E, generator=g).requires_grad_()
    dt = (torch.rand(BATCH, LENGTH, E, generator=g) * 0.1).requires_grad_()
    A = (-torch.rand(E, STATE, generator=g) * 3).requires_grad_()
    B = torch.randn(BATCH, LENGTH, STATE, generator=g).requires_grad_()
    C = torch.randn(BATCH, LENGTH, STATE, generator=g).requires_grad_()
    dt_large = (dt.detach() * 1000).requires_grad_()
    answer = torch.full((BATCH, 1), LENGTH - 1)
    ws = ScanWorkspace()
    forms = {
        "pytorch, every position": lambda: selective_scan(x, dt, A, B, C, ws),
        "compiled, every position": lambda: cpu_kernels.selective_scan_cpu(x, dt, A, B, C),
        "pytorch, answer only": lambda: selective_scan_at(x, dt, A, B, C, answer, ws),
        "compiled, answer only": lambda: cpu_kernels.selective_scan_cpu(x, dt, A, B, C)[:, -1:],
        # a model at a high learning rate: dt in the hundreds, decays far below exp(-80)
        "pytorch, large dt": lambda: selective_scan(x, dt_large, A, B, C, ws),
        "compiled, large dt": lambda: cpu_kernels.selective_scan_cpu(x, dt_large, A, B, C),
    }
    times = {name: [] for name in forms}
    for r in range(args.rounds + 3):                 # 3 warm-up rounds
        for name, form in forms.items():
            t0 = time.perf_counter()
            form().sum().backward()
            if r >= 3:
                times[name].append((time.perf_counter() - t0) * 1000)
    print(f"selective scan, forward + backward, median ms (batch {BATCH}, length {LENGTH}, E {E}, state {STATE}, "
          f"{args.threads} thread(s), {args.rounds} rounds):")
    med = {name: statistics.median(t) for name, t in times.items()}
    for name, m in med.items():
        print(f"  {name:<26} {m:7.2f}")
    print(f"  every position: pytorch / compiled = {med['pytorch, every position'] / med['compiled, every position']:.1f}x")
    print(f"  answer only:    pytorch / compiled = {med['pytorch, answer only'] / med['compiled, answer only']:.1f}x")
    print(f"  large dt:       pytorch / compiled = {med['pytorch, large dt'] / med['compiled, large dt']:.1f}x")


if __name__ == "__main__":
    main()
