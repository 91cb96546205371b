"""Documents per second of the task generators (issue targets: ar_32 >= 150 000,
atr_easy >= 50 000, atr_medium >= 16 000 on the 2-core machine; the reference generator makes
about 7 900, 2 500 and 800).

    python benchmarks/bench_data.py [--n 200000] [--repeats 5] [--workers 1 2]
"""
from __future__ import annotations

import argparse
import statistics
import time

from hf_mecheval.tasks import build_task

TARGETS = {"ar_32": 150_000, "atr_easy": 50_000, "atr_medium": 16_000}
REFERENCE = {"ar_32": 7_900, "atr_easy": 2_500, "atr_medium": 800}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_032, help="documents per timing (default: the reference train size)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    args = parser.parse_args()
    print("(x reference: against the reference generator's figures quoted in the issue, measured on this machine type)")
    print(f"{'preset':<12} {'workers':>7} {'docs/s (median)':>16} {'min..max':>21} {'x reference':>12} {'target':>8}")
    for preset, target in TARGETS.items():
        task = build_task(preset)
        task.generate(1000)  # warm up (grammar sampling, imports)
        for workers in args.workers:
            rates = []
            for r in range(args.repeats):
                t0 = time.perf_counter()
                task.generate(args.n, "train", seed=r, workers=workers)
                rates.append(args.n / (time.perf_counter() - t0))
            med = statistics.median(rates)
            ok = "ok" if med >= target else "MISSED"
            print(f"{preset:<12} {workers:>7} {med:>16,.0f} {min(rates):>10,.0f}..{max(rates):<10,.0f}"
                  f" {med / REFERENCE[preset]:>11.1f}x {target:>8,} {ok}")


if __name__ == "__main__":
    main()
