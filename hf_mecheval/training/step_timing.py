"""How long a run's training step takes on this machine, measured: what ``mecheval queue --dry-run
--time-steps`` prices a run by where no finished run is like it.

A few training steps of the run's own model (freshly initialised, its seed) on batches of its own
task, served as the Trainer serves them (``PaddedTaskDataset``: a batch padded to its longest
document; the first epoch's order), each one forward (the loss alone, as the Trainer asks),
backward, gradient clipping and an AdamW step. It leaves out what the Trainer adds around the steps (periodic evaluation, logging,
checkpoints): the dry run measures that share on the finished runs it can time, and scales by it.
"""
from __future__ import annotations

import contextlib
import statistics
import time

import torch

from .data import PaddedTaskDataset, epoch_order
from .trainer import build_run_model, data_seed, takes_skip_logits


def run_steps(spec) -> int:
    """The optimizer steps ``spec``'s training takes: ``max_steps``, or the epochs' steps."""
    training = spec.training
    if training.max_steps > 0:
        return int(training.max_steps)
    per_step = training.per_device_train_batch_size * training.gradient_accumulation_steps
    return int(-(-spec.train_size // per_step) * training.num_train_epochs)


def training_batches(spec, count: int) -> list[dict]:
    """``count`` batches of ``spec``'s task in its first epoch's order, from a training split of
    ``count`` batches (the same task and dataset seed: the same mixture of documents)."""
    batch = spec.training.per_device_train_batch_size
    data = PaddedTaskDataset(spec.task.generate(batch * count, "train", spec.data.dataset_seed))
    order = epoch_order(len(data), data_seed(spec.training), 0)
    return [data.__getitems__(order[i * batch:(i + 1) * batch]) for i in range(count)]


def median_step_seconds(spec, steps: int = 5, warmup: int = 2) -> float:
    """The median CPU seconds (this process's, as a run's ``train_cpu_seconds`` counts them: on a
    busy machine wall time would count the other processes' turns too) of ``steps`` training steps
    of ``spec``'s model, after ``warmup`` untimed ones, at the calling process's thread count."""
    batches = training_batches(spec, warmup + steps)
    longest = max(int(b["input_ids"].shape[1]) for b in batches)
    model = build_run_model(spec, spec.training.seed, longest).train()
    training = spec.training
    fused = str(getattr(training.optim, "value", training.optim)) == "adamw_torch_fused"     # the Trainer's default
    optimizer = torch.optim.AdamW(model.parameters(), lr=training.learning_rate, weight_decay=training.weight_decay,
                                  betas=(training.adam_beta1, training.adam_beta2), eps=training.adam_epsilon,
                                  fused=fused or None)
    loss_only = {"skip_logits": True} if takes_skip_logits(model) else {}      # as the Trainer's steps ask
    seconds = []
    for i, batch in enumerate(batches):
        start = time.process_time()
        model(**batch, **loss_only).loss.backward()
        if training.max_grad_norm and training.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), training.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if i >= warmup:
            seconds.append(time.process_time() - start)
    return statistics.median(seconds)


@contextlib.contextmanager
def torch_threads(threads: int):
    """torch's intra-op threads set to ``threads`` inside, as they were after."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def step_wall_seconds(spec, threads: int) -> float:
    """What a training step of ``spec`` takes on the clock when it trains at ``threads`` threads:
    its CPU seconds timed at that many (``median_step_seconds``) shared out over them. Each
    thread spends the step working or waiting for the others (OpenMP's waits spin), so the two
    agree: at width 256 on two cores, 2 threads, Hyena / H3 / DeltaNet 75 / 94 / 85 ms on the
    clock against 74 / 91 / 85 ms from CPU seconds (and 127 / 142 / 146 ms at 1 thread)."""
    with torch_threads(threads):
        return median_step_seconds(spec) / threads
