"""The mixer contract (``hf_mecheval/models/mixers.py``), checked for every mixer of every registered
architecture — built-in ones and a plug-in registered from outside the package — at its spec's
tiny configuration and its ``test_variants``: causality, ``step`` == ``forward`` (in float64, and
in float32 to rounding), the answer-position path, gradients, vmap over stacked copies, state
patches and the gradient through them, left padding; and each architecture's
save/load round trip through the Auto classes. A new architecture gets all of it by registering."""
import json
import sys
import tempfile
from pathlib import Path

import pytest
import torch
from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.models import ARCHITECTURES, MODEL_CLASSES, build_model
from hf_mecheval.models.mixers import at_positions
from hf_mecheval.models.sites import Site

from plugin_package import install_plugin

PLUGIN = install_plugin(Path(tempfile.mkdtemp(prefix="mecheval-plugin-")))
f64 = torch.float64


def _cases():
    """(architecture, variant fields, layer) for every mixer name each architecture's layers use."""
    cases = []
    for spec in ARCHITECTURES.values():
        for variant in ({}, *spec.test_variants):
            config = spec.config_class(**spec.tiny_fields(**variant))
            seen = set()
            for layer, mixer_name in enumerate(config.layer_mixers()):
                if mixer_name not in seen:
                    seen.add(mixer_name)
                    label = "-".join([spec.name, mixer_name, *(f"{k}={v}" for k, v in variant.items())])
                    cases.append(pytest.param(spec.name, variant, layer, id=label))
    return cases


CASES = _cases()


def make_mixer(arch, variant, layer, seed=0, dtype=f64):
    spec = ARCHITECTURES[arch]
    config = spec.config_class(**spec.tiny_fields(**variant))
    torch.manual_seed(seed)
    return spec.mixers[config.layer_mixers()[layer]](config, layer).to(dtype), config


def inputs(config, B=2, L=12, seed=1, dtype=f64):
    return torch.randn(B, L, config.hidden_size, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def run_steps(mixer, x, mask=None, state=None, return_state=False):
    ys = []
    for t in range(x.shape[1]):
        y_t, state = mixer.step(x[:, t], state, None if mask is None else mask[:, t])
        ys.append(y_t)
    return (torch.stack(ys, 1), state) if return_state else torch.stack(ys, 1)


@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_causal_and_shape(arch, variant, layer):
    mixer, config = make_mixer(arch, variant, layer)
    x = inputs(config)
    changed = x.clone()
    changed[:, 6] += 1.0
    y, y_changed = mixer(x), mixer(changed)
    assert y.shape == x.shape
    torch.testing.assert_close(y[:, :6], y_changed[:, :6], rtol=0, atol=1e-12)
    assert (y[:, 6:] - y_changed[:, 6:]).abs().max() > 1e-8


@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_step_equals_forward(arch, variant, layer):
    mixer, config = make_mixer(arch, variant, layer)
    x = inputs(config, L=13)
    torch.testing.assert_close(run_steps(mixer, x), mixer(x), rtol=0, atol=1e-9)


# float32 (what training uses): the step path and the sequence path agree to rounding. The largest
# gap over every case, seeds 0-4, 1 and 2 threads, was 6.1e-7 of the output's scale (DeltaNet);
# 2e-5 leaves 30x that for other CPUs and kernels
FLOAT32_STEP_TOLERANCE = 2e-5


@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_step_equals_forward_in_float32(arch, variant, layer):
    mixer, config = make_mixer(arch, variant, layer, dtype=torch.float32)
    x = inputs(config, L=13, dtype=torch.float32)
    y = mixer(x)
    assert y.dtype == torch.float32
    gap = (run_steps(mixer, x) - y).abs().max() / y.abs().max().clamp_min(1.0)
    assert gap <= FLOAT32_STEP_TOLERANCE


def tensors_of(state) -> list:
    """Every tensor (or None) of a nested tuple / list / dict state, in order."""
    if isinstance(state, dict):
        state = list(state.values())
    if isinstance(state, (tuple, list)):
        return [t for part in state for t in tensors_of(part)]
    return [state]


@pytest.mark.parametrize("padded", [False, True], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_forward_with_state_leaves_the_state_of_stepping_through_the_sequence(arch, variant, layer, padded):
    mixer, config = make_mixer(arch, variant, layer)
    if not hasattr(mixer, "forward_with_state"):
        pytest.skip(f"{type(mixer).__name__} has no forward_with_state: a prompt is stepped through token by token")
    x, more = inputs(config, L=13), inputs(config, L=3, seed=2)      # 16 in all: the tiny long filters
    mask = None
    if padded:
        mask = torch.ones(x.shape[:2], dtype=torch.bool)
        mask[0, :5] = False
    y, state = mixer.forward_with_state(x, mask)
    stepped, stepped_state = run_steps(mixer, x, mask, return_state=True)
    torch.testing.assert_close(y, mixer(x, mask=mask), rtol=0, atol=1e-12)
    # the same state, tensor for tensor, and the same continuation from it
    got, want = tensors_of(state), tensors_of(stepped_state)
    assert [getattr(t, "shape", None) for t in got] == [getattr(t, "shape", None) for t in want]
    for g, w in zip(got, want):
        if w is not None:
            torch.testing.assert_close(g, w, rtol=0, atol=1e-9)
    torch.testing.assert_close(run_steps(mixer, more, state=state), run_steps(mixer, more, state=stepped_state),
                               rtol=0, atol=1e-9)


# one answer per row (AR, ATR), or several in any order, repeated (MQAR: one per query; a row
# with fewer answers repeats position 0)
KEEPS = {"one": [[3], [10]], "several": [[3, 7, 10, 11], [0, 5, 0, 0]]}


@pytest.mark.parametrize("kept_path", ["default", "always"])
@pytest.mark.parametrize("keep", list(KEEPS))
@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_answer_positions_equal_the_gather_of_the_full_output(arch, variant, layer, keep, kept_path, monkeypatch):
    """"always": a mixer that chooses its kept-positions path by the number of answers (H3:
    ``KEPT_POSITIONS_PATH_MAX``) takes it whatever their number, so both of its paths are tested."""
    module = sys.modules[ARCHITECTURES[arch].mixers[make_mixer(arch, variant, layer)[1].layer_mixers()[layer]].__module__]
    if kept_path == "always":
        if not hasattr(module, "KEPT_POSITIONS_PATH_MAX"):
            pytest.skip("one answer-position path, whatever the number of answers")
        monkeypatch.setattr(module, "KEPT_POSITIONS_PATH_MAX", 10**9)
    mixer, config = make_mixer(arch, variant, layer)
    if not getattr(mixer, "accepts_keep", False):
        pytest.skip("the mixer has no answer-position path (the block gathers its full output)")
    x = inputs(config).requires_grad_()
    keep = torch.tensor(KEEPS[keep])                                   # (B, k)
    weights = torch.randn(2, keep.shape[1], config.hidden_size, dtype=f64)
    full = at_positions(mixer(x), keep)
    want = torch.autograd.grad((full * weights).sum(), [x, *mixer.parameters()])
    got = mixer(x, keep=keep)
    torch.testing.assert_close(got, full, rtol=0, atol=1e-10)
    for g, w in zip(torch.autograd.grad((got * weights).sum(), [x, *mixer.parameters()]), want):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10)


@pytest.mark.parametrize("materialize", [False, True], ids=["fast-path", "site-path"])
@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_gradients_reach_every_parameter(arch, variant, layer, materialize):
    mixer, config = make_mixer(arch, variant, layer)
    for site in mixer.modules():
        if isinstance(site, Site):
            site.materialize = materialize                             # state trajectories computed or not
    mixer(inputs(config)).pow(2).sum().backward()
    missing = [n for n, p in mixer.named_parameters() if p.grad is None or not p.grad.abs().sum() > 0]
    assert not missing


@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_vmap_over_stacked_copies_equals_each_copy(arch, variant, layer):
    copies = [make_mixer(arch, variant, layer, seed=k)[0] for k in range(3)]
    config = make_mixer(arch, variant, layer)[1]
    for copy in copies:
        if hasattr(copy, "functional_path"):
            copy.functional_path = True                                # what vmap cannot batch is avoided
    params, buffers = torch.func.stack_module_state(copies)            # every tensor (K, ...)
    x = torch.stack([inputs(config, seed=k) for k in range(3)])        # (K, B, L, D)

    def run(p, b, x_k, **kwargs):
        return torch.func.functional_call(copies[0], (p, b), (x_k,), kwargs)

    params = {n: p.detach().requires_grad_() for n, p in params.items()}
    stacked = torch.func.vmap(run)(params, buffers, x)
    for k, copy in enumerate(copies):
        torch.testing.assert_close(stacked[k], copy(x[k]), rtol=0, atol=1e-10)
    # backward through vmap, as a stacked run trains (every custom autograd function's vmap rule):
    # copy k's slice of each stacked gradient is the gradient that copy gets alone
    stacked.pow(2).sum().backward()
    for k, copy in enumerate(copies):
        copy(x[k]).pow(2).sum().backward()
        for name, p in copy.named_parameters():
            torch.testing.assert_close(params[name].grad[k], p.grad, rtol=1e-7, atol=1e-9, msg=name)
    if getattr(copies[0], "accepts_keep", False):
        keep = torch.tensor([[2], [9]])
        stacked = torch.func.vmap(lambda p, b, x_k: run(p, b, x_k, keep=keep))(params, buffers, x)
        for k, copy in enumerate(copies):
            torch.testing.assert_close(stacked[k], copy(x[k], keep=keep), rtol=0, atol=1e-10)


@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_a_state_patch_carries_on_as_the_recurrence_from_that_state(arch, variant, layer):
    """Two inputs that differ at position 1 only; the second run's state at p is patched with the
    first run's. From p on, its inputs and its state are the first run's, so re-running the
    recurrence from the patched state gives the first run's outputs (p is far enough from 1 for
    every short convolution and shift register to have forgotten position 1)."""
    mixer, config = make_mixer(arch, variant, layer)
    if not isinstance(getattr(mixer, "state", None), Site):
        pytest.skip("the mixer has no state site")
    clean = inputs(config, L=24)
    corrupt = clean.clone()
    corrupt[:, 1] = torch.randn(2, config.hidden_size, generator=torch.Generator().manual_seed(5), dtype=f64)
    p = 16
    seen = {}
    handle = mixer.state.register_forward_hook(lambda m, i, o: seen.setdefault("states", o.clone()))
    y_clean = mixer(clean)
    handle.remove()

    def patch(m, i, o):
        o = o.clone()
        o[:, p] = seen["states"][:, p]
        return o

    y_corrupt = mixer(corrupt)
    handle = mixer.state.register_forward_hook(patch)
    y_patched = mixer(corrupt)
    handle.remove()
    assert (y_corrupt[:, p + 1:] - y_clean[:, p + 1:]).abs().max() > 1e-10     # the state did carry it
    torch.testing.assert_close(y_patched[:, :p], y_corrupt[:, :p], rtol=0, atol=1e-12)
    torch.testing.assert_close(y_patched[:, p:], y_clean[:, p:], rtol=0, atol=1e-9)


@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_gradients_reach_a_state_patch(arch, variant, layer):
    """A patched state is part of the computation: the loss's gradient reaches what was patched
    in (interventions and their attributions rely on it). The patch changes the state (+1): a
    mixer may re-run its recurrence only from positions whose state was changed."""
    mixer, config = make_mixer(arch, variant, layer)
    if not isinstance(getattr(mixer, "state", None), Site):
        pytest.skip("the mixer has no state site")
    p, seen = 5, {}

    def patch(m, i, o):
        seen["new"] = torch.zeros_like(o[:, p], requires_grad=True)
        return torch.cat([o[:, :p], (o[:, p] + 1.0 + seen["new"])[:, None], o[:, p + 1:]], dim=1)

    handle = mixer.state.register_forward_hook(patch)
    mixer(inputs(config)).pow(2).sum().backward()
    handle.remove()
    assert seen["new"].grad is not None and seen["new"].grad.abs().sum() > 0


@pytest.mark.parametrize("arch, variant, layer", CASES)
def test_left_padding_changes_nothing_at_the_real_tokens(arch, variant, layer):
    mixer, config = make_mixer(arch, variant, layer)
    x = inputs(config) * 5                                             # what padding holds must not matter
    pads = [3, 1]
    mask = torch.ones(x.shape[:2], dtype=torch.bool)
    for row, n in enumerate(pads):
        mask[row, :n] = False
    padded, stepped = mixer(x, mask=mask), run_steps(mixer, x, mask)
    for row, n in enumerate(pads):
        alone = mixer(x[row:row + 1, n:])
        torch.testing.assert_close(padded[row:row + 1, n:], alone, rtol=0, atol=1e-9)
        torch.testing.assert_close(stepped[row:row + 1, n:], alone, rtol=0, atol=1e-9)


@pytest.mark.parametrize("arch", list(ARCHITECTURES))
def test_save_load_round_trip_through_the_auto_classes(arch, tmp_path):
    spec = ARCHITECTURES[arch]
    torch.manual_seed(0)
    model = build_model(arch, **spec.tiny_fields()).eval()
    assert type(model).__name__ == spec.causal_lm_class_name
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["model_type"] == spec.model_type and saved["architectures"] == [spec.causal_lm_class_name]
    # built-in: the checkpoint carries its code; a plug-in's names the package it needs instead
    assert (tmp_path / "modeling_mecheval.py").exists() == spec.builtin == ("auto_map" in saved)
    assert saved.get("mecheval_plugin") == (None if spec.builtin else spec.package)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert type(loaded) is type(model) is MODEL_CLASSES[arch][2]
    ids = torch.randint(3, 11, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.embed_tokens.weight.data_ptr()
    base = AutoModel.from_config(AutoConfig.for_model(spec.model_type, hidden_size=16, vocab_size=20))
    assert type(base) is MODEL_CLASSES[arch][1] and type(base).__name__ == spec.model_class_name


def test_the_plugin_is_among_the_cases():
    assert PLUGIN.name in ARCHITECTURES and not PLUGIN.builtin
    assert any(PLUGIN.name in case.id for case in CASES)
