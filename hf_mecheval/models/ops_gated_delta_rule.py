"""The gated delta rule of Gated DeltaNet, Yang, Kautz & Hatamizadeh 2024 ("Gated Delta Networks:
Improving Mamba2 with Delta Rule").

Per head, with (L2-normalised) query and key q_t, k_t (dk), value v_t (dv), a write strength
beta_t in (0, 1) and a decay alpha_t = exp(g_t) in (0, 1], the state S_t (dk, dv) is a
key -> value memory that forgets everything by alpha_t and then replaces what k_t retrieves:

    S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    o_t = S_t^T q_t

(alpha = 1 is DeltaNet's delta rule, beta = 0 and k k^T dropped is Mamba-2's decay.)

Computations, tested against each other (values and gradients):

* :func:`gated_delta_rule_recurrent`: the loop over time (the readable reference; optionally
  returns the state trajectory, which the ``state`` site reads and patches);
* :func:`gated_delta_rule_chunked`: the chunkwise-parallel WY/UT form, DeltaNet's (Yang et al.
  2024, see ``mixer_deltanet.py``) with the cumulative decay folded in — the training path;
* :func:`gated_delta_rule_readout` and :func:`gated_delta_rule_transition`: outputs from a (patched)
  state trajectory, and the trajectory after a patch (the rule is linear in S: a difference e is
  carried as e_t = alpha_t (I - beta_t k_t k_t^T) e_{t-1}).

Shapes, as flash-linear-attention's kernels take them: q, k (batch, L, H, dk); v (batch, L, H, dv);
g (log decay, <= 0) and beta (batch, L, H); states (batch, H, dk, dv), trajectories
(batch, L, H, dk, dv).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F



def _step(S, q_t, k_t, v_t, g_t, beta_t):
    """One step. S (b, H, dk, dv); q_t, k_t (b, H, dk); v_t (b, H, dv); g_t, beta_t (b, H).
    Returns (S_t, o_t)."""
    S = torch.exp(g_t)[..., None, None] * S                          # forget: alpha_t S_{t-1}
    retrieved = torch.einsum("bhkv,bhk->bhv", S, k_t)                # what k_t reads now: S^T k
    delta = beta_t[..., None] * (v_t - retrieved)                    # (b, H, dv)
    S = S + k_t[..., :, None] * delta[..., None, :]                  # + k delta^T
    return S, torch.einsum("bhkv,bhk->bhv", S, q_t)                  # o_t = S_t^T q_t


def gated_delta_rule_recurrent(q, k, v, g, beta, initial_state=None, return_states: bool = False):
    """Reference: loop over time.

    Returns (o, S_last), o (batch, L, H, dv) and S_last (batch, H, dk, dv); with
    ``return_states`` (o, states) instead, states (batch, L, H, dk, dv) with states[:, t] = S_t,
    the state *after* step t (the one o_t reads).
    """
    b, L, H, dk = k.shape
    S = initial_state if initial_state is not None else k.new_zeros(b, H, dk, v.shape[-1])
    outputs, states = [], []
    for t in range(L):
        S, o_t = _step(S, q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t])
        outputs.append(o_t)
        if return_states:
            states.append(S)
    o = torch.stack(outputs, dim=1)                                  # (b, L, H, dv)
    return (o, torch.stack(states, dim=1)) if return_states else (o, S)


def gated_delta_rule_chunked(q, k, v, g, beta, chunk_size: int, initial_state=None,
                             output_final_state: bool = True):
    """Chunkwise-parallel gated delta rule (WY representation via the UT transform).

    Inside a chunk of C steps starting from S0, let gamma_t = g_1 + ... + g_t (the log decay from
    the chunk's start through step t) and Gamma_t = exp(gamma_t). Writing the update as
        S_t = alpha_t S_{t-1} + k_t u_t^T,    u_t = beta_t (v_t - alpha_t S_{t-1}^T k_t)
    and unrolling, S_t = Gamma_t S0 + sum_{i<=t} exp(gamma_t - gamma_i) k_i u_i^T, so that
        u_t + beta_t sum_{i<t} exp(gamma_t - gamma_i) (k_t . k_i) u_i = beta_t v_t - beta_t Gamma_t S0^T k_t.
    In matrix form, with A = I + strictly_lower(diag(beta) (K K^T * Dec)) (unit lower
    triangular, Dec_ti = exp(gamma_t - gamma_i)):
        U = T diag(beta) V - T diag(beta Gamma) K S0,   T = A^{-1}      (chunk-only: all at once)
        O      = diag(Gamma) Q S0 + (tril(Q K^T) * Dec) U    (tril with the diagonal: o_t reads S_t)
        S_next = Gamma_C S0 + (diag(exp(gamma_C - gamma)) K)^T U
    and only this last (dk x dv) update runs chunk by chunk. Every exponent is <= 0 (Dec is
    masked before the exp), so nothing overflows however strong the decay. Where a chunk starts
    from the zero state (the first, without ``initial_state``) the S0 terms are skipped, and the
    final state is only formed when asked for: a sequence that fits in one chunk (the tasks' 37
    tokens) costs the within-chunk part alone.

    Returns (o, S_last): (batch, L, H, dv), (batch, H, dk, dv) (None without ``output_final_state``).
    """
    b, L, H, dk = k.shape
    dv = v.shape[-1]
    C = max(1, min(chunk_size, L))
    N = -(-L // C)                                                   # number of chunks
    pad = N * C - L
    if pad:
        # padded steps have k = v = beta = 0 and g = 0 (no decay): the state is unchanged
        q, k, v = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (q, k, v))
        g, beta = (F.pad(t, (0, 0, 0, pad)) for t in (g, beta))
    # heads first, chunk n holds steps n*C .. n*C + C-1: (b, H, N, C, d) and (b, H, N, C)
    q, k, v = (t.reshape(b, N, C, H, t.shape[-1]).permute(0, 3, 1, 2, 4) for t in (q, k, v))
    g, beta = (t.reshape(b, N, C, H).permute(0, 3, 1, 2) for t in (g, beta))

    gamma = g.cumsum(-1)                                             # (b, H, N, C)
    ones = torch.ones(C, C, dtype=torch.bool, device=k.device)
    lower, strict = ones.tril(), ones.tril(-1)                       # i <= t, i < t
    decay = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")).exp()  # Dec

    # UT transform for every chunk at once
    kb = beta[..., None] * k                                         # diag(beta) K
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    A = eye + ((kb @ k.transpose(-1, -2)) * decay).masked_fill(~strict, 0)    # (b, H, N, C, C)
    # T = A^{-1}: solved against the identity on a 3-d batch, then matmuls (as in ops_delta_rule.py:
    # much faster on a CPU than solving against the right-hand sides with 5-d batch dims), in at
    # least float32
    solve_dtype = torch.promote_types(A.dtype, torch.float32)
    T = torch.linalg.solve_triangular(A.reshape(-1, C, C).to(solve_dtype),
                                      eye.to(solve_dtype).expand(b * H * N, C, C),
                                      upper=False, unitriangular=True)
    T = T.to(A.dtype).reshape(b, H, N, C, C)
    U = T @ (beta[..., None] * v)                                    # (.., C, dv)
    causal = (q @ k.transpose(-1, -2)) * decay                       # tril(Q K^T) * Dec: (.., C, C)
    if N > 1 or initial_state is not None:                           # some chunk reads a non-zero S0
        Gamma = gamma.exp()[..., None]                               # (b, H, N, C, 1)
        W = T @ (kb * Gamma)                                         # (.., C, dk)
        q_in = q * Gamma                                             # reads S0 decayed to step t
    carry = N > 1 or output_final_state                              # a chunk's end state is needed
    if carry:
        k_out = k * torch.exp(gamma[..., -1:] - gamma)[..., None]    # writes decayed to the chunk's end
        chunk_decay = gamma[..., -1].exp()[..., None, None]          # Gamma_C: (b, H, N, 1, 1)

    # carry the state across chunks (None: the zero state, nothing to read or to correct)
    S = initial_state
    outputs = []
    for n in range(N):
        if S is None:
            u = U[:, :, n]                                           # (b, H, C, dv)
            outputs.append(causal[:, :, n] @ u)
        else:
            u = U[:, :, n] - W[:, :, n] @ S                          # Unew
            outputs.append(q_in[:, :, n] @ S + causal[:, :, n] @ u)  # (b, H, C, dv)
        if carry:
            written = k_out[:, :, n].transpose(-1, -2) @ u           # (b, H, dk, dv)
            S = written if S is None else chunk_decay[:, :, n] * S + written
    o = torch.stack(outputs, dim=2).reshape(b, H, N * C, dv)[:, :, :L]
    return o.transpose(1, 2), (S if output_final_state else None)    # (b, L, H, dv)


def gated_delta_rule_readout(states, q):
    """o_t = S_t^T q_t from a state trajectory: states (batch, L, H, dk, dv), q (batch, L, H, dk)
    -> (batch, L, H, dv)."""
    return torch.einsum("blhkv,blhk->blhv", states, q)


def gated_delta_rule_transition(k, g, beta):
    """The homogeneous part of the rule, which carries a state patch to later positions
    (``sites.through_state_site``): it maps a state difference e (batch, H, dk, dv) at step t to
    alpha_t (I - beta_t k_t k_t^T) e. k (batch, L, H, dk); g, beta (batch, L, H)."""
    alpha = torch.exp(g)

    def transition(t, e):
        k_t = k[:, t]                                                # (b, H, dk)
        ke = torch.einsum("bhk,bhkv->bhv", k_t, e)                  # k^T e: (b, H, dv)
        e = e - beta[:, t, :, None, None] * k_t[..., :, None] * ke[..., None, :]
        return alpha[:, t, :, None, None] * e

    return transition
