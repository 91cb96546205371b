"""Whether ``kernels="auto"`` picks the faster CPU path: a training step (the AR setting of
``bench_models.py``: batch 32, length 37, 2 layers, answer-only loss, AdamW) on the PyTorch code
(``kernels="torch"``) against the same model on the compiled kernels ``"auto"`` chooses (Mamba's
scan; H3's long convolutions, taps and shift kernel; Hyena's and BaseConv's long convolutions;
every short convolution), at widths 16 to 256 and 1 and 2 threads, interleaved in the same rounds
so that both share the machine's noise. Prints the median ms per step, torch / auto (>= 1: auto is
never the slower path). Threads wait passively
(``OMP_WAIT_POLICY=PASSIVE`` unless set), as a sweep's workers and the tests run: on a machine busy
with other trainings, spinning threads lost whole scheduler slices (a 2-thread step at width 16
took 3.4 s).

    python benchmarks/bench_kernel_choice.py [--architectures mamba h3] [--hidden 16 32 64 128 256] [--threads 1 2]
                                             [--rounds 5] [--steps 4]
"""
from __future__ import annotations

import argparse
import os
import statistics

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")     # read when torch starts its threads: before the import

import torch  # noqa: E402

from bench_models import batches, ours, time_steps  # noqa: E402  (run as python benchmarks/bench_kernel_choice.py)
from hf_mecheval.models import cpu_kernels  # noqa: E402

# the architectures with a compiled CPU path beyond the short convolution
ARCHITECTURES = ["mamba", "h3", "hyena", "baseconv"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--architectures", nargs="+", default=ARCHITECTURES)
    parser.add_argument("--hidden", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the two paths take turns within a round")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per path per round")
    args = parser.parse_args()
    if not cpu_kernels.available():
        raise SystemExit("no C++ compiler: the compiled kernels could not be built, so 'auto' is the PyTorch path")
    data = batches(args.steps)
    print(f"training step, median ms (batch 32, length 37, 2 layers, {args.rounds} rounds x {args.steps} steps)")
    print(f"  {'model':>8} {'threads':>7} {'hidden':>6} {'torch':>8} {'auto':>8} {'torch/auto':>10}")
    worst = None
    for arch, threads, d in ((a, t, d) for a in args.architectures for t in args.threads for d in args.hidden):
        torch.set_num_threads(threads)
        models = {}
        for kernels in ("torch", "auto"):
            torch.manual_seed(0)
            model = ours(arch, d, kernels=kernels).train()
            opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
            time_steps(model, opt, data[:2])               # warm-up
            models[kernels] = (model, opt)
        samples = {k: [] for k in models}
        for _ in range(args.rounds):
            for kernels, (model, opt) in models.items():
                samples[kernels] += time_steps(model, opt, data)
        ms = {k: statistics.median(s) for k, s in samples.items()}
        ratio = ms["torch"] / ms["auto"]
        print(f"  {arch:>8} {threads:>7} {d:>6} {ms['torch']:8.1f} {ms['auto']:8.1f} {ratio:9.2f}x", flush=True)
        worst = ratio if worst is None else min(worst, ratio)
    print(f"worst torch / auto: {worst:.2f}x ({'auto never slower' if worst >= 1 else 'auto SLOWER somewhere'})")


if __name__ == "__main__":
    main()
