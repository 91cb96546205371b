"""Gated DeltaNet mixer, Yang, Kautz & Hatamizadeh 2024. The math lives in
``ops_gated_delta_rule.py``; this file builds the parameters and dispatches.

    q, k, v = silu(conv(q_proj(x))), silu(conv(k_proj(x))), silu(conv(v_proj(x)))
              (use_short_conv=False: silu(q_proj(x)), ... without the convolutions)
    q, k    = L2-normalised per head                          (B, L, H, dk); v (B, L, H, dv)
    beta    = sigmoid(b_proj(x))                              write strength per head, (B, L, H)
    g       = -exp(A_log) * softplus(a_proj(x) + dt_bias)     log decay per head, alpha = exp(g)
    S_t     = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,    o_t = S_t^T q_t
    out     = o_proj(rmsnorm(o) * silu(g_proj(x)))           (per head, the gate after the norm)

As flash-linear-attention's ``GatedDeltaNet`` layer with its defaults (no biases anywhere,
bias-free short convolutions of width 4, A ~ U(0, 16) through A_log, dt log-uniform in
[0.001, 0.1] through an inverse-softplus bias, output gate with a gated RMSNorm whose weight is
shared by the heads), scaled to these widths. Heads: ``num_attention_heads`` (default 1, as our
Transformer and DeltaNet), key size ``head_dim`` (default hidden / heads), value size
``expand_v`` x ``head_dim``. fla uses expand_v 2 and several heads; the default here is 1, which
gives a layer exactly our DeltaNet's state (one hidden x hidden matrix), so the two differ by the
decay and the output gate, and keeps a training step within 3x of the Transformer's at hidden 64
on a CPU (expand_v 2 with two heads measured 1.3-1.4x slower per step, 3.0-3.5x the Transformer,
on the shared 2-core benchmark machine). flash-linear-attention scales q by dk^-1/2 inside its kernel; here o_t = S_t^T q_t
unscaled (as in ``mixer_deltanet.py``): the per-head RMSNorm that follows removes any constant scale
(up to its eps).

The six input projections run as one matmul and the three short convolutions as one
(``convolutions.short_conv_on``: the compiled CPU kernel, or ``ops_short_conv.py`` with its
hand-written backward) over concatenated parameters: the parameters keep
flash-linear-attention's names and shapes, and at these sizes fewer, larger calls are faster.

Paths: the chunked WY/UT form (``gated_delta_rule_chunked``) for training; when the ``state`` site
is observed the reference loop's trajectory goes through the site and a patch is carried to later
positions (``gated_delta_rule_transition``); flash-linear-attention's ``chunk_gated_delta_rule`` with
``kernels="auto"`` on CUDA where it is installed.
"""
from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from .convolutions import ShortConv, short_conv_on
from .kernels import gated_delta_rule_kernel, use_kernels
from .mixers import zero_padding
from .norms import GatedRMSNorm
from .ops_gated_delta_rule import (gated_delta_rule_chunked, gated_delta_rule_readout, gated_delta_rule_recurrent,
                                   gated_delta_rule_transition)
from .recurrent_cache import QKVWindowsAndRecurrentState
from .sites import Site, through_state_site
from .errors import ConfigError
from .configuration_mecheval import MechEvalConfig, check_divides_hidden, check_int
from .registry import ArchitectureSpec, register_architecture


class MechEvalGatedDeltaNetConfig(MechEvalConfig):
    """Gated delta-rule linear attention (flash-linear-attention's GatedDeltaNet: short convolutions
    + SiLU on q, k, v, L2-normalised q/k, sigmoid beta, Mamba-2-style decay, output gate with a
    per-head gated RMSNorm, no biases), in blocks with an MLP, like DeltaNet (LayerNorm, the shared
    GELU MLP; fla's own model uses RMSNorm and a SwiGLU MLP). By default one head with
    dk = dv = hidden_size: DeltaNet's state, so that the two differ by the gates."""

    model_type = "mecheval-gated-deltanet"
    num_attention_heads: int = 1
    head_dim: int | None = None
    """Query/key size per head; None = hidden_size / num_attention_heads."""
    expand_v: int = 1
    """Value size per head = expand_v * head_dim. flash-linear-attention uses 2 (and several
    heads): set expand_v=2 for its layout; the default 1 keeps the step time within 3x of the
    Transformer's at hidden 64 on a CPU (see the module's docstring)."""
    use_short_conv: bool = True
    conv_kernel: int = 4
    chunk_size: int = 64
    """Steps per chunk of the chunked delta rule (the PyTorch path); does not change the result."""

    def validate_fields(self) -> None:
        super().validate_fields()
        if self.head_dim is None:
            check_divides_hidden(self, "num_attention_heads")
        else:
            check_int(self, "num_attention_heads", minimum=1)
            check_int(self, "head_dim", minimum=1)
        check_int(self, "expand_v", minimum=1)
        if not isinstance(self.use_short_conv, bool):
            raise ConfigError("use_short_conv", f"must be true or false, got {self.use_short_conv!r}")
        check_int(self, "conv_kernel", minimum=1)
        check_int(self, "chunk_size", minimum=1)

    @property
    def key_head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads if self.head_dim is None else self.head_dim

    @property
    def value_head_dim(self) -> int:
        return self.expand_v * self.key_head_dim

    def layer_mixers(self) -> list[str]:
        return ["gated_deltanet"] * self.num_hidden_layers


# flash-linear-attention hard-codes these for Gated DeltaNet (they are not config fields there)
A_INIT_RANGE = (0.0, 16.0)
DT_MIN, DT_MAX, DT_INIT_FLOOR = 0.001, 0.1, 1e-4


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # per-head unit vectors; eps inside the root keeps the gradient finite at x = 0
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


class GatedDeltaNetMixer(QKVWindowsAndRecurrentState, nn.Module):
    """Gated DeltaNet sequence mixer: (batch, length, hidden) -> (batch, length, hidden)."""

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        D, H = config.hidden_size, config.num_attention_heads
        dk, dv = config.key_head_dim, config.value_head_dim
        self.num_heads, self.dk, self.dv = H, dk, dv
        self.key_dim, self.value_dim = H * dk, H * dv
        self.use_short_conv = config.use_short_conv
        self.chunk_size = config.chunk_size
        self.kernels = config.kernels

        self.q_proj = nn.Linear(D, self.key_dim, bias=False)
        self.k_proj = nn.Linear(D, self.key_dim, bias=False)
        self.v_proj = nn.Linear(D, self.value_dim, bias=False)
        self.a_proj = nn.Linear(D, H, bias=False)                            # decay input, per head
        self.b_proj = nn.Linear(D, H, bias=False)                            # write strength, per head
        self.A_log = nn.Parameter(torch.empty(H))
        self.dt_bias = nn.Parameter(torch.empty(H))
        if self.use_short_conv:
            self.q_conv1d = ShortConv(self.key_dim, config.conv_kernel, bias=False, kernels=config.kernels)
            self.k_conv1d = ShortConv(self.key_dim, config.conv_kernel, bias=False, kernels=config.kernels)
            self.v_conv1d = ShortConv(self.value_dim, config.conv_kernel, bias=False, kernels=config.kernels)
            self.conv_output = Site("short-conv outputs of q, k, v after SiLU, "
                                    "(batch, length, 2*heads*head_dim + heads*head_dim*expand_v)")
        self.g_proj = nn.Linear(D, self.value_dim, bias=False)               # output gate
        self.o_norm = GatedRMSNorm(dv, eps=config.layer_norm_eps, norm_before_gate=True)
        self.o_proj = nn.Linear(self.value_dim, D, bias=False)
        self.state = Site("gated delta-rule state trajectory S_t, (batch, length, heads, dk, dv)",
                          propagates_in_layer=True)
        self.init_mecheval_parameters()

    @torch.no_grad()
    def init_mecheval_parameters(self) -> None:
        """A ~ U(0, 16) per head (through A_log; floored at 1e-4 so the log is finite), dt
        log-uniform in [0.001, 0.1] floored at 1e-4 (through an inverse-softplus bias), as
        flash-linear-attention's GatedDeltaNet."""
        self.A_log.copy_(torch.empty(self.num_heads).uniform_(*A_INIT_RANGE).clamp(min=1e-4).log())
        dt = torch.exp(torch.rand(self.num_heads) * (math.log(DT_MAX) - math.log(DT_MIN)) + math.log(DT_MIN))
        dt = dt.clamp(min=DT_INIT_FLOOR)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))                # softplus^-1(dt)

    # shared pieces ---------------------------------------------------------------------------

    def _project(self, x: torch.Tensor):
        """x (..., D) -> qkv (..., 2*key_dim + value_dim), output gate (..., value_dim) and the inputs
        of the decay and of beta (..., H): the six projections as one matmul (the parameters stay
        separate, as flash-linear-attention's; at these sizes one call instead of six is faster)."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight,
                            self.g_proj.weight, self.a_proj.weight, self.b_proj.weight])
        H = self.num_heads
        return F.linear(x, weight).split([2 * self.key_dim + self.value_dim, self.value_dim, H, H], dim=-1)

    def _gates(self, a: torch.Tensor, b: torch.Tensor):
        # (..., H) each -> log decay g = -exp(A_log) softplus(a + dt_bias) and beta = sigmoid(b)
        return -torch.exp(self.A_log) * F.softplus(a + self.dt_bias), torch.sigmoid(b)

    def _heads(self, qkv: torch.Tensor):
        # (..., 2*H*dk + H*dv) after SiLU -> unit q, k (..., H, dk) and v (..., H, dv)
        H = self.num_heads
        qk = _l2norm(qkv[..., :2 * self.key_dim].unflatten(-1, (2 * H, self.dk)))   # q and k at once
        return qk[..., :H, :], qk[..., H:, :], qkv[..., 2 * self.key_dim:].unflatten(-1, (H, self.dv))

    def _out(self, o: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        # o (..., H, dv), gate (..., H*dv) -> per-head RMSNorm gated by silu(gate) -> o_proj: (..., D)
        return self.o_proj(self.o_norm(o, gate.unflatten(-1, (self.num_heads, self.dv))).flatten(-2))

    # full sequence ----------------------------------------------------------------------------

    def _inputs(self, x: torch.Tensor, mask: torch.Tensor | None):
        # x (B, L, D) -> the projections before the convolutions (B, L, 2 key_dim + value_dim), the
        # output gate, q, k, v (B, L, H, d) and the gates g, beta (B, L, H)
        projected, gate, a, b = self._project(zero_padding(x, mask))
        if self.use_short_conv:
            # the three convolutions as one over the concatenated channels
            weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight])
            qkv = self.conv_output(F.silu(short_conv_on(self.kernels, x.device)(projected, weight)))
        else:
            qkv = F.silu(projected)
        return (projected, gate, *self._heads(qkv), *self._gates(a, b))

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: (B, L, D); mask (B, L) False at padding. Nothing before the delta rule has a bias,
        # so a zero input gives k = 0 there, which leaves the (zero) state unchanged
        _, gate, q, k, v, g, beta = self._inputs(x, mask)
        if self.state.wanted():
            # materialise S_t for every t so it can be read or patched
            _, states = gated_delta_rule_recurrent(q, k, v, g, beta, return_states=True)   # (B, L, H, dk, dv)
            states = through_state_site(self.state, states, gated_delta_rule_transition(k, g, beta))
            o = gated_delta_rule_readout(states, q)
        elif use_kernels("gated_deltanet", self.kernels, x.device):
            # flash-linear-attention takes (B, L, H, d) as we do; scale 1 = o_t = S_t^T q_t
            chunk_gated_delta_rule = gated_delta_rule_kernel()
            o, _ = chunk_gated_delta_rule(q=q.contiguous(), k=k.contiguous(), v=v.contiguous(), g=g,
                                          beta=beta, scale=1.0)
        else:
            o, _ = gated_delta_rule_chunked(q, k, v, g, beta, self.chunk_size, output_final_state=False)
        return self._out(o, gate)

    def forward_with_state(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """forward(x, mask) (chunked) and the state ``step`` continues from: {"conv": the q, k and v
        windows (B, K-1, channels) or None, "S": (B, H, dk, dv)}."""
        projected, gate, q, k, v, g, beta = self._inputs(x, mask)
        o, S = gated_delta_rule_chunked(q, k, v, g, beta, self.chunk_size, output_final_state=True)
        conv = None
        if self.use_short_conv:
            parts = projected.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
            convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
            conv = tuple(c.state_after(part) for c, part in zip(convs, parts))
        return self._out(o, gate), {"conv": conv, "S": S}

    # one token --------------------------------------------------------------------------------

    def step(self, x_t: torch.Tensor, state: dict | None, mask: torch.Tensor | None = None):
        """x_t: (B, D). state: None at the start, else {"conv": (window_q, window_k, window_v) or
        None, "S": (B, H, dk, dv)}; mask (B,) False where x_t is padding. Returns (y_t (B, D),
        new_state). One step of the reference loop."""
        qkv, gate, a, b = self._project(zero_padding(x_t, mask))
        conv = None
        if self.use_short_conv:
            q, k, v = qkv.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
            wq, wk, wv = state["conv"] if state is not None else (None, None, None)
            q, wq = self.q_conv1d.step(q, wq)
            k, wk = self.k_conv1d.step(k, wk)
            v, wv = self.v_conv1d.step(v, wv)
            qkv, conv = torch.cat([q, k, v], dim=-1), (wq, wk, wv)
        q, k, v = self._heads(F.silu(qkv))                                    # (B, H, d)
        g, beta = self._gates(a, b)                                           # (B, H)
        o, S = gated_delta_rule_recurrent(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                          initial_state=state["S"] if state is not None else None)
        return self._out(o[:, 0], gate), {"conv": conv, "S": S}


register_architecture(ArchitectureSpec(
    name="gated_deltanet", config_class=MechEvalGatedDeltaNetConfig, mixers={"gated_deltanet": GatedDeltaNetMixer},
    class_stem="GatedDeltaNet", kernel_packages={"gated_deltanet": ("fla",)},
    tiny_config={"num_attention_heads": 2, "expand_v": 2, "chunk_size": 4},
    test_variants=({"use_short_conv": False}, {"num_attention_heads": 1, "expand_v": 1})))
