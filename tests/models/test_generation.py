"""The transformers conventions: generate() with the recurrent cache, attention_mask (left padding),
gradient checkpointing."""
import pytest
import torch

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.errors import MechEvalError
from hf_mecheval.models.recurrent_cache import RecurrentCache

from test_models import ARCHS, tiny

EOS, PAD = 2, 0


def naive_generate(model, ids, n, pick):
    """The reference: one full forward over the whole sequence per new token, ``pick(logits)`` ->
    tokens, and generate()'s stopping rule (a row that produced EOS gets PAD; all done = stop)."""
    done = torch.zeros(len(ids), dtype=torch.bool)
    for _ in range(n):
        with torch.no_grad():
            logits = model(ids).logits[:, -1].float()          # generate() picks from float32 logits
        token = torch.where(done, PAD, pick(logits))
        ids = torch.cat([ids, token[:, None]], dim=1)
        done |= token == EOS
        if done.all():
            break
    return ids


@pytest.mark.parametrize("arch", ARCHS)
def test_greedy_generate_equals_a_loop_of_full_forwards_and_steps_once_per_token(arch):
    model = tiny(arch).double().eval()
    ids = torch.randint(3, 11, (3, 7))
    lengths = []
    hook = model.model.register_forward_pre_hook(
        lambda m, args, kwargs: lengths.append(kwargs["input_ids"].shape[1]), with_kwargs=True)
    out = model.generate(ids, max_new_tokens=6, return_dict_in_generate=True)
    hook.remove()
    assert torch.equal(out.sequences, naive_generate(model, ids, 6, lambda logits: logits.argmax(-1)))
    # the prompt once, then one token per forward: the recurrent cache carried the rest
    assert lengths[0] == 7 and set(lengths[1:]) <= {1} and len(lengths) == out.sequences.shape[1] - 7
    assert isinstance(out.cache, RecurrentCache) and out.cache.get_seq_length() == out.sequences.shape[1] - 1


@pytest.mark.parametrize("arch", ["transformer", "mamba"])
def test_sampling_generate_equals_the_naive_loop_with_the_same_seed(arch):
    model = tiny(arch).double().eval()
    ids = torch.randint(3, 11, (4, 6))
    torch.manual_seed(123)
    got = model.generate(ids, max_new_tokens=8, do_sample=True, top_k=0)
    torch.manual_seed(123)
    want = naive_generate(model, ids, 8, lambda logits: torch.multinomial(logits.softmax(-1), 1)[:, 0])
    assert torch.equal(got, want)


def test_default_generation_answers_one_token_greedily():
    model = tiny("deltanet").eval()
    ids = torch.randint(3, 11, (2, 9))
    assert model.generate(ids).shape == (2, 10)
    assert torch.equal(model.generate(ids)[:, -1], model(ids).logits[:, -1].argmax(-1))


@pytest.mark.parametrize("arch", ARCHS)
def test_left_padding_gives_the_logits_of_the_unpadded_rows(arch):
    model = tiny(arch).double().eval()
    rows = [torch.randint(3, 11, (n,)) for n in (9, 6, 4)]
    width = 9
    ids = torch.stack([torch.cat([torch.full((width - len(r),), PAD), r]) for r in rows])
    mask = torch.stack([torch.cat([torch.zeros(width - len(r)), torch.ones(len(r))]) for r in rows]).long()
    with torch.no_grad():
        padded = model(ids, attention_mask=mask).logits
        padded_cached = model(ids, attention_mask=mask, use_cache=True).logits
        for i, r in enumerate(rows):
            alone = model(r[None]).logits[0]                                       # (len, V)
            torch.testing.assert_close(padded[i, width - len(r):], alone, rtol=0, atol=1e-10)
            torch.testing.assert_close(padded_cached[i, width - len(r):], alone, rtol=0, atol=1e-10)
    # and generation from a left-padded batch is each row's own generation
    out = model.generate(ids, attention_mask=mask, max_new_tokens=4)
    for i, r in enumerate(rows):
        alone = model.generate(r[None], max_new_tokens=4)[0]
        n = min(len(alone), out.shape[1] - (width - len(r)))
        assert torch.equal(out[i, width - len(r):][:n], alone[:n])


def test_right_padding_and_all_ones_masks_change_nothing():
    model = tiny("mamba").double().eval()
    ids = torch.randint(3, 11, (2, 8))
    mask = torch.ones_like(ids)
    mask[1, 5:] = 0
    with torch.no_grad():
        plain = model(ids).logits
        torch.testing.assert_close(model(ids, attention_mask=torch.ones_like(ids)).logits, plain, rtol=0, atol=0)
        torch.testing.assert_close(model(ids, attention_mask=mask).logits[1, :5], plain[1, :5], rtol=0, atol=0)


@pytest.mark.parametrize("arch", [a for a in ARCHS if a != "transformer"])
def test_a_mask_with_holes_is_refused_where_a_mixer_cannot_skip_a_token(arch):
    model = tiny(arch).eval()
    ids = torch.randint(3, 11, (2, 8))
    mask = torch.ones_like(ids)
    mask[0, 3] = 0
    for call in (lambda: model(ids, attention_mask=mask), lambda: model(ids, attention_mask=mask, use_cache=True),
                 lambda: model.generate(ids, attention_mask=torch.tril(torch.ones_like(ids)), max_new_tokens=2)):
        with pytest.raises(MechEvalError, match="padding between the tokens of a row: only left and right padding"):
            call()


@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_the_transformer_reads_a_row_with_holes_as_the_row_without_them(implementation):
    model = tiny("transformer").double().eval()
    model.set_attn_implementation(implementation)
    ids = torch.randint(3, 11, (3, 10))
    mask = torch.ones_like(ids)
    mask[0, 2], mask[1, 4:7], mask[2, [0, 5, 9]] = 0, 0, 0                 # a hole; a wider one; all kinds
    with torch.no_grad():
        for kwargs in ({}, {"use_cache": True}):
            padded = model(ids, attention_mask=mask, **kwargs).logits
            for i in range(3):
                real = mask[i].bool()
                alone = model(ids[i:i + 1, real]).logits[0]
                torch.testing.assert_close(padded[i, real], alone, rtol=0, atol=1e-10)


def test_the_transformer_generates_under_any_mask_as_a_loop_of_full_forwards_does():
    """``generate(ids, attention_mask=torch.tril(torch.ones_like(ids)))``: rows padded on the
    right, so that the generated tokens follow padding (holes). With the cache and without it,
    generate() gives what full forwards over the growing sequence and mask give."""
    model = tiny("transformer").double().eval()
    ids = torch.randint(3, 11, (4, 6))
    mask = torch.tril(torch.ones_like(ids))
    cached = model.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=None)
    uncached = model.generate(ids, attention_mask=mask, max_new_tokens=4, eos_token_id=None, use_cache=False)
    expected = ids
    for _ in range(4):
        grown = torch.cat([mask, torch.ones(4, expected.shape[1] - 6, dtype=mask.dtype)], dim=1)
        with torch.no_grad():
            token = model(expected, attention_mask=grown).logits[:, -1].float().argmax(-1)   # as generate() picks
        expected = torch.cat([expected, token[:, None]], dim=1)
    assert torch.equal(cached, expected) and torch.equal(uncached, expected)


def test_continuing_from_a_returned_cache_equals_one_generation():
    model = tiny("h3").double().eval()
    ids = torch.randint(3, 11, (2, 5))
    first = model.generate(ids, max_new_tokens=3, return_dict_in_generate=True, eos_token_id=None)
    more = model.generate(first.sequences, cache=first.cache, max_new_tokens=3, eos_token_id=None)
    assert torch.equal(more, model.generate(ids, max_new_tokens=6, eos_token_id=None))


@pytest.mark.parametrize("arch", ["transformer", "mamba", "hyena"])
def test_beam_search_with_the_cache_equals_beam_search_without_it(arch):
    # use_cache=False: every step is a full forward, so the reordering of the recurrent states
    # between beams is checked against a computation that has none
    model = tiny(arch).double().eval()
    ids = torch.randint(3, 11, (2, 6))
    kwargs = dict(max_new_tokens=4, num_beams=3, eos_token_id=None)
    assert torch.equal(model.generate(ids, **kwargs), model.generate(ids, use_cache=False, **kwargs))


def test_no_warning_about_a_maximum_length_of_zero(caplog):
    model = tiny("mamba").eval()       # max_position_embeddings = 0: no positions, any length
    model.generate(torch.randint(3, 11, (1, 20)), max_new_tokens=2)
    assert "maximum length (0)" not in caplog.text


@pytest.mark.parametrize("arch", ARCHS)
def test_gradient_checkpointing_recomputes_blocks_and_gives_the_same_gradients(arch):
    model = tiny(arch).double().train()
    ids = torch.randint(3, 11, (3, 10))
    labels = torch.full_like(ids, -100)
    labels[:, 7] = ids[:, 7]

    def gradients():
        model.zero_grad()
        model(ids, labels=labels).loss.backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}

    plain = gradients()
    calls = []
    # a pre-hook: the recomputation stops once it has every saved tensor back, which for Mamba
    # (no MLP) is inside the mixer, before a forward hook would run
    hook = model.model.layers[0].mixer.register_forward_pre_hook(lambda *a: calls.append(1))
    model.gradient_checkpointing_enable()        # what Trainer's --gradient_checkpointing calls
    checkpointed = gradients()
    hook.remove()
    model.gradient_checkpointing_disable()
    assert len(calls) == 2                     # the forward, then its recomputation in backward
    assert plain.keys() == checkpointed.keys()
    for name in plain:
        torch.testing.assert_close(checkpointed[name], plain[name], rtol=1e-9, atol=1e-12)
