"""The sites under nnsight: where the blocks' `input`/`output` sites appear, and state sites read
and patched with no `materialize_sites(True)`."""
import importlib.util
import sys
import warnings
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
from test_models import tiny  # noqa: E402

pytestmark = pytest.mark.skipif(importlib.util.find_spec("nnsight") is None,
                                reason="nnsight not installed (the interp extra)")


def wrap(model):
    from nnsight import NNsight

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = NNsight(model)
    return wrapped, [str(w.message) for w in caught]


def read_with_hooks(model, ids, names):
    seen, handles = {}, []
    for name in names:
        handles.append(model.get_site(name).register_forward_hook(
            lambda m, i, o, name=name: seen.__setitem__(name, o.detach().clone())))
    with torch.no_grad():
        model(ids)
    for h in handles:
        h.remove()
    return seen


def test_block_input_and_output_sites_under_nnsight():
    model = tiny("mamba").eval()
    ids = torch.randint(3, 11, (2, 7))
    nm, notes = wrap(model)
    # nnsight serves .input/.output on every module, so it names the sites E_input / E_output
    assert any("'model.model.layers.1' has a submodule named 'input'" in n and "E_input" in n for n in notes)
    with nm.trace(ids):                                            # in execution order
        block_in = nm.model.layers[1].input.save()                 # the block's input ...
        site_in = nm.model.layers[1].E_input.output.save()         # ... is the site layers.1.input
        site_out = nm.model.layers[1].E_output.output.save()
        block_out = nm.model.layers[1].output.save()               # the block's output = layers.1.output
    hooked = read_with_hooks(model, ids, ["layers.1.input", "layers.1.output"])
    assert torch.equal(block_in, hooked["layers.1.input"]) and torch.equal(site_in, hooked["layers.1.input"])
    assert torch.equal(block_out, hooked["layers.1.output"]) and torch.equal(site_out, hooked["layers.1.output"])


@pytest.mark.parametrize("arch", ["mamba", "deltanet"])
def test_a_state_site_reads_and_patches_under_nnsight_without_materialize_sites(arch):
    model = tiny(arch).double().eval()
    ids = torch.randint(3, 11, (2, 7))
    other = torch.randint(3, 11, (2, 7))
    site = "layers.1.mixer.state"
    # the references: torch hooks with every state site materialised, as nnsight has them (the
    # paths that skip states compute the same up to rounding)
    model.materialize_sites(True)
    want = read_with_hooks(model, ids, [site])[site]
    nm, _ = wrap(model)
    model.materialize_sites(False)
    with nm.trace(ids):
        state = nm.model.layers[1].mixer.state.output.save()
    assert torch.equal(state, want)
    # patch position 3 of the other document's state with this one's, through nnsight and through a hook
    with nm.trace(other):
        nm.model.layers[1].mixer.state.output[:, 3] = want[:, 3]
        patched = nm.output.logits.save()

    def patch(module, inputs, output):
        output = output.clone()
        output[:, 3] = want[:, 3]
        return output

    handle = model.get_site(site).register_forward_hook(patch)
    with torch.no_grad():
        hooked = model(other).logits
    handle.remove()
    torch.testing.assert_close(patched, hooked, rtol=0, atol=1e-14)
    with torch.no_grad():
        assert (hooked - model(other).logits).abs().max() > 1e-12     # the patch did something (small at init)
