"""Mamba-2 mixer (SSD), Dao & Gu 2024. The math lives in ``ops_ssd.py``; this file builds
the parameters and dispatches.

    z, xBC, dt = in_proj(u)              (B, L, E), (B, L, E + 2GN), (B, L, H);  E = expand * D, H = E / P
    xBC        = silu(conv(xBC))   (conv_kernel > 0)   or   silu(xBC)   (conv_kernel = 0: no convolution)
    x, B, C    = split(xBC)              x (B, L, H, P); B, C (B, L, G, N), shared by a group's heads
    dt         = softplus(dt + dt_bias)  one step size per head and token
    h_t        = exp(dt_t A_h) h_{t-1} + dt_t x_t B_t^T      per head: h (P, N), A_h = -exp(A_log_h)
    y_t        = h_t C_t + D_h x_t
    out        = out_proj(rmsnorm(y * silu(z)))              (the gate before the norm, per group)

As mamba-ssm's ``Mamba2`` with its defaults (in_proj and out_proj without bias, convolution with
bias, A ~ U(1, 16) through A_log, dt log-uniform in [dt_min, dt_max] through an inverse-softplus
bias, D = 1 per head, gated RMSNorm over each group's channels, n_groups 1), scaled to these
widths: head_dim 16 (mamba-ssm: 64), so hidden 64 (E = 128) has 8 heads; d_state 64 (mamba-ssm:
128; Mamba-1 here: 16): the scalar decay is what makes a larger state cheap (the chunked form's
cost grows with N only through C_t . B_s and the chunk-boundary states), and the Mamba-2 paper's
recall experiments use N >= 64.

Paths: the chunked SSD (``ssd_chunked``) for training, or on a CPU, unless ``kernels`` is
"torch", the same y by a compiled scan over time (``cpu_kernels.ssd_cpu``, ``ssd_cpu.cpp``: one
exp per head and step, three vector operations per state entry, instead of the chunks' dozen
whole-tensor passes over (B, H, L, L) decays and scores; tested against the reference); on the
answer-only path the attention form at the kept position only (``ssd_at``); when the ``state`` site is observed (a hook or
``materialize_sites(True)``) the reference loop's state trajectory goes through the site and a
patch is carried to later positions (``ssd_transition``); mamba-ssm's fused ``mamba_chunk_scan_combined``
with ``kernels="auto"`` on CUDA where it is installed.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .convolutions import ShortConv
from .kernels import cpu_ssd, ssd_kernel, use_kernels
from .mixers import at_positions, zero_padding
from .norms import GatedRMSNorm
from .ops_ssd import ssd_at, ssd_chunked, ssd_readout, ssd_recurrent, ssd_transition
from .recurrent_cache import WindowAndRecurrentState
from .sites import Site, through_state_site
from .errors import ConfigError
from .configuration_mecheval import MechEvalConfig, check_float, check_int
from .registry import ArchitectureSpec, register_architecture


class MechEvalMamba2Config(MechEvalConfig):
    """Mamba-2 (SSD) blocks with RMSNorm and no MLP, as Mamba: a selective SSM whose decay is one
    scalar per head and step (mamba-ssm's Mamba2 defaults, head size and state scaled to these
    widths; see the module's docstring)."""

    model_type = "mecheval-mamba2"
    d_state: int = 64
    """State size N per head (mamba-ssm: 128)."""
    expand: int = 2
    head_dim: int = 16
    """Channels per SSM head (mamba-ssm: 64); heads = expand * hidden_size / head_dim."""
    n_groups: int = 1
    """Groups of heads that share B and C (and a norm group)."""
    conv_kernel: int = 4
    """Width of the depthwise causal short convolution on [x, B, C]; 0 = no convolution at all."""
    chunk_size: int = 64
    """Steps per chunk of the chunked SSD (the PyTorch path); does not change the result."""
    dt_min: float = 0.001
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4

    use_mlp = False
    block_norm = "rmsnorm"

    def validate_fields(self) -> None:
        super().validate_fields()
        check_int(self, "d_state", minimum=1)
        check_int(self, "expand", minimum=1)
        check_int(self, "head_dim", minimum=1)
        if self.intermediate_ssm_size % self.head_dim:
            raise ConfigError("head_dim", f"must divide expand * hidden_size ({self.intermediate_ssm_size}), "
                                          f"got {self.head_dim}")
        check_int(self, "n_groups", minimum=1)
        if self.num_ssm_heads % self.n_groups:
            raise ConfigError("n_groups", f"must divide the number of heads ({self.num_ssm_heads}), got {self.n_groups}")
        check_int(self, "conv_kernel", minimum=0, maximum=16)
        check_int(self, "chunk_size", minimum=1)
        check_float(self, "dt_min", minimum=0, exclusive=True)
        check_float(self, "dt_max", minimum=self.dt_min)
        check_float(self, "dt_init_floor", minimum=0, exclusive=True)

    @property
    def intermediate_ssm_size(self) -> int:
        return self.expand * self.hidden_size

    @property
    def num_ssm_heads(self) -> int:
        return self.intermediate_ssm_size // self.head_dim

    def layer_mixers(self) -> list[str]:
        return ["mamba2"] * self.num_hidden_layers


KERNEL_CHUNK_SIZE = 256   # mamba-ssm's default; the chunking changes the blocking, not the result


class Mamba2Mixer(WindowAndRecurrentState, nn.Module):
    """Mamba-2 sequence mixer: (batch, length, hidden) -> (batch, length, hidden)."""

    # as Mamba's (mixer_mamba.py): nn.Linear's own init, out_proj then divided by sqrt(num_hidden_layers)
    reference_init = {"in_proj": "torch_default", "out_proj": "torch_default_residual"}

    accepts_keep = True

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        D, E, P = config.hidden_size, config.intermediate_ssm_size, config.head_dim
        H, G, N = config.num_ssm_heads, config.n_groups, config.d_state
        self.E, self.H, self.P, self.G, self.N = E, H, P, G, N
        self.chunk_size = config.chunk_size
        self.in_proj = nn.Linear(D, 2 * E + 2 * G * N + H, bias=False)         # [z, x, B, C, dt]
        self.conv = (ShortConv(E + 2 * G * N, config.conv_kernel, bias=True, kernels=config.kernels)
                     if config.conv_kernel > 0 else None)
        self.dt_bias = nn.Parameter(torch.empty(H))
        self.A_log = nn.Parameter(torch.empty(H))
        self.D = nn.Parameter(torch.empty(H))
        self.norm = GatedRMSNorm(E, eps=config.layer_norm_eps, group_size=E // G, norm_before_gate=False)
        self.out_proj = nn.Linear(E, D, bias=False)
        if self.conv is not None:
            self.conv_output = Site("short-conv output of [x, B, C] after SiLU, "
                                    "(batch, length, expand*hidden + 2*n_groups*d_state)")
        self.state = Site("SSM state trajectory h_t, (batch, length, heads, head_dim, d_state)",
                          propagates_in_layer=True)
        self.init_mecheval_parameters()

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        """A ~ U(1, 16) per head (through A_log), D = 1, dt in [dt_min, dt_max] log-uniformly
        (through an inverse-softplus bias, floored at dt_init_floor), as mamba-ssm's Mamba2."""
        c = self.config
        self.A_log.copy_(torch.empty(self.H).uniform_(1, 16).log())
        self.D.fill_(1.0)
        dt = torch.exp(torch.rand(self.H) * (math.log(c.dt_max) - math.log(c.dt_min)) + math.log(c.dt_min))
        dt = dt.clamp(min=c.dt_init_floor)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))                # softplus^-1(dt)

    # shared pieces ---------------------------------------------------------------------------

    def _activated(self, xBC: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # (B, L, E + 2GN): the convolution (causal, depthwise) and SiLU, through the site. Padded
        # positions enter the convolution as zeros (what it sees before the first token anyway)
        xBC = zero_padding(xBC, mask)
        if self.conv is None:
            return F.silu(xBC)
        return self.conv_output(self.conv(xBC, activation="silu"))

    def _ssm_inputs(self, xBC: torch.Tensor, dt: torch.Tensor, mask: torch.Tensor | None):
        # xBC (..., E + 2GN), dt (..., H) -> x (..., H, P), B and C (..., G, N), dt (..., H) > 0.
        # x is zero at padded positions (the convolution's bias made it non-zero): they then add
        # nothing to the state, which stays zero until the first token
        x, B, C = xBC.split([self.E, self.G * self.N, self.G * self.N], dim=-1)
        return (zero_padding(x, mask).unflatten(-1, (self.H, self.P)), B.unflatten(-1, (self.G, self.N)),
                C.unflatten(-1, (self.G, self.N)), F.softplus(dt + self.dt_bias))

    def _out(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        # y (..., H, P), z (..., E) -> gated RMSNorm -> out_proj: (..., D)
        return self.out_proj(self.norm(y.flatten(-2), z))

    # full sequence ----------------------------------------------------------------------------

    def forward(self, u: torch.Tensor, keep: torch.Tensor | None = None, mask: torch.Tensor | None = None) -> torch.Tensor:
        """u (B, L, D) -> (B, L, D); with keep (B, k) positions (the answer-only training path),
        the output at those positions only, (B, k, D). mask (B, L): False at padding."""
        fast = not self.state.wanted()
        if keep is not None and fast:
            return self._forward_at(u, keep, mask)
        if fast and not use_kernels("mamba2", self.config.kernels, u.device) and \
                (compiled := cpu_ssd(self.config.kernels, u.device)) is not None:
            # the scan compiled; z, xBC and dt by a product each: contiguous, so that the
            # convolution reads xBC without a copy and the backward has no (B, L, 2E + 2GN + H) concatenation
            w_z, w_xBC, w_dt = self.in_proj.weight.split([self.E, self.E + 2 * self.G * self.N, self.H], dim=0)
            x, B, C, dt = self._ssm_inputs(self._activated(F.linear(u, w_xBC), mask), F.linear(u, w_dt), mask)
            y = compiled(x, dt, -torch.exp(self.A_log), B, C) + self.D[:, None] * x    # (B, L, H, P)
            out = self._out(y, F.linear(u, w_z))
            return out if keep is None else at_positions(out, keep)
        z, xBC, dt = self.in_proj(u).split([self.E, self.E + 2 * self.G * self.N, self.H], dim=-1)
        x, B, C, dt = self._ssm_inputs(self._activated(xBC, mask), dt, mask)
        A = -torch.exp(self.A_log)                                            # (H,)
        if not fast:
            # the state trajectory goes through its Site, where it may be read or patched
            _, states = ssd_recurrent(x, dt, A, B, C, return_states=True)     # (B, L, H, P, N)
            states = through_state_site(self.state, states, ssd_transition(dt, A))
            y = ssd_readout(states, C, x, self.D)
        elif use_kernels("mamba2", self.config.kernels, u.device):
            mamba_chunk_scan_combined = ssd_kernel()
            y = mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size=KERNEL_CHUNK_SIZE, D=self.D)
        else:
            y, _ = ssd_chunked(x, dt, A, B, C, self.chunk_size, self.D, output_final_state=False)   # (B, L, H, P)
        out = self._out(y, z)
        return out if keep is None else at_positions(out, keep)

    def forward_with_state(self, u: torch.Tensor, mask: torch.Tensor | None = None):
        """forward(u, mask) (chunked) and the state ``step`` continues from: (conv window (B, K-1,
        E + 2GN) or None, h (B, H, P, N))."""
        z, xBC, dt = self.in_proj(u).split([self.E, self.E + 2 * self.G * self.N, self.H], dim=-1)
        window = None if self.conv is None else self.conv.state_after(zero_padding(xBC, mask))
        x, B, C, dt = self._ssm_inputs(self._activated(xBC, mask), dt, mask)
        y, h = ssd_chunked(x, dt, -torch.exp(self.A_log), B, C, self.chunk_size, self.D, output_final_state=True)
        return self._out(y, z), (window, h)

    def _forward_at(self, u: torch.Tensor, keep: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
        # the convolution and the SSM inputs are needed everywhere; the gate, the norm and the
        # output projection only where the output is kept
        # (xBC and dt by a product each: contiguous, so that the convolution reads xBC without a copy)
        w_z, w_xBC, w_dt = self.in_proj.weight.split([self.E, self.E + 2 * self.G * self.N, self.H], dim=0)
        x, B, C, dt = self._ssm_inputs(self._activated(F.linear(u, w_xBC), mask), F.linear(u, w_dt), mask)
        y = ssd_at(x, dt, -torch.exp(self.A_log), B, C, keep, self.D)        # (B, k, H, P)
        return self._out(y, F.linear(at_positions(u, keep), w_z))

    # one token --------------------------------------------------------------------------------

    def step(self, u_t: torch.Tensor, state, mask: torch.Tensor | None = None):
        """u_t (B, D). state: None at the start, else (conv window (B, K-1, E + 2GN) or None,
        h (B, H, P, N)); mask (B,) False where u_t is padding. Returns (y_t (B, D), new_state).
        One step of the reference loop."""
        window, h = (None, None) if state is None else state
        z, xBC, dt = self.in_proj(u_t).split([self.E, self.E + 2 * self.G * self.N, self.H], dim=-1)
        xBC = zero_padding(xBC, mask)                                         # as in _activated
        if self.conv is not None:
            xBC, window = self.conv.step(xBC, window)
        x, B, C, dt = self._ssm_inputs(F.silu(xBC), dt, mask)
        y, h = ssd_recurrent(x[:, None], dt[:, None], -torch.exp(self.A_log), B[:, None], C[:, None],
                             self.D, initial_state=h)
        return self._out(y[:, 0], z), (window, h)


# tiny: 4 heads of 4 channels, chunks that do not divide the tests' lengths
register_architecture(ArchitectureSpec(
    name="mamba2", config_class=MechEvalMamba2Config, mixers={"mamba2": Mamba2Mixer}, class_stem="Mamba2",
    kernel_packages={"mamba2": ("mamba_ssm",)}, tiny_config={"d_state": 4, "head_dim": 4, "chunk_size": 4},
    test_variants=({"conv_kernel": 0}, {"n_groups": 2}, {"conv_kernel": 2, "head_dim": 8})))
