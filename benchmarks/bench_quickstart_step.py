"""Training-step time at the quickstart setting, this tree's models against a baseline copy of
``hf_mecheval/models`` in the same process, interleaved.

Setting (``reports/quickstart.py``): AR with 64 keys/values and 4 pairs (13 tokens, the task's
vocabulary), batch 32, hidden 64, 2 layers, answer-only loss, one torch thread (the quickstart
runs one 1-thread process per core). A step is what the Trainer does per batch: forward,
backward, gradient clipping at 1.0, fused AdamW, zero_grad.

The baseline is a folder holding an older ``models`` package, e.g. made with

    mkdir -p /tmp/base && git archive main hf_mecheval/models | tar -x -C /tmp/base --strip-components=1

(``models`` is self-contained: relative imports only, so it loads as a package of its own). Both
copies start from the same weights (the state dict is copied) and see the same batches; models
take turns step by step so that background load hits them alike. Prints the median ms per step
of each and the ratio baseline / this tree, in CPU time of the (only) thread by default: on a
machine shared with other jobs, wall time also counts the time the process waits for a core
(``--clock wall`` for it).

    python benchmarks/bench_quickstart_step.py --baseline /tmp/base/models [--only mamba_conv4 deltanet] [--steps 200]
"""
from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

from hf_mecheval.models import model_classes
from hf_mecheval.reports.quickstart import PLAN
from hf_mecheval.tasks import build_task

from bench_models import batches      # run from benchmarks/ (as python benchmarks/bench_quickstart_step.py)


def load_models_package(folder: str, name: str = "baseline_models"):
    """Import the ``models`` package in ``folder`` under another name (its own registry and classes)."""
    init = Path(folder) / "__init__.py"
    spec = importlib.util.spec_from_file_location(name, init, submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def quickstart_batches(n: int):
    """(vocabulary size, n batches of 32) of the quickstart's task (``bench_models.batches``)."""
    task = build_task(PLAN.setting["task"], **PLAN.setting["task_config"])
    return task.vocab_size, batches(n, task)


def config_fields(name: str) -> tuple[str, dict]:
    model = PLAN.models[name]
    extra = {**model.get("model_config", {}),
             **({"max_position_embeddings": model["max_position_embeddings"]} if "max_position_embeddings" in model else {})}
    return model["architecture"], {"hidden_size": PLAN.setting["hidden_size"],
                                   "num_hidden_layers": PLAN.setting["num_hidden_layers"], "kernels": "torch", **extra}


def build(classes, name: str, vocab: int, state=None):
    arch, fields = config_fields(name)
    config_cls, _, lm_cls = classes(arch)
    torch.manual_seed(0)
    model = lm_cls(config_cls(vocab_size=vocab, **fields)).train()
    if state is not None:
        model.load_state_dict(state)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=True)   # the Trainer's default
    return model, opt


def step(model, opt, ids, labels, clock=time.thread_time) -> tuple[float, float]:
    t0 = clock()
    loss = model(input_ids=ids, labels=labels).loss
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    opt.zero_grad(set_to_none=True)
    return (clock() - t0) * 1000, float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="folder of a baseline models package (omit: this tree only)")
    parser.add_argument("--only", nargs="+", default=["mamba_conv4", "deltanet"], help="quickstart run names")
    parser.add_argument("--reference", default="transformer", help="run timed alongside as the machine-speed reference")
    parser.add_argument("--steps", type=int, default=200, help="timed steps per model")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                        help="cpu: CPU time of this thread (with --threads 1); wall: elapsed time")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    vocab, data = quickstart_batches(args.steps + 10)
    baseline = None
    if args.baseline:
        base = load_models_package(args.baseline)
        baseline = lambda arch: base.modeling_mecheval.MODEL_CLASSES[arch]      # noqa: E731
    models = {}
    for name in [args.reference, *args.only]:
        models[f"{name}"] = build(model_classes, name, vocab)
        if baseline is not None and name != args.reference:
            models[f"{name} (baseline)"] = build(baseline, name, vocab, models[name][0].state_dict())
    samples = {k: [] for k in models}
    losses = {k: [] for k in models}
    for i, (ids, labels) in enumerate(data):
        for k, (m, opt) in models.items():            # interleaved: shared background noise
            ms, loss = step(m, opt, ids, labels, clock)
            if i >= 10:                               # warm-up
                samples[k].append(ms)
            losses[k].append(loss)
    print(f"median {args.clock} ms per training step ({args.steps} steps, batch 32, length {data[0][0].shape[1]}, vocabulary {vocab}, "
          f"{args.threads} thread(s))")
    for k, s in samples.items():
        q = statistics.quantiles(s, n=4)
        print(f"  {k:<26} {statistics.median(s):7.2f}   (quartiles {q[0]:.2f} .. {q[2]:.2f})")
    for name in args.only:
        if f"{name} (baseline)" in samples:
            old, new = statistics.median(samples[f"{name} (baseline)"]), statistics.median(samples[name])
            drift = max(abs(a - b) for a, b in zip(losses[name], losses[f"{name} (baseline)"]))
            print(f"  {name}: baseline / this tree = {old / new:.2f}x   (largest loss difference over the run {drift:.1e})")


if __name__ == "__main__":
    main()
