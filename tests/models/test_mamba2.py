"""Mamba-2: the SSD computations agree (ops_ssd.py), a state patch re-runs the recurrence as by
hand; what every mixer must do is checked by test_mixer_contract.py."""
import pytest
import torch
from torch.nn import functional as F

from hf_mecheval.models.mixer_mamba2 import MechEvalMamba2Config
from hf_mecheval.models.mixer_mamba2 import Mamba2Mixer
from hf_mecheval.models.ops_ssd import ssd_at, ssd_chunked, ssd_readout, ssd_recurrent, ssd_transition
from hf_mecheval.models.sites import rerun_from_patched_states

from recurrent_mixers import (assert_state_patch_equals_the_recurrence_by_hand, assert_training_step_equal_across_kernels,
                             random_x, site_outputs)

f64 = torch.float64


def _inputs(b=2, L=11, H=4, P=3, G=2, N=5, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, L, H, P, generator=g, dtype=f64)
    dt = F.softplus(torch.randn(b, L, H, generator=g, dtype=f64))
    A = -torch.rand(H, generator=g, dtype=f64) * 3 - 0.1
    B = torch.randn(b, L, G, N, generator=g, dtype=f64)
    C = torch.randn(b, L, G, N, generator=g, dtype=f64)
    D = torch.randn(H, generator=g, dtype=f64)
    return [t.requires_grad_(requires_grad) for t in (x, dt, A, B, C, D)]


def _mixer(seed=0, **kw):
    torch.manual_seed(seed)
    fields = dict(hidden_size=8, d_state=4, head_dim=4, chunk_size=4)   # 4 heads
    fields.update(kw)
    return Mamba2Mixer(MechEvalMamba2Config(**fields), layer_idx=0).double()



# ----------------------------------------------------------------------------------- the ops

@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 11, 64])
def test_chunked_matches_recurrent(chunk):
    x, dt, A, B, C, D = _inputs()
    h0 = torch.randn(2, 4, 3, 5, dtype=f64)
    y_ref, h_ref = ssd_recurrent(x, dt, A, B, C, D, initial_state=h0)
    y, h = ssd_chunked(x, dt, A, B, C, chunk, D, initial_state=h0)
    assert (y - y_ref).abs().max() <= 1e-10 and (h - h_ref).abs().max() <= 1e-10
    y0, _ = ssd_recurrent(x, dt, A, B, C, D)                         # from the zero state
    y, none = ssd_chunked(x, dt, A, B, C, chunk, D, output_final_state=False)
    assert none is None and (y - y0).abs().max() <= 1e-10
    y, _ = ssd_chunked(x, dt, A, B, C, chunk, D, initial_state=h0, output_final_state=False)
    assert (y - y_ref).abs().max() <= 1e-10


@pytest.mark.parametrize("chunk", [3, 4, 64])
def test_chunked_gradients_match_recurrent(chunk):
    inputs = _inputs(L=10, requires_grad=True)
    h0 = torch.randn(2, 4, 3, 5, dtype=f64, requires_grad=True)
    wy, wh = torch.randn(2, 10, 4, 3, dtype=f64), torch.randn(2, 4, 3, 5, dtype=f64)

    def grads(fn):
        y, h = fn()
        return torch.autograd.grad((y * wy).sum() + (h * wh).sum(), [*inputs, h0])

    x, dt, A, B, C, D = inputs
    ref = grads(lambda: ssd_recurrent(x, dt, A, B, C, D, initial_state=h0))
    got = grads(lambda: ssd_chunked(x, dt, A, B, C, chunk, D, initial_state=h0))
    for g, r in zip(got, ref):
        assert (g - r).abs().max() <= 1e-10


def test_strong_decay_stays_finite():
    x, dt, A, B, C, D = _inputs(L=40)
    dt = dt * 50                                                     # exp(dt A) ~ 0: no overflow, no NaN
    y_ref, _ = ssd_recurrent(x, dt, A, B, C, D)
    y, _ = ssd_chunked(x, dt, A, B, C, 16, D)
    assert torch.isfinite(y).all() and (y - y_ref).abs().max() <= 1e-10


def test_states_are_the_trajectory():
    x, dt, A, B, C, D = _inputs()
    y, states = ssd_recurrent(x, dt, A, B, C, D, return_states=True)
    assert states.shape == (2, 11, 4, 3, 5)
    assert torch.allclose(ssd_readout(states, C, x, D), y)
    # one step by hand: h_t = exp(dt_t A_h) h_{t-1} + dt_t x_t B_t^T, head h reads group h // 2
    t, h = 5, 3
    expected = (torch.exp(dt[:, t, h] * A[h])[:, None, None] * states[:, t - 1, h]
                + dt[:, t, h, None, None] * x[:, t, h, :, None] * B[:, t, 1, None, :])
    assert torch.allclose(states[:, t, h], expected)


def test_answer_positions_match_gather_values_and_gradients():
    inputs = _inputs(requires_grad=True)
    keep = torch.tensor([[0, 6, 10], [10, 3, 3]])
    w = torch.randn(2, 3, 4, 3, dtype=f64)
    y_full, _ = ssd_recurrent(*inputs[:5], inputs[5])
    want = y_full.gather(1, keep[..., None, None].expand(-1, -1, 4, 3))
    ref = torch.autograd.grad((want * w).sum(), inputs)
    got_y = ssd_at(*inputs[:5], keep, inputs[5])
    assert (got_y - want).abs().max() <= 1e-10
    for g, r in zip(torch.autograd.grad((got_y * w).sum(), inputs), ref):
        assert (g - r).abs().max() <= 1e-10


def test_rerun_without_patch_is_identity_and_patch_restarts_the_recurrence():
    x, dt, A, B, C, D = _inputs()
    _, states = ssd_recurrent(x, dt, A, B, C, return_states=True)
    assert torch.equal(rerun_from_patched_states(states, states.clone(), ssd_transition(dt, A)), states)
    patched = states.clone()
    patched[:, 4] = 0.0
    out = rerun_from_patched_states(states, patched, ssd_transition(dt, A))
    assert torch.equal(out[:, :4], states[:, :4]) and torch.equal(out[:, 4], patched[:, 4])
    _, tail = ssd_recurrent(x[:, 5:], dt[:, 5:], A, B[:, 5:], C[:, 5:], return_states=True)
    assert torch.allclose(out[:, 5:], tail)                          # from zero at 4, as if it started there


def test_ops_under_vmap_equal_each_copy():
    # stacked copies: A and D per copy (parameters), the sequences per copy too
    K = 3
    per_copy = [_inputs(seed=k) for k in range(K)]
    stacked = [torch.stack(ts) for ts in zip(*per_copy)]
    y = torch.func.vmap(lambda x, dt, A, B, C, D: ssd_chunked(x, dt, A, B, C, 4, D)[0])(*stacked)
    keep = torch.tensor([[2, 10], [7, 0]])
    y_at = torch.func.vmap(lambda x, dt, A, B, C, D: ssd_at(x, dt, A, B, C, keep, D))(*stacked)
    for k, ins in enumerate(per_copy):
        ref, _ = ssd_recurrent(*ins[:5], ins[5])
        assert (y[k] - ref).abs().max() <= 1e-10
        assert (y_at[k] - ref.gather(1, keep[..., None, None].expand(-1, -1, 4, 3))).abs().max() <= 1e-10


def test_sites():
    m = _mixer()
    assert m.state.propagates and not m.conv_output.propagates
    assert not hasattr(_mixer(conv_kernel=0), "conv_output")
    _, seen = site_outputs(m, random_x(), "conv_output", "state")
    assert seen["conv_output"].shape == (2, 11, 16 + 2 * 4)                  # x (E = 16), B, C (N = 4)
    assert seen["state"].shape == (2, 11, 4, 4, 4)                   # (B, L, heads, head_dim, d_state)


def test_state_site_path_equals_fast_path():
    m = _mixer(n_groups=2)
    x = random_x()
    fast = m(x)
    h = m.state.register_forward_hook(lambda mod, i, o: None)        # read-only hook
    slow = m(x)
    h.remove()
    assert (slow - fast).abs().max() <= 1e-10


def _by_hand_from(m, x, p, patch_at):
    """The mixer's output when the state is replaced at positions ``patch_at`` ({t: h_t}) and the
    recurrence runs by hand from there (independent of ssd_transition / rerun_from_patched_states)."""
    z, xBC, dt = m.in_proj(x).split([m.E, m.E + 2 * m.G * m.N, m.H], dim=-1)
    xs, B, C, dt = m._ssm_inputs(m._activated(xBC, None), dt, None)
    A = -torch.exp(m.A_log)
    _, states = ssd_recurrent(xs, dt, A, B, C, return_states=True)
    h, ys = states[:, p - 1], []
    Bh, Ch = B.repeat_interleave(m.H // m.G, dim=2), C.repeat_interleave(m.H // m.G, dim=2)
    for t in range(p, x.shape[1]):
        h = torch.exp(dt[:, t] * A)[..., None, None] * h + (dt[:, t, :, None] * xs[:, t])[..., None] * Bh[:, t, :, None, :]
        if t in patch_at:
            h = patch_at[t]
        ys.append((h @ Ch[:, t, :, :, None])[..., 0] + m.D[:, None] * xs[:, t])
    return m._out(torch.stack(ys, 1), z[:, p:])


def test_state_patch_equals_the_recurrence_run_by_hand_from_the_patched_state():
    assert_state_patch_equals_the_recurrence_by_hand(_mixer(n_groups=2), random_x(), _by_hand_from)


def test_initialisation_follows_mamba_ssm():
    m = _mixer(hidden_size=64, head_dim=16)                          # 8 heads
    A = torch.exp(m.A_log)
    dt = F.softplus(m.dt_bias)
    assert ((A >= 1) & (A <= 16)).all() and torch.equal(m.D, torch.ones(8, dtype=f64))
    assert ((dt >= 1e-3 - 1e-9) & (dt <= 0.1 + 1e-9)).all()
    assert m.in_proj.out_features == 2 * 128 + 2 * 4 + 8 and m.in_proj.bias is None
    assert m.conv.bias is not None and m.out_proj.bias is None


# ------------------------------------------------------------------- the compiled scan (CPU)
from hf_mecheval.models import cpu_kernels  # noqa: E402
from hf_mecheval.models.kernels import cpu_ssd  # noqa: E402

needs_compiler = pytest.mark.skipif(not cpu_kernels.available(), reason="no C++ compiler: the kernels are not built")


def _values_and_gradients(fn, tensors, w):
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    y = fn(*leaves)
    return y, torch.autograd.grad((y * w.to(y.dtype)).sum(), leaves)


@needs_compiler
@pytest.mark.parametrize("shape", [dict(H=4, P=3, G=2, N=5), dict(H=9, P=20, G=3, N=4), dict(H=8, P=16, G=1, N=7)],
                         ids=["partial-block", "two-blocks-odd-heads", "four-heads-at-once"])
def test_compiled_ssd_matches_the_reference(shape):
    # the compiled scan (no D) against the loop over time and the chunked form: values and the
    # gradients of x, dt, A, B, C in float64, to 1e-12 / 1e-10 of each tensor's largest entry (the
    # same sums in another order); gradcheck. Shapes: a head narrower than a vector (3 of 16
    # lanes), heads of 20 channels (a full and a partial block) in groups of 3, and 8 heads of one
    # group (the backward's passes of four heads at once)
    x, dt, A, B, C, _ = _inputs(b=2, L=9, seed=3, **shape)
    assert torch.autograd.gradcheck(cpu_kernels.ssd_cpu, [t[:, :4].clone().requires_grad_() if t.dim() > 1 else
                                                          t.clone().requires_grad_() for t in (x, dt, A, B, C)])
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(4), dtype=f64)
    y, grads = _values_and_gradients(cpu_kernels.ssd_cpu, (x, dt, A, B, C), w)
    for reference in (lambda *t: ssd_recurrent(*t)[0], lambda *t: ssd_chunked(*t, chunk_size=4)[0]):
        y_ref, grads_ref = _values_and_gradients(reference, (x, dt, A, B, C), w)
        assert (y - y_ref).abs().max() <= 1e-12 * y_ref.abs().max()
        for got, want in zip(grads, grads_ref):
            assert (got - want).abs().max() <= 1e-10 * want.abs().max()


@needs_compiler
def test_compiled_ssd_in_float32_at_width_256():
    # Mamba-2's layer at width 256 (32 heads of 16 channels, state 64, one group), length 37, in
    # float32 against the float64 reference: to 1e-5 of each tensor's largest entry (float32's
    # rounding step is 6e-8; sums over 37 steps and 64 state entries, and over 32 heads and 16
    # channels for B's and C's gradients, gather up to a few hundred)
    x, dt, A, B, C, _ = _inputs(b=2, L=37, H=32, P=16, G=1, N=64, seed=5)
    dt = dt * 0.1
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(6), dtype=f64)
    y32, grads32 = _values_and_gradients(cpu_kernels.ssd_cpu, [t.float() for t in (x, dt, A, B, C)], w)
    y64, grads64 = _values_and_gradients(lambda *t: ssd_recurrent(*t)[0], (x, dt, A, B, C), w)
    assert y32.dtype == torch.float32
    assert (y32.double() - y64).abs().max() <= 1e-5 * y64.abs().max()
    for got, want in zip(grads32, grads64):
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()


@needs_compiler
def test_compiled_ssd_under_vmap_with_an_A_per_copy():
    x, dt, A, B, C, _ = _inputs(seed=7)
    K_A = torch.stack([A, 0.5 * A, 2 * A]).requires_grad_()
    K_x = torch.stack([x, -x, 2 * x]).requires_grad_()
    ys = torch.func.vmap(cpu_kernels.ssd_cpu, in_dims=(0, None, 0, None, None))(K_x, dt, K_A, B, C)
    w = torch.randn_like(ys)
    gx, gA = torch.autograd.grad((ys * w).sum(), (K_x, K_A))
    for k in range(3):
        xk, ak = K_x[k].detach().requires_grad_(), K_A[k].detach().requires_grad_()
        y_k = ssd_recurrent(xk, dt, ak, B, C)[0]
        want_x, want_A = torch.autograd.grad((y_k * w[k]).sum(), (xk, ak))
        assert (ys[k] - y_k).abs().max() <= 1e-12 * y_k.abs().max()
        assert (gx[k] - want_x).abs().max() <= 1e-10 * want_x.abs().max()
        assert (gA[k] - want_A).abs().max() <= 1e-10 * want_A.abs().max()


@needs_compiler
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_training_step_on_the_compiled_ssd_equals_the_pytorch_path(dtype):
    # the training step as a run takes it (layer 0 on the full path: the compiled scan where
    # kernels="auto", the chunked form where "torch"; layer 1 on the answer-only path): loss and
    # every parameter's gradient, to 1e-12 / 1e-10 in float64 and 1e-6 / 1e-5 in float32 (of the
    # loss and of each gradient's largest entry)
    assert cpu_ssd("auto", torch.device("cpu")) is cpu_kernels.ssd_cpu and cpu_ssd("torch", torch.device("cpu")) is None
    tolerance = (1e-12, 1e-10) if dtype == torch.float64 else (1e-6, 1e-5)
    assert_training_step_equal_across_kernels("mamba2", dtype, *tolerance, hidden_size=32)


@needs_compiler
def test_compiled_ssd_takes_transposed_inputs_and_splits_rows_between_threads(monkeypatch):
    # dense but transposed views of x, dt, B, C (their strides not row-major): the kernel reads
    # them in their logical order, values and gradients as the loop over time's; and rows split
    # between 3 threads give the 1-thread result exactly (each row is one thread's)
    x, dt, A, B, C, _ = _inputs(b=3, L=9, H=4, P=5, G=2, N=3, seed=11)
    views = [x.transpose(1, 2).contiguous().transpose(1, 2), dt.transpose(1, 2).contiguous().transpose(1, 2), A,
             B.transpose(1, 2).contiguous().transpose(1, 2), C.transpose(1, 2).contiguous().transpose(1, 2)]
    assert not views[0].is_contiguous() and torch.equal(views[0], x)
    w = torch.randn(x.shape, generator=torch.Generator().manual_seed(12), dtype=f64)
    y_ref, grads_ref = _values_and_gradients(lambda *t: ssd_recurrent(*t)[0], (x, dt, A, B, C), w)
    leaves = [t.detach().requires_grad_() for t in views]           # the views themselves are the leaves
    y = cpu_kernels.ssd_cpu(*leaves)
    grads = torch.autograd.grad((y * w).sum(), leaves)
    assert (y - y_ref).abs().max() <= 1e-12 * y_ref.abs().max()
    for got, want in zip(grads, grads_ref):
        assert (got - want).abs().max() <= 1e-10 * want.abs().max()
    monkeypatch.setattr(cpu_kernels, "WORK_PER_THREAD", 1)          # split even this small call
    threads = torch.get_num_threads()
    try:
        results = []
        for n in (1, 3):
            torch.set_num_threads(n)
            results.append(_values_and_gradients(cpu_kernels.ssd_cpu, (x, dt, A, B, C), w))
        (y1, g1), (y3, g3) = results
        assert torch.equal(y1, y3) and all(torch.equal(a, b) for a, b in zip(g1, g3))
    finally:
        torch.set_num_threads(threads)


@needs_compiler
def test_the_compiled_kernels_refuse_shapes_they_would_read_out_of_bounds():
    # more groups than heads (a division by zero in the kernel), heads not a multiple of the
    # groups (B and C read past their end), a scan whose B has another state size than A's: one
    # ValueError naming the tensor, before the kernel runs
    x, dt, A, B, C, _ = _inputs(b=1, L=2, H=2, P=4, G=1, N=3, seed=13)
    B4, C4 = B.repeat(1, 1, 4, 1), C.repeat(1, 1, 4, 1)             # 4 groups for 2 heads
    with pytest.raises(ValueError, match="multiple of B's and C's groups"):
        cpu_kernels.ssd_cpu(x, dt, A, B4, C4)
    x4, dt4, A4 = x.repeat(1, 1, 2, 1), dt.repeat(1, 1, 2), A.repeat(2)
    with pytest.raises(ValueError, match="multiple of B's and C's groups"):
        cpu_kernels.ssd_cpu(x4, dt4, A4, B.repeat(1, 1, 3, 1), C.repeat(1, 1, 3, 1))   # 4 heads, 3 groups
    with pytest.raises(ValueError, match="ssd_forward: dt must be"):
        cpu_kernels.ssd_cpu(x, dt[:, :1], A, B, C)
    xs, dts = torch.randn(1, 3, 16, dtype=f64), torch.rand(1, 3, 16, dtype=f64)
    A_scan, B2 = -torch.rand(16, 4, dtype=f64), torch.randn(1, 3, 2, dtype=f64)
    with pytest.raises(ValueError, match="scan_forward: B must be"):
        cpu_kernels.selective_scan_cpu(xs, dts, A_scan, B2, B2)
