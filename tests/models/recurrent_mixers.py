"""What the recurrent mixers' own tests (DeltaNet, Mamba, Mamba-2, Gated DeltaNet) share: their
input, the reading of site outputs, the check that patching a state equals running the mixer's
recurrence by hand from the patched state, and a training step on the compiled kernels against
the PyTorch path."""
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


def assert_training_step_equal_across_kernels(architecture: str, dtype: torch.dtype, loss_tolerance: float,
                                              grad_tolerance: float, **fields) -> None:
    """One training step as a run takes it (2 layers: layer 0 on the full path, layer 1 on the
    answer-only path, the answer at the last position) with kernels="torch" and kernels="auto"
    (the compiled CPU kernels), the same seed: the losses within ``loss_tolerance`` of the
    PyTorch loss, and every parameter's gradient within ``grad_tolerance`` of its largest entry."""
    from hf_mecheval.models import build_model
    results = {}
    for kernels in ("torch", "auto"):
        torch.manual_seed(0)
        model = build_model(architecture, vocab_size=11, num_hidden_layers=2, kernels=kernels, **fields).to(dtype)
        ids = torch.randint(3, 11, (4, 23))
        labels = torch.full_like(ids, -100)
        labels[:, -1] = ids[:, -1]
        loss = model(ids, labels=labels).loss
        loss.backward()
        results[kernels] = loss.item(), {n: p.grad for n, p in model.named_parameters()}
    (loss, grads), (want_loss, want_grads) = results["auto"], results["torch"]
    assert abs(loss - want_loss) <= loss_tolerance * abs(want_loss)
    for n, want in want_grads.items():
        assert (grads[n] - want).abs().max() <= grad_tolerance * want.abs().max(), n
