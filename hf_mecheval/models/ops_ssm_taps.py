"""The convolution kernel of a diagonal SSM, its taps K[c, l] = sum_n w[c, n] * a[c, n]^l, with
backwards by Horner's rule that keep memory O(channels * modes) instead of the (channels, modes,
L) Vandermonde matrix: :class:`PowerSumTaps` (real modes, H3's "mecheval-v1" form) and
:class:`ConjugatePairTaps` (conjugate pairs of complex modes, H3's "reference" form). Their
readable references are the Vandermonde forms in ``mixer_h3.py`` (``kernel_vandermonde``), against
which both are tested by gradcheck (``tests/models/test_h3_hyena.py``, ``test_h3_reference.py``).
"""
from __future__ import annotations

import torch

from .mixers import fold_copies


def _horner(G: torch.Tensor, a: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """P(a) = sum_l G[:, l] a^l and P'(a) by Horner's rule, accumulated in place in L steps:
    G (C, L) real, a (C, N) real or complex -> (P, P') (C, N), a's dtype."""
    L = G.shape[1]
    P = G[:, L - 1, None].to(a.dtype).expand_as(a).clone()        # Horner from the highest power
    dP = torch.zeros_like(a)
    for l in range(L - 2, -1, -1):
        dP.mul_(a).add_(P)
        P.mul_(a).add_(G[:, l, None])
    return P, dP


class ChannelwiseTaps(torch.autograd.Function):
    """What the taps functions f(x, y, L) -> (C, L) share, x and y (C, N) with independent
    channels: the backward keeps x, y and L, and under vmap (stacked copies) the copies fold into
    the channels. Subclasses write ``forward`` and ``backward``."""

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, y, L = inputs
        ctx.save_for_backward(x, y)
        ctx.L = L

    @classmethod
    def vmap(cls, info, in_dims, x, y, L):
        K = info.batch_size
        taps = cls.apply(*fold_copies(K, (x, y), in_dims[:2]), L)
        return taps.view(K, -1, L), 0


class PowerSumTaps(ChannelwiseTaps):
    """taps[c, l] = sum_n w[c, n] * a[c, n]^l for l < L: w, a (C, N) -> (C, L).

    Forward by repeated multiplication; backward by Horner's rule on the polynomial
    P(a) = sum_l G[:, l] a^l (G = dLoss/dtaps): dL/dw = P(a), dL/da = w P'(a), both accumulated in
    place in L steps — instead of an autograd graph of L products and sums, which made this small
    kernel a fifth of an H3 training step on a CPU. Tested against exp(l log a) (gradcheck)."""

    @staticmethod
    def forward(w: torch.Tensor, a: torch.Tensor, L: int) -> torch.Tensor:
        taps = w.new_empty(w.shape[0], L)
        p = w.clone()
        for l in range(L):
            torch.sum(p, dim=-1, out=taps[:, l])
            if l + 1 < L:
                p.mul_(a)
        return taps

    @staticmethod
    def backward(ctx, G: torch.Tensor):
        w, a = ctx.saved_tensors
        P, dP = _horner(G, a)
        return P, w * dP, None


class ConjugatePairTaps(ChannelwiseTaps):
    """taps[c, l] = 2 Re sum_n w[c, n] * a[c, n]^l for l < L: w, a (C, n) complex -> (C, L) real
    (the kernel of n conjugate pairs of modes, as the reference's ``log_vandermonde``).

    As :class:`PowerSumTaps`, forward by repeated multiplication and backward by Horner's rule on
    P(a) = sum_l G[:, l] a^l (G = dLoss/dtaps, real): the taps are holomorphic in w and a up to
    the real part, so in PyTorch's convention (the gradient of a real loss with respect to a complex
    z is dL/dRe z + i dL/dIm z) dL/dw = 2 conj(P(a)) and dL/da = 2 conj(w P'(a)). Memory O(C n)
    instead of the (C, n, L) complex Vandermonde matrix exp(l log a) (``DiagonalSSM.kernel_vandermonde``,
    the readable form, against which it is tested by gradcheck)."""

    @staticmethod
    def forward(w: torch.Tensor, a: torch.Tensor, L: int) -> torch.Tensor:
        taps = w.real.new_empty(w.shape[0], L)
        p = w.clone()
        for l in range(L):
            torch.sum(p.real, dim=-1, out=taps[:, l])
            if l + 1 < L:
                p.mul_(a)
        return taps.mul_(2)

    @staticmethod
    def backward(ctx, G: torch.Tensor):
        w, a = ctx.saved_tensors
        P, dP = _horner(G, a)
        return 2 * P.conj(), 2 * (w * dP).conj(), None
