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
(``ops_short_conv.short_conv``) over concatenated parameters, which keep flash-linear-attention's
names and shapes: at these sizes fewer, larger calls are faster (tested against the module-by-
module form in ``test_delta_net.py``).

Two computations of the delta rule, tested against each other:

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
from .convolutions import ShortConv
from .mixers import zero_padding
from .ops_short_conv import short_conv
from .sites import Site, through_state_site
from .configuration_mecheval import DeltaNetConfig
from .registry import ArchitectureSpec, register_architecture


# --------------------------------------------------------------------------------------------
# the delta rule, three ways. Shapes: q, k (B, H, L, dk); v (B, H, L, dv); beta (B, H, L);
# states (B, H, dk, dv).
# --------------------------------------------------------------------------------------------

def _delta_update(S: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, beta_t: torch.Tensor) -> torch.Tensor:
    """One delta-rule step. S: (B, H, dk, dv); k_t: (B, H, dk); v_t: (B, H, dv); beta_t: (B, H)."""
    retrieved = torch.einsum("bhkv,bhk->bhv", S, k_t)                  # S^T k: (B, H, dv)
    delta = beta_t[..., None] * (v_t - retrieved)                        # (B, H, dv)
    return S + k_t[..., :, None] * delta[..., None, :]                   # + k delta^T: (B, H, dk, dv)


def delta_rule_recurrent(q, k, v, beta, initial_state=None, return_states: bool = False):
    """Reference: loop over time.

    Returns (o, S_last) with o: (B, H, L, dv) and S_last: (B, H, dk, dv); with ``return_states``
    returns (o, states) instead, states: (B, H, L, dk, dv) with states[:, :, t] = S_t (the state
    *after* token t, the one o_t reads).
    """
    B, H, L, dk = k.shape
    dv = v.shape[-1]
    S = initial_state if initial_state is not None else k.new_zeros(B, H, dk, dv)
    outputs, states = [], []
    for t in range(L):
        S = _delta_update(S, k[:, :, t], v[:, :, t], beta[:, :, t])
        outputs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, :, t]))    # S_t^T q_t: (B, H, dv)
        if return_states:
            states.append(S)
    o = torch.stack(outputs, dim=2)                                      # (B, H, L, dv)
    return (o, torch.stack(states, dim=2)) if return_states else (o, S)


def delta_rule_chunked(q, k, v, beta, chunk_size: int, initial_state=None, output_final_state: bool = True):
    """Chunkwise-parallel delta rule (WY representation via the UT transform).

    Inside a chunk of C tokens starting from state S0, unrolling the recurrence gives
        S_t = S0 + sum_{i<=t} k_i u_i^T,   u_i = beta_i (v_i - S_{i-1}^T k_i)
    and substituting S_{i-1} = S0 + sum_{j<i} k_j u_j^T:
        u_i + beta_i sum_{j<i} (k_i . k_j) u_j = beta_i (v_i - S0^T k_i).
    In matrix form, with A = I + strictly_lower(diag(beta) K K^T) (unit lower triangular, C x C),
        A Unew = diag(beta) V - diag(beta) K S0   =>   Unew = U - W S0,
        W = A^{-1} diag(beta) K,   U = A^{-1} diag(beta) V
    (W, U depend on the chunk only, so all chunks are solved at once). Then
        O      = Q S0 + tril(Q K^T) Unew        (tril including the diagonal: o_t = S_t^T q_t)
        S_next = S0 + K^T Unew
    and only this last, cheap (dk x dv) recurrence runs chunk by chunk. From the zero state
    (no ``initial_state``, first chunk) the terms in S0 vanish and are skipped, and the state is
    carried out of the last chunk only with ``output_final_state``: a sequence in one chunk (the
    training path at short lengths) then runs no state product at all, forward or backward.

    Returns (o, S_last): (B, H, L, dv), (B, H, dk, dv) (None without ``output_final_state``).
    """
    B, H, L, dk = k.shape
    dv = v.shape[-1]
    C = max(1, min(chunk_size, L))
    N = -(-L // C)                                                       # number of chunks
    pad = N * C - L
    if pad:
        # padded tokens have k = v = beta = 0: they leave the state unchanged; outputs dropped
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        beta = F.pad(beta, (0, pad))
    # (B, H, N, C, d): chunk n holds tokens n*C .. n*C + C-1
    q, k, v = (x.reshape(B, H, N, C, x.shape[-1]) for x in (q, k, v))
    beta = beta.reshape(B, H, N, C, 1)

    # UT transform for every chunk at once
    kb, vb = beta * k, beta * v                                          # diag(beta) K, diag(beta) V
    ones = torch.ones(C, C, dtype=torch.bool, device=k.device)
    lower, strict = torch.tril(ones), torch.tril(ones, diagonal=-1)      # j <= i, j < i
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    A = eye + (kb @ k.transpose(-1, -2)).masked_fill(~strict, 0)         # (B, H, N, C, C)
    # T = A^{-1} (C x C per chunk). Solving against the identity on a 3-d batch and then two
    # matmuls is much faster on CPU than solving against [kb, vb] with 5-d batch dims.
    # The solve runs in at least float32 (half types are not supported by it, and too coarse).
    solve_dtype = torch.promote_types(A.dtype, torch.float32)
    T = torch.linalg.solve_triangular(A.reshape(-1, C, C).to(solve_dtype),
                                      eye.to(solve_dtype).expand(B * H * N, C, C),
                                      upper=False, unitriangular=True)
    T = T.to(A.dtype).reshape(B, H, N, C, C)
    U = T @ vb                                                           # (.., C, dv)
    W = T @ kb if N > 1 or initial_state is not None else None           # (.., C, dk): some chunk reads S0
    causal = (q @ k.transpose(-1, -2)).masked_fill(~lower, 0)            # tril(Q K^T): (.., C, C)
    carry = N > 1 or output_final_state                                  # a chunk's end state is needed

    # carry the state across chunks (None: the zero state, nothing to read or to correct)
    S = initial_state
    outputs = []
    for n in range(N):
        if S is None:
            u = U[:, :, n]                                               # Unew = U: (B, H, C, dv)
            outputs.append(causal[:, :, n] @ u)
        else:
            u = U[:, :, n] - W[:, :, n] @ S                              # Unew: (B, H, C, dv)
            outputs.append(q[:, :, n] @ S + causal[:, :, n] @ u)         # (B, H, C, dv)
        if carry:
            written = k[:, :, n].transpose(-1, -2) @ u                   # (B, H, dk, dv)
            S = written if S is None else S + written
    o = torch.stack(outputs, dim=2).reshape(B, H, N * C, dv)[:, :, :L]
    return o, (S if output_final_state else None)


def delta_rule_transition(k, beta):
    """The homogeneous part of the delta rule, for carrying a state patch along
    (``rerun_from_patched_states``): it maps a state difference e to (I - beta_t k_t k_t^T) e.
    k: (B, H, L, dk); beta: (B, H, L); e: (B, H, dk, dv)."""

    def transition(t, e):
        k_t = k[:, :, t]                                                 # (B, H, dk)
        ke = torch.einsum("bhk,bhkv->bhv", k_t, e)                      # k^T e: (B, H, dv)
        return e - beta[:, :, t, None, None] * k_t[..., :, None] * ke[..., None, :]

    return transition


def _l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    # per-head unit vectors; eps inside the root keeps the gradient finite at x = 0
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


# --------------------------------------------------------------------------------------------
# the mixer
# --------------------------------------------------------------------------------------------

class DeltaNetMixer(nn.Module):
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
            self.q_conv1d = ShortConv(D, config.conv_kernel, bias=False)
            self.k_conv1d = ShortConv(D, config.conv_kernel, bias=False)
            self.v_conv1d = ShortConv(D, config.conv_kernel, bias=False)
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

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        # x: (B, L, D)
        B, L, D = x.shape
        H, d = self.num_heads, self.head_dim
        qkv, b = self._project(zero_padding(x, mask))                   # (B, L, 3D), (B, L, H)
        if self.use_short_conv:
            # the three convolutions as one over the concatenated channels (q, k, v)
            weight = torch.cat([self.q_conv1d.weight, self.k_conv1d.weight, self.v_conv1d.weight])
            qk, v = self.conv_output(F.silu(short_conv(qkv, weight))).split([2 * D, D], dim=-1)
        else:
            qk, v = qkv.split([2 * D, D], dim=-1)
            qk = F.silu(qk)
        beta = torch.sigmoid(b).transpose(1, 2)                          # (B, H, L)
        # q and k normalised per head at once: (B, L, 2H, d) -> (B, 2H, L, d)
        qk = _l2norm(qk.reshape(B, L, 2 * H, d)).transpose(1, 2)
        q, k, v = qk[:, :H], qk[:, H:], self._heads(v)                   # (B, H, L, d) each

        if self.state.wanted():
            # materialise S_t for every t so it can be read or patched
            _, states = delta_rule_recurrent(q, k, v, beta, return_states=True)
            states = states.transpose(1, 2)                              # (B, L, H, dk, dv)
            states = through_state_site(self.state, states, delta_rule_transition(k, beta))
            o = torch.einsum("blhkv,bhlk->bhlv", states, q)              # o_t = S_t^T q_t
        elif use_kernels("delta_net", self.kernels, x.device):
            # flash-linear-attention takes (B, L, H, d); scale 1 = this module's o_t = S_t^T q_t
            chunk_delta_rule = delta_rule_kernel()
            o, _ = chunk_delta_rule(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                    beta.transpose(1, 2), scale=1.0)
            o = o.transpose(1, 2)
        else:
            o, _ = delta_rule_chunked(q, k, v, beta, self.chunk_size, output_final_state=False)   # (B, H, L, dv)
        return self._out(o.transpose(1, 2))                              # (B, L, D)

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
        S = _delta_update(S, k, v, beta)                                 # (B, H, dk, dv)
        o = torch.einsum("bhkv,bhk->bhv", S, q)                          # (B, H, dv)
        return self._out(o), {"conv": conv, "S": S}


register_architecture(ArchitectureSpec(
    name="deltanet", config_class=DeltaNetConfig, mixers={"delta_net": DeltaNetMixer}, class_stem="DeltaNet",
    kernel_packages={"delta_net": ("fla",)}, tiny_config={"num_attention_heads": 2, "chunk_size": 4},
    test_variants=({"use_short_conv": False}, {"num_attention_heads": 1})))
