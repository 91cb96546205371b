"""Fused CPU kernels in plain C++, compiled on first use with the system's C++ compiler into one
library and called through ctypes: no torch headers, no build step at install, a compile of a few
seconds.

* ``selective_scan_cpu`` (``selective_scan_cpu.cpp``): Mamba's selective scan, what
  ``ops_selective_scan.selective_scan`` computes, ~4-6x faster forward and backward at Mamba's
  sizes (``benchmarks/bench_scan.py``); with mamba-ssm's options (``selective_scan_fn``'s
  ``D``, ``z``, ``delta_bias``, ``delta_softplus``) the elementwise steps around it too:
  out = (scan(x, softplus(dt_raw + bias), A, B, C) + D x) * silu(z);
* ``short_conv_cpu`` (``short_conv_cpu.cpp``): the depthwise causal short convolution of
  ``ops_short_conv.short_conv`` (Mamba, Mamba-2, Hyena, BaseConv, DeltaNet, Gated DeltaNet), in
  one pass forward and one backward instead of 2K - 1 whole-tensor passes each, with its bias
  and (``activation="silu"``, Mamba's and Mamba-2's) the SiLU after it in the same pass; with a
  sequence-long kernel as its taps, also the direct long convolution of ``ops_long_conv.causal_conv``
  (H3, Hyena, BaseConv's long layers, up to 64 tokens);
* ``ssd_cpu`` (``ssd_cpu.cpp``): Mamba-2's SSD (a scalar decay per head) as a scan over time,
  what ``ops_ssd.ssd_chunked`` computes (without D), forward and backward, instead of the chunks'
  attention form and its whole-tensor passes over (batch, heads, length, length) tensors;
* ``bilinear_taps_cpu`` (``ssm_taps_cpu.cpp``): the taps of H3's diagonal SSM from its
  parameters, its bilinear discretisation (``mixer_h3.DiagonalSSM.discretize``) and the taps of
  ``ops_ssm_taps.ConjugatePairTaps``, forward and backward (Horner's rule, then the chain rule
  through the discretisation) in one pass per head over its modes, instead of L whole-tensor
  complex products and sums each way and a dozen elementwise passes; and ``shift_taps_cpu``,
  H3's shift-SSM kernel (the cross-correlation of its B and C) lag by lag, instead of FFTs of
  its whole state;
* ``h3_kept_heads_cpu`` (``h3_heads_cpu.cpp``): H3's heads (the outer products k v^T, the
  diagonal SSM's convolution and the q contraction) at the kept positions of the answer-only
  training path, or at every position of rows up to 128 tokens, forward and backward in one pass
  over each row, instead of the (batch, length, channels) outer products and the (batch, kept,
  length, channels) window PyTorch gathers, multiplies and scatters back.

Where no compiler is found the mixers keep their PyTorch paths; a checkpoint's copy of the
modeling code never imports this module (``kernels.cpu_kernel``).

The library is cached per source, flags and CPU (``-march=native``) under
``$HF_MECHEVAL_KERNEL_CACHE`` or ``~/.cache/hf-mecheval/kernels``, written atomically, so that
concurrent sweep workers can build it at once.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch
from transformers.utils import logging

from .mixers import fold_copies
from .ops_selective_scan import _row_decays, _state_major
from .ops_ssm_taps import ChannelwiseTaps

logger = logging.get_logger(__name__)

SOURCES = tuple(Path(__file__).with_name(name) for name in ("selective_scan_cpu.cpp", "short_conv_cpu.cpp",
                                                            "cpu_threads.h", "cpu_vectors.h", "ssd_cpu.cpp",
                                                            "ssm_taps_cpu.cpp", "h3_heads_cpu.cpp"))
FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fno-math-errno", "-shared", "-fPIC", "-std=c++17", "-pthread"]


def _cache_dir() -> Path:
    return Path(os.environ.get("HF_MECHEVAL_KERNEL_CACHE") or Path.home() / ".cache" / "hf-mecheval" / "kernels")


def _cpu_signature() -> str:
    """What ``-march=native`` compiles for: the CPU's model and flags (a library built on another
    machine sharing the cache may use instructions this one lacks)."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({line for line in info if line.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor() or platform.machine()


@functools.cache
def cpu_identity() -> dict:
    """The CPU this process runs on, as each training segment records it (``train_segment_times``):
    its model name and a short hash of its model and flags lines. On a CPU of another signature the
    matrix products and the compiled kernels can take other instruction paths and round differently,
    so a run trained again there can end a little apart; on one CPU at one thread count it is
    identical."""
    text = _cpu_signature()
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")),
                 text or "unknown")
    return {"cpu_model": model, "cpu_signature": hashlib.sha256(text.encode()).hexdigest()[:12]}


@functools.cache
def kernel_library() -> ctypes.CDLL | None:
    """The compiled kernels, or None (logged once) where they cannot be built."""
    compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if not all(p.exists() for p in SOURCES) or compiler is None:
        logger.info("hf-mecheval: no C++ compiler or kernel source; the mixers run on their PyTorch paths")
        return None
    sources = b"".join(p.read_bytes() for p in SOURCES)
    key = hashlib.sha256(sources + " ".join([compiler, *FLAGS]).encode() + _cpu_signature().encode()).hexdigest()[:16]
    library = _cache_dir() / f"cpu_kernels-{key}.so"
    try:
        if not library.exists():
            library.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(dir=library.parent) as tmp:
                built = Path(tmp) / library.name
                units = [str(p) for p in SOURCES if p.suffix == ".cpp"]
                result = subprocess.run([compiler, *FLAGS, *units, "-o", str(built)], capture_output=True, text=True)
                if result.returncode != 0:
                    logger.warning(f"hf-mecheval: compiling the CPU kernels failed; the mixers run on their "
                                   f"PyTorch paths:\n{result.stderr[-2000:]}")
                    return None
                os.replace(built, library)     # atomic: a concurrent build replaces it with the same bytes
        lib = ctypes.CDLL(str(library))
    except OSError as exc:                     # a cache folder that cannot be written, a library that cannot load
        logger.warning(f"hf-mecheval: the compiled CPU kernels are unavailable ({exc}); the mixers run on their "
                       f"PyTorch paths")
        return None
    for kernel in ("scan_forward", "scan_backward", "short_conv_forward", "short_conv_backward", "ssd_forward",
                   "ssd_backward", "bilinear_taps_forward", "bilinear_taps_backward", "shift_taps_forward",
                   "shift_taps_backward", "h3_kept_forward", "h3_kept_backward"):
        for suffix in ("f32", "f64"):
            getattr(lib, f"{kernel}_{suffix}").restype = None
    return lib


def available() -> bool:
    return kernel_library() is not None


# Floating-point operations the kernels execute per state element (batch row, position, state,
# channel), an exp counted as one: the forward's decay dt*A and its exp, h = dA*h + B*(dt*x) (3)
# and y += C*h (2); the backward's recomputation of the forward's decays and states (5) and its
# pass backwards in time: G = dA*G + C*gy (3), the terms of gC, gB and d(dt*x) and their sums (6),
# q = G*H*dA (2), and q's terms of gdt and gA with their sums (4).
SCAN_FLOPS_PER_STATE = {"forward": 7, "backward": 20}


def scan_flops(rows: int, length: int, state: int, channels: int, backward: bool = True) -> int:
    """What one call of the compiled scan computes, forward and (by default) backward: the figure a
    FLOP count must add by hand, since the kernel runs outside torch's dispatcher."""
    per_state = SCAN_FLOPS_PER_STATE["forward"] + (SCAN_FLOPS_PER_STATE["backward"] if backward else 0)
    return per_state * rows * length * state * channels


_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}

# Tensors a kernel takes as int64 indices whatever its float dtype (bounds checked by the caller).
INDEX_TENSORS = ("keep",)


def _ptr(t: torch.Tensor) -> ctypes.c_void_p:
    return ctypes.c_void_p(t.data_ptr())


def scan_forward(x, dt, A_ne, Bm, C, D_rows=None, z=None, bias_rows=None, softplus=False) -> torch.Tensor:
    """out (B, L, E). x, dt (dt_raw), z: (B, L, E); A_ne: (N, E) or (B, N, E); Bm, C: (B, L, N);
    D_rows, bias_rows: (B, E); all contiguous, of one dtype (float32 or float64), on the CPU. None
    turns that option off (``selective_scan_cpu.cpp``)."""
    out = x.new_empty(x.shape)
    _run_rows("scan_forward", dict(x=x, dt=dt, A=A_ne, B=Bm, C=C, D=D_rows, z=z, bias=bias_rows, out=out), softplus)
    return out


def scan_backward(x, dt, A_ne, Bm, C, D_rows, z, bias_rows, softplus, gout):
    """(gx, gdt (of dt_raw), gA per row (B, N, E), gB, gC, gD per row (B, E) or None, gz or None,
    gbias per row (B, E) or None): the gradients of sum(gout * out), same layouts."""
    gx, gdt = x.new_empty(x.shape), x.new_empty(x.shape)
    gA = x.new_empty(x.shape[0], *A_ne.shape[-2:])
    gB, gC = Bm.new_empty(Bm.shape), C.new_empty(C.shape)
    gD = None if D_rows is None else D_rows.new_empty(D_rows.shape)
    gz = None if z is None else z.new_empty(z.shape)
    gbias = None if bias_rows is None else bias_rows.new_empty(bias_rows.shape)
    _run_rows("scan_backward", dict(x=x, dt=dt, A=A_ne, B=Bm, C=C, D=D_rows, z=z, bias=bias_rows, gout=gout, gx=gx,
                                    gdt=gdt, gA=gA, gB=gB, gC=gC, gD=gD, gz=gz, gbias=gbias), softplus)
    return gx, gdt, gA, gB, gC, gD, gz, gbias


# Operations a thread of a kernel call should have at least: a thread costs tens of microseconds to
# start, which a small call (width 16, a few hundred thousand operations) would not repay on a
# machine with many cores. Results do not depend on the count (each row is one thread's).
WORK_PER_THREAD = 1 << 20


def _threads_for(work: int) -> int:
    """Threads for a kernel call of ``work`` operations: torch's, at most one per WORK_PER_THREAD."""
    return max(1, min(torch.get_num_threads(), work // WORK_PER_THREAD))


def _call(kernel: str, tensors: dict[str, torch.Tensor | None], shapes: dict[str, tuple], sizes: tuple) -> None:
    """Call ``kernel`` (of the first tensor's dtype) with a pointer to each of ``tensors`` (in the
    kernel's argument order; null for None), then ``sizes``. Each tensor must have the shape
    ``shapes`` gives its name, the first tensor's dtype and a contiguous layout, or the call is
    refused before the kernel runs: the kernels take bare pointers and row-major sizes, and would
    read out of bounds or in the wrong order. ctypes releases the GIL during the call."""
    x = next(iter(tensors.values()))
    for name, t in tensors.items():
        if t is None:
            continue
        shape, dtype = tuple(shapes[name]), torch.int64 if name in INDEX_TENSORS else x.dtype
        if tuple(t.shape) != shape or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"{kernel}: {name} must be a contiguous {dtype} tensor of shape {shape}, "
                             f"got {t.dtype} {tuple(t.shape)}{'' if t.is_contiguous() else ' (not contiguous)'}")
    fn = getattr(kernel_library(), f"{kernel}_{_SUFFIX[x.dtype]}")
    pointers = (ctypes.c_void_p(None) if t is None else _ptr(t) for t in tensors.values())
    fn(*pointers, *(ctypes.c_int64(v) for v in sizes))


def _run_rows(kernel: str, tensors: dict[str, torch.Tensor | None], softplus: bool) -> None:
    """Call the scan ``kernel`` with ``tensors`` (``_call``) and (rows, L, N, E, A per row,
    softplus, threads): x (B, L, E) and A (N, E) or (B, N, E) among them, every other tensor with
    one row per batch row. The kernel splits the rows between as many threads as torch uses
    (``_threads_for``)."""
    x, A_ne = tensors["x"], tensors["A"]
    rows, L, E = x.shape
    N = A_ne.shape[-2]
    per_position, per_row, per_state = (rows, L, E), (rows, E), (rows, L, N)
    shapes = dict(x=per_position, dt=per_position, z=per_position, out=per_position, gout=per_position,
                  gx=per_position, gdt=per_position, gz=per_position, A=A_ne.shape if A_ne.dim() == 2 else (rows, N, E),
                  gA=(rows, N, E), B=per_state, C=per_state, gB=per_state, gC=per_state, D=per_row, bias=per_row,
                  gD=per_row, gbias=per_row)
    threads = _threads_for(SCAN_FLOPS_PER_STATE["forward"] * rows * L * N * E)
    _call(kernel, tensors, shapes, (rows, L, N, E, int(A_ne.dim() == 3), int(softplus), threads))


class CpuSelectiveScan(torch.autograd.Function):
    """The compiled C++ kernel: out = y * silu(z), y = selective_scan_reference(x, dt, A, B, C)[0]
    + D * x, with dt = softplus(dt_raw + delta_bias) (``delta_softplus``) or dt_raw + delta_bias,
    as mamba-ssm's ``selective_scan_fn`` takes them; D, z, delta_bias None = left out. Forward keeps
    nothing but its inputs; backward recomputes each row's states in cache. A is (E, N), or (B, E, N)
    one per row; D, delta_bias (E,), or (B, E) one per row (the vmap rule folds stacked copies into
    rows, as ``SelectiveScan``'s). Float32 or float64, on the CPU; ``apply`` takes all nine arguments
    (use ``selective_scan_cpu``)."""

    @staticmethod
    def forward(x, dt, A, B, C, D, z, delta_bias, delta_softplus):
        # x, dt, z: (B, L, E); A: (E, N) or (B, E, N); B, C: (B, L, N); D, delta_bias: (E,) or (B, E)
        rows = x.shape[0]
        return scan_forward(x.contiguous(), dt.contiguous(), _state_major(A, 3), B.contiguous(), C.contiguous(),
                            _per_row(D, rows), _contiguous(z), _per_row(delta_bias, rows), delta_softplus)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dt, A, B, C, D, z, delta_bias, delta_softplus = inputs
        ctx.save_for_backward(x, dt, A, B, C, D, z, delta_bias)
        ctx.delta_softplus = delta_softplus

    @staticmethod
    def backward(ctx, gout):
        x, dt, A, B, C, D, z, delta_bias = ctx.saved_tensors
        rows = x.shape[0]
        gx, gdt, gA, gB, gC, gD, gz, gbias = scan_backward(
            x.contiguous(), dt.contiguous(), _state_major(A, 3), B.contiguous(), C.contiguous(), _per_row(D, rows),
            _contiguous(z), _per_row(delta_bias, rows), ctx.delta_softplus, gout.contiguous())
        gA = gA.transpose(1, 2) if A.dim() == 3 else gA.sum(0).T            # (B, E, N) or (E, N)
        gD = None if D is None else gD if D.dim() == 2 else gD.sum(0)
        gbias = None if delta_bias is None else gbias if delta_bias.dim() == 2 else gbias.sum(0)
        return gx, gdt, gA, gB, gC, gD, gz, gbias, None

    @staticmethod
    def vmap(info, in_dims, x, dt, A, B, C, D, z, delta_bias, delta_softplus):
        K = info.batch_size
        dims = in_dims
        x, dt, B, C = fold_copies(K, (x, dt, B, C), (dims[0], dims[1], dims[3], dims[4]))
        b = x.shape[0] // K                                                     # rows per copy
        if z is not None:
            (z,) = fold_copies(K, (z,), (dims[6],))
        D, delta_bias = (None if p is None else _row_decays(p, d, K, b) for p, d in ((D, dims[5]), (delta_bias, dims[7])))
        y = CpuSelectiveScan.apply(x, dt, _row_decays(A, dims[2], K, b), B, C, D, z, delta_bias, delta_softplus)
        return y.view(K, b, *y.shape[1:]), 0


def _per_row(p: torch.Tensor | None, rows: int) -> torch.Tensor | None:
    """A per-channel parameter (E,) -> (rows, E), contiguous: the kernel reads one per row."""
    return None if p is None else p.expand(rows, p.shape[-1]).contiguous()


def selective_scan_cpu(x, dt, A, B, C, D=None, z=None, delta_bias=None, delta_softplus=False) -> torch.Tensor:
    """out (B, L, E), as ``selective_scan`` (followed by the options: ``CpuSelectiveScan``), by the
    compiled kernel (where ``available()``). Inputs in a lower precision are scanned in float32;
    out comes back in x's dtype."""
    return CpuSelectiveScan.apply(*_one_dtype([x, dt, A, B, C, D, z, delta_bias]), delta_softplus).to(x.dtype)


def _one_dtype(inputs: list[torch.Tensor | None]) -> list[torch.Tensor | None]:
    """The inputs in the one dtype a kernel takes: as they are where they share float32 or
    float64, else all in float64 where all are, else in float32 (lower precisions widened)."""
    given = [t for t in inputs if t is not None]
    if len({t.dtype for t in given}) == 1 and given[0].dtype.itemsize >= 4:
        return inputs
    compute = torch.float64 if all(t.dtype == torch.float64 for t in given) else torch.float32
    return [None if t is None else t.to(compute) for t in inputs]


# --------------------------------------------------------------------------- the short convolution
class CpuShortConv(torch.autograd.Function):
    """y = ops_short_conv.short_conv_reference(x, weight, bias), followed by SiLU where ``silu``
    (as causal-conv1d's activation="silu"), by the compiled kernel. x (B, L, C); weight (C, 1, K)
    and bias (C,) or None, or (B, C, 1, K) and (B, C) one per row (the vmap rule folds stacked
    copies into rows). Float32 or float64, on the CPU; ``apply`` takes all four arguments (use
    ``short_conv_cpu``)."""

    @staticmethod
    def forward(x, weight, bias, silu):
        x = x.contiguous()
        y = x.new_empty(x.shape)
        _run_conv("short_conv_forward", dict(x=x, weight=_taps_major(weight), bias=_contiguous(bias), y=y),
                  weight.dim() == 4, silu)
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, weight, bias, silu = inputs
        ctx.save_for_backward(x, weight, bias)
        ctx.silu = silu

    @staticmethod
    def backward(ctx, g):
        x, weight, bias = ctx.saved_tensors
        x = x.contiguous()
        gx = x.new_empty(x.shape)
        gw = x.new_empty(x.shape[0], weight.shape[-1], x.shape[-1])                # (B, K, C): one share per row
        gbias = None if bias is None else x.new_empty(x.shape[0], x.shape[-1])    # (B, C)
        _run_conv("short_conv_backward", dict(x=x, weight=_taps_major(weight), bias=_contiguous(bias), g=g.contiguous(),
                                              gx=gx, gw=gw, gbias=gbias), weight.dim() == 4, ctx.silu)
        per_row = weight.dim() == 4
        gw = gw.transpose(1, 2)[:, :, None, :] if per_row else gw.sum(0).T[:, None, :]
        if gbias is not None and not per_row:
            gbias = gbias.sum(0)
        return gx, gw, gbias, None

    @staticmethod
    def vmap(info, in_dims, x, weight, bias, silu):
        K = info.batch_size
        (x,) = fold_copies(K, (x,), (in_dims[0],))
        b = x.shape[0] // K                                                     # rows per copy
        w = weight.movedim(in_dims[1], 0) if in_dims[1] is not None else weight.expand(K, *weight.shape)
        bias = None if bias is None else _row_decays(bias, in_dims[2], K, b)    # (K*b, C)
        y = CpuShortConv.apply(x, w.repeat_interleave(b, dim=0), bias, silu)
        return y.view(K, b, *y.shape[1:]), 0


def _contiguous(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.contiguous()


def _taps_major(weight: torch.Tensor) -> torch.Tensor:
    """weight (C, 1, K) -> (K, C); per row (B, C, 1, K) -> (B, K, C): the kernel's layout, taps
    outermost, channels contiguous."""
    return weight[..., 0, :].transpose(-1, -2).contiguous()


def _run_conv(kernel: str, tensors: dict[str, torch.Tensor | None], per_row: bool, silu: bool) -> None:
    """Call the convolution ``kernel`` with ``tensors`` (``_call``) and (rows, L, C, K, weight per
    row, silu, threads): x (B, L, C) and the weight (K, C) or (B, K, C) among them."""
    x, w = tensors["x"], tensors["weight"]
    rows, L, C = x.shape
    K = w.shape[-2]
    shapes = dict(x=(rows, L, C), y=(rows, L, C), g=(rows, L, C), gx=(rows, L, C), gw=(rows, K, C), gbias=(rows, C),
                  weight=(rows, K, C) if per_row else (K, C), bias=(rows, C) if per_row else (C,))
    _call(kernel, tensors, shapes, (rows, L, C, K, int(per_row), int(silu), _threads_for(2 * rows * L * C * K)))


def short_conv_cpu(x, weight, bias=None, activation: str | None = None) -> torch.Tensor:
    """``ops_short_conv.short_conv(x, weight, bias, activation)`` by the compiled kernel (where
    ``available()``): the bias and ``activation="silu"`` in the kernel. Inputs in a lower precision
    are convolved in float32; y comes back in the dtype the PyTorch form gives (x's, the weight's
    and the bias's, promoted)."""
    if activation not in (None, "silu"):
        raise ValueError(f"activation must be None or 'silu', got {activation!r}")
    dtype = torch.promote_types(x.dtype, weight.dtype)                    # as the PyTorch form's x * w
    if bias is not None:
        dtype = torch.promote_types(dtype, bias.dtype)
    compute = torch.promote_types(dtype, torch.float32)
    return CpuShortConv.apply(x.to(compute).contiguous(), weight.to(compute), None if bias is None else bias.to(compute),
                              activation == "silu").to(dtype)


# --------------------------------------------------------------------------- Mamba-2's SSD
# Floating-point operations the SSD scan executes per state entry (batch row, position, head, head
# channel, state): forward h = a h + B (dt x) (3) and y += C h (2); backward the states again (3)
# and the sum of gC's terms (2), then G = a G + C gy (3) and the terms of gB, d(dt x) and d a (6).
SSD_FLOPS_PER_STATE = {"forward": 5, "backward": 14}


def ssd_flops(rows: int, length: int, heads: int, head_dim: int, state: int, backward: bool = True) -> int:
    """What one call of the compiled SSD scan computes, forward and (by default) backward: the
    figure a FLOP count must add by hand, since the kernel runs outside torch's dispatcher."""
    per_state = SSD_FLOPS_PER_STATE["forward"] + (SSD_FLOPS_PER_STATE["backward"] if backward else 0)
    return per_state * rows * length * heads * head_dim * state


class CpuSsd(torch.autograd.Function):
    """y = ops_ssd.ssd_recurrent(x, dt, A, B, C)[0] (no D, no initial state) by the compiled scan.
    x (B, L, H, P); dt (B, L, H); A (H,), or (B, H) one per row (the vmap rule folds stacked
    copies into rows); B, C (B, L, G, N). Float32 or float64, on the CPU; use ``ssd_cpu``."""

    @staticmethod
    def forward(x, dt, A, B, C):
        # outputs are allocated row-major (new_empty), never with an input's strides: a dense
        # but transposed input would give empty_like's output its order, which the kernel ignores
        x, dt, B, C = (t.contiguous() for t in (x, dt, B, C))
        y = x.new_empty(x.shape)
        _run_ssd("ssd_forward", dict(x=x, dt=dt, A=_per_row(A, x.shape[0]), B=B, C=C, y=y))
        return y

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, gy):
        x, dt, A, B, C = ctx.saved_tensors
        x, dt, B, C = (t.contiguous() for t in (x, dt, B, C))
        gx, gdt = x.new_empty(x.shape), dt.new_empty(dt.shape)
        gA = x.new_empty(x.shape[0], x.shape[2])                                # (B, H): one share per row
        gB, gC = B.new_empty(B.shape), C.new_empty(C.shape)
        _run_ssd("ssd_backward", dict(x=x, dt=dt, A=_per_row(A, x.shape[0]), B=B, C=C, gy=gy.contiguous(), gx=gx,
                                      gdt=gdt, gA=gA, gB=gB, gC=gC))
        return gx, gdt, gA if A.dim() == 2 else gA.sum(0), gB, gC

    @staticmethod
    def vmap(info, in_dims, x, dt, A, B, C):
        K = info.batch_size
        x, dt, B, C = fold_copies(K, (x, dt, B, C), (in_dims[0], in_dims[1], in_dims[3], in_dims[4]))
        b = x.shape[0] // K                                                     # rows per copy
        y = CpuSsd.apply(x, dt, _row_decays(A, in_dims[2], K, b), B, C)
        return y.view(K, b, *y.shape[1:]), 0


def _run_ssd(kernel: str, tensors: dict[str, torch.Tensor]) -> None:
    """Call the SSD ``kernel`` with ``tensors`` (``_call``) and (rows, L, H, P, G, N, threads): x
    (B, L, H, P) and B (B, L, G, N) among them; the heads a multiple of the groups."""
    x, B = tensors["x"], tensors["B"]
    rows, L, H, P = x.shape
    G, N = B.shape[-2:]
    if G < 1 or H % G:
        raise ValueError(f"{kernel}: the heads ({H}) must be a multiple of B's and C's groups ({G})")
    per_channel, per_head, per_group = (rows, L, H, P), (rows, L, H), (rows, L, G, N)
    shapes = dict(x=per_channel, y=per_channel, gy=per_channel, gx=per_channel, dt=per_head, gdt=per_head, A=(rows, H),
                  gA=(rows, H), B=per_group, C=per_group, gB=per_group, gC=per_group)
    _call(kernel, tensors, shapes, (rows, L, H, P, G, N, _threads_for(3 * rows * L * H * P * N)))


def ssd_cpu(x, dt, A, B, C) -> torch.Tensor:
    """y (B, L, H, P) = ``ops_ssd.ssd_chunked(x, dt, A, B, C, ...)[0]`` (no D, no initial state) by
    the compiled scan (where ``available()``). Inputs in a lower precision are scanned in float32;
    y comes back in x's dtype."""
    return CpuSsd.apply(*_one_dtype([x, dt, A, B, C])).to(x.dtype)


# --------------------------------------------------------------------------- H3's SSM taps
class CpuBilinearTaps(torch.autograd.Function):
    """taps (H, L) of H3's diagonal SSM from its parameters (``mixer_h3.DiagonalSSM``): its
    bilinear discretisation (``DiagonalSSM.discretize``) and the taps 2 Re sum_n C dB dA^l
    (``ConjugatePairTaps``) in one compiled pass per head, and the backward through both. log_dt
    (H,); inv_A_real, A_imag (H, N); B, C (H, N, 2) (real, imaginary). Float32 or float64, on
    the CPU; use ``bilinear_taps_cpu``. Under vmap (stacked copies) the copies fold into the heads."""

    @staticmethod
    def forward(log_dt, inv_A_real, A_imag, B, C, L):
        params = [t.contiguous() for t in (log_dt, inv_A_real, A_imag, B, C)]
        taps = log_dt.new_empty(log_dt.shape[0], L)
        _run_bilinear("bilinear_taps_forward", dict(zip(_BILINEAR, params), taps=taps), L)
        return taps

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:5])
        ctx.L = inputs[5]

    @staticmethod
    def backward(ctx, G):
        params = [t.contiguous() for t in ctx.saved_tensors]
        grads = [torch.empty_like(t) for t in params]
        _run_bilinear("bilinear_taps_backward", dict(zip(_BILINEAR, params), G=G.to(params[0].dtype).contiguous(),
                                                     **dict(zip((f"g_{n}" for n in _BILINEAR), grads))), ctx.L)
        return (*grads, None)

    @staticmethod
    def vmap(info, in_dims, log_dt, inv_A_real, A_imag, B, C, L):
        K = info.batch_size
        taps = CpuBilinearTaps.apply(*fold_copies(K, (log_dt, inv_A_real, A_imag, B, C), in_dims[:5]), L)
        return taps.view(K, -1, L), 0


_BILINEAR = ("log_dt", "inv_A_real", "A_imag", "B", "C")


def _run_bilinear(kernel: str, tensors: dict[str, torch.Tensor], L: int) -> None:
    """Call the bilinear taps ``kernel`` with ``tensors`` (``_call``) and (H, N, L, threads)."""
    H, N = tensors["inv_A_real"].shape
    per_head, per_mode, per_complex = (H,), (H, N), (H, N, 2)
    shapes = dict(log_dt=per_head, g_log_dt=per_head, inv_A_real=per_mode, g_inv_A_real=per_mode, A_imag=per_mode,
                  g_A_imag=per_mode, B=per_complex, g_B=per_complex, C=per_complex, g_C=per_complex,
                  taps=(H, L), G=(H, L))
    _call(kernel, tensors, shapes, (H, N, L, _threads_for(8 * H * N * L)))


def bilinear_taps_cpu(log_dt, inv_A_real, A_imag, B, C, L: int) -> torch.Tensor:
    """H3's diagonal-SSM taps (H, L) from its parameters by the compiled kernel (where
    ``available()``): ``ConjugatePairTaps.apply(C dB, dA, L)`` of ``DiagonalSSM.discretize``'s dA,
    dB, C, in the parameters' dtype (at least float32)."""
    if L < 1:
        raise ValueError(f"bilinear_taps_cpu: the taps L must be at least 1, got {L}")
    return CpuBilinearTaps.apply(*_one_dtype([log_dt, inv_A_real, A_imag, B, C]), L)


class CpuShiftTaps(ChannelwiseTaps):
    """K (C, T) = the first T lags of the cross-correlation of B and C (C, N), K[c, l] =
    sum_m B[c, m] C[c, m + l] (``mixer_h3.ShiftSSM.kernel``'s, there by FFTs), by the compiled
    kernel: float32 or float64, on the CPU; use ``shift_taps_cpu``."""

    @staticmethod
    def forward(B, C, T):
        B, C = B.contiguous(), C.contiguous()
        K = B.new_empty(B.shape[0], T)
        _run_shift("shift_taps_forward", dict(B=B, C=C, K=K), T)
        return K

    @staticmethod
    def backward(ctx, G):
        B, C = (t.contiguous() for t in ctx.saved_tensors)
        gB, gC = B.new_empty(B.shape), C.new_empty(C.shape)
        _run_shift("shift_taps_backward", dict(B=B, C=C, G=G.to(B.dtype).contiguous(), gB=gB, gC=gC), ctx.L)
        return gB, gC, None


def _run_shift(kernel: str, tensors: dict[str, torch.Tensor], T: int) -> None:
    """Call the shift-SSM ``kernel`` with ``tensors`` (``_call``) and (C, N, T, threads)."""
    C, N = tensors["B"].shape
    shapes = {name: (C, T) if name in ("K", "G") else (C, N) for name in tensors}
    _call(kernel, tensors, shapes, (C, N, T, _threads_for(2 * C * N * T)))


def shift_taps_cpu(B: torch.Tensor, C: torch.Tensor, T: int) -> torch.Tensor:
    """The first T lags (1 <= T <= N) of the cross-correlation of B and C (C, N), by the compiled
    kernel (where ``available()``): K[c, l] = sum_m B[c, m] C[c, m + l], (C, T) in their dtype
    (at least float32)."""
    N = B.shape[-1]
    if not 1 <= T <= N:
        raise ValueError(f"shift_taps_cpu: the lags T must be between 1 and the state size {N}, got {T}")
    dtype = torch.promote_types(torch.promote_types(B.dtype, C.dtype), torch.float32)
    return CpuShiftTaps.apply(B.to(dtype), C.to(dtype), T)


# --------------------------------------------------------------------------- H3's heads at kept positions
class CpuH3KeptHeads(torch.autograd.Function):
    """H3's heads at the kept positions (``mixer_h3.H3Reference``, the answer-only path), by the
    compiled kernel: o[b, s, j H + h] = sum_i q[b, p, h P + i] sum_{l <= p} taps[l, h]
    k[b, p - l, h P + i] v[b, p - l, h P + j], p = keep[b, s]. q, k, v (B, L, D = H P) as the
    projections give them; taps (L, H), or (B, L, H) one per row (the vmap rule folds stacked copies
    into rows); keep (B, S) int64 in [0, L); o (B, S, D). Float32 or float64, on the CPU; ``apply``
    takes the head_dim P after them (use ``h3_kept_heads_cpu``)."""

    @staticmethod
    def forward(q, k, v, taps, keep, P):
        L = k.shape[1]
        if keep.numel() and not (0 <= int(keep.min()) and int(keep.max()) < L):   # the kernel reads k, v there
            raise ValueError(f"h3_kept_heads_cpu: kept positions must lie in [0, {L}), "
                             f"got {int(keep.min())} .. {int(keep.max())}")
        q, k, v, taps, keep = (t.contiguous() for t in (q, k, v, taps, keep))
        o = q.new_empty(q.shape[0], keep.shape[1], q.shape[2])
        _run_heads("h3_kept_forward", dict(q=q, k=k, v=v, taps=taps, keep=keep, o=o), P)
        return o

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs[:5])
        ctx.P = inputs[5]

    @staticmethod
    def backward(ctx, go):
        q, k, v, taps, keep = (t.contiguous() for t in ctx.saved_tensors)
        gq, gk, gv = q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)
        gtaps = k.new_empty(k.shape[0], *taps.shape[-2:])                       # (B, L, H): one share per row
        _run_heads("h3_kept_backward", dict(q=q, k=k, v=v, taps=taps, keep=keep, go=go.contiguous(), gq=gq, gk=gk,
                                            gv=gv, gtaps=gtaps), ctx.P)
        return gq, gk, gv, gtaps if taps.dim() == 3 else gtaps.sum(0), None, None

    @staticmethod
    def vmap(info, in_dims, q, k, v, taps, keep, P):
        K = info.batch_size
        q, k, v, keep = fold_copies(K, (q, k, v, keep), (in_dims[0], in_dims[1], in_dims[2], in_dims[4]))
        b = q.shape[0] // K                                                     # rows per copy
        if in_dims[3] is not None:                                              # taps per copy -> per row
            taps = taps.movedim(in_dims[3], 0)
            taps = taps.repeat_interleave(b, dim=0) if taps.dim() == 3 else taps.reshape(-1, *taps.shape[2:])
        o = CpuH3KeptHeads.apply(q, k, v, taps, keep, P)
        return o.view(K, b, *o.shape[1:]), 0


def _run_heads(kernel: str, tensors: dict[str, torch.Tensor], P: int) -> None:
    """Call the kept-heads ``kernel`` with ``tensors`` (``_call``) and (B, L, S, P, H, taps per
    row, threads): q, k (B, L, D), keep (B, S) and the taps among them."""
    k, taps, keep = tensors["k"], tensors["taps"], tensors["keep"]
    rows, L, D = k.shape
    S, H = keep.shape[1], D // P
    if P < 1 or D % P or taps.shape[-1] != H:
        raise ValueError(f"{kernel}: head_dim {P} must divide the width {D}, and the taps have one column per "
                         f"head ({D // max(P, 1)}), got {taps.shape[-1]}")
    per_row = taps.dim() == 3
    per_position, per_slot = (rows, L, D), (rows, S, D)
    shapes = dict(q=per_position, k=per_position, v=per_position, gq=per_position, gk=per_position,
                  gv=per_position, o=per_slot, go=per_slot, taps=(rows, L, H) if per_row else (L, H),
                  gtaps=(rows, L, H), keep=(rows, S))
    _call(kernel, tensors, shapes, (rows, L, S, P, H, int(per_row), _threads_for(3 * rows * S * L * P * D)))


def h3_kept_heads_cpu(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, taps: torch.Tensor, keep: torch.Tensor,
                      head_dim: int) -> torch.Tensor:
    """H3's heads at the kept positions by the compiled kernel (where ``available()``; the math
    is ``CpuH3KeptHeads``'s): q, k, v (B, L, D), model channel h P + i (P = ``head_dim``); taps (L,
    H) with the skip at lag 0; keep (B, S) positions -> o (B, S, D), output channel j H + h. Inputs
    in a lower precision are computed in float32; o comes back in q's dtype. A position outside
    [0, L) is refused."""
    dtype = q.dtype
    q, k, v, taps = _one_dtype([q, k, v, taps])
    return CpuH3KeptHeads.apply(q, k, v, taps, keep.to(torch.int64), head_dim).to(dtype)
