"""The outputs a transformers user asks for, by keyword or by config: hidden states, attention
probabilities, tuples instead of dataclasses, the cache; shifted labels; generate() returning
hidden states and attentions; assisted decoding refused as for any stateful model; and a prompt
read in one parallel pass into the cache."""
import math

import pytest
import torch
from transformers.modeling_outputs import CausalLMOutputWithPast

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.models.recurrent_cache import RecurrentCache

from test_models import ARCHS, tiny


def ids_of(B=2, L=9, seed=0):
    return torch.randint(3, 11, (B, L), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("arch", ["transformer", "mamba"])
def test_the_config_decides_what_a_forward_returns_unless_the_call_says_otherwise(arch):
    model = tiny(arch).double().eval()
    ids = ids_of()
    with torch.no_grad():
        plain = model(ids)
        assert plain.hidden_states is None and plain.cache is None
        model.config.output_hidden_states = True
        hidden = model(ids).hidden_states
        assert len(hidden) == model.config.num_hidden_layers + 1 and hidden[0].shape == (2, 9, 8)
        assert model(ids, output_hidden_states=False).hidden_states is None
        model.config.use_cache = True
        assert isinstance(model(ids).cache, RecurrentCache)
        assert model(ids, use_cache=False).cache is None
        model.config.return_dict = False
        as_tuple = model(ids, use_cache=False, output_hidden_states=False)
        assert isinstance(as_tuple, tuple) and torch.equal(as_tuple[0], plain.logits)
        assert isinstance(model(ids, return_dict=True), CausalLMOutputWithPast)
    model.config.return_dict = True
    # the keyword alone, on the backbone too
    out = model.model(ids, return_dict=False, use_cache=False, output_hidden_states=False)
    assert isinstance(out, tuple) and len(out) == 1


def test_the_transformer_returns_its_attention_probabilities():
    model = tiny("transformer").double().eval()
    ids = ids_of(L=7)
    with torch.no_grad():
        out = model(ids, output_attentions=True, output_hidden_states=True)
    assert len(out.attentions) == model.config.num_hidden_layers
    # by hand for layer 0: softmax(q k^T / sqrt(hd)) under the causal mask, from its input
    block = model.model.layers[0]
    x = block.mixer_norm(out.hidden_states[0])
    q, k, _ = x.matmul(block.mixer.qkv.weight.T).split(8, dim=-1)               # one head of 8
    scores = (q @ k.transpose(-1, -2) / math.sqrt(8)).masked_fill(~torch.ones(7, 7, dtype=torch.bool).tril(), -math.inf)
    torch.testing.assert_close(out.attentions[0][:, 0], scores.softmax(-1), rtol=0, atol=1e-12)
    # and the logits are those of the plain forward
    torch.testing.assert_close(out.logits, model(ids).logits, rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", ["mamba", "deltanet"])
def test_a_model_without_softmax_attention_returns_no_attentions(arch):
    out = tiny(arch).eval()(ids_of(), output_attentions=True)
    assert out.attentions is None


@pytest.mark.parametrize("arch", ["transformer", "mamba", "h3"])
def test_generate_returns_hidden_states_and_attentions_of_each_step(arch):
    model = tiny(arch).double().eval()
    ids = ids_of(L=6)
    out = model.generate(ids, max_new_tokens=3, return_dict_in_generate=True, output_hidden_states=True,
                         output_attentions=True, output_logits=True)
    assert len(out.hidden_states) == 3
    with torch.no_grad():
        full = model(out.sequences[:, :-1], output_hidden_states=True, output_attentions=True)
    # step 0 covers the prompt, each later step one token: together the full forward's
    for layer in range(model.config.num_hidden_layers + 1):
        stitched = torch.cat([step[layer] for step in out.hidden_states], dim=1)
        torch.testing.assert_close(stitched, full.hidden_states[layer], rtol=0, atol=1e-9)
    if arch == "transformer":
        last = out.attentions[-1][0]                                             # (B, H, 1, 8)
        torch.testing.assert_close(last[:, :, 0], full.attentions[0][:, :, -1], rtol=0, atol=1e-9)
    else:
        assert all(step is None for step in out.attentions) or out.attentions is None


def test_shift_labels_score_the_same_positions_as_labels():
    model = tiny("mamba").double()
    ids = ids_of(L=8)
    labels = torch.full_like(ids, -100)
    labels[:, 5:] = ids[:, 5:]
    shifted = torch.full_like(ids, -100)
    shifted[:, :-1] = labels[:, 1:]
    by_labels = model(ids, labels=labels).loss
    torch.testing.assert_close(model(ids, shift_labels=shifted).loss, by_labels, rtol=0, atol=1e-12)
    # one scored position per row (the answer-only path): the same again
    labels[:, 5:-1] = -100
    shifted[:, 4:-2] = -100
    torch.testing.assert_close(model(ids, shift_labels=shifted).loss, model(ids, labels=labels).loss,
                               rtol=0, atol=1e-12)


@pytest.mark.parametrize("kwargs", [{"prompt_lookup_num_tokens": 2}, {"assistant_model": "self"}],
                         ids=["prompt-lookup", "assisted"])
def test_assisted_decoding_is_refused_as_for_any_stateful_model(kwargs):
    model = tiny("deltanet").eval()
    if kwargs.get("assistant_model") == "self":
        kwargs = {"assistant_model": tiny("deltanet").eval()}
    with pytest.raises(ValueError, match="not supported with stateful models"):
        model.generate(ids_of(), max_new_tokens=3, **kwargs)


@pytest.mark.parametrize("arch", ARCHS)
def test_a_prompt_is_read_in_one_parallel_pass_where_the_mixers_allow(arch, monkeypatch):
    model = tiny(arch).double().eval()
    ids = ids_of(L=12)
    steps = []
    for block in model.model.layers:
        original = block.mixer.step
        monkeypatch.setattr(block.mixer, "step", lambda *a, _f=original, **k: steps.append(1) or _f(*a, **k))
    cache = RecurrentCache(model.config.num_hidden_layers)
    with torch.no_grad():
        prefilled = model(ids, cache=cache).logits
    torch.testing.assert_close(prefilled, model(ids).logits, rtol=0, atol=1e-9)
    stepped_layers = sum(not hasattr(b.mixer, "forward_with_state") for b in model.model.layers)
    assert stepped_layers == 0 and steps == []          # (only H3's mecheval-v1 form would step through it)
    assert cache.get_seq_length() == 12
