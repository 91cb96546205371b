"""What the recurrent mixers' own tests (DeltaNet, Mamba-2, Gated DeltaNet) share: their input, the
reading of site outputs, and the check that patching a state equals running the mixer's recurrence
by hand from the patched state."""
import torch


def random_x(B: int = 2, L: int = 11, D: int = 8, seed: int = 1) -> torch.Tensor:
    """A mixer input (B, L, D), float64, from its own generator."""
    return torch.randn(B, L, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def site_outputs(m, x: torch.Tensor, *names: str) -> tuple[torch.Tensor, dict]:
    """One forward of x with the mixer's sites ``names`` (``conv_output``, ``state``) listened to:
    (the mixer's output, {name: the site's output}). A listened-to state site is computed, which
    may sum in another order than a forward nobody listens to: compare outputs of such passes."""
    seen = {}
    hooks = [getattr(m, name).register_forward_hook(lambda mod, i, o, name=name: seen.setdefault(name, o))
             for name in names]
    out = m(x)
    for h in hooks:
        h.remove()
    return out, seen


def assert_state_patch_equals_the_recurrence_by_hand(m, x, by_hand, p: int = 4, q: int = 8) -> None:
    """Patch one entry of the state at position p and the whole state at q (through ``m.state``,
    the mixer's state site), and compare with ``by_hand(m, x, p, {p: S_p, q: S_q})``: the
    outputs from p on, the mixer's recurrence written out in the test. Positions before p must not
    move; p and every later one must."""
    clean, seen = site_outputs(m, x, "state")
    states = seen["state"]                                           # (B, L, *state)
    new_p = states[:, p].clone()
    new_p[:, 1, 2, 3] = 5.0                                          # one entry of the state at p
    new_q = torch.randn_like(states[:, q])                           # all of the state at q

    def patch(mod, i, o):
        o = o.clone()
        o[:, p], o[:, q] = new_p, new_q
        return o

    h = m.state.register_forward_hook(patch)
    got = m(x)
    h.remove()
    assert torch.equal(got[:, :p], clean[:, :p])
    want = by_hand(m, x, p, {p: new_p, q: new_q})
    assert (got[:, p:] - want).abs().max() <= 1e-10
    assert ((got - clean).abs().amax(dim=(0, 2))[p:] > 1e-8).all()   # p and every later position
