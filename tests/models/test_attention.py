"""The Transformer's attention implementations, chosen as transformers chooses them
(``attn_implementation``): "sdpa" (transformers' SDPA function, the default) and "eager" (ours,
written out). Both give the same outputs to float32 rounding on every path (full forward, padding
anywhere, the answer-only path, the cache); eager runs whenever probabilities are asked for and on
the stacked (vmap) path; the intervention sites see the same tensors under either."""
import copy

import pytest
import torch
from torch.nn import functional as F
from transformers import AutoModelForCausalLM

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.models import build_model, mixer_transformer
from hf_mecheval.models.mixer_transformer import eager_attention_forward, visible_keys

from test_models import tiny


def transformer(implementation: str, seed: int = 0):
    """A float32 Transformer wide enough for rounding to show (4 heads of 8), with ``implementation``."""
    torch.manual_seed(seed)
    model = build_model("transformer", vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        max_position_embeddings=64).eval()
    model.set_attn_implementation(implementation)
    return model


def ids_of(B=3, L=20, seed=0):
    return torch.randint(3, 40, (B, L), generator=torch.Generator().manual_seed(seed))


def padded_anywhere(ids):
    """A mask with left padding (row 0), a hole (row 1) and right padding (row 2)."""
    mask = torch.ones_like(ids)
    mask[0, :4], mask[1, 6:9], mask[2, -5:] = 0, 0, 0
    return mask


@pytest.fixture
def sdpa_calls(monkeypatch):
    """Counts the calls of PyTorch's fused attention (transformers' SDPA function looks it up at
    each call)."""
    calls = []
    fused = F.scaled_dot_product_attention
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention",
                        lambda *a, **k: calls.append(1) or fused(*a, **k))
    return calls


def test_eager_attention_equals_pytorchs_fused_attention():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(3, 2, 3, 7, 5, generator=g, dtype=torch.float64).unbind(0)      # (B, H, L, hd)
    scaling = 5 ** -0.5
    y, probabilities = eager_attention_forward(torch.nn.Module(), q, k, v, None, scaling)
    torch.testing.assert_close(y.transpose(1, 2), F.scaled_dot_product_attention(q, k, v, is_causal=True),
                               rtol=0, atol=1e-12)
    torch.testing.assert_close(probabilities.sum(-1), torch.ones(2, 3, 7, dtype=torch.float64), rtol=0, atol=1e-12)
    assert not probabilities.triu(1).any()                                    # causal
    # a padding mask with a hole: the hidden keys get no weight, and SDPA agrees under the same mask
    mask = torch.ones(2, 7, dtype=torch.bool)
    mask[0, 2:4] = False
    visible = visible_keys(7, None, mask, q.device)                           # (B, 1, L, L)
    y, probabilities = eager_attention_forward(torch.nn.Module(), q, k, v, visible, scaling)
    torch.testing.assert_close(y.transpose(1, 2), F.scaled_dot_product_attention(q, k, v, attn_mask=visible),
                               rtol=0, atol=1e-12)
    assert not probabilities[0, :, 4:, 2:4].any()


@pytest.mark.parametrize("implementation", ["eager", "sdpa"])
def test_the_implementation_is_chosen_as_transformers_chooses(implementation, tmp_path, sdpa_calls):
    model = transformer("sdpa")
    assert tiny("transformer").config._attn_implementation == "sdpa"          # transformers' default
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation=implementation)
    assert loaded.config._attn_implementation == implementation
    with torch.no_grad():
        loaded(ids_of())
    assert len(sdpa_calls) == (2 if implementation == "sdpa" else 0)           # one per layer
    other = "eager" if implementation == "sdpa" else "sdpa"
    loaded.set_attn_implementation(other)
    assert all(m.config._attn_implementation == other for m in loaded.modules() if hasattr(m, "config"))
    with pytest.raises(ValueError, match='attn_implementation="foo"'):
        loaded.set_attn_implementation("foo")


def test_a_model_without_softmax_attention_has_none_to_choose(tmp_path):
    tiny("mamba").save_pretrained(tmp_path)
    assert AutoModelForCausalLM.from_pretrained(tmp_path).config._attn_implementation == "eager"
    with pytest.raises(ValueError, match="does not support"):
        AutoModelForCausalLM.from_pretrained(tmp_path, attn_implementation="sdpa")


def _same(a, b):
    torch.testing.assert_close(a, b)        # float32's default tolerances: rounding, no more


def test_eager_and_sdpa_give_the_same_outputs_to_float32_rounding():
    sdpa, eager = transformer("sdpa"), transformer("eager")
    ids = ids_of()
    mask = padded_anywhere(ids)
    labels = torch.full_like(ids, -100)
    labels[torch.arange(3), torch.tensor([19, 12, 14])] = 7                   # one answer per row
    with torch.no_grad():
        for kwargs in ({}, {"attention_mask": mask}, {"labels": labels}, {"labels": labels, "attention_mask": mask}):
            a, b = sdpa(ids, output_hidden_states="labels" not in kwargs, **kwargs), eager(ids, **kwargs)
            _same(a.logits, b.logits)
            if "labels" in kwargs:                                            # the answer-only path
                assert a.logits.shape == (3, 1, 40)
                _same(a.loss, b.loss)
        # the cached forward: a prompt read in one pass, then a token at a time
        a, b = sdpa(ids[:, :12], use_cache=True), eager(ids[:, :12], use_cache=True)
        _same(a.cache.layers[0].keys, b.cache.layers[0].keys)
        _same(sdpa(ids[:, 12:13], cache=a.cache).logits, eager(ids[:, 12:13], cache=b.cache).logits)
    generated = {name: model.generate(ids, attention_mask=mask, max_new_tokens=4, return_dict_in_generate=True,
                                      output_logits=True) for name, model in (("sdpa", sdpa), ("eager", eager))}
    assert torch.equal(generated["sdpa"].sequences, generated["eager"].sequences)
    for a, b in zip(generated["sdpa"].logits, generated["eager"].logits):
        _same(a, b)


def test_output_attentions_falls_back_to_eager_under_sdpa(monkeypatch, sdpa_calls):
    warnings = []
    monkeypatch.setattr(mixer_transformer.logger, "warning_once", warnings.append)
    sdpa, eager = transformer("sdpa"), transformer("eager")
    ids = ids_of()
    with torch.no_grad():
        fallen_back = sdpa(ids, output_attentions=True)
        assert not sdpa_calls and len(warnings) == 2 and "falls back to `eager`" in warnings[0]
        chosen = eager(ids, output_attentions=True)
    assert len(warnings) == 2                                                 # eager chosen: nothing to say
    for a, b in zip(fallen_back.attentions, chosen.attentions):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # as transformers: a config cannot ask for the probabilities of an SDPA model
    with pytest.raises(ValueError, match="output_attentions"):
        sdpa.config.output_attentions = True


def test_the_stacked_path_attends_eagerly_whatever_the_setting(sdpa_calls):
    sdpa, eager = transformer("sdpa"), transformer("eager")
    sdpa.model.use_functional_path(True)                                     # what StackedCausalLM sets
    ids = ids_of()
    with torch.no_grad():
        torch.testing.assert_close(sdpa(ids).logits, eager(ids).logits, rtol=0, atol=0)
    assert not sdpa_calls


def test_the_sites_see_the_same_tensors_under_either_implementation():
    """Every site is visited with the same shapes and values to float32 rounding, and a patch at a
    site (zeroing layer 0's mixer output at position 5, as the intervention engine's hook
    replaces an activation) changes the logits alike."""
    ids = ids_of()
    seen, logits = {}, {}
    for implementation in ("sdpa", "eager"):
        model = transformer(implementation)
        readings = seen[implementation] = {}
        hooks = [model.get_site(name).register_forward_hook(lambda m, a, out, name=name: readings.__setitem__(name, out))
                 for name in model.site_names()]
        with torch.no_grad():
            model(ids)
        for hook in hooks:
            hook.remove()

        def patch(module, args, out):
            out = out.clone()
            out[:, 5] = 0
            return out

        with torch.no_grad(), model.get_site("layers.0.mixer_output").register_forward_hook(patch):
            logits[implementation] = model(ids).logits
    # six sites a block: its input and output, the mixer's and the MLP's input and output
    assert seen["sdpa"].keys() == seen["eager"].keys() and len(seen["sdpa"]) == 2 * 6
    for name in seen["sdpa"]:
        _same(seen["sdpa"][name], seen["eager"][name])
    _same(logits["sdpa"], logits["eager"])
    assert (logits["sdpa"][:, 5:] - transformer("sdpa")(ids).logits[:, 5:]).abs().max() > 1e-3   # the patch did something


def test_a_deep_copy_switched_to_eager_leaves_the_original_on_sdpa(sdpa_calls):
    # what transformers' own eager-versus-sdpa test does: the mixers read the model's config object
    sdpa = transformer("sdpa")
    eager = copy.deepcopy(sdpa)
    eager.set_attn_implementation("eager")
    with torch.no_grad():
        eager(ids_of())
        assert not sdpa_calls
        sdpa(ids_of())
    assert len(sdpa_calls) == 2
