"""The generation cache read as transformers reads its own: each layer holds its mixer's state in
transformers' layout (keys and values; a convolution's last inputs, time last; a recurrent state),
checked against the same quantities read from the model's own activations; and the ``Cache`` API
(``is_initialized``, ``get_seq_length``, the batch operations, ``reset``) behaves as on
transformers' caches. (The shapes, for every architecture: ``test_past_key_values_format`` in
test_transformers_common.py.)"""
import pytest
import torch

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.models.recurrent_cache import KeyValueLayer, RecurrentCache, RecurrentStateLayer
from hf_mecheval.models.sites import Site

from test_models import ARCHS, tiny

# What each mixer's short convolution reads, from its own projections of the mixer's input x
# (B, L, D): the cache keeps the last K-1 of them
CONV_INPUT = {
    "MambaMixer": lambda m, x: m.in_proj(x)[..., :m.E],
    "Mamba2Mixer": lambda m, x: m.in_proj(x)[..., m.E:2 * m.E + 2 * m.G * m.N],
    "DeltaNetMixer": lambda m, x: torch.cat([m.q_proj(x), m.k_proj(x), m.v_proj(x)], dim=-1),
    "GatedDeltaNetMixer": lambda m, x: torch.cat([m.q_proj(x), m.k_proj(x), m.v_proj(x)], dim=-1),
    "HyenaOperator": lambda m, x: m.in_proj(x),
    "BaseConv": lambda m, x: x,
    # the shift SSM's register: with its initial B = e_0 (a pure shift) it holds the last d_state keys
    "H3Reference": lambda m, x: m.k_proj(x),
}


def ids_of(B=2, L=9, seed=0):
    return torch.randint(3, 11, (B, L), generator=torch.Generator().manual_seed(seed))


def _activations(model, ids) -> dict:
    """{(layer, site name): activation} of a plain forward: each mixer's input, its state
    trajectory (the state site, (B, L, ...)) and its short convolution's output, where it has them."""
    seen, hooks = {}, []
    for i, block in enumerate(model.model.layers):
        sites = {"mixer_input": block.mixer_input, "state": getattr(block.mixer, "state", None),
                 "conv_output": getattr(block.mixer, "conv_output", None)}
        for name, site in sites.items():
            if isinstance(site, Site):
                hooks.append(site.register_forward_hook(lambda m, a, out, key=(i, name): seen.__setitem__(key, out.clone())))
    with torch.no_grad():
        model(ids)
    for hook in hooks:
        hook.remove()
    return seen


@pytest.mark.parametrize("arch", ARCHS)
def test_each_layer_holds_its_mixers_state_in_transformers_layout(arch):
    model = tiny(arch).double().eval()
    ids = ids_of()
    seen = _activations(model, ids)
    with torch.no_grad():
        cache = model(ids, use_cache=True).cache
    for i, (block, layer) in enumerate(zip(model.model.layers, cache.layers)):
        mixer, x = block.mixer, seen[(i, "mixer_input")]
        checked = []
        if isinstance(layer, KeyValueLayer):
            D = x.shape[-1]
            k, v = mixer.qkv(x)[..., D:].chunk(2, dim=-1)
            heads = lambda t: t.unflatten(-1, (mixer.num_heads, mixer.head_dim)).transpose(1, 2)  # noqa: E731
            torch.testing.assert_close(layer.keys, heads(k), rtol=0, atol=1e-12)
            torch.testing.assert_close(layer.values, heads(v), rtol=0, atol=1e-12)
            assert layer.real.all() and layer.get_seq_length() == ids.shape[1]
            continue
        assert isinstance(layer, RecurrentStateLayer)
        conv = cache.get_conv_state(i)
        if conv is not None:                                    # (B, channels, K-1), oldest first
            width = conv.shape[-1]
            expected = CONV_INPUT[type(mixer).__name__](mixer, x)[:, -width:].transpose(1, 2)
            torch.testing.assert_close(conv, expected, rtol=0, atol=1e-12)
            checked.append("conv")
        recurrent = cache.get_recurrent_state(i)
        if recurrent is not None:                               # the state at the last position
            torch.testing.assert_close(recurrent, seen[(i, "state")][:, -1], rtol=0, atol=1e-10)
            checked.append("recurrent")
        if layer.input_history is not None:                     # what the long filter reads: every input
            if type(mixer).__name__ == "HyenaOperator":
                _, x1, v = seen[(i, "conv_output")].chunk(3, dim=-1)
                expected = v * x1                               # the gated v
            else:
                expected = x                                    # BaseConv's long layer: its input
            torch.testing.assert_close(layer.input_history, expected, rtol=0, atol=1e-12)
            checked.append("history")
        assert checked, f"layer {i} holds nothing"


def test_the_cache_api_reads_as_transformers():
    model = tiny("based").double().eval()                      # a short convolution, then linear attention
    ids = ids_of()
    cache = RecurrentCache(model.config.num_hidden_layers)
    assert not cache.is_initialized and cache.get_seq_length() == 0 and cache.batch_size == -1
    with torch.no_grad():
        first = model(ids, cache=cache).logits
    assert cache.is_initialized and cache.get_seq_length() == 9 and cache.batch_size == 2
    assert cache.get_max_length() == -1 and cache.get_mask_sizes(1, 0) == (10, 0)
    assert cache.has_previous_state(0) and cache.has_previous_state(1)
    assert cache.get_recurrent_state(0) is None and cache.get_conv_state(1) is None
    assert not cache.is_croppable and not cache.is_compileable
    with pytest.raises(NotImplementedError, match="rolled back"):
        cache.crop(-1)

    # the batch operations move every state's rows (and each row's position)
    conv, recurrent = cache.get_conv_state(0).clone(), cache.get_recurrent_state(1).clone()
    cache.reorder_cache(torch.tensor([1, 0]))
    assert torch.equal(cache.get_conv_state(0), conv.flip(0)) and torch.equal(cache.get_recurrent_state(1), recurrent.flip(0))
    cache.batch_repeat_interleave(2)
    assert torch.equal(cache.get_recurrent_state(1), recurrent[[1, 1, 0, 0]]) and cache.batch_size == 4
    cache.batch_select_indices(torch.tensor([1, 2]))
    assert torch.equal(cache.get_conv_state(0), conv[[1, 0]])

    # reset: empty again, and the next forward starts afresh
    cache.reset()
    assert not cache.is_initialized and cache.get_seq_length() == 0 and cache.get_conv_state(0) is None
    with torch.no_grad():
        torch.testing.assert_close(model(ids, cache=cache).logits, first, rtol=0, atol=0)


def test_the_key_value_layer_takes_transformers_updates():
    model = tiny("transformer").double().eval()
    with torch.no_grad():
        cache = model(ids_of(), use_cache=True).cache                       # 9 positions, 1 head of 8
    new_keys = torch.randn(2, 1, 3, 8, dtype=torch.float64)
    keys, values = cache.update(new_keys, new_keys + 1, 0)
    assert keys.shape == (2, 1, 12, 8) and torch.equal(keys[:, :, -3:], new_keys)
    assert torch.equal(values[:, :, -3:], new_keys + 1)
    layer = cache.layers[0]
    assert layer.real.shape == (2, 12) and layer.real.all() and layer.get_seq_length() == 12
