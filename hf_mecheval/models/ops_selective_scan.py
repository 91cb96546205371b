"""Mamba's selective scan (the math of ``mixer_mamba.py``): a readable reference and the fast
forms with hand-written backward loops over time.

    h_t = exp(dt_t A) * h_{t-1} + dt_t B_t x_t        h: (B, E, N), A (E, N)
    y_t = C_t · h_t

* :func:`selective_scan_reference`: the recurrence as written, autograd through it.
* :func:`selective_scan` (``SelectiveScan``): forward and backward loops in place on reused
  buffers (``ScanWorkspace``), no per-step autograd graph: at these lengths the fastest PyTorch
  form on a CPU.
* :func:`linear_scan` (``LinearScan``): the scan of given decays and inputs, used where the state
  trajectory is wanted (an output a state Site may patch).
* :func:`selective_scan_at` (``SelectiveScanAt``): y at kept positions only, in closed form (the
  answer-only training path of the last layer).

The compiled CPU form (``cpu_kernels.py``, ``selective_scan_cpu.cpp``) sits outside this file so
that a checkpoint's copy of the code, which cannot carry C++ source, keeps this PyTorch path.

Each has a vmap rule (stacked runs). Tested against the reference in ``tests/models/test_mamba_scan.py``.
"""
from __future__ import annotations

import torch

from .mixers import at_positions, fold_copies


def selective_scan_reference(x, dt, A, B, C):
    """The readable reference: h_t = exp(dt_t A) h_{t-1} + dt_t B_t x_t, y_t = C_t · h_t.

    x, dt: (B, L, E); A: (E, N); B, C: (B, L, N) -> y (B, L, E), states (B, L, E, N)."""
    h = x.new_zeros(x.shape[0], *A.shape)
    states = []
    for t in range(x.shape[1]):
        h = torch.exp(dt[:, t, :, None] * A) * h + (dt[:, t] * x[:, t])[..., None] * B[:, t, None, :]
        states.append(h)
    H = torch.stack(states, dim=1)
    return (H * C[:, :, None, :]).sum(-1), H


class LinearScan(torch.autograd.Function):
    """H_t = dA_t * H_{t-1} + dBx_t (H_{-1} = 0) over dim 1. dA, dBx: (B, L, E, N) -> H (B, L, E, N).
    Used where the state trajectory is wanted (it is an output that a Site may patch)."""

    @staticmethod
    def forward(ctx, dA: torch.Tensor, dBx: torch.Tensor) -> torch.Tensor:
        H = _scan(dBx.clone(), dA)
        ctx.save_for_backward(dA, H)
        return H

    @staticmethod
    def backward(ctx, grad_H: torch.Tensor):
        dA, H = ctx.saved_tensors
        G = _reverse_scan(grad_H.clone(), dA)
        grad_dA = torch.zeros_like(dA)
        torch.mul(G[:, 1:], H[:, :-1], out=grad_dA[:, 1:])   # dA_0 multiplies H_{-1} = 0
        return grad_dA, G


def linear_scan(dA: torch.Tensor, dBx: torch.Tensor) -> torch.Tensor:
    """``LinearScan``; without gradients (interventions) it scans in place in ``dBx``, a temporary
    of the caller's: one (B, L, E, N) copy fewer."""
    if torch.is_grad_enabled() and (dA.requires_grad or dBx.requires_grad):
        return LinearScan.apply(dA, dBx)
    return _scan(dBx, dA)


def _scan(H: torch.Tensor, dA: torch.Tensor) -> torch.Tensor:
    """In place: H_t += dA_t * H_{t-1}, from the start (H holds dBx on entry, the states on exit)."""
    for t in range(1, H.shape[1]):
        H[:, t].addcmul_(dA[:, t], H[:, t - 1])
    return H


def _reverse_scan(G: torch.Tensor, dA: torch.Tensor) -> torch.Tensor:
    """In place: G_t += dA_{t+1} * G_{t+1}, from the end (dLoss/dH_t through every later step)."""
    for t in range(G.shape[1] - 2, -1, -1):
        G[:, t].addcmul_(dA[:, t + 1], G[:, t + 1])
    return G


class ScanWorkspace:
    """Big (B, L, N, E) buffers kept between calls: allocating ~40 MB tensors afresh every step
    costs page faults that can double a step's time on a CPU. Buffers are kept per shape (the
    intervention engine alternates batch sizes), the most recent few only. A buffer set is reused
    only once the backward pass that needed it has run (``busy``); otherwise fresh memory is used."""

    KEEP = 4   # training: dA, H, G, T of one shape; interventions: dA, H of two batch sizes

    def __init__(self):
        self.buffers: dict[tuple, torch.Tensor] = {}
        self.busy = False

    def get(self, name: str, shape, like: torch.Tensor) -> torch.Tensor:
        key = (name, tuple(shape), like.dtype, like.device)
        buf = self.buffers.pop(key, None)
        if buf is None:
            buf = like.new_empty(shape)
        self.buffers[key] = buf                       # most recently used last
        while len(self.buffers) > self.KEEP:
            self.buffers.pop(next(iter(self.buffers)))
        return buf


class SelectiveScan(torch.autograd.Function):
    """Fused training path: y = selective_scan_reference(x, dt, A, B, C)[0], with hand-written
    forward and backward that touch each big tensor as few times as possible, write into reused
    buffers, and keep no per-step autograd graph. Tested against the reference (values and
    gradients).

    Internally the state is laid out (B, L, N, E), channels innermost: contractions over the state
    dimension N are matmuls with contiguous operands, never batched products of tiny matrices.

    A is (E, N), shared by every row, or (B, E, N), one per row: under ``torch.func.vmap`` (stacked
    copies, each with its own A) the ``vmap`` rule folds the copies into the rows and calls the
    same kernel. Use ``selective_scan`` rather than ``apply`` (it returns y only).
    """

    @staticmethod
    def forward(x, dt, A, B, C, workspace: ScanWorkspace | None = None):
        # x, dt: (B, L, E); A: (E, N) or (B, E, N); B, C: (B, L, N). workspace: None = fresh memory
        shape = (x.shape[0], x.shape[1], A.shape[-1], A.shape[-2])
        dA = workspace.get("dA", shape, x) if workspace is not None else x.new_empty(shape)
        H = workspace.get("H", shape, x) if workspace is not None else x.new_empty(shape)
        dtx = dt * x
        torch.mul(dt[:, :, None, :], _state_major(A), out=dA).exp_()             # exp(dt A)
        _scan(torch.mul(B[..., None], dtx[:, :, None, :], out=H), dA)           # dt B x, scanned in place
        y = (C[:, :, None, :] @ H)[:, :, 0]                                     # (B, L, E)
        return y, dtx, dA, H

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dt, A, B, C, workspace = inputs
        y, dtx, dA, H = output
        ctx.mark_non_differentiable(dtx, dA, H)
        ctx.set_materialize_grads(False)     # else autograd fills zero gradients for dtx, dA, H
        ctx.save_for_backward(x, dt, A, B, C, dtx, dA, H)
        ctx.workspace = workspace

    @staticmethod
    def backward(ctx, gy, *unused):
        x, dt, A, B, C, dtx, dA, H = ctx.saved_tensors
        ws = ctx.workspace
        if ws is not None:                   # no forward runs during this backward: lend them again
            ws.busy = False
        if gy is None:                       # y did not reach the loss
            return None, None, None, None, None, None
        gy = gy.contiguous()
        G = ws.get("G", H.shape, H) if ws is not None else torch.empty_like(H)
        T = ws.get("T", H.shape, H) if ws is not None else torch.empty_like(H)
        grad_C = torch.mul(H, gy[:, :, None, :], out=T).sum(-1)                # (B, L, N)
        torch.mul(C[..., None], gy[:, :, None, :], out=G)
        _reverse_scan(G, dA)                                                    # dL/dH, (B, L, N, E)
        grad_B = torch.mul(G, dtx[:, :, None, :], out=T).sum(-1)               # (B, L, N)
        grad_dtx = (B[:, :, None, :] @ G)[:, :, 0]                             # (B, L, E)
        # dL/d(dt A)_t = G_t * H_{t-1} * dA_t (zero at t = 0), in G's memory
        G[:, 1:].mul_(H[:, :-1]).mul_(dA[:, 1:])
        G[:, 0].zero_()
        grad_dt = grad_dtx * x + torch.mul(G, _state_major(A), out=T).sum(2)   # (B, L, E)
        grad_A = _sum_to_decays(torch.mul(G, dt[:, :, None, :], out=T), A)
        return grad_dtx * dt, grad_dt, grad_A, grad_B, grad_C, None

    @staticmethod
    def vmap(info, in_dims, x, dt, A, B, C, workspace):
        K = info.batch_size
        x, dt, B, C = fold_copies(K, (x, dt, B, C), (in_dims[0], in_dims[1], in_dims[3], in_dims[4]))
        b = x.shape[0] // K                                                     # rows per copy
        out = SelectiveScan.apply(x, dt, _row_decays(A, in_dims[2], K, b), B, C, workspace)
        return tuple(o.view(K, b, *o.shape[1:]) for o in out), (0, 0, 0, 0)


def _row_decays(A: torch.Tensor, dim, K: int, b: int) -> torch.Tensor:
    """A (E, N) of each of K copies -> one A per folded row, (K*b, E, N)."""
    A = A.movedim(dim, 0) if dim is not None else A.expand(K, *A.shape)
    return A.repeat_interleave(b, dim=0)


def _state_major(A: torch.Tensor, ndim: int = 4) -> torch.Tensor:
    """A (E, N) -> (N, E); per-row A (B, E, N) -> (B, 1, ..., N, E): broadcastable against an
    ndim-dimensional (B, ..., N, E) tensor. Always contiguous: broadcasting the transposed view
    ``A.T`` over a (B, L, N, E) tensor took ~6x as long on a CPU (a strided inner loop) as
    broadcasting a contiguous copy, and the copy is only N * E numbers."""
    if A.dim() == 2:
        return A.T.contiguous()
    return A.transpose(1, 2).contiguous().reshape(A.shape[0], *[1] * (ndim - 3), A.shape[2], A.shape[1])


def _sum_to_decays(T: torch.Tensor, A: torch.Tensor) -> torch.Tensor:
    """Gradient terms T (B, ..., N, E) summed to A's shape: (E, N), or (B, E, N) per row."""
    if A.dim() == 2:
        return T.sum(tuple(range(T.dim() - 2))).T
    return T.sum(tuple(range(1, T.dim() - 2))).transpose(1, 2)


def selective_scan(x, dt, A, B, C, workspace: ScanWorkspace | None = None) -> torch.Tensor:
    """y (B, L, E) of the fused scan; reuses the workspace's buffers unless a backward still needs them."""
    return _with_workspace(SelectiveScan, workspace, x, dt, A, B, C)


def _with_workspace(function, workspace: ScanWorkspace | None, *inputs) -> torch.Tensor:
    """function.apply(*inputs, workspace)[0], lending the workspace's buffers only when no pending
    backward still needs them, and marking them taken until this call's backward has run (which
    frees them). An output that is never backpropagated leaves them taken: later calls then use
    fresh memory, which is slower but safe. (Grad mode is off inside ``setup_context``, so the
    decision is made here.) Inputs in a lower precision are scanned in float32; y comes back in
    x's dtype."""
    reuse = workspace is not None and not workspace.busy
    dtype = inputs[0].dtype
    inputs = in_scan_precision(inputs)
    out = function.apply(*inputs, workspace if reuse else None)[0]
    if reuse and torch.is_grad_enabled() and any(t.requires_grad for t in inputs if torch.is_tensor(t)):
        workspace.busy = True
    return out.to(dtype)


def in_scan_precision(inputs: tuple) -> tuple:
    """The scan's inputs, in float32 where any is in a lower precision (e.g. under autocast): the
    scan itself runs in float32, as mamba-ssm's does."""
    if any(t.is_floating_point() and t.dtype.itemsize < 4 for t in inputs):
        return tuple(t.float() if t.is_floating_point() else t for t in inputs)
    return inputs


class SelectiveScanAt(torch.autograd.Function):
    """y of the selective scan at kept positions only, (B, k, E) — the last layer on the
    answer-only training path, where nothing reads the states. No sequential scan: the decays
    between s and p telescope, prod_{r=s+1..p} exp(dt_r A) = exp(R_ps A) with
    R_ps = sum_{s<r<=p} dt_r, so

        y_p = sum_{s<=p} sum_n C_p[n] exp(R_ps A[:, n]) B_s[n] dt_s x_s        (E,)

    computed over one (B, k, L, N, E) tensor W = exp(R A) in a reused buffer, with a hand-written
    backward. ~1.4x faster than the scan of the whole sequence on a CPU (the exp of W is most of
    what is left). Tested against the reference (values and gradients)."""

    @staticmethod
    def forward(x, dt, A, B, C, keep, workspace: ScanWorkspace | None = None):
        # x, dt: (B, L, E); A: (E, N) or (B, E, N); B, C: (B, L, N); keep: (B, k) positions
        L, N = x.shape[1], B.shape[-1]
        valid = (torch.arange(L, device=x.device) <= keep[..., None]).to(x.dtype)   # (B, k, L): s <= p
        dt_in = dt[:, None] * valid[..., None]                                  # (B, k, L, E)
        R = torch.zeros_like(dt_in)
        R[:, :, :-1] = dt_in.flip(2).cumsum(2).flip(2)[:, :, 1:]                # sum_{s<r<=p} dt_r
        shape = (*R.shape[:3], N, x.shape[2])
        W = workspace.get("W", shape, x) if workspace is not None else x.new_empty(shape)
        torch.mul(R[:, :, :, None, :], _state_major(A, 5), out=W).exp_()        # (B, k, L, N, E)
        u = at_positions(C, keep)[:, :, None, :] * B[:, None] * valid[..., None]   # C_p B_s, (B, k, L, N)
        inner = (u[..., None, :] @ W)[..., 0, :]                                # (B, k, L, E)
        dtx = dt * x
        return (inner * dtx[:, None]).sum(2), valid, R, W, u, inner, dtx        # y: (B, k, E)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, dt, A, B, C, keep, workspace = inputs
        ctx.mark_non_differentiable(*output[1:])
        ctx.set_materialize_grads(False)
        ctx.save_for_backward(x, dt, A, B, C, keep, *output[1:])
        ctx.workspace = workspace

    @staticmethod
    def backward(ctx, gy, *unused):
        x, dt, A, B, C, keep, valid, R, W, u, inner, dtx = ctx.saved_tensors
        ws = ctx.workspace
        if ws is not None:
            ws.busy = False
        if gy is None:
            return (None,) * 7
        g_inner = gy[:, :, None, :] * dtx[:, None]                              # (B, k, L, E)
        grad_dtx = (gy[:, :, None, :] * inner).sum(1)                           # (B, L, E)
        T = ws.get("T", W.shape, W) if ws is not None else torch.empty_like(W)
        grad_u = torch.mul(W, g_inner[..., None, :], out=T).sum(-1)             # (B, k, L, N)
        # dL/d(R A) = W * u * g_inner: summed over n with A for R, over rows with R for A
        grad_R = (u[..., None, :] @ torch.mul(W, _state_major(A, 5), out=T))[..., 0, :] * g_inner
        torch.mul(W, (g_inner * R)[..., None, :], out=T).mul_(u[..., None])
        grad_A = _sum_to_decays(T, A)
        # R_s = sum_{s<r<=p} dt_r, so dt_r receives the gradient of every R_s with s < r
        grad_dt_in = torch.zeros_like(grad_R)
        grad_dt_in[:, :, 1:] = grad_R.cumsum(2)[:, :, :-1]
        grad_dt = (grad_dt_in * valid[..., None]).sum(1) + grad_dtx * x
        grad_u = grad_u * valid[..., None]
        C_p = at_positions(C, keep)                                             # (B, k, N)
        grad_B = (grad_u * C_p[:, :, None, :]).sum(1)                           # (B, L, N)
        grad_C = torch.zeros_like(C).scatter_add_(1, keep[..., None].expand(-1, -1, C.shape[-1]),
                                                  (grad_u * B[:, None]).sum(2))
        return grad_dtx * dt, grad_dt, grad_A, grad_B, grad_C, None, None

    @staticmethod
    def vmap(info, in_dims, x, dt, A, B, C, keep, workspace):
        K = info.batch_size
        x, dt, B, C, keep = fold_copies(K, (x, dt, B, C, keep), (*in_dims[:2], *in_dims[3:6]))
        b = x.shape[0] // K                                                     # rows per copy
        out = SelectiveScanAt.apply(x, dt, _row_decays(A, in_dims[2], K, b), B, C, keep, workspace)
        return tuple(o.view(K, b, *o.shape[1:]) for o in out), (0,) * 7


def selective_scan_at(x, dt, A, B, C, keep, workspace: ScanWorkspace | None = None) -> torch.Tensor:
    """y (B, k, E) at the kept positions (B, k), as ``selective_scan(...)`` gathered there."""
    return _with_workspace(SelectiveScanAt, workspace, x, dt, A, B, C, keep)
