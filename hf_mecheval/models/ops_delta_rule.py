"""The delta rule (the math of ``mixer_deltanet.py``): a readable recurrent reference, the
chunked (WY) form the training path runs, and the transition through which a patched state is
carried on (``sites.through_state_site``). Tested against each other in
``tests/models/test_deltanet.py``.
"""
from __future__ import annotations

import torch
from torch.nn import functional as F


# --------------------------------------------------------------------------------------------
# the delta rule, three ways. Shapes: q, k (B, H, L, dk); v (B, H, L, dv); beta (B, H, L);
# states (B, H, dk, dv).
# --------------------------------------------------------------------------------------------

def delta_rule_step(S: torch.Tensor, k_t: torch.Tensor, v_t: torch.Tensor, beta_t: torch.Tensor) -> torch.Tensor:
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
        S = delta_rule_step(S, k[:, :, t], v[:, :, t], beta[:, :, t])
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
