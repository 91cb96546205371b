"""Training steps with the batch's rows run in groups of similar length (``length_groups`` in
models/modeling_mecheval.py) against the whole padded batch in one call, on the tasks whose
documents differ in length: which ``GROUP_CALL_TOKENS`` (what one more backbone call is taken to
cost, in token-rows) to use.

Each cell is one model (width, 2 layers, ``kernels="auto"``) on batches of 32 of a preset's training
data in its first epoch's order, as the Trainer serves them (padded to the batch's longest
document), forward + backward + AdamW; every setting of the constant is timed on the same batches,
taking turns within each round (shared noise). ``off`` is one call for the whole batch (the code
before grouping). Prints the median ms per step, each setting's ratio to ``off``, and the tokens the
groups computed as a share of the padded batch's.

    python benchmarks/bench_length_groups.py [--presets atr_medium atr_easy mqar_cpu] [--hidden 64 128]
                                             [--only transformer mamba] [--tokens 64 256 1024] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

import hf_mecheval.models.modeling_mecheval as modeling
from hf_mecheval.models import architecture_names, build_model
from hf_mecheval.tasks import build_task
from hf_mecheval.training.data import PaddedTaskDataset, epoch_order

BATCH = 32
OFF = 10 ** 12          # no split ever saves this much: one call, as before grouping


def batches(preset: str, n: int) -> list[dict]:
    task = build_task(preset)
    data = PaddedTaskDataset(task.generate(BATCH * n, "train", seed=0))
    order = epoch_order(len(data), 0, 0)
    return [data.__getitems__(order[i * BATCH:(i + 1) * BATCH]) for i in range(n)], task


def computed_share(data: list[dict], tokens: int) -> float:
    """Token-rows the groups compute over the padded batches' token-rows."""
    done = padded = 0
    for batch in data:
        positions, _ = modeling.scored_positions(batch["labels"][:, 1:])           # as the forward keeps them
        needed = positions.max(1).values + 1                                        # last scored position + 1
        groups = modeling.length_groups(needed, tokens)
        padded += batch["input_ids"].numel()
        # one group runs the batch as it is (the forward's one call); several, each cut to its length
        done += batch["input_ids"].numel() if len(groups) == 1 else sum(len(rows) * n for rows, n in groups)
    return done / padded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", nargs="+", default=["atr_medium", "atr_easy", "mqar_cpu"])
    parser.add_argument("--hidden", type=int, nargs="+", default=[64])
    parser.add_argument("--only", nargs="+", help="subset of architectures")
    parser.add_argument("--tokens", type=int, nargs="+", default=[64, 256, 1024], help="GROUP_CALL_TOKENS to try")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per setting per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    archs = [a for a in architecture_names() if not args.only or a in args.only]
    settings = [("off", OFF)] + [(str(t), t) for t in args.tokens]
    for preset in args.presets:
        data, task = batches(preset, args.steps + 1)
        shares = "  ".join(f"{name}: {100 * computed_share(data, t):.0f} %" for name, t in settings)
        print(f"\n{preset}: token-rows computed, share of the padded batches': {shares}")
        for d in args.hidden:
            for arch in archs:
                extra = {"max_position_embeddings": 1024} if arch == "transformer" else {}
                torch.manual_seed(0)
                model = build_model(arch, vocab_size=task.vocab_size, hidden_size=d, num_hidden_layers=2,
                                    kernels="auto", **extra).train()
                optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)
                samples = {name: [] for name, _ in settings}
                for r in range(args.rounds + 1):                      # round 0: warm-up
                    for name, tokens in settings:
                        modeling.GROUP_CALL_TOKENS = tokens
                        for batch in data[1:] if r else data[:1]:
                            start = time.perf_counter()
                            model(**batch).loss.backward()
                            optimizer.step()
                            optimizer.zero_grad(set_to_none=True)
                            if r:
                                samples[name].append(1000 * (time.perf_counter() - start))
                off = statistics.median(samples["off"])
                cells = "  ".join(f"{name} {statistics.median(s):7.1f} ({statistics.median(s) / off:.2f}x)"
                                  for name, s in samples.items())
                print(f"  {arch:<15} width {d:<4} ms per step: {cells}")


if __name__ == "__main__":
    main()
