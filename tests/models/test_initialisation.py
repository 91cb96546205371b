"""New models' weights are drawn as the reference's code draws them (init_scheme "reference", the
default), or by the plain rule (init_scheme "normal"), checked weight by weight against a table
written from the reference's code (its zoology fork's ``_init_weights`` and mamba-ssm 2.2.4's
``Mamba``); loaded weights are never redrawn."""
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, set_seed

from hf_mecheval.models import ARCHITECTURES, get_architecture
from hf_mecheval.models.configuration_mecheval import INIT_SCHEMES

HIDDEN, LAYERS = 64, 2
RESIDUAL_STD = 0.02 / math.sqrt(2 * LAYERS)         # the reference's out_proj / fc2 rule: 0.01


def uniform(fan_in, layers=1):
    """nn.Linear's own init, U(+-1/sqrt(fan_in)), divided by sqrt(layers)."""
    return ("uniform", 1 / math.sqrt(fan_in) / math.sqrt(layers))


# Per architecture, the Linear weights (name inside a block) the reference draws otherwise than
# N(0, 0.02). Names the reference gives "out_proj" or "fc2" are scaled in its TransformerBlock
# models; Based's and H3's output projections are named otherwise there (proj_o, output_linear)
# and keep N(0, 0.02). In its MambaBlock models nn.Linear keeps PyTorch's init, and out_proj is
# redrawn that way and divided by sqrt(n_layers).
E = 2 * HIDDEN                                        # Mamba's and Mamba-2's expand * hidden
REFERENCE = {
    "transformer": {"mixer.out_proj": ("normal", RESIDUAL_STD), "mlp.fc_out": ("normal", RESIDUAL_STD)},
    "hyena": {"mixer.out_proj": ("normal", RESIDUAL_STD), "mlp.fc_out": ("normal", RESIDUAL_STD)},
    "based": {"mlp.fc_out": ("normal", RESIDUAL_STD)},
    "baseconv": {"mlp.fc_out": ("normal", RESIDUAL_STD)},
    "h3": {"mlp.fc_out": ("normal", RESIDUAL_STD)},
    "deltanet": {"mlp.fc_out": ("normal", RESIDUAL_STD)},
    "gated_deltanet": {"mlp.fc_out": ("normal", RESIDUAL_STD)},
    "mamba": {"mixer.in_proj": uniform(HIDDEN), "mixer.x_proj": uniform(E),
              "mixer.out_proj": uniform(E, LAYERS), "mixer.dt_proj": uniform(math.ceil(HIDDEN / 16))},
    "mamba2": {"mixer.in_proj": uniform(HIDDEN), "mixer.out_proj": uniform(E, LAYERS)},
}
# dt_proj is mamba-ssm's own U(+-dt_rank^-1/2) under both schemes
NORMAL = {"mamba": {"mixer.dt_proj": uniform(math.ceil(HIDDEN / 16))}}


def build(arch: str, scheme: str | None, seed: int = 0):
    spec = get_architecture(arch)
    fields = {"hidden_size": HIDDEN, "num_hidden_layers": LAYERS, "vocab_size": 512}
    if scheme is not None:
        fields["init_scheme"] = scheme
    set_seed(seed)
    return AutoModelForCausalLM.from_config(spec.config_class(**fields))


def check_weight(name: str, weight: torch.Tensor, rule: tuple[str, float]) -> None:
    kind, scale = rule
    w = weight.detach().double()
    # the standard deviation of n draws is within ~3/sqrt(2n) of the true one, relatively (31 % for
    # the smallest weight here, DeltaNet's b_proj with 64 values; 2 % for 8 192): 5/sqrt(2n) leaves room
    tolerance = 5 / math.sqrt(2 * w.numel())
    if kind == "normal":
        assert w.std().item() == pytest.approx(scale, rel=tolerance), name
        if w.numel() >= 1000:                 # some of 1 000 normal draws pass 2 std (P ~ 1 - 1e-20);
            assert w.abs().max().item() > 2 * scale, name      # a uniform of this std stays below 1.73
    else:
        assert w.std().item() == pytest.approx(scale / math.sqrt(3), rel=tolerance), name
        assert w.abs().max().item() <= scale, name
    assert abs(w.mean().item()) < 4 * w.std().item() / math.sqrt(w.numel()) + 1e-12, name


@pytest.mark.parametrize("scheme", [None, "normal"])
@pytest.mark.parametrize("arch", sorted(REFERENCE))
def test_every_linear_weight_follows_the_schemes_rule(arch, scheme):
    assert set(REFERENCE) >= {a for a in ARCHITECTURES if get_architecture(a).builtin}
    model = build(arch, scheme)
    assert model.config.init_scheme == (scheme or "reference")
    rules = REFERENCE[arch] if scheme is None else NORMAL.get(arch, {})
    seen = set()
    for layer, block in enumerate(model.model.layers):
        for name, module in block.named_modules():
            if not isinstance(module, torch.nn.Linear):
                continue
            if name in rules:
                seen.add(name)
            rule = rules.get(name, ("normal", 0.02))       # implicit filters' MLPs included, as the reference's
            check_weight(f"layers.{layer}.{name}", module.weight, rule)
            if module.bias is not None:
                assert torch.equal(module.bias, torch.zeros_like(module.bias)), name
    assert seen == set(rules), f"weights the table names but the model lacks: {set(rules) - seen}"
    embedding = model.model.embed_tokens.weight
    check_weight("embed_tokens", embedding, ("normal", 0.02))
    assert model.lm_head.weight.data_ptr() == embedding.data_ptr()


def test_the_scheme_is_validated_and_recorded():
    with pytest.raises(Exception, match="init_scheme: must be one of 'reference', 'normal'"):
        build("mamba", "kaiming")
    assert INIT_SCHEMES == ("reference", "normal")
    assert build("mamba", None).config.to_dict()["init_scheme"] == "reference"


def test_loaded_weights_are_not_redrawn(tmp_path):
    model = build("mamba", None, seed=3)
    with torch.no_grad():
        model.model.layers[0].mixer.out_proj.weight.fill_(0.25)   # nothing any rule would draw
    model.save_pretrained(tmp_path)
    set_seed(7)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path)
    for (name, a), (_, b) in zip(model.state_dict().items(), loaded.state_dict().items()):
        assert torch.equal(a, b), name


def test_the_same_seed_draws_the_same_model_and_the_schemes_differ_only_in_their_rules():
    a, b = build("transformer", None, seed=1), build("transformer", None, seed=1)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(x, y), name
    normal = build("transformer", "normal", seed=1)
    differ = {n for (n, x), (_, y) in zip(a.state_dict().items(), normal.state_dict().items()) if not torch.equal(x, y)}
    assert differ and all(n.endswith(("mixer.out_proj.weight", "mlp.fc_out.weight")) for n in differ)
