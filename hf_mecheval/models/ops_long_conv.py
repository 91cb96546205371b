"""The long causal convolution per channel, y = k ∗ u, of Hyena, BaseConv's "long" layers and H3's
SSM kernels: by FFT for long sequences, directly (a grouped ``conv1d``) for short ones, each with
a backward of its own (:class:`FFTCausalConv`, :class:`DirectCausalConv`); on a CPU under
``kernels="auto"`` the direct form runs the compiled depthwise causal convolution instead
(``cpu_kernels.short_conv_cpu`` with the kernel as its taps). ``_fft_causal_conv`` and
``_grouped_causal_conv`` are the readable references, with autograd's backward, that the fast ones
are tested against (``tests/models/test_convolutions.py``).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F

from .kernels import cpu_short_conv


def causal_conv(u: torch.Tensor, kernel: torch.Tensor, use_fft: bool | None = None,
                kernels: str = "torch") -> torch.Tensor:
    """Long causal convolution per channel.

    u: (B, L, C); kernel: (C, L') with L' >= L (only the first L taps are used).
    y[b, t, c] = sum_{s <= t} kernel[c, t - s] * u[b, s, c].
    Direct for short sequences, FFT of size 2L for long ones (measured crossover on a CPU: about
    L = 64); all forms are exact and tested against each other. The direct form is, under the
    mixer's ``kernels`` mode, the compiled CPU convolution where it runs (the kernel as its L taps,
    oldest first: each position's t + 1 taps in one pass over the contiguous channels), else a
    grouped ``conv1d`` (:class:`DirectCausalConv`; oneDNN took ~7 ms for the forward alone at
    batch 32, length 37, 512 channels, one CPU thread, the compiled kernel ~1 ms).
    """
    L = u.shape[1]
    k = kernel[:, :L]
    if use_fft is None:
        use_fft = L > 64
    if use_fft:
        return FFTCausalConv.apply(u, k)[0]
    compiled = cpu_short_conv(kernels, u.device)
    if compiled is not None:
        return compiled(u, k.flip(-1)[:, None, :]).to(u.dtype)      # (C, 1, L): tap j looks back L-1-j steps
    return DirectCausalConv.apply(u, k)


def _spectrum(x: torch.Tensor, n: int) -> torch.Tensor:
    """x (..., L) real -> its real FFT of size n (zero-padded), (..., n/2+1), in at least float32."""
    return torch.fft.rfft(x.to(torch.promote_types(x.dtype, torch.float32)), n=n)


def _fft_conv_and_spectrum(u: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """u (B, L, C), k (C, L) -> y (B, L, C) by FFTs of size 2L (no wrap-around), and the spectrum
    of u, (B, C, L+1)."""
    L = u.shape[1]
    U = _spectrum(u.transpose(1, 2), 2 * L)
    y = torch.fft.irfft(U * _spectrum(k, 2 * L), n=2 * L)[..., :L]
    return y.transpose(1, 2).to(u.dtype), U


def _fft_causal_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """The FFT form with autograd's own backward: the readable reference ``FFTCausalConv`` is
    tested against."""
    return _fft_conv_and_spectrum(u, k)[0]


class FFTCausalConv(torch.autograd.Function):
    """The FFT causal convolution, y = irfft(rfft(u) rfft(k))[:L] with FFTs of size n = 2L, with a
    backward of real FFTs only. Both gradients are cross-correlations, which the same size keeps
    free of wrap-around (lags beyond L - 1 fall on the zero padding):

        grad_u[s] = sum_t g[t] k[t - s]            = irfft(rfft(g) conj(rfft(k)))[s]
        grad_k[j] = sum_b sum_t g[b, t] u[b, t - j] = irfft(sum_b rfft(g_b) conj(rfft(u_b)))[j]

    Autograd's backward of ``rfft`` runs a complex FFT of the whole zero-padded (B, C, n) input
    and fills and copies it. The forward's spectrum of u is returned beside y (not differentiable;
    ``causal_conv`` drops it) so that the backward reuses it. Tested against ``_fft_causal_conv``
    and the direct form, and by gradcheck."""

    generate_vmap_rule = True    # plain torch ops only, so vmap (stacked copies) can batch it

    @staticmethod
    def forward(u: torch.Tensor, k: torch.Tensor):
        return _fft_conv_and_spectrum(u, k)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.mark_non_differentiable(output[1])
        ctx.save_for_backward(inputs[1], output[1])
        ctx.u_dtype = inputs[0].dtype

    @staticmethod
    def backward(ctx, g: torch.Tensor, _):
        k, U = ctx.saved_tensors
        L = g.shape[1]
        n = 2 * L
        G = _spectrum(g.transpose(1, 2), n)                                  # (B, C, L+1)
        grad_u = grad_k = None
        if ctx.needs_input_grad[0]:
            grad_u = torch.fft.irfft(G * _spectrum(k, n).conj(), n=n)[..., :L].transpose(1, 2).to(ctx.u_dtype)
        if ctx.needs_input_grad[1]:
            grad_k = torch.fft.irfft((G * U.conj()).sum(0), n=n)[..., :L].to(k.dtype)   # summed over the batch
        return grad_u, grad_k


def _grouped_causal_conv(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """u (B, L, C), k (C, L) -> (B, L, C). conv1d correlates, so the kernel is flipped; left
    padding makes it causal."""
    L = u.shape[1]
    y = F.conv1d(F.pad(u.transpose(1, 2), (L - 1, 0)), k.flip(-1)[:, None, :], groups=k.shape[0])
    return y.transpose(1, 2)


def _channels_first(x: torch.Tensor) -> torch.Tensor:
    """x (B, L, C) -> (C, B, L) contiguous, x[b, t, c] at [c, b, t]."""
    B, L, C = x.shape
    return x.reshape(B * L, C).t().contiguous().view(C, B, L)


class DirectCausalConv(torch.autograd.Function):
    """The direct causal convolution with a backward made of forward convolutions: on a CPU,
    oneDNN's backward of a depthwise conv1d with a sequence-long kernel took ~10x its forward
    (~2.5 ms at batch 32, length 37, 128 channels), the largest single cost of an H3 step.

        grad_u[s] = sum_{t >= s} k[t - s] g[t]        = the causal conv of g reversed in time, reversed
        grad_k[j] = sum_b sum_t g[b, t] u[b, t - j]   = a depthwise conv1d over the B*C rows, each
                    row u[b, :, c] correlated with its own filter g[b, :, c], summed over b
                    (3x faster here than a grouped conv with the batch as input channels)
    Tested against autograd through ``_grouped_causal_conv`` and by gradcheck."""

    generate_vmap_rule = True    # plain torch ops only, so vmap (stacked copies) can batch it

    @staticmethod
    def forward(u: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        return _grouped_causal_conv(u, k)

    @staticmethod
    def setup_context(ctx, inputs, output):
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        u_in, k_in = ctx.saved_tensors
        # computed in the gradient's dtype (under autocast the forward ran in a lower precision than
        # the saved inputs), returned in the inputs' dtypes, as autograd does for conv1d itself
        u, k = u_in.to(g.dtype), k_in.to(g.dtype)
        B, L, C = u.shape
        grad_u = grad_k = None
        if ctx.needs_input_grad[0]:
            grad_u = _grouped_causal_conv(g.flip(1), k).flip(1).to(u_in.dtype)
        if ctx.needs_input_grad[1]:
            # (B, L, C) -> (C, B, L) as the transpose of a (B*L, C) matrix: the same values, but
            # ~4x faster on a CPU than copying the 3-d permutation (2.3 -> 0.5 ms at 32 x 37 x 512)
            rows = F.pad(_channels_first(u), (L - 1, 0)).view(1, C * B, 2 * L - 1)     # row c*B + b
            filters = _channels_first(g).view(C * B, 1, L)
            per_row = F.conv1d(rows, filters, groups=C * B)[0]                         # (C*B, L), lag L-1-j
            grad_k = per_row.view(C, B, L).sum(1).flip(-1).to(k_in.dtype)              # (C, L)
        return grad_u, grad_k
