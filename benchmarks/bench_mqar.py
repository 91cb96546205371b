"""Training-step time of every architecture on MQAR, beside the AR reference step (ar_32) in the
same run, and the sweep's CPU hours estimated from it.

Each MQAR batch is 32 documents as training serves them (``PaddedTaskDataset``: one batch padded
to its longest document, labels at every answer), drawn from one setting (seq_len, num_pairs) or
from a preset's training data in its first epoch's order. The loss runs through the LM head at
the answer positions only and, as the Trainer's training step asks (``skip_logits``), returns
the loss alone; on the first preset two peers of that path: ``with logits``, the same step that
also returns the (batch, k, vocab) logits (before training skipped them), and ``full-logits``,
the LM head at every position (what transformers' causal LMs do, Zoology's loss). H3's state size is a preset's
longest document (as the sweep files set it), its default 1 024 on single settings and ar_32.
Prints median ms per step (forward + backward + AdamW) and each one's ratio to our Transformer on
ar_32; with ``--sweep``, the CPU hours of a sweep file's runs from the steps of their preset.

    python benchmarks/bench_mqar.py [--hidden 64 128] [--settings 64x4 128x8 256x16] [--presets mqar_cpu]
                                    [--only transformer mamba] [--sweep hf_mecheval/training/sweeps/cpu/mqar.yaml]
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch

from hf_mecheval.models import architecture_names, build_model
from hf_mecheval.tasks import build_task
from hf_mecheval.tasks.mqar import MQARConfig, MQARTask
from hf_mecheval.training.data import PaddedTaskDataset, epoch_order

BATCH = 32


def model(arch: str, vocab: int, d: int, longest: int | None = None):
    extra = {"max_position_embeddings": 1024} if arch == "transformer" else {}
    if arch == "h3" and longest:
        extra["d_state"] = longest
    return build_model(arch, vocab_size=vocab, hidden_size=d, num_hidden_layers=2, kernels="auto", **extra)


def task_batches(task, n: int, seed: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """n training batches of ``task`` in its first epoch's order (as the Trainer serves them)."""
    data = PaddedTaskDataset(task.generate(BATCH * n * 4, "train", seed=0))
    order = epoch_order(len(data), seed, 0)
    out = []
    for i in range(n):
        batch = data.__getitems__(order[i * BATCH:(i + 1) * BATCH])
        out.append((batch["input_ids"], batch["labels"]))
    return out


def setting_task(seq_len: int, pairs: int) -> MQARTask:
    setting = ((seq_len, pairs, 1),)
    return MQARTask(MQARConfig(train_mixture=setting, eval_mixture=setting))


# how a step gets its loss: as the Trainer trains (the loss alone), with the answers' logits
# returned too, or with the LM head at every position (output_hidden_states turns the
# answer-position path off)
STEP_FORMS = {"loss": {"skip_logits": True}, "with logits": {}, "full-logits": {"output_hidden_states": True}}


def time_steps(m, optimizer, data, form: str = "loss") -> list[float]:
    times = []
    for ids, labels in data:
        t0 = time.perf_counter()
        loss = m(input_ids=ids, labels=labels, **STEP_FORMS[form]).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        times.append((time.perf_counter() - t0) * 1000)
    return times


def sweep_hours(path: str, step_ms: dict[tuple[str, int, str], float]) -> None:
    """CPU hours of a sweep file's runs: steps (train_size / batch x epochs) x the step of the
    run's architecture, width and preset."""
    from hf_mecheval.training.sweep import Sweep

    sweep = Sweep.load(path)
    total, missing = 0.0, set()
    for run in sweep.runs:
        spec = run.spec
        key = (spec.model.architecture, spec.model.hidden_size, spec.data.task)
        if key not in step_ms:
            missing.add(key)
            continue
        steps = -(-spec.train_size // spec.training.per_device_train_batch_size) * spec.training.num_train_epochs
        total += steps * step_ms[key] / 1000 / 3600
    print(f"\n{sweep.name}: {len(sweep.runs)} runs, about {total:.1f} CPU hours of training at the timed steps "
          f"(one thread each; the intervention grids add minutes per run)"
          + (f"; not timed: {sorted(missing)}" if missing else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, nargs="+", default=[64, 128])
    parser.add_argument("--settings", nargs="*", default=["64x4", "128x8", "256x16"],
                        help="single settings SEQLENxPAIRS to time")
    parser.add_argument("--presets", nargs="+", default=["mqar_cpu"], help="MQAR presets whose training data is timed")
    parser.add_argument("--steps", type=int, default=4, help="timed steps per model per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds; models take turns within a round")
    parser.add_argument("--only", nargs="+", help="subset of architectures")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sweep", help="a sweep file whose CPU hours to estimate from its presets' steps")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    archs = [a for a in architecture_names() if not args.only or a in args.only]
    inputs = {"ar_32 (peer)": (task_batches(build_task("ar_32"), args.steps), None)}
    for s in args.settings:
        seq_len, pairs = map(int, s.split("x"))
        inputs[f"mqar {seq_len}x{pairs}"] = (task_batches(setting_task(seq_len, pairs), args.steps), None)
    for preset in args.presets:
        task = build_task(preset)
        inputs[preset] = (task_batches(task, args.steps), task.max_document_length())
    mixture = args.presets[0]
    results: dict[tuple[str, int, str], float] = {}
    for d in args.hidden:
        cells = []
        for arch in archs:
            for name, (data, longest) in inputs.items():
                vocab = 8196 if name.startswith("ar_32") else 8192
                torch.manual_seed(0)
                m = model(arch, vocab, d, longest).train()
                opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
                time_steps(m, opt, data[:1])                                  # warm-up
                cells.append((arch, name, m, opt, data, "loss"))
            for form in ("with logits", "full-logits"):
                torch.manual_seed(0)
                m = model(arch, 8192, d, inputs[mixture][1]).train()
                opt = torch.optim.AdamW(m.parameters(), lr=1e-3, weight_decay=0.0, fused=True)
                time_steps(m, opt, inputs[mixture][0][:1], form)              # warm-up
                cells.append((arch, f"{mixture}, {form}", m, opt, inputs[mixture][0], form))
        samples = {(a, n): [] for a, n, *_ in cells}
        for _ in range(args.rounds):                                          # interleaved: shared noise
            for arch, name, m, opt, data, form in cells:
                samples[(arch, name)] += time_steps(m, opt, data, form)
        print(f"\nhidden {d}: median ms per training step (batch {BATCH}, {args.threads} thread(s)); "
              f"ratio to transformer on ar_32")
        base = statistics.median(samples[("transformer", "ar_32 (peer)")]) if ("transformer", "ar_32 (peer)") in samples else None
        for (arch, name), s in samples.items():
            results[(arch, d, name)] = statistics.median(s)
            ratio = f"{results[(arch, d, name)] / base:6.1f}x" if base else ""
            print(f"  {arch:<15} {name:<30} {results[(arch, d, name)]:8.1f} {ratio}  (min {min(s):.1f}, max {max(s):.1f})")
        for arch in archs:
            keep = results[(arch, d, mixture)]
            logits, full = (results[(arch, d, f"{mixture}, {form}")] for form in ("with logits", "full-logits"))
            print(f"  {arch:<15} on {mixture}: the loss alone / with logits = {keep / logits:.2f}x, "
                  f"full-logits / the loss alone = {full / keep:.1f}x")
    if args.sweep:
        sweep_hours(args.sweep, {(a, d, n): v for (a, d, n), v in results.items() if n in args.presets})


if __name__ == "__main__":
    main()
