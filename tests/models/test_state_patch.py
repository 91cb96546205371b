"""A time-invariant linear SSM's state read and patched in closed form (ops_state_patch), against
the recurrence run step by step, and H3's state site read and patched that way
(``Site.reading_entries`` / ``patching_entries``) against the same done through a forward hook."""
import pytest
import torch

from hf_mecheval.models import build_model
from hf_mecheval.models.ops_state_patch import lti_state_patch_effect, lti_states_at
from hf_mecheval.models.sites import Site

f64 = torch.float64


def random_lti(C=3, M=4, L=9, seed=0):
    """Per channel c a full (not diagonal) transition T (M, M), input vector b and readout r (M,);
    response[j] = T^j b and readout[j] = r T^j, each (L, C, M)."""
    g = torch.Generator().manual_seed(seed)
    T = 0.5 * torch.randn(C, M, M, dtype=f64, generator=g)
    b, r = torch.randn(C, M, dtype=f64, generator=g), torch.randn(C, M, dtype=f64, generator=g)
    response, readout = [b], [r]
    for _ in range(L - 1):
        response.append(torch.einsum("cmn,cn->cm", T, response[-1]))          # T (T^j b)
        readout.append(torch.einsum("cm,cmn->cn", readout[-1], T))            # (r T^j) T
    return T, b, r, torch.stack(response), torch.stack(readout)


def run_by_hand(u, T, b, r, patches=()):
    """The recurrence step by step, x_t = T x_{t-1} + b u_t, y_t = r . x_t, with the state of
    row ``row`` replaced by ``value`` at ``pos`` for each (row, pos, value) -> (y (B, L, C), x (B, L, C, M))."""
    B, L, C = u.shape
    x = torch.zeros(B, C, T.shape[1], dtype=f64)
    ys, xs = [], []
    for t in range(L):
        x = torch.einsum("cmn,bcn->bcm", T, x) + b * u[:, t, :, None]
        for row, pos, value in patches:
            if pos == t:
                x = x.clone()
                x[row] = value
        xs.append(x)
        ys.append((r * x).sum(-1))
    return torch.stack(ys, 1), torch.stack(xs, 1)


def test_states_at_positions_equal_the_recurrences():
    T, b, r, response, _ = random_lti()
    u = torch.randn(3, 9, 3, dtype=f64, generator=torch.Generator().manual_seed(1))
    _, states = run_by_hand(u, T, b, r)
    rows, positions = torch.tensor([0, 2, 2, 1, 0]), torch.tensor([0, 8, 3, 5, 0])   # rows repeat
    torch.testing.assert_close(lti_states_at(u, rows, positions, response), states[rows, positions],
                               rtol=1e-12, atol=1e-12)


def test_a_patched_state_changes_the_output_as_the_recurrence_run_again():
    T, b, r, response, readout = random_lti()
    g = torch.Generator().manual_seed(2)
    u = torch.randn(4, 9, 3, dtype=f64, generator=g)
    rows, positions = torch.tensor([2, 0, 3]), torch.tensor([4, 0, 8])          # row 1 not patched; the last position
    values = torch.randn(3, 3, 4, dtype=f64, generator=g)
    y, _ = run_by_hand(u, T, b, r)
    y_patched, _ = run_by_hand(u, T, b, r, list(zip(rows.tolist(), positions.tolist(), values)))
    delta = lti_state_patch_effect(u, rows, positions, values, response, readout)
    torch.testing.assert_close(y + delta, y_patched, rtol=1e-12, atol=1e-12)
    assert delta[1].abs().max() == 0 and delta[2, :4].abs().max() == 0          # no row 1; nothing before p
    assert delta[2, 4:].abs().min() > 0                                         # from p on, everything moves


# ------------------------------------------------------------------ H3's state site
def h3_mixer(form):
    torch.manual_seed(0)
    model = build_model("h3", vocab_size=11, hidden_size=8, d_state=6, head_dim=2, ssm_form=form).double().eval()
    return model.model.layers[0].mixer


@pytest.mark.parametrize("form", ["reference", "mecheval-v1"])
def test_h3_reads_and_patches_its_state_as_a_hook_on_the_trajectory_would(form):
    m = h3_mixer(form)
    x = torch.randn(3, 10, 8, dtype=f64, generator=torch.Generator().manual_seed(3))
    seen = []
    hook = m.state.register_forward_hook(lambda mod, inp, out: seen.append(out.clone()))
    with torch.no_grad():
        y = m(x)
    hook.remove()
    trajectory = seen[0]                                                      # (B, L, C, *state)
    rows, positions = torch.tensor([1, 0, 1]), torch.tensor([9, 0, 2])
    with torch.no_grad(), m.state.reading_entries(rows, positions) as found:
        torch.testing.assert_close(m(x), y, rtol=1e-12, atol=1e-12)         # reading changes nothing
    assert len(found) == 1
    torch.testing.assert_close(found[0], trajectory[rows, positions], rtol=1e-10, atol=1e-12)

    rows, positions = torch.tensor([2, 0]), torch.tensor([3, 7])
    values = torch.randn(2, *trajectory.shape[2:], dtype=f64, generator=torch.Generator().manual_seed(4))

    def write(mod, inp, out):
        out = out.clone()
        out[rows, positions] = values
        return out

    hook = m.state.register_forward_hook(write)
    with torch.no_grad():
        by_hook = m(x)
    hook.remove()
    with torch.no_grad(), m.state.patching_entries(rows, positions, values):
        closed_form = m(x)
    torch.testing.assert_close(closed_form, by_hook, rtol=1e-9, atol=1e-10)
    assert (by_hook - y).abs().max() > 1e-2                                   # the patch matters
    # a hook observing the site as well: the trajectory carries the handed-over patch
    hook = m.state.register_forward_hook(lambda mod, inp, out: None)
    with torch.no_grad(), m.state.patching_entries(rows, positions, values):
        observed = m(x)
    hook.remove()
    torch.testing.assert_close(observed, by_hook, rtol=1e-9, atol=1e-10)


def test_entry_access_is_refused_where_a_site_has_none_or_a_row_repeats():
    plain = Site("a plain activation")
    with pytest.raises(TypeError, match="hooks only"), plain.reading_entries(torch.tensor([0]), torch.tensor([0])):
        pass
    state = h3_mixer("reference").state
    with pytest.raises(ValueError, match="at most once"), \
            state.patching_entries(torch.tensor([1, 1]), torch.tensor([0, 2]), torch.zeros(2, 1)):
        pass
    assert state.entry_patch is None and state.entry_read is None
