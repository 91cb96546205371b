"""DeltaNet mixer: the three delta-rule computations agree, the state site path equals the fast
path; what every mixer must do is checked by test_mixer_contract.py."""
import pytest
import torch
from torch.nn import functional as F

from hf_mecheval.models.mixer_deltanet import MechEvalDeltaNetConfig
from hf_mecheval.models.sites import rerun_from_patched_states
from hf_mecheval.models.mixer_deltanet import DeltaNetMixer, _l2norm
from hf_mecheval.models.ops_delta_rule import delta_rule_chunked, delta_rule_recurrent, delta_rule_transition

from recurrent_mixers import random_x, site_outputs


def _inputs(B=2, H=2, L=11, dk=4, dv=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.nn.functional.normalize(torch.randn(B, H, L, dk, generator=g, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(B, H, L, dk, generator=g, dtype=torch.float64), dim=-1)
    v = torch.randn(B, H, L, dv, generator=g, dtype=torch.float64)
    beta = torch.rand(B, H, L, generator=g, dtype=torch.float64)
    return q, k, v, beta


def _mixer(heads=2, hidden=8, seed=0, **kw):
    torch.manual_seed(seed)
    cfg = MechEvalDeltaNetConfig(hidden_size=hidden, num_attention_heads=heads, chunk_size=4, **kw)
    return DeltaNetMixer(cfg, layer_idx=0).double()


@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 11, 64])
def test_chunked_matches_recurrent(chunk):
    q, k, v, beta = _inputs(L=11)
    S0 = torch.randn(2, 2, 4, 3, dtype=torch.float64)
    o_ref, S_ref = delta_rule_recurrent(q, k, v, beta, initial_state=S0)
    o, S = delta_rule_chunked(q, k, v, beta, chunk, initial_state=S0)
    assert (o - o_ref).abs().max() <= 1e-10
    assert (S - S_ref).abs().max() <= 1e-10


def test_recurrent_states_are_trajectory():
    q, k, v, beta = _inputs()
    o, states = delta_rule_recurrent(q, k, v, beta, return_states=True)
    assert states.shape == (2, 2, 11, 4, 3)
    assert torch.allclose(torch.einsum("bhlkv,bhlk->bhlv", states, q), o)
    # explicit form of one step: S_t = (I - beta k k^T) S_{t-1} + beta k v^T
    t = 5
    kt, vt, bt = k[:, :, t], v[:, :, t], beta[:, :, t, None, None]
    eye = torch.eye(4, dtype=torch.float64)
    expected = (eye - bt * kt[..., :, None] * kt[..., None, :]) @ states[:, :, t - 1] + bt * kt[..., :, None] * vt[..., None, :]
    assert torch.allclose(states[:, :, t], expected)


def test_replay_without_patch_is_identity_and_patch_propagates():
    q, k, v, beta = _inputs()
    _, states = delta_rule_recurrent(q, k, v, beta, return_states=True)
    states = states.transpose(1, 2)                                   # (B, L, H, dk, dv)
    assert torch.equal(rerun_from_patched_states(states, states.clone(), delta_rule_transition(k, beta)), states)
    patched = states.clone()
    patched[:, 4] = 0.0
    out = rerun_from_patched_states(states, patched, delta_rule_transition(k, beta))
    assert torch.equal(out[:, :4], states[:, :4])
    assert torch.equal(out[:, 4], patched[:, 4])
    # after the patch the recurrence restarts from zero at position 5
    _, tail = delta_rule_recurrent(q[:, :, 5:], k[:, :, 5:], v[:, :, 5:], beta[:, :, 5:], return_states=True)
    assert torch.allclose(out[:, 5:], tail.transpose(1, 2))


def test_sites():
    m = _mixer()
    assert m.state.propagates and not m.conv_output.propagates
    assert not hasattr(_mixer(use_short_conv=False), "conv_output")
    _, seen = site_outputs(m, random_x(), "conv_output", "state")
    assert seen["conv_output"].shape == (2, 11, 24)
    assert seen["state"].shape == (2, 11, 2, 4, 4)


@pytest.mark.parametrize("heads", [1, 2])
def test_state_site_path_equals_fast_path(heads):
    m = _mixer(heads)
    x = random_x()
    fast = m(x)
    h = m.state.register_forward_hook(lambda mod, i, o: None)   # read-only hook
    assert m.state.wanted()
    slow = m(x)
    h.remove()
    assert (slow - fast).abs().max() <= 1e-10
    m.state.materialize = True
    assert (m(x) - fast).abs().max() <= 1e-10


def test_chunked_gradients_match_recurrent():
    inputs = [t.requires_grad_() for t in _inputs(L=10)]
    w = torch.randn(2, 2, 10, 3, dtype=torch.float64)
    (delta_rule_recurrent(*inputs)[0] * w).sum().backward()
    ref = [t.grad.clone() for t in inputs]
    for t in inputs:
        t.grad = None
    (delta_rule_chunked(*inputs, chunk_size=4)[0] * w).sum().backward()
    for t, g in zip(inputs, ref):
        assert (t.grad - g).abs().max() <= 1e-10


@pytest.mark.parametrize("chunk", [3, 11, 64])          # several chunks, and the whole sequence in one
@pytest.mark.parametrize("final", [True, False])
def test_chunked_from_zero_state_skips_nothing_it_needs(chunk, final):
    # from the zero state the S0 terms are skipped, and without output_final_state the last chunk's
    # state is not carried out: outputs and gradients still equal the loop's (float64, 1e-10)
    inputs = [t.requires_grad_() for t in _inputs(L=11)]
    w = torch.randn(2, 2, 11, 3, dtype=torch.float64)
    o_ref, S_ref = delta_rule_recurrent(*inputs)
    ref = torch.autograd.grad((o_ref * w).sum(), inputs)
    o, S = delta_rule_chunked(*inputs, chunk, output_final_state=final)
    assert (o - o_ref).abs().max() <= 1e-10
    assert S is None if not final else (S - S_ref).abs().max() <= 1e-10
    for g, r in zip(torch.autograd.grad((o * w).sum(), inputs), ref):
        assert (g - r).abs().max() <= 1e-10


def _module_by_module(m, x):
    """The readable form of DeltaNetMixer.forward: each projection and convolution on its own,
    then the reference loop over time."""
    B, L, D = x.shape
    H, d = m.num_heads, m.head_dim
    q, k, v = m.q_proj(x), m.k_proj(x), m.v_proj(x)
    if m.use_short_conv:
        q, k, v = F.silu(m.q_conv1d(q)), F.silu(m.k_conv1d(k)), F.silu(m.v_conv1d(v))
    else:
        q, k = F.silu(q), F.silu(k)
    heads = lambda t: t.reshape(B, L, H, d).transpose(1, 2)                     # noqa: E731
    o, _ = delta_rule_recurrent(_l2norm(heads(q)), _l2norm(heads(k)), heads(v),
                                torch.sigmoid(m.b_proj(x)).transpose(1, 2))
    return m.o_proj(m.o_norm(o.transpose(1, 2)).flatten(-2))


@pytest.mark.parametrize("kw", [{}, {"use_short_conv": False}, {"heads": 1}])
def test_fused_projections_and_convolutions_equal_module_by_module(kw):
    # forward runs the four projections and the three convolutions as one call each: values and
    # the gradients of the input and of every parameter equal the module-by-module form (float64, 1e-10)
    m = _mixer(**{"heads": 2, **kw})
    x = random_x().requires_grad_()
    w = torch.randn(2, 11, 8, dtype=torch.float64)
    params = [x, *m.parameters()]
    ref = _module_by_module(m, x)
    ref_grads = torch.autograd.grad((ref * w).sum(), params)
    y = m(x)
    assert (y - ref).abs().max() <= 1e-10
    for g, r in zip(torch.autograd.grad((y * w).sum(), params), ref_grads):
        assert (g - r).abs().max() <= 1e-10
