"""The intervention grid's memory: measured on one document, so that every batch fits.

What one batch holds grows with its documents: the clean activations cached where they are
patched in, the corrupted residual streams, and the patched runs of one site at a time (one row
per (position, document)), whose size depends on the model's internals (a state trajectory
built for a hook, such as Mamba's, (L, C, N) per row, is many times its residual stream). So it
is measured, not estimated: the most expensive document (the longest) runs through the engine
once alone and once as a batch of two copies, while every tensor allocated is counted, and the
peak of what was alive at once is each one's cost. The difference is what one more document
adds; the rest is fixed per batch (the lag kernels of H3's state read in closed form, (length,
channels, d_state) twice, about 155 MB at width 256, which counted once per document had cut its
batches from 64 documents to 42). ``fitting_batch_size`` picks the largest batch, up to the one
asked for, whose fixed part plus that many documents fits in ``SAFE_FRACTION`` of the memory
available now, and refuses with the estimate when one document does not fit.

Not counted: memory that kernels allocate for themselves below torch's dispatcher (BLAS or
cuDNN workspaces) and the allocator's own slack; the margin left by ``SAFE_FRACTION`` covers them.
"""
from __future__ import annotations

import sys
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..resources import check_memory, format_bytes, memory_available

# the share of the memory available now that a batch may use: the rest stays for the allocator's
# slack, uncounted kernel workspaces, and whatever else runs on the machine meanwhile
SAFE_FRACTION = 0.5


def _tensors(value):
    """The tensors in an op's arguments or results (nested tuples, lists and dicts)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from _tensors(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors(item)


def _storage(t: torch.Tensor):
    try:
        return t.untyped_storage()
    except (RuntimeError, NotImplementedError):      # sparse and other tensors without one storage
        return None


class TensorMemory(TorchDispatchMode):
    """Counts the bytes of the tensor storages that torch operations allocate inside the block:
    ``current`` (still alive) and ``peak``. A storage counts once however many views share it and
    stops counting when it is freed; tensors made before the block (weights, inputs) never count.

        with TensorMemory() as memory:
            engine.run(...)
        memory.peak
    """

    def __init__(self):
        super().__init__()
        self.current = 0
        self.peak = 0
        self._live: dict[int, int] = {}           # id(storage) -> bytes, while the storage lives

    def _freed(self, key: int) -> None:
        self.current -= self._live.pop(key)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        # a result sharing an argument's storage (a view, an in-place op) allocated nothing
        given = {id(s) for s in map(_storage, _tensors((args, kwargs))) if s is not None}
        for storage in map(_storage, _tensors(out)):
            if storage is None or id(storage) in given or id(storage) in self._live:
                continue
            key = id(storage)
            self._live[key] = storage.nbytes()
            self.current += storage.nbytes()
            # torch keeps one Python object per live storage: it is finalised when the memory is freed
            weakref.finalize(storage, self._freed, key)
        self.peak = max(self.peak, self.current)
        return out


def memory_budget(device: torch.device) -> tuple[int, str] | None:
    """(bytes the grid may use on ``device``, how they were found), or None where the memory
    available cannot be read."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        # blocks that torch's caching allocator holds but no tensor uses are free to torch too
        free += torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        where = f"free on {device}"
    else:                  # the CPU, and accelerators that share its memory
        free = memory_available()
        if free is None:
            return None
        where = "of memory available"
    return int(SAFE_FRACTION * free), f"{SAFE_FRACTION:.0%} of the {format_bytes(free)} {where} now"


def fitting_batch_size(run_copies, requested: int, device: torch.device, what: str) -> int:
    """The largest batch size up to ``requested`` whose measured memory fits the budget.

    run_copies(n): the grid's work on n copies of its most expensive document, as one batch
    (measured here for n = 1 and 2).
    what: the work, for the messages (e.g. "the intervention grid (16 sites, 37 tokens a document)").
    Says on stderr when it lowers the batch size; raises MechEvalError (check_memory's message)
    when one document does not fit."""
    budget = memory_budget(device)
    if budget is None:
        return requested                      # nothing to measure against
    limit, described = budget
    def measured(copies: int) -> int:
        with TensorMemory() as memory:
            run_copies(copies)
        return max(memory.peak, 1)

    one = measured(1)
    # a document that does not fit alone is refused before two copies run
    check_memory(what, {"its activations, cached and patched, measured": one},
                 limit=limit, has=f"free for it ({described})",
                 advice="evaluate fewer sites (a recurrent state trajectory, where there is one, is by far the "
                        "largest), or free memory")
    two = measured(2)
    # what a second copy adds is what each document costs; where it adds nothing measurable, every
    # document is taken to cost all of the first one's
    per_document = two - one if two > one else one
    fixed = one - per_document
    fits = max(1, min(requested, (limit - fixed) // per_document))
    if fits < requested:
        print(f"interventions: batches of {fits} documents instead of {requested}: each document takes about "
              f"{format_bytes(per_document)} beyond {format_bytes(fixed)} a batch (measured), and "
              f"{format_bytes(limit)} is free for the grid ({described})", file=sys.stderr)
    return fits
