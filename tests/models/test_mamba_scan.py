"""The fused selective scan and the state-path scan against the readable reference."""
import torch

from hf_mecheval.models import build_model
from hf_mecheval.models.mixers.mamba import LinearScan, SelectiveScan, selective_scan_reference


def inputs(seed=0, B=3, L=9, E=5, N=4):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(B, L, E, generator=g, dtype=torch.float64)
    dt = torch.rand(B, L, E, generator=g, dtype=torch.float64) * 0.5
    A = -torch.rand(E, N, generator=g, dtype=torch.float64) * 3
    Bm = torch.randn(B, L, N, generator=g, dtype=torch.float64)
    C = torch.randn(B, L, N, generator=g, dtype=torch.float64)
    return [t.requires_grad_() for t in (x, dt, A, Bm, C)]


def test_fused_scan_matches_reference_values_and_gradients():
    assert torch.autograd.gradcheck(SelectiveScan.apply, inputs())
    a, b = inputs(1), inputs(1)
    y_ref, _ = selective_scan_reference(*a)
    y = SelectiveScan.apply(*b)
    assert torch.allclose(y, y_ref, atol=1e-12)
    w = torch.randn_like(y)
    (y_ref * w).sum().backward()
    (y * w).sum().backward()
    for p, q in zip(a, b):
        assert torch.allclose(p.grad, q.grad, atol=1e-10)


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
