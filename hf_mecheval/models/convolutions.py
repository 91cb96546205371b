"""Convolution modules shared by the mixers: the short causal depthwise convolution and implicit
long filters (the long causal convolution itself, direct and FFT, is ``ops_long_conv.py``).

Implicit long filters, all over the positional features of :func:`positional_features`:

* :class:`HyenaFilter`: Hyena's filter as the paper's reference code builds it (Hyena's
  ``filter_form`` "reference");
* :class:`ImplicitLongConv`: the reference's implicit long convolution of BaseConv's "long" layers
  (and Based's "long only" ablation; ``long_conv_form`` "reference");
* :class:`ImplicitFilter`: hf-mecheval's first filter, used by both until then (the
  "mecheval-v1" forms, kept so that the checkpoints made with it load and compute as before).
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .kernels import cpu_short_conv
from .ops_long_conv import causal_conv
from .ops_short_conv import short_conv


def short_conv_on(kernels: str, device: torch.device):
    """The short convolution ``(x, weight, bias=None) -> y`` a mixer runs under its ``kernels``
    mode: the compiled CPU kernel (``kernels.cpu_short_conv``) where it runs, else
    ``ops_short_conv.short_conv``; both compute the same, tested against each other."""
    return cpu_short_conv(kernels, device) or short_conv


class ShortConv(nn.Module):
    """Depthwise causal convolution of width ``kernel_size`` over (batch, length, channels).

    y[t, c] = bias[c] + sum_j weight[c, j] * x[t - (K-1) + j, c]   (x = 0 before the start)

    The forward is ``ops_short_conv.short_conv``: K shifted multiply-adds in the (batch, length,
    channels) layout (no transposes, as ``conv1d`` needs) with a hand-written backward that
    accumulates the taps in place (``short_conv_reference`` there is the readable form, tested
    against it); on a CPU, unless ``kernels`` is "torch", the compiled kernel that computes the
    same (``short_conv_on``). ``forward(x, activation="silu")`` returns silu of the convolution
    (Mamba's and Mamba-2's), which the compiled kernel computes in the same pass, forward and
    backward. The parameter is stored as ``weight`` of shape (channels, 1, K), like
    ``nn.Conv1d(groups=channels)``, so it is interchangeable with the kernel packages.
    """

    def __init__(self, channels: int, kernel_size: int, bias: bool = True, kernels: str = "torch"):
        super().__init__()
        self.channels, self.kernel_size, self.kernels = channels, kernel_size, kernels
        self.weight = nn.Parameter(torch.empty(channels, 1, kernel_size))
        self.bias = nn.Parameter(torch.zeros(channels)) if bias else None
        # drawn here for a ShortConv on its own, and again by a model's _init_weights, which must
        # draw every weight itself (a model built on the meta device is materialised through it)
        self.init_mecheval_parameters()

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        """weight and bias U(+-1/sqrt(K)): nn.Conv1d's default for groups == channels."""
        bound = 1 / math.sqrt(self.kernel_size)
        self.weight.uniform_(-bound, bound)
        if self.bias is not None:
            self.bias.uniform_(-bound, bound)

    def forward(self, x: torch.Tensor, activation: str | None = None) -> torch.Tensor:
        # x: (B, L, C) -> (B, L, C); activation "silu": silu of that (in the compiled kernel's pass)
        return short_conv_on(self.kernels, x.device)(x, self.weight, self.bias, activation)

    def step(self, x_t: torch.Tensor, window: torch.Tensor | None):
        """x_t: (B, C); window: (B, K-1, C) previous inputs (None = zeros). Returns (y_t, window)."""
        K = self.kernel_size
        if window is None:
            window = x_t.new_zeros(x_t.shape[0], K - 1, x_t.shape[1])
        full = torch.cat([window, x_t[:, None]], dim=1)  # (B, K, C)
        y = (full * self.weight[:, 0, :].T).sum(1)
        if self.bias is not None:
            y = y + self.bias
        return y, full[:, 1:]

    def state_after(self, x: torch.Tensor) -> torch.Tensor:
        """The window ``step`` holds after reading x (B, L, C): its last K-1 inputs, (B, K-1, C),
        zeros standing for positions before the start."""
        return F.pad(x, (0, 0, self.kernel_size - 1, 0))[:, x.shape[1]:]


class Sin(nn.Module):
    """sin(freq * x) with a learnable frequency per feature (Hyena's filter activation)."""

    def __init__(self, dim: int, freq: float = 1.0):
        super().__init__()
        self.init_freq = freq
        self.freq = nn.Parameter(freq * torch.ones(1, dim))

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        """freq = its initial value (the model's ``_init_weights`` calls this where it was not
        loaded, e.g. a model built on the meta device)."""
        self.freq.fill_(self.init_freq)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sin(self.freq * x)


def positional_features(length: int, max_length: int, emb_dim: int = 3, device=None, dtype=None,
                        single_band_freq: float = 1e-4) -> torch.Tensor:
    """The positional features every implicit filter is a function of, at positions p < length of
    a filter defined up to ``max_length`` = T positions:

        z(p) = [p / (T-1), cos(2π f_k p / T) for k < K, -sin(2π f_k p / T) for k < K]   (length, emb_dim)

    with K = (emb_dim - 1) / 2 bands at f = linspace(1e-4, K - 1, K), as the reference computes
    them (the real and imaginary parts of exp(-i 2π f p / T)). For emb_dim 3 (one band) that is
    the single frequency 1e-4, under which cos ≈ 1 and -sin ≈ 0 over the whole filter: in effect
    the filter sees the time p / (T-1) alone. hf-mecheval's first filter (:class:`ImplicitFilter`)
    used f = 1 for a single band: ``single_band_freq`` = 1.0."""
    T = max_length
    pos = torch.arange(length, device=device, dtype=dtype)[:, None]        # (L, 1)
    bands = (emb_dim - 1) // 2
    f = torch.linspace(1e-4, bands - 1, bands, device=device, dtype=dtype)[None] if bands > 1 \
        else torch.full((1, 1), single_band_freq, device=device, dtype=dtype)   # (1, K)
    angle = 2 * math.pi * f * pos / T                                       # (L, K)
    return torch.cat([pos / (T - 1), torch.cos(angle), torch.sin(-angle)], dim=-1)   # (L, emb_dim)


def decay_window(channels: int, length: int, max_length: int, device=None, dtype=None,
                 fast_decay: float = 0.3, slow_decay: float = 1.5, target: float = 1e-2) -> torch.Tensor:
    """The reference Hyena filter's exponential decay (its ``ExponentialModulation``), fixed:

        window[c, p] = exp(-|delta_c| * p / (T-1)),   delta = linspace(ln(target) / slow_decay,
                                                                       ln(target) / fast_decay, channels)

    Rates grow linearly across channels: channel 0 decays slowest (its response falls to ``target``
    after ``slow_decay`` times the maximum length T: rate ln(100) / 1.5 ≈ 3.07), the last channel
    fastest (after ``fast_decay`` of it: ≈ 15.35). Returns (channels, length)."""
    delta = torch.linspace(math.log(target) / slow_decay, math.log(target) / fast_decay, channels,
                           device=device, dtype=dtype)                         # (C,)
    t = torch.arange(length, device=device, dtype=dtype) / (max_length - 1)   # (L,)
    return torch.exp(-delta.abs()[:, None] * t[None])                         # (C, L)


class HyenaFilter(nn.Module):
    """Hyena's implicit long filter in the reference's form (its ``HyenaFilter``, order 2):

        z = trainable positional features, (T, emb_dim), initialised to ``positional_features``
        h(p) = W_out s(W_2 s(W_1 s(W_in z(p) + b_in) + b_1) + b_2)      s(x) = sin(freq * x)
        kernel[c, p] = h(p)[c] * window[c, p]                           ``decay_window``

    Each W is a Linear (W_out: order -> channels without bias); the three activations are ONE
    :class:`Sin` module, so they share one trainable frequency vector (1, order). ``forward(L)``
    uses the first L rows of z and returns the kernel (channels, L). z is a parameter (trained by
    the model's optimizer, as every other), redrawn by :meth:`init_mecheval_parameters` wherever it
    was not loaded; the window is fixed and recomputed on the fly (see :class:`ImplicitFilter`).
    """

    def __init__(self, channels: int, max_length: int, order: int = 64, emb_dim: int = 3,
                 sine_freq: float = 1.0, inner_layers: int = 2, fast_decay: float = 0.3,
                 slow_decay: float = 1.5, target: float = 1e-2):
        super().__init__()
        self.channels, self.max_length, self.emb_dim = channels, max_length, emb_dim
        self.fast_decay, self.slow_decay, self.target = fast_decay, slow_decay, target
        self.z = nn.Parameter(torch.empty(max_length, emb_dim))
        self.sin = Sin(order, sine_freq)                        # shared by all three activations
        self.input_proj = nn.Linear(emb_dim, order)
        self.inner = nn.ModuleList(nn.Linear(order, order) for _ in range(inner_layers))
        self.output_proj = nn.Linear(order, channels, bias=False)
        self.init_mecheval_parameters()

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        """z = the positional features of every position up to the maximum length."""
        self.z.copy_(positional_features(self.max_length, self.max_length, self.emb_dim,
                                         device=self.z.device, dtype=self.z.dtype))

    def forward(self, length: int) -> torch.Tensor:
        if length > self.max_length:
            raise ValueError(f"sequence length {length} exceeds the implicit filter's maximum {self.max_length}")
        h = self.sin(self.input_proj(self.z[:length]))          # (L, order)
        for linear in self.inner:
            h = self.sin(linear(h))                              # (L, order)
        h = self.output_proj(h)                                  # (L, C)
        window = decay_window(self.channels, length, self.max_length, device=self.z.device, dtype=self.z.dtype,
                              fast_decay=self.fast_decay, slow_decay=self.slow_decay, target=self.target)
        return h.T * window                                      # (C, L)


class ImplicitLongConv(nn.Module):
    """The reference's implicit long convolution (its ``ImplicitLongConvolution``), with its skip:

        z = positional_features (fixed), (L, emb_dim)
        kernel = MLP(z)^T, (channels, L)      MLP: Linear(emb_dim, hidden) - ReLU - Linear(hidden, channels)
        y[t] = sum_{s <= t} kernel[:, t - s] * u[s] + u[t]

    No decay window and no further bias (the MLP's last Linear has one). The features are
    recomputed on the fly (tiny), as :class:`ImplicitFilter` explains."""

    def __init__(self, channels: int, max_length: int, hidden: int = 16, emb_dim: int = 3, kernels: str = "torch"):
        super().__init__()
        self.channels, self.max_length, self.emb_dim = channels, max_length, emb_dim
        self.kernels = kernels                                                 # the direct convolution's path (ops_long_conv)
        self.mlp = nn.Sequential(nn.Linear(emb_dim, hidden), nn.ReLU(), nn.Linear(hidden, channels))

    def kernel(self, length: int) -> torch.Tensor:
        if length > self.max_length:
            raise ValueError(f"sequence length {length} exceeds the implicit filter's maximum {self.max_length}")
        w = self.mlp[0].weight
        z = positional_features(length, self.max_length, self.emb_dim, device=w.device, dtype=w.dtype)
        return self.mlp(z).T                                                   # (C, L)

    def forward(self, u: torch.Tensor) -> torch.Tensor:
        # u: (B, L, C) -> (B, L, C)
        return causal_conv(u, self.kernel(u.shape[1]), kernels=self.kernels) + u

    def step(self, u_t: torch.Tensor, history: torch.Tensor | None):
        """u_t: (B, C); history: (B, t-1, C) every earlier input (None = none). Returns (y_t, history)."""
        history = u_t[:, None] if history is None else torch.cat([history, u_t[:, None]], dim=1)  # (B, t, C)
        kernel = self.kernel(history.shape[1]).flip(-1)                        # (C, t): column s = tap for lag t-1-s
        return (history * kernel.T).sum(1) + u_t, history

    def state_after(self, u: torch.Tensor) -> torch.Tensor:
        """The history ``step`` holds after reading u (B, L, C): every input, u itself."""
        return u


class ImplicitFilter(nn.Module):
    """A long convolution kernel given by a small MLP over positional features: hf-mecheval's
    first filter, kept as Hyena's ``filter_form`` and BaseConv's ``long_conv_form`` "mecheval-v1"
    (the reference forms are :class:`HyenaFilter` and :class:`ImplicitLongConv`).

    z(t) = [t / (T-1), cos(2π f t / T), sin(-2π f t / T)]   (T, emb_dim), f as ``positional_features``
           but f = 1 for a single band (emb_dim 3)
    h(t) = MLP(z(t)) * window(t)   -> kernel (channels, T)
    MLP: Linear(emb_dim, order) - Sin - Linear(order, order) - Sin - Linear(order, channels, no bias).
    With ``decay``, window(t) = exp(-alpha_c * t / T) with rates alpha_c spread log-uniformly
    across channels (so some channels see far, some only near); without it, window = 1.
    """

    def __init__(self, channels: int, max_length: int, order: int = 64, emb_dim: int = 3,
                 sine_freq: float = 1.0, decay: bool = True, fast_decay: float = 0.3,
                 slow_decay: float = 1.5, target: float = 1e-2):
        super().__init__()
        self.channels, self.max_length = channels, max_length
        self.emb_dim, self.decay = emb_dim, decay
        self.fast_decay, self.slow_decay, self.target = fast_decay, slow_decay, target
        self.mlp = nn.Sequential(
            nn.Linear(emb_dim, order), Sin(order, sine_freq),
            nn.Linear(order, order), Sin(order, sine_freq),
            nn.Linear(order, channels, bias=False),
        )

    # The positional features and the window are fixed functions of the position, recomputed on
    # the fly (tiny) rather than kept as buffers, so that models built on the meta device (as
    # from_pretrained does) need nothing re-initialised.
    def positional_features(self, length: int, device, dtype) -> torch.Tensor:
        return positional_features(length, self.max_length, self.emb_dim, device=device, dtype=dtype,
                                   single_band_freq=1.0)                   # (L, emb_dim)

    def window(self, length: int, device, dtype) -> torch.Tensor:
        if not self.decay:
            return torch.ones(self.channels, length, device=device, dtype=dtype)
        # channel c's response falls to `target` after fraction span_c of the maximum length
        span = torch.linspace(self.fast_decay, self.slow_decay, self.channels, device=device, dtype=dtype)
        rate = math.log(1 / self.target) / span                                    # (C,)
        t = torch.arange(length, device=device, dtype=dtype) / (self.max_length - 1)
        return torch.exp(-rate[:, None] * t[None])                                 # (C, L)

    def forward(self, length: int) -> torch.Tensor:
        if length > self.max_length:
            raise ValueError(f"sequence length {length} exceeds the implicit filter's maximum {self.max_length}")
        w = self.mlp[0].weight
        h = self.mlp(self.positional_features(length, w.device, w.dtype))     # (L, C)
        return h.T * self.window(length, w.device, w.dtype)                    # (C, L)
