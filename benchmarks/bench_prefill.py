"""Reading a prompt into the generation cache: one parallel pass (``forward_with_state``, what
``generate()`` now does) against the token-by-token prefill it replaced, and the plain forward
over the same prompt as the floor, for every architecture, in the same run.

Setting: vocabulary 8196, hidden 64, 2 layers, a batch of 1 prompt of ``--length`` tokens (1 000
by default), PyTorch path (``kernels="torch"``), 1 thread by default. Prints the median seconds of
each and the ratios: prefill / forward (near 1: every default form prefills in parallel; H3's
earlier mecheval-v1 form would step through the prompt) and token-by-token / prefill (the speed-up).

    python benchmarks/bench_prefill.py [--length 1000] [--rounds 3] [--only mamba transformer] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from hf_mecheval.models import architecture_names, build_model, model_classes
from hf_mecheval.models.recurrent_cache import RecurrentCache


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", nargs="+", help="subset of architectures")
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    ids = torch.randint(3, 8196, (1, args.length), generator=torch.Generator().manual_seed(0))
    print(f"prompt of {args.length} tokens, batch 1, hidden 64, 2 layers, {args.threads} thread(s); median of "
          f"{args.rounds} rounds, seconds")
    print(f"{'architecture':<16}{'forward':>10}{'prefill':>10}{'token by token':>16}{'prefill/forward':>17}"
          f"{'speed-up':>10}")
    for arch in args.only or architecture_names():
        fields = model_classes(arch)[0].field_names()
        # room for the prompt in learned positions and implicit long filters, where the model has them
        extra = {name: args.length for name in ("max_filter_length",) if name in fields}
        if arch == "transformer":
            extra["max_position_embeddings"] = args.length
        model = build_model(arch, vocab_size=8196, hidden_size=64, num_hidden_layers=2, kernels="torch", **extra).eval()
        n = model.config.num_hidden_layers

        def token_by_token():
            cache = RecurrentCache(n)
            for t in range(args.length):
                model(ids[:, t:t + 1], cache=cache)

        times = {"forward": [], "prefill": [], "steps": []}
        with torch.no_grad():
            for _ in range(args.rounds):
                times["forward"].append(timed(lambda: model(ids, logits_to_keep=1)))
                times["prefill"].append(timed(lambda: model(ids, cache=RecurrentCache(n), logits_to_keep=1)))
                times["steps"].append(timed(token_by_token))
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"{arch:<16}{med['forward']:>10.3f}{med['prefill']:>10.3f}{med['steps']:>16.2f}"
              f"{med['prefill'] / med['forward']:>17.1f}{med['steps'] / med['prefill']:>10.0f}")


if __name__ == "__main__":
    main()
