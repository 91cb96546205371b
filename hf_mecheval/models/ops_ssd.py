"""Mamba-2's selective SSM with a scalar decay per head: state-space duality (SSD), Dao & Gu 2024
("Transformers are SSMs: Generalized Models and Efficient Algorithms Through Structured State
Space Duality").

Per head h (head size P, state size N), with a step size dt_t > 0 and a decay rate A_h < 0:

    h_t = exp(dt_t A_h) h_{t-1} + dt_t x_t B_t^T         h_t: (P, N); x_t: (P,); B_t, C_t: (N,)
    y_t = h_t C_t + D_h x_t

B and C are shared by the heads of a group (``G`` groups; head h reads group h // (H / G)).
Because the decay is one scalar per head and step, unrolling gives a masked attention:

    y_t = sum_{s<=t} exp(a_{s+1} + ... + a_t) (C_t . B_s) dt_s x_s + D_h x_t,   a_r = dt_r A_h

Computations, tested against each other (values and gradients):

* :func:`ssd_recurrent`: the loop over time (the readable reference; optionally returns the
  state trajectory, which the ``state`` site reads and patches);
* :func:`ssd_chunked`: the SSD algorithm: the attention form (quadratic) inside chunks of
  ``chunk_size`` steps, the recurrence only across chunks, once per chunk — the training path;
* :func:`ssd_at`: y at a few positions per row only (the answer-only training path), the
  attention form restricted to those rows;
* :func:`ssd_readout` and :func:`ssd_transition`: outputs from a (patched) state trajectory, and the
  trajectory after a patch (the recurrence is linear in h: a difference e is carried as
  e_t = exp(dt_t A) e_{t-1}).

Shapes: x (batch, L, H, P); dt (batch, L, H), already positive (softplus applied by the caller);
A (H,), negative; B, C (batch, L, G, N); D (H,) or None; states (batch, H, P, N), trajectories
(batch, L, H, P, N).
"""
from __future__ import annotations

import torch
from torch.nn import functional as F



def _per_head(t: torch.Tensor, H: int) -> torch.Tensor:
    """(..., G, N) group-shared B or C -> (..., H, N), one per head (head h reads group h // (H/G))."""
    return t.repeat_interleave(H // t.shape[-2], dim=-2)


def _gather(t: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """t (batch, L, ...) at positions (batch, k) -> (batch, k, ...)."""
    index = positions.reshape(*positions.shape, *[1] * (t.dim() - 2)).expand(-1, -1, *t.shape[2:])
    return t.gather(1, index)


def ssd_recurrent(x, dt, A, B, C, D=None, initial_state=None, return_states: bool = False):
    """Reference: loop over time.

    Returns (y, h_last), y (batch, L, H, P) and h_last (batch, H, P, N); with ``return_states``
    (y, states) instead, states (batch, L, H, P, N) with states[:, t] = h_t, the state *after*
    step t (the one y_t reads).
    """
    b, L, H, P = x.shape
    Bh, Ch = _per_head(B, H), _per_head(C, H)                       # (b, L, H, N)
    decay = torch.exp(dt * A)                                        # exp(dt_t A_h), (b, L, H)
    h = initial_state if initial_state is not None else x.new_zeros(b, H, P, B.shape[-1])
    ys, states = [], []
    for t in range(L):
        write = (dt[:, t, :, None] * x[:, t])[..., :, None] * Bh[:, t, :, None, :]   # dt x B^T: (b, H, P, N)
        h = decay[:, t, :, None, None] * h + write
        ys.append((h @ Ch[:, t, :, :, None])[..., 0])               # h_t C_t: (b, H, P)
        if return_states:
            states.append(h)
    y = torch.stack(ys, dim=1)                                       # (b, L, H, P)
    if D is not None:
        y = y + D[:, None] * x
    return (y, torch.stack(states, dim=1)) if return_states else (y, h)


def ssd_chunked(x, dt, A, B, C, chunk_size: int, D=None, initial_state=None, output_final_state: bool = True):
    """The SSD algorithm: attention form within chunks, recurrence across chunks.

    Inside a chunk starting from state h0, with gamma_t = a_1 + ... + a_t (log decay from the
    chunk's start through step t, cumulative within the chunk):

        y_t     = sum_{s<=t} exp(gamma_t - gamma_s) (C_t . B_s) dt_s x_s   +  exp(gamma_t) h0 C_t
        h_end   = exp(gamma_C) h0 + sum_s exp(gamma_C - gamma_s) dt_s x_s B_s^T

    The first term is a masked matmul per chunk (all chunks at once), C_t . B_s is computed once
    per group and shared by its heads; only h0 -> h_end, a (P, N) update, runs chunk by chunk.
    Every exponent is <= 0 (the mask is applied before the exp), so nothing overflows. The h0
    terms are skipped where every chunk starts from zero (one chunk, no ``initial_state``), and
    the final state is only formed when asked for.

    Returns (y, h_last): (batch, L, H, P), (batch, H, P, N) (None without ``output_final_state``).
    """
    b, L, H, P = x.shape
    G, N = B.shape[-2:]
    Cn = max(1, min(chunk_size, L))                                  # steps per chunk
    nc = -(-L // Cn)                                                 # number of chunks
    pad = nc * Cn - L
    xdt = x * dt[..., None]                                          # what step s writes: dt_s x_s
    a = dt * A                                                       # log decay of each step, (b, L, H)
    if pad:
        # padded steps write nothing (xdt = 0) and keep the state (a = 0); their outputs are dropped
        xdt, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (xdt, B, C))
        a = F.pad(a, (0, 0, 0, pad))
    # chunk n holds steps n*Cn .. n*Cn + Cn-1; heads first, split (G, H/G) by the B, C they read
    xdt = xdt.reshape(b, nc, Cn, G, H // G, P).permute(0, 3, 4, 1, 2, 5)      # (b, G, H/G, nc, Cn, P)
    a = a.reshape(b, nc, Cn, G, H // G).permute(0, 3, 4, 1, 2)                # (b, G, H/G, nc, Cn)
    Bc, Cc = (t.reshape(b, nc, Cn, G, N).permute(0, 3, 1, 2, 4)[:, :, None]   # (b, G, 1, nc, Cn, N)
              for t in (B, C))

    gamma = a.cumsum(-1)                                             # (b, G, H/G, nc, Cn)
    lower = torch.ones(Cn, Cn, dtype=torch.bool, device=x.device).tril()      # s <= t
    segment = (gamma[..., :, None] - gamma[..., None, :]).masked_fill(~lower, float("-inf")).exp()
    scores = Cc @ Bc.transpose(-1, -2)                               # C_t . B_s: (b, G, 1, nc, Cn, Cn)
    y = (segment * scores) @ xdt                                     # within chunks: (b, G, H/G, nc, Cn, P)

    # the state carried from chunk to chunk (None: the zero state)
    h = initial_state.unflatten(1, (G, H // G)) if initial_state is not None else None
    carry = nc > 1 or output_final_state                             # a chunk's end state is needed
    if carry:
        to_end = torch.exp(gamma[..., -1:] - gamma)                  # decay from step s to the chunk's end
        written = (xdt * to_end[..., None]).transpose(-1, -2) @ Bc   # what a chunk adds: (b, G, H/G, nc, P, N)
        chunk_decay = torch.exp(gamma[..., -1])[..., None, None]     # (b, G, H/G, nc, 1, 1)
    starts = []
    for n in range(nc):
        starts.append(h)
        if carry:
            h = written[..., n, :, :] if h is None else chunk_decay[..., n, :, :] * h + written[..., n, :, :]
    if nc > 1 or initial_state is not None:                          # some chunk starts from h0 != 0
        zero = x.new_zeros(b, G, H // G, P, N)
        starts = torch.stack([zero if s is None else s for s in starts], dim=3)   # (b, G, H/G, nc, P, N)
        y = y + torch.exp(gamma)[..., None] * (Cc @ starts.transpose(-1, -2))    # exp(gamma_t) h0 C_t
    y = y.permute(0, 3, 4, 1, 2, 5).reshape(b, nc * Cn, H, P)[:, :L]
    if D is not None:
        y = y + D[:, None] * x
    return y, (h.flatten(1, 2) if output_final_state else None)


def ssd_at(x, dt, A, B, C, keep, D=None):
    """y at the kept positions only: ``ssd_chunked(...)[0]`` gathered at keep (batch, k).

    For a kept position p nothing reads the states, so the attention form is used for row p only:
        y_p = sum_{s<=p} exp(R_ps) (C_p . B_s) dt_s x_s + D x_p,   R_ps = sum_{s<r<=p} a_r
    with R summed from p backwards (the recent decays, which weigh most, are then exact).
    Costs (batch, k, L, H) instead of the chunks' (batch, H, L, chunk). Returns (batch, k, H, P).
    """
    b, L, H, P = x.shape
    valid = torch.arange(L, device=x.device) <= keep[..., None]     # s <= p: (b, k, L)
    a = (dt * A)[:, None] * valid[..., None]                         # steps up to p only: (b, k, L, H)
    through_p = a.flip(2).cumsum(2).flip(2)                          # sum_{s<=r<=p} a_r
    R = F.pad(through_p[:, :, 1:], (0, 0, 0, 1))                     # sum_{s<r<=p} a_r (0 for s >= p)
    decay = R.exp() * valid[..., None]                               # (b, k, L, H); 0 after p
    scores = torch.einsum("bkgn,blgn->bklg", _gather(C, keep), B)   # C_p . B_s per group
    weights = decay * _per_head(scores[..., None], H)[..., 0]       # (b, k, L, H)
    y = torch.einsum("bklh,blhp->bkhp", weights, x * dt[..., None])
    if D is not None:
        y = y + D[:, None] * _gather(x, keep)
    return y


def ssd_readout(states, C, x=None, D=None):
    """Outputs from a state trajectory: y_t = h_t C_t (+ D x_t). states (batch, L, H, P, N),
    C (batch, L, G, N), x (batch, L, H, P) -> (batch, L, H, P)."""
    y = (states @ _per_head(C, states.shape[2])[..., None])[..., 0]
    if D is not None:
        y = y + D[:, None] * x
    return y


def ssd_transition(dt, A):
    """The homogeneous part of the recurrence, which carries a state patch to later positions
    (``sites.through_state_site``): it maps a state difference e (batch, H, P, N) at step t to
    exp(dt_t A) e. dt (batch, L, H); A (H,)."""
    decay = torch.exp(dt * A)[..., None, None]                       # (b, L, H, 1, 1)
    return lambda t, e: decay[:, t] * e
