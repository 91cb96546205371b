"""Hyena's implicit filter and BaseConv's implicit long convolution in the paper's reference form
(``filter_form`` / ``long_conv_form`` "reference", the default), each checked against the
equations written out by hand here from the module's own weights, not through the module's code;
and the "mecheval-v1" forms, which the checkpoints under results/ were made with and still load
exactly."""
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.models import build_model
from hf_mecheval.models import MechEvalBaseConvConfig, MechEvalBasedConfig, MechEvalHyenaConfig
from hf_mecheval.models.convolutions import Sin
from hf_mecheval.models.errors import ConfigError
from hf_mecheval.models.mixer_baseconv import BaseConv
from hf_mecheval.models.mixer_hyena import HyenaOperator

f64 = torch.float64
ROOT = Path(__file__).resolve().parents[2]
V1_RUNS = {
    "hyena": ROOT / "results/reference/ref_ar/runs/hyena_lr1e-03_s0",
    "baseconv": ROOT / "results/reference/ref_ar/runs/baseconv_lr1e-03_s0",
    "based": ROOT / "results/reference/ref_ablations/runs/based_lr1e-03_short_conv_kernellong_s0",
}
FORM_FIELD = {"hyena": "filter_form", "baseconv": "long_conv_form", "based": "long_conv_form"}


def features_by_hand(length: int, max_length: int) -> torch.Tensor:
    """[p / (T-1), cos(2π 1e-4 p / T), -sin(2π 1e-4 p / T)] for p < length, element by element."""
    rows = []
    for p in range(length):
        angle = 2 * math.pi * 1e-4 * p / max_length
        rows.append([p / (max_length - 1), math.cos(angle), -math.sin(angle)])
    return torch.tensor(rows, dtype=f64)


def hyena(D=6, order=5, max_length=20, seed=0, **fields):
    torch.manual_seed(seed)
    config = MechEvalHyenaConfig(hidden_size=D, filter_order=order, max_filter_length=max_length, **fields)
    return HyenaOperator(config, layer_idx=0).double()


# ------------------------------------------------------------------ (a) the reference Hyena filter
def test_reference_hyena_filter_is_the_reference_equation():
    D, order, T, L = 6, 5, 20, 13
    mixer = hyena(D, order, T)
    filt = mixer.filter
    sins = [m for m in filt.modules() if isinstance(m, Sin)]
    assert len(sins) == 1                                            # one Sin, shared by the three activations
    linears = [m for m in filt.modules() if isinstance(m, torch.nn.Linear)]
    assert [tuple(m.weight.shape) for m in linears] == [(order, 3), (order, order), (order, order), (D, order)]
    assert [m.bias is not None for m in linears] == [True, True, True, False]
    assert tuple(sins[0].freq.shape) == (1, order) and torch.equal(sins[0].freq, torch.ones(1, order, dtype=f64))
    # z starts as the positional features with f = 1e-4 (computed in float32, then made float64)
    torch.testing.assert_close(filt.z, features_by_hand(T, T), rtol=0, atol=1e-6)
    with torch.no_grad():                      # values the initialisation would not give, so that each matters
        filt.z.copy_(torch.randn(T, 3, dtype=f64))
        sins[0].freq.copy_(0.5 + torch.rand(1, order, dtype=f64))
        for m in linears:
            m.weight.normal_()
            if m.bias is not None:
                m.bias.normal_()

    freq = sins[0].freq[0]
    W_in, W_1, W_2, W_out = (m.weight for m in linears)
    b_in, b_1, b_2 = (m.bias for m in linears[:3])
    rate = [math.log(100) / 1.5 + c * (math.log(100) / 0.3 - math.log(100) / 1.5) / (D - 1) for c in range(D)]
    want = torch.empty(D, L, dtype=f64)
    for p in range(L):
        z = filt.z[p]
        a = torch.sin(freq * (W_in @ z + b_in))
        a = torch.sin(freq * (W_1 @ a + b_1))
        a = torch.sin(freq * (W_2 @ a + b_2))
        h = W_out @ a                                                # (D,)
        for c in range(D):
            want[c, p] = h[c] * math.exp(-rate[c] * p / (T - 1))
    torch.testing.assert_close(filt(L), want, rtol=1e-12, atol=1e-12)
    assert rate[0] == pytest.approx(3.0701, abs=1e-4) and rate[-1] == pytest.approx(15.3506, abs=1e-4)


def test_the_reference_window_decays_slowest_in_channel_0():
    mixer = hyena(D=6)
    with torch.no_grad():                      # a constant MLP output leaves the window alone
        for m in mixer.filter.modules():
            if isinstance(m, torch.nn.Linear):
                m.weight.zero_()
                if m.bias is not None:
                    m.bias.fill_(math.pi / 2)                        # sin(pi/2) = 1 after each activation
        mixer.filter.output_proj.weight.fill_(1.0 / mixer.filter.output_proj.weight.shape[1])
    window = mixer.filter(20)                                        # sin(1 * (0 + pi/2)) = 1, averaged: 1
    assert torch.all(window[:-1, -1] > window[1:, -1])               # channel 0 keeps the most at the end
    torch.testing.assert_close(window[0, -1], torch.tensor(math.exp(-math.log(100) / 1.5), dtype=f64))


# ------------------------------------------------------------------ (b) no skip in the long conv
def identity_hyena(**fields):
    """A Hyena whose gates are 1 and whose v is the input: its output is the long conv of the input."""
    mixer = hyena(D=4, **fields)
    D = 4
    with torch.no_grad():
        mixer.in_proj.weight.zero_()
        mixer.in_proj.bias.zero_()
        mixer.in_proj.bias[:2 * D] = 1.0                             # x0 = x1 = 1
        mixer.in_proj.weight[2 * D:] = torch.eye(D, dtype=f64)      # v = x
        mixer.short_conv.weight.zero_()
        mixer.short_conv.weight[:, 0, -1] = 1.0                      # the current position alone
        mixer.short_conv.bias.zero_()
        mixer.out_proj.weight.copy_(torch.eye(D, dtype=f64))
        mixer.out_proj.bias.zero_()
    return mixer


def test_reference_hyena_has_no_skip_term():
    mixer = identity_hyena()
    assert "bias" not in dict(mixer.named_parameters())
    L = 11
    impulse = torch.zeros(1, L, 4, dtype=f64)
    impulse[0, 0] = 1.0
    # the impulse response is the filter itself (a skip would add to tap 0)
    torch.testing.assert_close(mixer(impulse)[0], mixer.filter(L).T, rtol=0, atol=1e-12)
    x = torch.randn(2, L, 4, dtype=f64)
    with torch.no_grad():
        mixer.filter.output_proj.weight.zero_()                      # h = 0
    assert torch.equal(mixer(x), torch.zeros_like(x))
    steps, state = [], None
    for t in range(L):
        y, state = mixer.step(x[:, t], state)
        steps.append(y)
    assert torch.equal(torch.stack(steps, 1), torch.zeros_like(x))


def test_v1_hyena_keeps_its_skip_term():
    mixer = identity_hyena(filter_form="mecheval-v1")
    impulse = torch.zeros(1, 5, 4, dtype=f64)
    impulse[0, 0] = 1.0
    want = mixer.filter(5).T.clone()
    want[0] += mixer.bias                                            # tap 0 + bias at the impulse
    torch.testing.assert_close(mixer(impulse)[0], want, rtol=0, atol=1e-12)


# ------------------------------------------------------------------ (c) BaseConv's long conv
def test_reference_baseconv_long_conv_is_h_conv_u_plus_u():
    D, hidden, T, L = 3, 5, 10, 7
    torch.manual_seed(0)
    config = MechEvalBaseConvConfig(hidden_size=D, kernel_schedule=["long"], long_filter_order=hidden, max_filter_length=T)
    mixer = BaseConv(config, layer_idx=0).double()
    names = {n for n, _ in mixer.named_parameters()}
    assert names == {"projection.weight", "projection.bias", "conv.mlp.0.weight", "conv.mlp.0.bias",
                     "conv.mlp.2.weight", "conv.mlp.2.bias"}               # z is no parameter, no conv bias
    assert not list(mixer.buffers())                                       # nor a buffer: computed on the fly
    W1, b1 = mixer.conv.mlp[0].weight, mixer.conv.mlp[0].bias              # (hidden, 3)
    W2, b2 = mixer.conv.mlp[2].weight, mixer.conv.mlp[2].bias              # (D, hidden)
    assert tuple(W1.shape) == (hidden, 3) and tuple(W2.shape) == (D, hidden)
    z = features_by_hand(L, T)
    h = torch.stack([W2 @ torch.clamp(W1 @ z[p] + b1, min=0) + b2 for p in range(L)], 1)   # (D, L)

    u = torch.randn(2, L, D, dtype=f64)
    conv = torch.zeros_like(u)
    for t in range(L):
        for s in range(t + 1):
            conv[:, t] += h[:, t - s] * u[:, s]
        conv[:, t] += u[:, t]                                              # the skip inside the conv
    seen = {}
    handle = mixer.conv_output.register_forward_hook(lambda m, i, o: seen.setdefault("conv", o.clone()))
    y = mixer(u)
    handle.remove()
    torch.testing.assert_close(seen["conv"], conv, rtol=1e-12, atol=1e-12)
    projection = u @ mixer.projection.weight.T + mixer.projection.bias
    torch.testing.assert_close(y, conv * projection + u, rtol=1e-12, atol=1e-12)


def test_the_reference_hyena_positions_are_a_trained_parameter():
    mixer = hyena()
    params = dict(mixer.named_parameters())
    assert "filter.z" in params and params["filter.z"].requires_grad
    mixer(torch.randn(2, 9, 6, dtype=f64)).pow(2).sum().backward()
    assert params["filter.z"].grad[:9].abs().sum() > 0 and not params["filter.z"].grad[9:].any()


def test_the_mlp_width_defaults_to_the_reference_16():
    assert MechEvalBaseConvConfig().long_filter_order == 16 and MechEvalBasedConfig().long_filter_order == 16
    assert MechEvalHyenaConfig().filter_form == "reference"
    assert MechEvalBaseConvConfig().long_conv_form == MechEvalBasedConfig().long_conv_form == "reference"


# ------------------------------------------------------------------ initialisation in a model
def z_formula(model):
    mixer = model.model.layers[0].mixer
    T = mixer.filter.max_length
    return mixer.filter.z, features_by_hand(T, T).float()


def test_a_new_model_and_a_model_missing_z_get_z_from_the_formula(tmp_path):
    model = build_model("hyena", vocab_size=11, hidden_size=8, filter_order=4, max_filter_length=16)
    z, want = z_formula(model)
    torch.testing.assert_close(z.detach(), want, rtol=0, atol=1e-6)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mixer.filter.z.add_(0.5)                                 # trained away from it
    model.save_pretrained(tmp_path)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)                # loaded z is kept
    torch.testing.assert_close(z_formula(loaded)[0], z.detach(), rtol=0, atol=0)
    # a checkpoint without z (built on the meta device): z is drawn by init_mecheval_parameters
    weights = load_file(tmp_path / "model.safetensors")
    save_file({k: v for k, v in weights.items() if not k.endswith("filter.z")}, tmp_path / "model.safetensors",
              metadata={"format": "pt"})
    partial, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert sorted(info["missing_keys"]) == ["model.layers.0.mixer.filter.z", "model.layers.1.mixer.filter.z"]
    z, want = z_formula(partial)
    torch.testing.assert_close(z.detach(), want, rtol=0, atol=1e-6)


# ------------------------------------------------------------------ (d) v1 checkpoints load exactly
@pytest.mark.parametrize("arch", list(V1_RUNS))
def test_v1_checkpoints_load_with_every_key(arch):
    folder = V1_RUNS[arch]
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert not any(info.values()), info
    assert getattr(model.config, FORM_FIELD[arch]) == "mecheval-v1"
    assert model.config.init_scheme == "normal"
    saved = {k: tuple(v.shape) for k, v in load_file(folder / "model.safetensors").items()}
    state = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    if "lm_head.weight" not in saved:                                       # tied to the embedding
        state.pop("lm_head.weight", None)
    assert state == saved
    names = set(state)
    if arch == "hyena":
        assert "model.layers.0.mixer.bias" in names and "model.layers.0.mixer.filter.mlp.3.freq" in names
    else:
        layer = 1 if arch == "baseconv" else 0
        assert f"model.layers.{layer}.mixer.conv_bias" in names
        assert f"model.layers.{layer}.mixer.filter.mlp.4.weight" in names


@pytest.mark.parametrize("arch", list(V1_RUNS))
def test_a_config_saved_after_init_scheme_but_before_the_form_reads_as_v1(arch):
    saved = json.loads((V1_RUNS[arch] / "config.json").read_text())
    saved["init_scheme"] = "reference"
    config_class = type(AutoModelForCausalLM.from_pretrained(V1_RUNS[arch]).config)
    config = config_class.from_dict(saved)
    assert getattr(config, FORM_FIELD[arch]) == "mecheval-v1" and config.init_scheme == "reference"


# ------------------------------------------------------------------ (e) the new forms are recorded
@pytest.mark.parametrize("arch, fields", [
    ("hyena", dict(filter_order=4, max_filter_length=16)),
    ("baseconv", dict(long_filter_order=4, max_filter_length=16)),
    ("based", dict(short_conv_kernel="long", long_filter_order=4, max_filter_length=16)),
])
def test_a_new_model_saves_and_reloads_the_reference_form(arch, fields, tmp_path):
    model = build_model(arch, vocab_size=11, hidden_size=8, **fields).eval()
    model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())[FORM_FIELD[arch]] == "reference"
    loaded, info = AutoModelForCausalLM.from_pretrained(tmp_path, output_loading_info=True)
    assert not any(info.values()), info
    assert getattr(loaded.config, FORM_FIELD[arch]) == "reference"
    ids = torch.randint(3, 11, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(ids).logits, loaded(ids).logits)


@pytest.mark.parametrize("config_class, field", [
    (MechEvalHyenaConfig, "filter_form"), (MechEvalBaseConvConfig, "long_conv_form"), (MechEvalBasedConfig, "long_conv_form")])
def test_bad_forms_name_the_field(config_class, field):
    with pytest.raises(ConfigError) as info:
        config_class(**{field: "mecheval-v2"})
    assert info.value.field == field
    assert "'reference', 'mecheval-v1'" in str(info.value)
    assert getattr(config_class(**{field: "mecheval-v1"}), field) == "mecheval-v1"
