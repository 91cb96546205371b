"""The fused selective scan, its answer-position form and the state-path scan against the
readable reference."""
import torch

from hf_mecheval.models import build_model
from hf_mecheval.models.ops_selective_scan import (LinearScan, ScanWorkspace, selective_scan, selective_scan_at,
                                                   selective_scan_reference)


def inputs(seed=0, B=3, L=9, E=5, N=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, E, generator=g, dtype=torch.float64)
    dt = torch.rand(B, L, E, generator=g, dtype=torch.float64) * 0.5
    A = -torch.rand(E, N, generator=g, dtype=torch.float64) * 3
    Bm = torch.randn(B, L, N, generator=g, dtype=torch.float64)
    C = torch.randn(B, L, N, generator=g, dtype=torch.float64)
    return [t.requires_grad_() for t in (x, dt, A, Bm, C)]


def assert_same_values_and_gradients(fast, reference, seed):
    """fast(*inputs) and reference(*inputs) agree, and so do the gradients of every input."""
    a, b = inputs(seed), inputs(seed)
    y_ref, y = reference(*a), fast(*b)
    assert torch.allclose(y, y_ref, atol=1e-12)
    w = torch.randn_like(y)
    (y_ref * w).sum().backward()
    (y * w).sum().backward()
    for p, q in zip(a, b):
        assert torch.allclose(p.grad, q.grad, atol=1e-10)


def test_fused_scan_matches_reference_values_and_gradients():
    assert torch.autograd.gradcheck(selective_scan, inputs())
    assert_same_values_and_gradients(selective_scan, lambda *t: selective_scan_reference(*t)[0], seed=1)


def test_fused_scan_with_one_A_per_row_and_under_vmap():
    # per-row A (stacked copies folded into rows) equals running each row with its own A
    x, dt, A, Bm, C = inputs(3)
    A_rows = (A[None] * torch.tensor([1.0, 0.5, 2.0], dtype=A.dtype)[:, None, None]).detach().requires_grad_()
    assert torch.autograd.gradcheck(selective_scan, (x, dt, A_rows, Bm, C))
    y = selective_scan(x, dt, A_rows, Bm, C)
    for r in range(3):
        y_r, _ = selective_scan_reference(x[r:r + 1], dt[r:r + 1], A_rows[r], Bm[r:r + 1], C[r:r + 1])
        assert torch.allclose(y[r:r + 1], y_r, atol=1e-12)
    # vmap over K = 2 copies (A batched, inputs batched or shared) equals a loop over the copies
    K_A = torch.stack([A.detach(), 0.3 * A.detach()]).requires_grad_()
    K_x = torch.stack([x.detach(), x.detach().flip(0)]).requires_grad_()
    ys = torch.func.vmap(selective_scan, in_dims=(0, None, 0, None, None))(K_x, dt, K_A, Bm, C)
    w = torch.randn_like(ys)
    (ys * w).sum().backward()
    for k in range(2):
        a = K_A.detach()[k].clone().requires_grad_()
        xk = K_x.detach()[k].clone().requires_grad_()
        y_k, _ = selective_scan_reference(xk, dt, a, Bm, C)
        (y_k * w[k]).sum().backward()
        assert torch.allclose(ys[k], y_k, atol=1e-12)
        assert torch.allclose(K_A.grad[k], a.grad, atol=1e-10) and torch.allclose(K_x.grad[k], xk.grad, atol=1e-10)


def _at(y, keep):
    return y.gather(1, keep[..., None].expand(-1, -1, y.shape[-1]))


def test_scan_at_kept_positions_matches_reference_values_and_gradients():
    # per-row positions, two per row (one of them the first position), in any order
    keep = torch.tensor([[8, 3], [0, 5], [6, 6]])
    assert torch.autograd.gradcheck(lambda *t: selective_scan_at(*t, keep), inputs(4))
    assert_same_values_and_gradients(lambda *t: selective_scan_at(*t, keep, ScanWorkspace()),
                                     lambda *t: _at(selective_scan_reference(*t)[0], keep), seed=5)


def test_scan_at_kept_positions_under_vmap():
    x, dt, A, Bm, C = (t.detach() for t in inputs(6))
    keep = torch.tensor([[8], [2], [5]])
    K_A = torch.stack([A, 0.3 * A]).requires_grad_()
    K_B = torch.stack([Bm, -Bm]).requires_grad_()
    ys = torch.func.vmap(selective_scan_at, in_dims=(None, None, 0, 0, None, None))(x, dt, K_A, K_B, C, keep)
    w = torch.randn_like(ys)
    (ys * w).sum().backward()
    for k in range(2):
        a, bk = K_A.detach()[k].clone().requires_grad_(), K_B.detach()[k].clone().requires_grad_()
        y_k = _at(selective_scan_reference(x, dt, a, bk, C)[0], keep)
        (y_k * w[k]).sum().backward()
        assert torch.allclose(ys[k], y_k, atol=1e-12)
        assert torch.allclose(K_A.grad[k], a.grad, atol=1e-10) and torch.allclose(K_B.grad[k], bk.grad, atol=1e-10)


def test_linear_scan_gradcheck():
    x, dt, A, Bm, _ = inputs(2)
    dA = torch.exp(dt[..., None] * A).detach().requires_grad_()
    dBx = ((dt * x)[..., None] * Bm[:, :, None, :]).detach().requires_grad_()
    assert torch.autograd.gradcheck(LinearScan.apply, (dA, dBx))


def test_state_path_equals_fused_path():
    torch.manual_seed(0)
    model = build_model("mamba", vocab_size=11, hidden_size=8, d_state=4).double().eval()
    ids = torch.randint(3, 11, (2, 10))
    fast = model(ids).logits
    model.materialize_sites(True)
    slow = model(ids).logits
    assert torch.allclose(fast, slow, atol=1e-10)


def test_state_patch_propagates_forward_only():
    torch.manual_seed(0)
    model = build_model("mamba", vocab_size=11, hidden_size=8, d_state=4, num_hidden_layers=1).double().eval()
    ids = torch.randint(3, 11, (2, 10))
    clean = model(ids).logits
    p = 4

    def patch(module, args, out):
        out = out.clone()
        out[:, p] += 1.0
        return out

    handle = model.get_site("layers.0.mixer.state").register_forward_hook(patch)
    patched = model(ids).logits
    handle.remove()
    assert torch.allclose(patched[:, :p], clean[:, :p], atol=1e-12)
    assert ((patched - clean)[:, p:].abs().amax(-1) > 1e-9).all()    # every later position moves


def tiny_mamba_batch():
    """A 2-layer Mamba and a batch with one answer label per row (the training path)."""
    torch.manual_seed(0)
    model = build_model("mamba", vocab_size=11, hidden_size=8, d_state=4, num_hidden_layers=2, kernels="torch")
    ids = torch.randint(3, 11, (2, 10))
    labels = torch.full_like(ids, -100)
    labels[:, -1] = ids[:, -1]
    return model, ids, labels


def test_buffers_needed_by_a_pending_backward_are_never_reused():
    # a second forward (with or without grad) before the first one's backward must not write into
    # the buffers that backward reads; the gradients equal those of a lone forward and backward
    model, ids, labels = tiny_mamba_batch()
    model(ids, labels=labels).loss.backward()
    want = {n: p.grad.clone() for n, p in model.named_parameters()}
    for second in ("grad", "no_grad"):
        model.zero_grad()
        loss = model(ids, labels=labels).loss
        with torch.set_grad_enabled(second == "grad"):
            model(ids.flip(1), labels=labels)
        loss.backward()
        for n, p in model.named_parameters():
            assert torch.allclose(p.grad, want[n], atol=1e-6), (second, n)


def test_mamba_trains_under_bfloat16_autocast():
    # the scans run in float32 inside; the loss stays close to the float32 one and every
    # parameter gets a finite gradient
    model, ids, labels = tiny_mamba_batch()
    full = model(ids, labels=labels).loss
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = model(ids, labels=labels).loss
        logits = model(ids).logits
    loss.backward()
    assert abs(loss.item() - full.item()) < 0.02 and logits.dtype == torch.bfloat16
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
