"""H3 and Hyena mixers: shapes, causality, recurrent form = parallel form, gradients, and H3's
patchable state trajectory."""
import pytest
import torch

from hf_mecheval.models import build_model
from hf_mecheval.models import MechEvalH3Config, MechEvalHyenaConfig
from hf_mecheval.models.registry import mixer_class
from hf_mecheval.models.mixer_hyena import HyenaOperator

D, L, B = 8, 24, 2  # L > d_state so every shift-SSM tap is used


def make_h3(**kw):
    """The mixer the config's ssm_form names, as the model builds it."""
    torch.manual_seed(0)
    config = MechEvalH3Config(hidden_size=D, d_state=16, head_dim=2, **kw)
    return mixer_class(config.layer_mixers()[0])(config, layer_idx=0).double()


def make_hyena(**kw):
    torch.manual_seed(0)
    return HyenaOperator(MechEvalHyenaConfig(hidden_size=D, max_filter_length=64, **kw), layer_idx=0).double()




def inputs(length=L):
    return torch.randn(B, length, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("form", ["reference", "mecheval-v1"])
def test_h3_state_path_matches_conv_path(form):
    m, x = make_h3(ssm_form=form), inputs()
    y_conv = m(x)
    m.state.materialize = True
    torch.testing.assert_close(m(x), y_conv, rtol=0, atol=1e-10)
    # a hook that returns an unchanged copy counts as "patched" but changes nothing
    m.state.materialize = False
    handle = m.state.register_forward_hook(lambda mod, inp, out: out.clone())
    torch.testing.assert_close(m(x), y_conv, rtol=0, atol=1e-10)
    handle.remove()


def test_h3_state_patch_propagates():
    m, x, p = make_h3(ssm_form="mecheval-v1"), inputs(), 7
    y = m(x)
    delta = torch.randn(B, m.channels, m.d_state, dtype=torch.float64)

    def patch(mod, inp, out):
        out = out.clone()
        out[:, p] += delta
        return out

    handle = m.state.register_forward_hook(patch)
    y_patched = m(x)
    handle.remove()
    torch.testing.assert_close(y_patched[:, :p], y[:, :p], rtol=0, atol=1e-12)
    assert ((y_patched[:, p:] - y[:, p:]).abs().amax(dim=(0, 2)) > 1e-8).all()

    # The recurrence is linear, so the SSM output moves by sum_n C a^(t-p) delta at t >= p,
    # and the mixer output by out_proj's weight applied to q contracted with that.
    with torch.no_grad():
        dtA, _ = m._discretize()
        dtA, C = m._per_channel(dtA), m._per_channel(m.C)                     # per outer-product channel
        lags = torch.arange(L - p, dtype=torch.float64)
        ds = torch.einsum("cn,bcn,cnl->blc", C, delta, torch.exp(dtA[..., None] * lags))  # (B, L-p, C)
        q = m.q_proj(x[:, p:])
        expected = m._contract(q, ds) @ m.out_proj.weight.T
    torch.testing.assert_close(y_patched[:, p:] - y[:, p:], expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("L", [1, 2, 7, 37, 100])
def test_h3_kernel_by_repeated_products_equals_closed_form(L):
    torch.manual_seed(0)
    mixer = build_model("h3", vocab_size=11, hidden_size=16, d_state=32, ssm_form="mecheval-v1").double().model.layers[0].mixer
    fast, slow = mixer.ssm_kernel(L), mixer.ssm_kernel_reference(L)
    assert fast.shape == slow.shape == (mixer.channels, L)
    assert torch.allclose(fast, slow, atol=1e-12)
    w = torch.randn_like(fast)
    grads = [torch.autograd.grad((k * w).sum(), [mixer.A_log, mixer.log_dt, mixer.B, mixer.C]) for k in (fast, slow)]
    for g_fast, g_slow in zip(*grads):
        assert torch.allclose(g_fast, g_slow, atol=1e-10)


def test_power_sum_taps_gradients():
    from hf_mecheval.models.ops_ssm_taps import PowerSumTaps

    g = torch.Generator().manual_seed(0)
    for L in (1, 2, 9):
        w = torch.randn(3, 4, generator=g, dtype=torch.float64, requires_grad=True)
        a = (0.2 + 0.7 * torch.rand(3, 4, generator=g, dtype=torch.float64)).requires_grad_()
        assert torch.autograd.gradcheck(lambda w, a: PowerSumTaps.apply(w, a, L), (w, a))
        closed = (w[..., None] * a[..., None] ** torch.arange(L, dtype=a.dtype)).sum(1)
        assert torch.allclose(PowerSumTaps.apply(w, a, L), closed, atol=1e-12)
