"""Gated DeltaNet: the gated delta-rule computations agree (ops_gated_delta_rule.py), a state
patch re-runs the rule as by hand; what every mixer must do is checked by test_mixer_contract.py."""
import pytest
import torch
from torch.nn import functional as F

from hf_mecheval.models.mixer_gated_deltanet import MechEvalGatedDeltaNetConfig
from hf_mecheval.models.ops_delta_rule import delta_rule_recurrent
from hf_mecheval.models.mixer_gated_deltanet import GatedDeltaNetMixer
from hf_mecheval.models.ops_gated_delta_rule import (gated_delta_rule_chunked, gated_delta_rule_readout,
                                                     gated_delta_rule_recurrent, gated_delta_rule_transition)
from hf_mecheval.models.sites import rerun_from_patched_states

from recurrent_mixers import assert_state_patch_equals_the_recurrence_by_hand, random_x, site_outputs

f64 = torch.float64


def _inputs(b=2, L=11, H=2, dk=4, dv=3, seed=0, requires_grad=False):
    g = torch.Generator().manual_seed(seed)
    q = F.normalize(torch.randn(b, L, H, dk, generator=g, dtype=f64), dim=-1)
    k = F.normalize(torch.randn(b, L, H, dk, generator=g, dtype=f64), dim=-1)
    v = torch.randn(b, L, H, dv, generator=g, dtype=f64)
    logdecay = -2 * torch.rand(b, L, H, generator=g, dtype=f64)
    beta = torch.rand(b, L, H, generator=g, dtype=f64)
    return [t.requires_grad_(requires_grad) for t in (q, k, v, logdecay, beta)]


def _mixer(seed=0, **kw):
    torch.manual_seed(seed)
    fields = dict(hidden_size=8, num_attention_heads=2, chunk_size=4)
    fields.update(kw)
    return GatedDeltaNetMixer(MechEvalGatedDeltaNetConfig(**fields), layer_idx=0).double()



# ----------------------------------------------------------------------------------- the ops

@pytest.mark.parametrize("chunk", [1, 3, 4, 5, 11, 64])
def test_chunked_matches_recurrent(chunk):
    q, k, v, g, beta = _inputs()
    S0 = torch.randn(2, 2, 4, 3, dtype=f64)
    o_ref, S_ref = gated_delta_rule_recurrent(q, k, v, g, beta, initial_state=S0)
    o, S = gated_delta_rule_chunked(q, k, v, g, beta, chunk, initial_state=S0)
    assert (o - o_ref).abs().max() <= 1e-10 and (S - S_ref).abs().max() <= 1e-10
    o0, S0_ref = gated_delta_rule_recurrent(q, k, v, g, beta)        # from the zero state
    o, S = gated_delta_rule_chunked(q, k, v, g, beta, chunk)
    assert (o - o0).abs().max() <= 1e-10 and (S - S0_ref).abs().max() <= 1e-10
    o, none = gated_delta_rule_chunked(q, k, v, g, beta, chunk, initial_state=S0, output_final_state=False)
    assert none is None and (o - o_ref).abs().max() <= 1e-10


@pytest.mark.parametrize("chunk", [3, 4, 64])
def test_chunked_gradients_match_recurrent(chunk):
    inputs = _inputs(L=10, requires_grad=True)
    S0 = torch.randn(2, 2, 4, 3, dtype=f64, requires_grad=True)
    wo, wS = torch.randn(2, 10, 2, 3, dtype=f64), torch.randn(2, 2, 4, 3, dtype=f64)

    def grads(fn):
        o, S = fn(*inputs)
        return torch.autograd.grad((o * wo).sum() + (S * wS).sum(), [*inputs, S0])

    ref = grads(lambda *t: gated_delta_rule_recurrent(*t, initial_state=S0))
    got = grads(lambda *t: gated_delta_rule_chunked(*t, chunk, initial_state=S0))
    for g, r in zip(got, ref):
        assert (g - r).abs().max() <= 1e-10


def test_strong_decay_stays_finite():
    q, k, v, g, beta = _inputs(L=40)
    g = g * 30                                                       # alpha ~ e^-60: no overflow, no NaN
    o_ref, _ = gated_delta_rule_recurrent(q, k, v, g, beta)
    o, _ = gated_delta_rule_chunked(q, k, v, g, beta, 16)
    assert torch.isfinite(o).all() and (o - o_ref).abs().max() <= 1e-10


def test_no_decay_is_deltanets_delta_rule():
    q, k, v, g, beta = _inputs()
    o, S = gated_delta_rule_recurrent(q, k, v, torch.zeros_like(g), beta)
    o_dn, S_dn = delta_rule_recurrent(*(t.transpose(1, 2) for t in (q, k, v, beta)))
    assert torch.allclose(o, o_dn.transpose(1, 2)) and torch.allclose(S, S_dn)


def test_states_are_the_trajectory():
    q, k, v, g, beta = _inputs()
    o, states = gated_delta_rule_recurrent(q, k, v, g, beta, return_states=True)
    assert states.shape == (2, 11, 2, 4, 3)
    assert torch.allclose(gated_delta_rule_readout(states, q), o)
    # one step by hand: S_t = alpha_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T
    t = 5
    kt, vt = k[:, t], v[:, t]
    bt, at = beta[:, t, :, None, None], torch.exp(g[:, t])[:, :, None, None]
    eye = torch.eye(4, dtype=f64)
    expected = at * (eye - bt * kt[..., :, None] * kt[..., None, :]) @ states[:, t - 1] + bt * kt[..., :, None] * vt[..., None, :]
    assert torch.allclose(states[:, t], expected)


def test_rerun_without_patch_is_identity_and_patch_restarts_the_recurrence():
    q, k, v, g, beta = _inputs()
    _, states = gated_delta_rule_recurrent(q, k, v, g, beta, return_states=True)
    assert torch.equal(rerun_from_patched_states(states, states.clone(), gated_delta_rule_transition(k, g, beta)), states)
    patched = states.clone()
    patched[:, 4] = 0.0
    out = rerun_from_patched_states(states, patched, gated_delta_rule_transition(k, g, beta))
    assert torch.equal(out[:, :4], states[:, :4]) and torch.equal(out[:, 4], patched[:, 4])
    _, tail = gated_delta_rule_recurrent(q[:, 5:], k[:, 5:], v[:, 5:], g[:, 5:], beta[:, 5:], return_states=True)
    assert torch.allclose(out[:, 5:], tail)


def test_ops_under_vmap_equal_each_copy():
    K = 3
    per_copy = [_inputs(seed=k) for k in range(K)]
    stacked = [torch.stack(ts) for ts in zip(*per_copy)]
    o = torch.func.vmap(lambda *t: gated_delta_rule_chunked(*t, 4)[0])(*stacked)
    for kk, ins in enumerate(per_copy):
        assert (o[kk] - gated_delta_rule_recurrent(*ins)[0]).abs().max() <= 1e-10


# --------------------------------------------------------------------------------- the mixer

def test_sites():
    m = _mixer(expand_v=2)
    assert m.state.propagates and not m.conv_output.propagates
    assert not hasattr(_mixer(use_short_conv=False), "conv_output")
    _, seen = site_outputs(m, random_x(), "conv_output", "state")
    assert seen["conv_output"].shape == (2, 11, 8 + 8 + 16)                  # q, k (2 heads x 4), v (2 x 8)
    assert seen["state"].shape == (2, 11, 2, 4, 8)                   # (B, L, heads, dk, dv)


@pytest.mark.parametrize("fields", [dict(), dict(expand_v=2, use_short_conv=False)])
def test_state_site_path_equals_fast_path(fields):
    m = _mixer(**fields)
    x = random_x()
    fast = m(x)
    h = m.state.register_forward_hook(lambda mod, i, o: None)        # read-only hook
    slow = m(x)
    h.remove()
    assert (slow - fast).abs().max() <= 1e-10
    m.state.materialize = True
    assert (m(x) - fast).abs().max() <= 1e-10


def _by_hand_from(m, x, p, patch_at):
    """The mixer's output when the state is replaced at positions ``patch_at`` ({t: S_t}) and the
    rule runs by hand from there (independent of gated_delta_rule_transition / rerun_from_patched_states)."""
    qkv, gate, a, b = m._project(x)
    qkv = F.silu(torch.cat([conv(part) for conv, part in zip(
        (m.q_conv1d, m.k_conv1d, m.v_conv1d), qkv.split([m.key_dim, m.key_dim, m.value_dim], dim=-1))], dim=-1))
    q, k, v = m._heads(qkv)
    g, beta = m._gates(a, b)
    _, states = gated_delta_rule_recurrent(q, k, v, g, beta, return_states=True)
    S, outs = states[:, p - 1], []
    eye = torch.eye(m.dk, dtype=x.dtype)
    for t in range(p, x.shape[1]):
        kt, bt, at = k[:, t], beta[:, t, :, None, None], torch.exp(g[:, t])[:, :, None, None]
        S = at * (eye - bt * kt[..., :, None] * kt[..., None, :]) @ S + bt * kt[..., :, None] * v[:, t, :, None, :]
        if t in patch_at:
            S = patch_at[t]
        outs.append(torch.einsum("bhkv,bhk->bhv", S, q[:, t]))
    return m._out(torch.stack(outs, 1), gate[:, p:])


def test_state_patch_equals_the_rule_run_by_hand_from_the_patched_state():
    assert_state_patch_equals_the_recurrence_by_hand(_mixer(expand_v=2), random_x(), _by_hand_from)


def test_layout_and_initialisation_follow_flash_linear_attention():
    m = _mixer(hidden_size=64, num_attention_heads=2, expand_v=2)   # dk 32, dv 64
    assert (m.q_proj.out_features, m.k_proj.out_features, m.v_proj.out_features) == (64, 64, 128)
    assert (m.g_proj.out_features, m.o_proj.in_features, m.a_proj.out_features) == (128, 128, 2)
    assert all(lin.bias is None for lin in (m.q_proj, m.k_proj, m.v_proj, m.a_proj, m.b_proj, m.g_proj, m.o_proj))
    assert m.q_conv1d.bias is None and m.o_norm.weight.shape == (64,)
    A, dt = torch.exp(m.A_log), F.softplus(m.dt_bias)
    assert ((A > 0) & (A <= 16)).all() and ((dt >= 1e-4 - 1e-9) & (dt <= 0.1 + 1e-9)).all()
    default = MechEvalGatedDeltaNetConfig(hidden_size=64)
    assert (default.num_attention_heads, default.key_head_dim, default.value_head_dim) == (1, 64, 64)
