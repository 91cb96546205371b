"""DeltaNet: linear attention whose fast-weight state is updated by the delta rule.

Per head, with L2-normalised query/key q_t, k_t (dk), value v_t (dv) and a write strength
beta_t in (0, 1), the state S_t (dk, dv) is a key -> value memory:

    S_t = S_{t-1} + beta_t k_t (v_t - S_{t-1}^T k_t)^T      (replace what k_t retrieved by v_t)
        = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T q_t

The layer follows flash-linear-attention's DeltaNet with its default settings: bias-free q, k,
v projections, each through a causal depthwise short convolution + SiLU, beta = sigmoid of a
per-head projection, L2-normalised q and k, per-head RMSNorm on the output, bias-free output
projection. The four input projections run as one matmul and the three convolutions as one
(``convolutions.short_conv_on``: the compiled CPU kernel or ``ops_short_conv.short_conv``) over
concatenated parameters, which keep flash-linear-attention's
names and shapes: at these sizes fewer, larger calls are faster (tested against the module-by-
module form in ``test_deltanet.py``).

Two computations of the delta rule (``ops_delta_rule.py``), tested against each other:

* :func:`delta_rule_recurrent`: the plain loop over time (the readable reference; optionally
  returns the whole state trajectory);
* :func:`delta_rule_chunked`: the chunkwise-parallel WY/UT form of Yang et al. 2024
  ("Parallelizing Linear Transformers with the Delta Rule over Sequence Length"), the training
  path of ``forward``;
and, when the ``state`` site is observed, the loop's trajectory goes through the site and a
patch at position p is carried to later positions (``through_state_site``; the delta rule
is linear in S: S_t = (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from .kernels import delta_rule_kernel, use_kernels
from .convolutions import ShortConv, short_conv_on
from .mixers import zero_padding
from .ops_delta_rule import delta_rule_chunked, delta_rule_recurrent, delta_rule_step, delta_rule_transition
from .recurrent_cache import QKVWindowsAndRecurrentState
from .sites import Site, through_state_site
from .errors import ConfigError
from .configuration_mecheval import MechEvalConfig, check_divides_hidden, check_int
from .registry import ArchitectureSpec, register_architecture


class MechEvalDeltaNetConfig(MechEvalConfig):
    """Delta-rule linear attention with short convolutions on q, k, v (flash-linear-attention's
    DeltaNet: SiLU + L2-normalised q/k, sigmoid beta, per-head RMSNorm on the output, no biases)."""

    model_type = "mecheval-deltanet"
    num_attention_heads: int = 1
    use_short_conv: bool = True
    conv_kernel: int = 4
    chunk_size: int = 64

    def validate_fields(self) -> None:
        super().validate_fields()
        check_divides_hidden(self, "num_attention_heads")
        if not isinstance(self.use_short_conv, bool):
            raise ConfigError("use_short_conv", f"must be true or false, got {self.use_short_conv!r}")
        check_int(self, "conv_kernel", minimum=1)
        check_int(self, "chunk_size", minimum=1)

    def layer_mixers(self) -> list[str]:
        return ["deltanet"] * self.num_hidden_layers


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # per-head unit vectors; eps inside the root keeps the gradient finite at x = 0
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


# --------------------------------------------------------------------------------------------
# the mixer
# --------------------------------------------------------------------------------------------

class DeltaNetMixer(QKVWindowsAndRecurrentState, nn.Module):
    """DeltaNet sequence mixer: (batch, length, hidden) -> (batch, length, hidden).

    Without short convolutions (``use_short_conv=False``) SiLU is applied to q and k only and v
    stays linear (a choice made for this package; some flash-linear-attention versions apply
    SiLU to v there too).

    Padding: nothing here has a bias, so a zero input gives k = 0 (and q = v = 0) through the
    convolutions, and a zero key leaves the state unchanged; zeroing the layer's input is enough.
    """

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.layer_idx = layer_idx
        D, H = config.hidden_size, config.num_attention_heads
        self.hidden_size, self.num_heads, self.head_dim = D, H, D // H  # dk = dv = D / H
        self.use_short_conv = config.use_short_conv
        self.chunk_size = config.chunk_size
        self.kernels = config.kernels

        self.q_proj = nn.Linear(D, D, bias=False)
        self.k_proj = nn.Linear(D, D, bias=False)
        self.v_proj = nn.Linear(D, D, bias=False)
        self.b_proj = nn.Linear(D, H, bias=False)                        # one write strength per head
        if self.use_short_conv:
            self.q_conv1d = ShortConv(D, config.conv_kernel, bias=False, kernels=config.kernels)
            self.k_conv1d = ShortConv(D, config.conv_kernel, bias=False, kernels=config.kernels)
            self.v_conv1d = ShortConv(D, config.conv_kernel, bias=False, kernels=config.kernels)
            self.conv_output = Site("short-conv outputs of q, k, v after SiLU, (batch, length, 3*hidden)")
        self.o_norm = nn.RMSNorm(self.head_dim, eps=config.layer_norm_eps)  # per head, weight shared
        self.o_proj = nn.Linear(D, D, bias=False)
        self.state = Site("delta-rule state trajectory S_t, (batch, length, heads, dk, dv)",
                          propagates_in_layer=True)

    # shared pieces ---------------------------------------------------------------------------

    def _project(self, x: torch.Tensor):
        """x (..., D) -> q, k, v concatenated (..., 3D) and the logits of beta (..., H): the four
        projections as one matmul over the concatenated weights (the parameters stay separate,
        as flash-linear-attention's; at these sizes one call, and one in the backward, is faster
        than four)."""
        weight = torch.cat([self.q_proj.weight, self.k_proj.weight, self.v_proj.weight, self.b_proj.weight])
        return F.linear(x, weight).split([3 * self.hidden_size, self.num_heads], dim=-1)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        # (B, L, D) -> (B, H, L, d)
        B, L, _ = x.shape
        return x.reshape(B, L, self.num_heads, self.head_dim).transpose(1, 2)

    def _out(self, o: torch.Tensor) -> torch.Tensor:
        # o: (..., H, dv) -> per-head RMSNorm -> merge heads -> o_proj: (..., D)
        return self.o_proj(self.o_norm(o).flatten(-2))

    # full sequence ----------------------------------------------------------------------------

    def _inputs(self, x: torch.Tensor, mask: torch.Tensor | None):
        # x: (B, L, D) -> the projections before the convolutions (B, L, 3D); q, k, v (B, H, L, d); beta (B, H, L)
        B, L, D = x.shape
        H, d = self.num_heads, self.head_dim
        qkv, b = self._project(zero_padding(x, mask))                   # (B, L, 3D), (B, L, H)
        projected = qkv
        if self.use_short_conv:
            # the three convolutions as one over the concatenated channels (q, k, v)
            weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight])
            conv = short_conv_on(self.kernels, x.device)
            qk, v = self.conv_output(F.silu(conv(qkv, weight))).split([2 * D, D], dim=-1)
        else:
            qk, v = qkv.split([2 * D, D], dim=-1)
            qk = F.silu(qk)
        beta = torch.sigmoid(b).transpose(1, 2)                          # (B, H, L)
        # q and k normalised per head at once: (B, L, 2H, d) -> (B, 2H, L, d)
        qk = _l2norm(qk.reshape(B, L, 2 * H, d)).transpose(1, 2)
        return projected, qk[:, :H], qk[:, H:], self._heads(v), beta    # q, k, v: (B, H, L, d) each

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: (B, L, D)
        _, q, k, v, beta = self._inputs(x, mask)
        if self.state.wanted():
            # materialise S_t for every t so it can be read or patched
            _, states = delta_rule_recurrent(q, k, v, beta, return_states=True)
            states = states.transpose(1, 2)                              # (B, L, H, dk, dv)
            states = through_state_site(self.state, states, delta_rule_transition(k, beta))
            o = torch.einsum("blhkv,bhlk->bhlv", states, q)              # o_t = S_t^T q_t
        elif use_kernels("deltanet", self.kernels, x.device):
            # flash-linear-attention takes (B, L, H, d); scale 1 = this module's o_t = S_t^T q_t
            chunk_delta_rule = delta_rule_kernel()
            o, _ = chunk_delta_rule(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    beta.transpose(1, 2), scale=1.0)
            o = o.transpose(1, 2)
        else:
            o, _ = delta_rule_chunked(q, k, v, beta, self.chunk_size, output_final_state=False)   # (B, H, L, dv)
        return self._out(o.transpose(1, 2))                              # (B, L, D)

    def forward_with_state(self, x: torch.Tensor, mask: torch.Tensor | None = None):
        """forward(x, mask) (chunked) and the state ``step`` continues from: {"conv": the three
        windows (B, K-1, D) or None, "S": (B, H, dk, dv)}."""
        projected, q, k, v, beta = self._inputs(x, mask)
        o, S = delta_rule_chunked(q, k, v, beta, self.chunk_size, output_final_state=True)   # (B, H, L, dv)
        conv = None
        if self.use_short_conv:
            convs = (self.q_conv1d, self.k_conv1d, self.v_conv1d)
            conv = tuple(c.state_after(part) for c, part in zip(convs, projected.chunk(3, dim=-1)))
        return self._out(o.transpose(1, 2)), {"conv": conv, "S": S}

    # one token --------------------------------------------------------------------------------

    def step(self, x_t: torch.Tensor, state: dict | None, mask: torch.Tensor | None = None):
        """x_t: (B, D). state: None at the start, else {"conv": (window_q, window_k, window_v) or
        None, "S": (B, H, dk, dv)}. Returns (y_t (B, D), new_state)."""
        B, D = x_t.shape
        x_t = zero_padding(x_t, mask)
        H, d = self.num_heads, self.head_dim
        qkv, b = self._project(x_t)                                      # (B, 3D), (B, H)
        q, k, v = qkv.split(D, dim=-1)                                   # (B, D) each
        conv = None
        if self.use_short_conv:
            wq, wk, wv = state["conv"] if state is not None else (None, None, None)
            q, wq = self.q_conv1d.step(q, wq)
            k, wk = self.k_conv1d.step(k, wk)
            v, wv = self.v_conv1d.step(v, wv)
            q, k, v = F.silu(q), F.silu(k), F.silu(v)
            conv = (wq, wk, wv)
        else:
            q, k = F.silu(q), F.silu(k)
        beta = torch.sigmoid(b)                                          # (B, H)
        q, k, v = _l2norm(q.view(B, H, d)), _l2norm(k.view(B, H, d)), v.view(B, H, d)
        S = state["S"] if state is not None else x_t.new_zeros(B, H, d, d)
        S = delta_rule_step(S, k, v, beta)                                 # (B, H, dk, dv)
        o = torch.einsum("bhkv,bhk->bhv", S, q)                          # (B, H, dv)
        return self._out(o), {"conv": conv, "S": S}


register_architecture(ArchitectureSpec(
    name="deltanet", config_class=MechEvalDeltaNetConfig, mixers={"deltanet": DeltaNetMixer}, class_stem="DeltaNet",
    kernel_packages={"deltanet": ("fla",)}, tiny_config={"num_attention_heads": 2, "chunk_size": 4},
    test_variants=({"use_short_conv": False}, {"num_attention_heads": 1})))
