"""What one evaluation of a run's validation split costs: the Trainer's path for our models (the
LM head at the answers alone, in pieces: ``AnswerSummary.of_model``) beside its peer, the
forward's logits ((batch, k, vocab) at every row's k slots) summarised afterwards
(``AnswerSummary.of_logits``, what any other model gets), on the same documents in the same run.

Documents as the Trainer serves them (``PaddedTaskDataset``, batches of the runs' 256); untrained
models (the cost does not depend on the weights). Prints each path's seconds for the split
(median of the rounds) and their ratio, and checks that both give the same predictions.

    python benchmarks/bench_evaluation.py [--preset mqar_cpu] [--documents 2000] [--hidden 64]
                                          [--only based transformer] [--rounds 3] [--threads 1]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from hf_mecheval.models import architecture_names, build_model
from hf_mecheval.tasks import build_task
from hf_mecheval.training.data import PaddedTaskDataset
from hf_mecheval.training.evaluation import logits_summary_for

BATCH = 256      # per_device_eval_batch_size's default (training/arguments.py)


def evaluation_seconds(summarize, model, data, path: str) -> tuple[float, list[torch.Tensor]]:
    """One pass over ``data`` by ``path`` ("states" or "logits") -> (seconds, each batch's summary)."""
    summaries = []
    start = time.perf_counter()
    for first in range(0, len(data), BATCH):
        batch = data.__getitems__(list(range(first, min(first + BATCH, len(data)))))
        with torch.no_grad():
            if path == "states":
                summaries.append(summarize.of_model(model, batch)[1])
            else:
                summaries.append(summarize.of_logits(model(**batch).logits, batch["labels"]))
    return time.perf_counter() - start, summaries


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="mqar_cpu")
    parser.add_argument("--documents", type=int, default=2000, help="validation documents (mqar_cpu's eval_size)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--only", nargs="+", default=["transformer", "based", "mamba"], choices=architecture_names())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    task = build_task(args.preset)
    data = PaddedTaskDataset(task.generate(args.documents, "validation", seed=0))
    summarize = logits_summary_for(task)
    print(f"{args.preset}: {len(data)} validation documents, batches of {BATCH}, hidden {args.hidden}, "
          f"{args.threads} thread(s), median of {args.rounds} rounds")
    print(f"  {'architecture':<14}{'answers alone s':>16}{'forward logits s':>18}{'ratio':>8}")
    for arch in args.only:
        extra = {"max_position_embeddings": 1024} if arch == "transformer" else {}
        torch.manual_seed(0)
        model = build_model(arch, vocab_size=task.vocab_size, hidden_size=args.hidden, num_hidden_layers=2,
                            kernels="auto", **extra).eval()
        times = {"states": [], "logits": []}
        for _ in range(args.rounds):
            for path in times:                       # alternated, so both see the same machine
                seconds, summaries = evaluation_seconds(summarize, model, data, path)
                times[path].append(seconds)
                if path == "states":
                    ours = summaries
                else:
                    assert all(torch.equal(a[..., :2], b[..., :2]) for a, b in zip(ours, summaries)), \
                        f"{arch}: the two paths predict differently"
        states, logits = (statistics.median(times[p]) for p in ("states", "logits"))
        print(f"  {arch:<14}{states:>16.2f}{logits:>18.2f}{states / logits:>7.2f}x")


if __name__ == "__main__":
    main()
