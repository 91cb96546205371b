"""Optional fused kernels: CUDA ones from optional packages, imported lazily (never at package
import: importing flash-linear-attention replaces transformers' built-in ``mamba`` model types),
and the C++ CPU ones of ``cpu_kernels.py``, compiled on first use.

``kernels="auto"`` uses a CUDA kernel where CUDA and its package are present and a CPU kernel on
the CPU where one compiles; ``"torch"`` never uses either; ``"cuda"`` always uses the CUDA kernel
(and fails clearly otherwise). The choice is logged once per mixer type.
"""
from __future__ import annotations

import functools
import importlib
import importlib.util

import torch
from transformers.utils import logging

from .errors import ConfigError
from .registry import kernel_packages

logger = logging.get_logger(__name__)


@functools.cache
def _installed(package: str) -> bool:
    return importlib.util.find_spec(package) is not None


def use_kernels(mixer: str, mode: str, device: torch.device | None = None) -> bool:
    """Whether ``mixer`` should run its fused kernels under ``mode``."""
    packages = kernel_packages(mixer)          # declared by the mixer's architecture spec
    available = torch.cuda.is_available() and bool(packages) and all(_installed(p) for p in packages)
    if device is not None and device.type != "cuda":
        available = False
    if mode == "cuda" and not available:
        raise ConfigError("kernels", f"'cuda' requested for {mixer} but CUDA or the packages "
                                     f"{', '.join(packages) or '(none exist for this mixer)'} are unavailable")
    chosen = mode == "cuda" or (mode == "auto" and available)
    _log_choice(mixer, chosen)
    return chosen


@functools.cache
def _log_choice(mixer: str, chosen: bool) -> None:
    logger.info(f"hf-mecheval: {mixer} runs on {'fused CUDA kernels' if chosen else 'the PyTorch reference path'}")


def cpu_scan(mixer: str, mode: str, device: torch.device):
    """The compiled CPU selective scan (``cpu_kernels.selective_scan_cpu``) where ``mixer`` should
    run it under ``mode``, else None.

    ``"auto"`` takes it wherever it builds, whatever the width and threads: a training step on it
    was faster than on the PyTorch scan at every width from 16 to 256, at 1 and 2 threads, in each
    of two runs on a machine busy with two other trainings (1.0-2.6x; median 2.0x;
    ``benchmarks/bench_kernel_choice.py``, which prints the two side by side)."""
    return cpu_kernel("selective_scan_cpu", f"{mixer}'s scan", mode, device)


def cpu_short_conv(mode: str, device: torch.device):
    """The compiled CPU short convolution (``cpu_kernels.short_conv_cpu``) where it should run under
    ``mode``, else None (``ops_short_conv.short_conv`` then: the same arguments and result)."""
    return cpu_kernel("short_conv_cpu", "the short convolution", mode, device)


def cpu_ssd(mode: str, device: torch.device):
    """The compiled CPU scan of Mamba-2's SSD (``cpu_kernels.ssd_cpu``: ``ops_ssd.ssd_chunked``'s y
    without D and initial state) where it should run under ``mode``, else None."""
    return cpu_kernel("ssd_cpu", "Mamba-2's SSD", mode, device)


def cpu_bilinear_taps(mode: str, device: torch.device):
    """The compiled CPU taps of H3's diagonal SSM from its parameters, its bilinear discretisation
    taken in the same pass (``cpu_kernels.bilinear_taps_cpu``), where they should run under ``mode``,
    else None."""
    return cpu_kernel("bilinear_taps_cpu", "H3's SSM taps", mode, device)


def cpu_shift_taps(mode: str, device: torch.device):
    """The compiled CPU kernel of H3's shift SSM (``cpu_kernels.shift_taps_cpu``: the first T lags of
    the cross-correlation of its B and C) where it should run under ``mode``, else None."""
    return cpu_kernel("shift_taps_cpu", "H3's shift-SSM kernel", mode, device)


def cpu_h3_kept_heads(mode: str, device: torch.device):
    """The compiled CPU kernel of H3's heads at the kept positions (``cpu_kernels.h3_kept_heads_cpu``:
    outer products, the diagonal SSM's convolution and the q contraction in one pass) where it
    should run under ``mode``, else None."""
    return cpu_kernel("h3_kept_heads_cpu", "H3's heads at the kept positions", mode, device)


def cpu_kernel(name: str, what: str, mode: str, device: torch.device):
    """``cpu_kernels.<name>`` where a compiled CPU kernel should run under ``mode`` (any but
    "torch", on a CPU, where the kernels build), else None. Imported by name: transformers copies
    every ``from .x import`` of the modeling code into a checkpoint, and that copy cannot carry
    the C++ source, so it has no ``cpu_kernels`` and keeps the PyTorch path."""
    if mode == "torch" or device.type != "cpu":
        return None
    try:
        module = importlib.import_module(".cpu_kernels", __package__)
    except ImportError:
        module = None
    chosen = module is not None and module.available()
    _log_cpu_choice(what, chosen)
    return getattr(module, name) if chosen else None


@functools.cache
def _log_cpu_choice(what: str, chosen: bool) -> None:
    logger.info(f"hf-mecheval: {what} on a CPU runs {'compiled C++' if chosen else 'in PyTorch'}")


# The imports below sit in try blocks: besides failing clearly, that tells transformers' remote-code
# loader (which refuses a module whose imports are missing, except inside try blocks) that these
# packages are optional, so a checkpoint's copy of this file loads without them.
def mamba_kernels():
    """(selective_scan_fn, causal_conv1d_fn) from mamba-ssm and causal-conv1d."""
    try:
        from causal_conv1d import causal_conv1d_fn
        from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    except ImportError as exc:
        raise ConfigError("kernels", f"the Mamba kernels need mamba-ssm and causal-conv1d: {exc}") from exc
    return selective_scan_fn, causal_conv1d_fn


def delta_rule_kernel():
    """flash-linear-attention's chunked delta rule."""
    try:
        from fla.ops.delta_rule import chunk_delta_rule
    except ImportError as exc:
        raise ConfigError("kernels", f"the DeltaNet kernel needs flash-linear-attention: {exc}") from exc
    return chunk_delta_rule


def ssd_kernel():
    """mamba-ssm's chunked SSD scan (Mamba-2), Triton: takes x (B, L, H, P), dt (B, L, H), A (H,),
    B, C (B, L, G, N) as ``ops_ssd.py`` does."""
    try:
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    except ImportError as exc:
        raise ConfigError("kernels", f"the Mamba-2 kernel needs mamba-ssm: {exc}") from exc
    return mamba_chunk_scan_combined


def gated_delta_rule_kernel():
    """flash-linear-attention's chunked gated delta rule (Gated DeltaNet)."""
    try:
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule
    except ImportError as exc:
        raise ConfigError("kernels", f"the Gated DeltaNet kernel needs flash-linear-attention: {exc}") from exc
    return chunk_gated_delta_rule
