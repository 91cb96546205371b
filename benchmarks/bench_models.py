"""Training-step time of every architecture at the AR setting, side by side with transformers'
GPT2, Llama and Mamba trained on the same batches and labels in the same run, and what each step
computes against what the machine's matrix products reach.

Setting: vocabulary 8196, length 37, batch 32, answer-only loss, 2 layers, AdamW step,
2 threads. Our models run the path a run takes (``--kernels auto``: on a CPU with a C++ compiler
the compiled scan and short convolution of ``cpu_kernels``), beside ``ours-mamba-torch``, our
Mamba on its PyTorch path; ``--kernels torch`` runs every model's PyTorch path, beside
``ours-mamba-compiled``. Prints the
median ms per step (forward + backward + AdamW) and the ratios the models issue asks for: our Transformer >= 4x faster than GPT2; our Mamba >= 10x faster than HF
Mamba's default path and >= 3x faster than HF Mamba + mambapy; every architecture within 3x
of our Transformer at hidden 64. ``ours-transformer-eager`` and ``-sdpa``: our Transformer under
each ``attn_implementation`` (the default, ``ours-transformer``, is "sdpa").

Beside each time: the floating-point operations of one training step (``FlopCounterMode``:
matrix products, convolutions, attention; plus, by hand, the compiled scans, which run outside
torch's dispatcher: ``cpu_kernels.scan_flops`` for Mamba's, ``cpu_kernels.ssd_flops`` for
Mamba-2's SSD, each the operations the kernel executes, which for Mamba-2 are ~3x the chunked
form's matrix products that the PyTorch path has counted; the step's time as a multiple of the
Transformer's is printed beside, free of that convention), the GFLOP/s the step achieves, and the GFLOP/s
of a plain matrix product of the Transformer's MLP shape ((batch x length, hidden) @ (hidden,
4 hidden)) timed in the same rounds at the same thread count: the machine's own rate. At hidden
256 every architecture's GFLOP/s should be >= 70 % of our Transformer's. ``--profile NAME ...``
prints torch.profiler's table of those models' steps (where the time goes besides the products).

    python benchmarks/bench_models.py [--hidden 64 128 256] [--steps 10] [--rounds 3] [--only mamba transformer] [--device cuda]
    python benchmarks/bench_models.py --hidden 256 --threads 1 --only ours --profile mamba h3 hyena deltanet
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import time

import torch
from torch.utils.flop_counter import FlopCounterMode

from hf_mecheval.models import architecture_names, build_model, cpu_kernels
from hf_mecheval.models.kernels import cpu_scan
from hf_mecheval.models.mixer_mamba import MambaMixer
from hf_mecheval.tasks import build_task

VOCAB, LENGTH, BATCH = 8196, 37, 32
MAMBA_PEER = {"auto": "ours-mamba-torch", "torch": "ours-mamba-compiled"}   # Mamba on the other CPU path


def ours(arch: str, d: int, kernels: str = "torch", attention: str | None = None):
    extra = {"max_position_embeddings": 64} if arch == "transformer" else {}
    model = build_model(arch, vocab_size=VOCAB, hidden_size=d, num_hidden_layers=2, kernels=kernels, **extra)
    if attention:                                          # the Transformer's attn_implementation
        model.set_attn_implementation(attention)
    return model


def peers(d: int) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, MambaConfig, MambaForCausalLM

    out = {
        "hf-gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=d, n_layer=2, n_head=1, n_positions=64,
                                                      resid_pdrop=0, embd_pdrop=0, attn_pdrop=0)),
        "hf-llama": lambda: LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=d, intermediate_size=4 * d,
                                                         num_hidden_layers=2, num_attention_heads=1,
                                                         num_key_value_heads=1, max_position_embeddings=64)),
        "hf-mamba": lambda: MambaForCausalLM(MambaConfig(vocab_size=VOCAB, hidden_size=d, num_hidden_layers=2,
                                                         state_size=16, expand=2, conv_kernel=4)),
    }
    if importlib.util.find_spec("mambapy"):
        out["hf-mamba+mambapy"] = lambda: MambaForCausalLM(MambaConfig(
            vocab_size=VOCAB, hidden_size=d, num_hidden_layers=2, state_size=16, expand=2, conv_kernel=4,
            use_mambapy=True))
    return out


def batches(n: int, task=None):
    """n training batches (input ids, answer-only labels) of ``task`` (default: the reference ar_32)."""
    data = (task or build_task("ar_32")).generate(BATCH * n, "train", seed=0)
    ids = torch.from_numpy(data.padded()).long()
    labels = torch.full_like(ids, -100)
    rows = torch.arange(len(ids))
    pos = torch.from_numpy(data.columns["answer_pos"]).long()
    labels[rows, pos] = ids[rows, pos]
    return [(ids[i * BATCH:(i + 1) * BATCH], labels[i * BATCH:(i + 1) * BATCH]) for i in range(n)]


def time_steps(model, optimizer, data) -> list[float]:
    cuda = data[0][0].is_cuda
    times = []
    for ids, labels in data:
        t0 = time.perf_counter()
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if cuda:
            torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1000)
    return times


def step_flops(model, optimizer, batch) -> tuple[int, int]:
    """(counted, by hand): the floating-point operations of one training step on ``batch`` as
    ``FlopCounterMode`` counts them, and those it cannot see, written out by hand (the compiled
    scans' arithmetic: Mamba's in every layer, Mamba-2's SSD in the layers that call it, counted
    per call; the compiled depthwise convolutions, short and long, as ``FlopCounterMode`` counts the
    grouped ``conv1d`` of the PyTorch path: 2 operations per output and tap forward, and as
    much again for each of the two gradients; H3's compiled heads as the grouped ``conv1d`` of
    its long convolution over the P D outer-product channels at the positions they compute, whose
    outer products and q contraction, elementwise on the PyTorch path, ``FlopCounterMode`` does not
    count either). The step is taken (one more AdamW update)."""
    ids, labels = batch
    calls = []                                                # the compiled kernels' operations, per call
    ssd, conv, heads = cpu_kernels.ssd_cpu, cpu_kernels.short_conv_cpu, cpu_kernels.h3_kept_heads_cpu

    def ssd_counted(x, dt, A, B, C):
        calls.append(cpu_kernels.ssd_flops(*x.shape, B.shape[-1]))
        return ssd(x, dt, A, B, C)

    def conv_counted(x, weight, *args, **kwargs):
        calls.append(3 * 2 * x.numel() * weight.shape[-1])  # forward, input gradient, weight gradient
        return conv(x, weight, *args, **kwargs)

    def heads_counted(q, k, v, taps, keep, head_dim):
        rows, length, width = k.shape                         # S positions of L taps, P D channels, as above
        calls.append(3 * 2 * rows * keep.shape[1] * length * head_dim * width)
        return heads(q, k, v, taps, keep, head_dim)

    cpu_kernels.ssd_cpu, cpu_kernels.short_conv_cpu, cpu_kernels.h3_kept_heads_cpu = ssd_counted, conv_counted, heads_counted
    try:
        with FlopCounterMode(display=False) as counter:
            time_steps(model, optimizer, [batch])
    finally:
        cpu_kernels.ssd_cpu, cpu_kernels.short_conv_cpu, cpu_kernels.h3_kept_heads_cpu = ssd, conv, heads
    by_hand = sum(calls)
    for module in model.modules():
        if isinstance(module, MambaMixer) and cpu_scan("mamba", module.config.kernels, ids.device) is not None:
            by_hand += cpu_kernels.scan_flops(*ids.shape, module.N, module.E)   # every position, both layers
    return counter.get_total_flops(), by_hand


def matmul_samples(d: int, device: str, repeats: int = 5) -> list[float]:
    """GFLOP/s of (batch x length, d) @ (d, 4 d), the Transformer MLP's first product, ``repeats``
    times: the machine's own matmul rate at this width and thread count."""
    a = torch.randn(BATCH * LENGTH, d, device=device)
    b = torch.randn(d, 4 * d, device=device)
    out = torch.empty(BATCH * LENGTH, 4 * d, device=device)
    rates = []
    for _ in range(repeats + 1):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        if device == "cuda":
            torch.cuda.synchronize()
        rates.append(2 * a.shape[0] * d * 4 * d / (time.perf_counter() - t0) / 1e9)
    return rates[1:]                                          # the first is a warm-up


def print_arithmetic(d: int, ms: dict[str, float], flops: dict[str, tuple[int, int]], matmul: float) -> None:
    """The FLOP table of one width: per model GFLOP per step (counted + by hand), the GFLOP/s its
    median step achieves, as a share of the machine's matmul rate and of our Transformer's."""
    rate = {name: sum(flops[name]) / ms[name] / 1e6 for name in ms}         # GFLOP/s
    base = rate.get("ours-transformer")
    print(f"  {'':<20} {'GFLOP/step':>10} {'by hand':>8} {'GFLOP/s':>8} {'of matmul':>9} {'of Transformer':>14} "
          f"{'step / Transformer':>18}")
    for name in ms:
        counted, by_hand = flops[name]
        share = f"{rate[name] / base:14.0%}" if base else f"{'':>14}"
        steps = f"{ms[name] / ms['ours-transformer']:17.2f}x" if base else ""
        flag = " (< 70 %)" if base and d == 256 and name.startswith("ours-") and rate[name] < 0.7 * base else ""
        print(f"  {name:<20} {counted / 1e9:10.3f} {by_hand / 1e9:8.3f} {rate[name]:8.1f} "
              f"{rate[name] / matmul:9.0%} {share} {steps}{flag}")
    print(f"  {'matmul':<20} ({BATCH * LENGTH}x{d} @ {d}x{4 * d}) {matmul:8.1f} GFLOP/s (median over the rounds)")


def print_profile(name: str, model, optimizer, data, rows: int = 18) -> None:
    """torch.profiler's table of ``model``'s training steps on ``data``: operators by self CPU time."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        time_steps(model, optimizer, data)
    print(f"\nprofile of {name}, {len(data)} steps (self CPU time per operator):")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=40))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 128, 256])
    parser.add_argument("--steps", type=int, default=8, help="timed steps per model per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; models take turns within a round")
    parser.add_argument("--only", nargs="+", help="models: a full name (ours-transformer) alone, other text every "
                                                  "name containing it (mamba, ours)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--device", default="cpu", help="cpu (the issue's setting) or cuda")
    parser.add_argument("--kernels", choices=["auto", "torch"], default="auto",
                        help="our models' kernels: auto (as a run trains; compiled CPU kernels where they build) "
                             "or torch (every model's PyTorch path)")
    parser.add_argument("--profile", nargs="+", default=[], metavar="NAME",
                        help="print torch.profiler's table of these models' steps (e.g. mamba h3)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    archs = architecture_names()          # every registered architecture, plug-ins included
    data = [(i.to(args.device), l.to(args.device)) for i, l in batches(args.steps)]
    results: dict[tuple[str, int], float] = {}
    for d in args.hidden:
        makers = {f"ours-{a}": (lambda a=a: ours(a, d, kernels=args.kernels)) for a in archs}
        makers.update({f"ours-transformer-{i}": (lambda i=i: ours("transformer", d, kernels=args.kernels, attention=i))
                       for i in ("eager", "sdpa")})
        if args.device == "cpu" and cpu_kernels.available():  # Mamba on the other of its two CPU paths
            other = "torch" if args.kernels == "auto" else "auto"
            makers[MAMBA_PEER[args.kernels]] = lambda: ours("mamba", d, kernels=other)
        makers.update(peers(d))
        if args.only:
            # a full model name selects that model alone (ours-transformer, not its -eager and -sdpa
            # variants); any other text every model whose name contains it (mamba, ours)
            makers = {k: v for k, v in makers.items()
                      if any(o == k if o in makers else o in k for o in args.only)}
        models, flops = {}, {}
        for name, make in makers.items():
            torch.manual_seed(0)
            m = make().to(args.device).train()
            opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0, fused=True)   # as Trainer (adamw_torch_fused)
            time_steps(m, opt, data[:2])                      # warm-up
            flops[name] = step_flops(m, opt, data[0])
            models[name] = (m, opt)
        samples = {name: [] for name in models}
        matmul = []
        for _ in range(args.rounds):                          # interleave: shared noise
            matmul += matmul_samples(d, args.device)
            for name, (m, opt) in models.items():
                samples[name] += time_steps(m, opt, data)
        print(f"\nhidden {d}: median ms per training step (batch {BATCH}, length {LENGTH}, vocabulary {VOCAB}, "
              + (f"{args.threads} threads)" if args.device == "cpu" else f"{args.device})"))
        for name, s in samples.items():
            results[(name, d)] = statistics.median(s)
            print(f"  {name:<20} {results[(name, d)]:8.1f}   (min {min(s):.1f}, max {max(s):.1f})")
        print_arithmetic(d, {name: results[(name, d)] for name in samples}, flops, statistics.median(matmul))
        for name in args.profile:
            for full in (n for n in models if n == name or n == f"ours-{name}"):
                print_profile(f"{full} at hidden {d}", *models[full], data)

    print("\nratios (higher = ours faster):")
    for d in args.hidden:
        def ratio(a, b, target):
            if (a, d) in results and (b, d) in results:
                r = results[(a, d)] / results[(b, d)]
                print(f"  hidden {d}: {a} / {b} = {r:.1f}x  (target >= {target}x) {'ok' if r >= target else 'MISSED'}")
        ratio("hf-gpt2", "ours-transformer", 4)
        ratio("hf-mamba", "ours-mamba", 10)
        ratio("hf-mamba+mambapy", "ours-mamba", 3)
        if args.kernels == "auto":
            ratio("ours-mamba-torch", "ours-mamba", 1)
        else:
            ratio("ours-mamba", "ours-mamba-compiled", 1)
        if ("ours-transformer-eager", d) in results and ("ours-transformer-sdpa", d) in results:   # no target
            print(f"  hidden {d}: ours-transformer-eager / -sdpa = "
                  f"{results[('ours-transformer-eager', d)] / results[('ours-transformer-sdpa', d)]:.2f}x")
    if 64 in args.hidden and ("ours-transformer", 64) in results:
        base = results[("ours-transformer", 64)]
        for a in archs:
            if (f"ours-{a}", 64) in results:
                r = results[(f"ours-{a}", 64)] / base
                print(f"  hidden 64: ours-{a} / ours-transformer = {r:.2f}x (target <= 3x) {'ok' if r <= 3 else 'MISSED'}")


if __name__ == "__main__":
    main()
