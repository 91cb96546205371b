"""Every registered architecture through one backbone: parameter counts, the answer-only loss,
sites, config validation. (What every mixer must do, and save/load: test_mixer_contract.py.)"""
import subprocess
import sys

import pytest
import torch
from transformers import AutoConfig

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.errors import ConfigError, MechEvalError
from hf_mecheval.models import ARCHITECTURES, build_model

# the built-in architectures, each at its spec's tiny configuration (plug-ins: test_mixer_contract.py)
ARCHS = [name for name, spec in ARCHITECTURES.items() if spec.builtin]


def tiny(arch, **extra):
    torch.manual_seed(0)
    return build_model(arch, **ARCHITECTURES[arch].tiny_fields(**extra))


def count(model):
    return sum(p.numel() for p in model.parameters())


# The reference's model (tinylang's Zoology, vocabulary 26, 1 024 learned positions, which its
# main sweeps give every architecture), its parameters counted on the CPU
@pytest.mark.parametrize("arch, fields, expected", [
    ("mamba", dict(num_hidden_layers=1, hidden_size=256), 445_184),
    ("mamba", dict(num_hidden_layers=2, hidden_size=128), 236_800),
    ("transformer", dict(num_hidden_layers=2, hidden_size=256, max_position_embeddings=1024), 1_847_296),
    ("based", dict(num_hidden_layers=2, hidden_size=128), 319_872),
    ("baseconv", dict(hidden_size=64, max_position_embeddings=1024), 143_744),
    ("baseconv", dict(hidden_size=128, max_position_embeddings=1024), 434_880),
    ("h3", dict(hidden_size=64, max_position_embeddings=1024), 626_304),
    ("h3", dict(hidden_size=128, max_position_embeddings=1024), 1_449_216),
    # the reference's Hyena also creates a filter bias of 2 x hidden_size that it multiplies by 0
    # (it changes no output); ours has none: 200 576 - 128 and 574 336 - 256
    ("hyena", dict(hidden_size=64, max_position_embeddings=1024), 200_576 - 2 * 64),
    ("hyena", dict(hidden_size=128, max_position_embeddings=1024), 574_336 - 2 * 128),
])
def test_reference_parameter_counts(arch, fields, expected):
    assert count(build_model(arch, vocab_size=26, **fields)) == expected


@pytest.mark.parametrize("arch", ARCHS)
def test_positions_add_one_learned_vector_per_position_to_every_architecture(arch):
    # what the reference's main sweeps give every architecture: 1 024 x hidden_size parameters more
    without, with_positions = (count(build_model(arch, vocab_size=26, hidden_size=64, max_position_embeddings=n))
                               for n in (0, 1024))
    assert with_positions - without == 1024 * 64


@pytest.mark.parametrize("arch", ARCHS)
def test_answer_only_loss_equals_full_cross_entropy(arch):
    model = tiny(arch).eval()
    ids = torch.randint(3, 11, (4, 12))
    labels = torch.full_like(ids, -100)
    answer_pos = torch.tensor([5, 9, 11, 7])
    labels[torch.arange(4), answer_pos] = ids[torch.arange(4), answer_pos]
    out = model(ids, labels=labels)
    full = model(ids).logits
    want = torch.nn.functional.cross_entropy(full[torch.arange(4), answer_pos - 1], ids[torch.arange(4), answer_pos])
    assert out.logits.shape == (4, 1, 11)
    assert torch.allclose(out.loss, want, atol=1e-6)
    assert torch.allclose(out.logits[:, 0], full[torch.arange(4), answer_pos - 1], atol=1e-6)
    # per-row positions through logits_to_keep
    kept = model(ids, logits_to_keep=(answer_pos - 1)[:, None]).logits
    assert torch.allclose(kept[:, 0], out.logits[:, 0], atol=1e-6)
    # a hook on the last block turns the position-restricted path off: same loss, full sites
    shapes = []
    handle = model.get_site("layers.1.output").register_forward_hook(lambda m, i, o: shapes.append(o.shape))
    hooked = model(ids, labels=labels)
    handle.remove()
    assert shapes == [(4, 12, 8)] and torch.allclose(hooked.loss, out.loss, atol=1e-6)


@pytest.mark.parametrize("arch", ARCHS)
def test_several_answers_per_row_equal_full_cross_entropy(arch):
    # MQAR's labels: one per query, 1 to 4 per row; the loss is the mean over all of them
    model = tiny(arch)
    ids = torch.randint(3, 11, (4, 12))
    labels = torch.full_like(ids, -100)
    answers = {0: [4, 6, 9], 1: [11], 2: [2, 8], 3: [3, 5, 7, 10]}
    for row, positions in answers.items():
        labels[row, positions] = ids[row, positions]
    out = model(ids, labels=labels)
    assert out.logits.shape == (4, 4, 11)
    full = model(ids).logits                                            # (4, 12, 11)
    rows = [r for r, ps in answers.items() for _ in ps]
    cols = [p - 1 for ps in answers.values() for p in ps]               # position t predicts t + 1
    want = torch.nn.functional.cross_entropy(full[rows, cols], ids[rows, [c + 1 for c in cols]])
    assert torch.allclose(out.loss, want, atol=1e-6)
    for row, ps in answers.items():                                     # each row's positions in order
        assert torch.allclose(out.logits[row, :len(ps)], full[row, [p - 1 for p in ps]], atol=1e-6)
        # its padding slots (a row with fewer answers is padded with position 0) read position 0
        assert torch.allclose(out.logits[row, len(ps):], full[row, 0].expand(4 - len(ps), -1), atol=1e-6)
    # the LM head runs once per answer (10) and once per padded row (rows 0, 1 and 2): 13 rows, not 16
    seen = []
    handle = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    model(ids, labels=labels)
    handle.remove()
    assert seen == [(13, model.config.hidden_size)]
    # the same gradients as the loss over the full logits
    grads = torch.autograd.grad(out.loss, list(model.parameters()), allow_unused=True)
    wanted = torch.autograd.grad(want, list(model.parameters()), allow_unused=True)
    for g, w in zip(grads, wanted):
        assert (g is None) == (w is None) and (g is None or torch.allclose(g, w, atol=1e-6))
    # the loss alone (a training step): the same loss and gradients, no logits, the head as often
    seen.clear()
    handle = model.lm_head.register_forward_hook(lambda m, i, o: seen.append(i[0].shape))
    alone = model(ids, labels=labels, skip_logits=True)
    handle.remove()
    assert alone.logits is None and seen == [(13, model.config.hidden_size)]
    assert torch.equal(alone.loss, out.loss)
    for g, w in zip(torch.autograd.grad(alone.loss, list(model.parameters()), allow_unused=True), grads):
        assert (g is None) == (w is None) and (g is None or torch.equal(g, w))


@pytest.mark.parametrize("answers", [{0: [5], 1: [9], 2: [11], 3: [7]}, {0: [4, 6], 1: [11], 2: [2, 8], 3: [3]}],
                         ids=["one answer a row", "several"])
def test_skip_logits_gives_the_loss_alone(answers):
    model = tiny("mamba")
    ids = torch.randint(3, 11, (4, 12))
    labels = torch.full_like(ids, -100)
    for row, positions in answers.items():
        labels[row, positions] = ids[row, positions]
    out, alone = model(ids, labels=labels), model(ids, labels=labels, skip_logits=True)
    assert out.logits is not None and alone.logits is None and torch.equal(alone.loss, out.loss)
    with pytest.raises(MechEvalError, match="skip_logits=True returns the loss alone, so it needs labels"):
        model(ids, skip_logits=True)


def brute_force_groups(needed, call_tokens):
    """The least sum(rows x longest need) + call_tokens x groups over every partition of the rows
    (not only runs of the sorted needs), by enumeration."""
    def partitions(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for part in partitions(rest):
            yield [[first], *part]
            for i in range(len(part)):
                yield [*part[:i], [first, *part[i]], *part[i + 1:]]
    return min(sum(len(g) * max(needed[r] for r in g) + call_tokens for g in part)
               for part in partitions(list(range(len(needed)))))


def test_length_groups_by_hand_and_against_every_partition():
    from hf_mecheval.models.modeling_mecheval import length_groups

    def as_lists(groups):
        return [(rows.tolist(), length) for rows, length in groups]

    needed = torch.tensor([10, 10, 100, 10])
    # free calls: one group per length; the long row alone
    assert as_lists(length_groups(needed, 0)) == [([2], 100), ([0, 1, 3], 10)]
    # split: 100 + 3 x 10 + 2 x 50 = 230 < one call 4 x 100 + 50 = 450
    assert as_lists(length_groups(needed, 50)) == [([2], 100), ([0, 1, 3], 10)]
    # a call dearer than the 270 token-rows a split saves: one group, every row in order
    assert as_lists(length_groups(needed, 271)) == [([0, 1, 2, 3], 100)]
    assert as_lists(length_groups(torch.tensor([37] * 5), 0)) == [([0, 1, 2, 3, 4], 37)]   # AR: all alike
    generator = torch.Generator().manual_seed(0)
    for _ in range(60):
        n = int(torch.randint(1, 7, (1,), generator=generator))
        needed = torch.randint(1, 40, (n,), generator=generator)
        call_tokens = int(torch.randint(0, 60, (1,), generator=generator))
        groups = length_groups(needed, call_tokens)
        rows = torch.cat([r for r, _ in groups])
        assert sorted(rows.tolist()) == list(range(n))                                   # each row once
        assert all(int(needed[r].max()) == length for r, length in groups)              # cut to its longest
        cost = sum(len(r) * length + call_tokens for r, length in groups)
        assert cost == brute_force_groups(needed.tolist(), call_tokens)


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_grouped_by_length_give_the_whole_batchs_loss_and_gradients(arch, monkeypatch):
    """Rows whose last answers stand far apart run in groups, each cut to its longest need: the
    loss, logits and gradients of the padded batch in one call (float64), one call per group."""
    import hf_mecheval.models.modeling_mecheval as modeling

    torch.manual_seed(0)
    model = tiny(arch).double()
    ids = torch.randint(3, 11, (6, 16))
    labels = torch.full_like(ids, -100)
    answers = {0: [3], 1: [5, 15], 2: [4], 3: [2, 8, 12], 4: [15], 5: [3]}   # needs 3, 15, 4, 12, 15, 3
    for row, positions in answers.items():
        labels[row, positions] = ids[row, positions]

    def loss_and_grads(call_tokens):
        monkeypatch.setattr(modeling, "GROUP_CALL_TOKENS", call_tokens)
        model.zero_grad()
        out = model(ids, labels=labels)
        out.loss.backward()
        return out.loss.detach(), out.logits.detach(), [p.grad.clone() for p in model.parameters()]

    widths = []
    backbone = model.model.forward
    monkeypatch.setattr(model.model, "forward", lambda *a, **k: widths.append(k["input_ids"].shape) or backbone(*a, **k))
    grouped = loss_and_grads(0)
    assert widths == [(2, 15), (1, 12), (1, 4), (2, 3)]           # one call per need, longest first
    widths.clear()
    whole = loss_and_grads(10 ** 9)
    assert widths == [(6, 16)]                                    # one call, the batch as it is
    assert torch.allclose(grouped[0], whole[0], rtol=0, atol=1e-12)
    assert torch.allclose(grouped[1], whole[1], rtol=0, atol=1e-12)
    for g, w in zip(grouped[2], whole[2]):
        assert torch.allclose(g, w, rtol=0, atol=1e-12)


@pytest.mark.parametrize("arch", ARCHS)
def test_standard_sites_and_errors(arch):
    model = tiny(arch)
    names = model.site_names()
    has_mlp = model.config.use_mlp
    for layer in range(2):
        for site in ("input", "mixer_input", "mixer_output", "output") + (("mlp_input", "mlp_output") if has_mlp else ()):
            assert f"layers.{layer}.{site}" in names
    if not has_mlp:
        assert not any("mlp" in n for n in names)
    with pytest.raises(MechEvalError, match="valid sites: layers.0.input"):
        model.get_site("layers.9.input")


def test_internal_sites_where_the_spec_asks():
    assert "layers.0.mixer.state" in tiny("mamba").site_names()
    assert "layers.0.mixer.conv_output" in tiny("mamba").site_names()
    assert "layers.0.mixer.conv_output" not in tiny("mamba", conv_kernel=0).site_names()
    assert "layers.1.mixer.state" in tiny("based").site_names()          # odd layers: linear attention
    assert "layers.0.mixer.conv_output" in tiny("based").site_names()    # even layers: BaseConv
    assert "layers.0.mixer.state" in tiny("deltanet").site_names()
    for arch in ("mamba2", "gated_deltanet"):
        assert {"layers.1.mixer.state", "layers.1.mixer.conv_output"} <= set(tiny(arch).site_names())
    assert "layers.0.mixer.conv_output" not in tiny("mamba2", conv_kernel=0).site_names()
    assert "layers.0.mixer.conv_output" not in tiny("gated_deltanet", use_short_conv=False).site_names()


def test_site_hooks_read_and_replace():
    model = tiny("transformer").eval()
    ids = torch.randint(3, 11, (2, 10))
    seen = {}
    site = model.get_site("layers.1.input")
    h = site.register_forward_hook(lambda m, i, o: seen.setdefault("x", o.clone()))
    clean = model(ids).logits
    h.remove()
    out0 = model.model.layers[0](model.model.embed(ids))
    assert torch.allclose(seen["x"], out0)
    h = site.register_forward_hook(lambda m, i, o: torch.zeros_like(o))
    patched = model(ids).logits
    h.remove()
    assert not torch.allclose(clean, patched)


def test_the_names_checkpoints_and_sweeps_hold_do_not_change():
    # run.json and sweeps hold the architecture names, config.json the model types and class names
    want = {"transformer": ("mecheval-transformer", "Transformer"), "based": ("mecheval-based", "Based"),
            "baseconv": ("mecheval-baseconv", "BaseConv"), "h3": ("mecheval-h3", "H3"),
            "hyena": ("mecheval-hyena", "Hyena"), "mamba": ("mecheval-mamba", "Mamba"),
            "deltanet": ("mecheval-deltanet", "DeltaNet"), "mamba2": ("mecheval-mamba2", "Mamba2"),
            "gated_deltanet": ("mecheval-gated-deltanet", "GatedDeltaNet")}
    assert {name: (ARCHITECTURES[name].model_type, ARCHITECTURES[name].class_stem) for name in ARCHS} == want
    assert type(tiny("mamba")).__name__ == "MechEvalMambaForCausalLM"


def test_each_built_in_architecture_has_one_name():
    # its mixer file, its model type and its mixers' registered names spell the architecture's name
    squashed = {name.replace("_", ""): name for name in ARCHITECTURES}
    for name in ARCHS:
        spec = ARCHITECTURES[name]
        assert spec.config_class.__module__ == f"hf_mecheval.models.mixer_{name}"
        assert spec.model_type == "mecheval-" + name.replace("_", "-")
        assert type(tiny(name)).__module__ == "hf_mecheval.models.modeling_mecheval"
        for mixer_name, mixer in spec.mixers.items():
            # a mixer named after an architecture is spelt as it, and lives in that one's file
            if mixer_name.replace("_", "") in squashed:
                assert mixer_name == squashed[mixer_name.replace("_", "")]
                assert mixer.__module__ == f"hf_mecheval.models.mixer_{mixer_name}"
            else:
                assert mixer.__module__ == f"hf_mecheval.models.mixer_{name}"


def test_custom_autograd_functions_live_in_ops_files():
    import ast
    from pathlib import Path

    import hf_mecheval.models

    classes = {}                                        # class name -> (its file, the names of its bases)
    for path in Path(hf_mecheval.models.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                classes[node.name] = (path.name, [ast.unparse(b).split(".")[-1] for b in node.bases])
    found = {}                                          # autograd functions, subclasses of subclasses too
    while True:
        more = {name: file for name, (file, bases) in classes.items()
                if name not in found and any(b == "Function" or b in found for b in bases)}
        if not more:
            break
        found.update(more)
    assert {"SelectiveScan", "DirectCausalConv", "PowerSumTaps", "ConjugatePairTaps", "ChannelwiseTaps",
            "CpuShiftTaps"} <= set(found)
    # the compiled CPU scan's binding is the one exception: it stays out of a checkpoint's code
    assert {f for f in found.values() if not f.startswith("ops_")} == {"cpu_kernels.py"}


def test_hf_configs_accept_standard_extra_keys():
    config = AutoConfig.for_model("mecheval-mamba", hidden_size=16, conv_kernel=0, output_attentions=False,
                                  architectures=["MechEvalMambaForCausalLM"], my_note="kept")
    assert config.conv_kernel == 0 and config.my_note == "kept"


@pytest.mark.parametrize("arch, fields, field", [
    ("mamba", dict(conv_kernel=-1), "conv_kernel"),
    ("mamba", dict(hidden_size=-4), "hidden_size"),
    ("mamba", dict(conv_kernel=1, kernels="cuda"), "conv_kernel"),
    ("mamba", dict(kernels="triton"), "kernels"),
    ("transformer", dict(num_attention_heads=3), "num_attention_heads"),
    ("based", dict(short_conv_kernel=0), "short_conv_kernel"),
    ("baseconv", dict(kernel_schedule=[3, "huge"]), "kernel_schedule"),
    ("deltanet", dict(use_short_conv="yes"), "use_short_conv"),
    ("h3", dict(head_dim=3), "head_dim"),
    ("hyena", dict(filter_emb_dim=4), "filter_emb_dim"),
    ("mamba2", dict(head_dim=48), "head_dim"),                            # 128 channels, not divisible
    ("mamba2", dict(n_groups=3), "n_groups"),                             # 8 heads
    ("mamba2", dict(conv_kernel=17), "conv_kernel"),
    ("mamba2", dict(dt_max=1e-4), "dt_max"),
    ("gated_deltanet", dict(num_attention_heads=3), "num_attention_heads"),
    ("gated_deltanet", dict(head_dim=0), "head_dim"),
    ("gated_deltanet", dict(expand_v=0), "expand_v"),
    ("gated_deltanet", dict(use_short_conv=1), "use_short_conv"),
])
def test_invalid_configs_name_the_field(arch, fields, field):
    with pytest.raises(ConfigError) as info:
        build_model(arch, **fields)
    assert info.value.field == field


def test_unknown_architecture():
    with pytest.raises(ConfigError, match="transformer, baseconv, based"):
        build_model("rwkv")


def test_ablation_knobs_change_the_model():
    # the short convolution by hand: a depthwise filter of k taps per channel, with a bias (Mamba,
    # Mamba-2) or without (DeltaNet's on q, k and v); width 0 removes filter and bias
    def conv(arch, channels, k, bias=True):
        return tiny(arch).config.num_hidden_layers * (channels * k + channels * bias)
    mamba = tiny("mamba").config
    inner = mamba.expand * mamba.hidden_size                              # Mamba's convolution: x, E channels
    assert mamba.conv_kernel == 4
    assert count(tiny("mamba")) - count(tiny("mamba", conv_kernel=2)) == conv("mamba", inner, 4) - conv("mamba", inner, 2)
    assert count(tiny("mamba", conv_kernel=2)) - count(tiny("mamba", conv_kernel=0)) == conv("mamba", inner, 2)
    m2 = tiny("mamba2").config                                            # x, B and C: E + 2 groups x state
    channels = m2.expand * m2.hidden_size + 2 * m2.n_groups * m2.d_state
    assert count(tiny("mamba2")) - count(tiny("mamba2", conv_kernel=2)) == conv("mamba2", channels, 4) - conv("mamba2", channels, 2)
    assert count(tiny("mamba2", conv_kernel=2)) - count(tiny("mamba2", conv_kernel=0)) == conv("mamba2", channels, 2)
    dn = tiny("deltanet").config                                          # q, k, v: hidden channels each
    assert count(tiny("deltanet")) - count(tiny("deltanet", use_short_conv=False)) == \
        3 * conv("deltanet", dn.hidden_size, dn.conv_kernel, bias=False)
    assert count(tiny("gated_deltanet", use_short_conv=False)) < count(tiny("gated_deltanet"))
    assert count(tiny("gated_deltanet", expand_v=1)) < count(tiny("gated_deltanet"))
    assert count(tiny("gated_deltanet", num_attention_heads=1, head_dim=4)) < count(tiny("gated_deltanet"))
    assert count(tiny("based", short_conv_kernel="long")) != count(tiny("based"))
    three = tiny("transformer", num_hidden_layers=3)
    assert len(three.model.layers) == 3
    assert tiny("transformer", max_position_embeddings=0).model.embed_positions is None


def test_package_import_is_light_and_registers():
    code = ("import sys, hf_mecheval; from transformers import AutoConfig; "
            "AutoConfig.for_model('mecheval-deltanet'); AutoConfig.for_model('mecheval-mamba2'); "
            "AutoConfig.for_model('mecheval-gated-deltanet'); "
            "bad = [m for m in ('fla', 'mamba_ssm', 'causal_conv1d', 'datasets', 'hf_mecheval.tasks') if m in sys.modules]; "
            "print(bad); assert not bad")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA and the [cuda] extra")
@pytest.mark.parametrize("arch", [n for n, s in ARCHITECTURES.items() if s.kernel_packages])
def test_kernel_path_matches_torch_path(arch):
    import importlib.util
    import time

    packages = {p for needed in ARCHITECTURES[arch].kernel_packages.values() for p in needed}
    missing = sorted(p for p in packages if importlib.util.find_spec(p) is None)
    if missing:
        pytest.skip(f"{arch}'s kernel packages are not installed: {', '.join(missing)}")
    torch.manual_seed(0)
    fields = dict(vocab_size=8196, hidden_size=256)
    fast = build_model(arch, kernels="cuda", **fields).cuda()
    ref = build_model(arch, kernels="torch", **fields).cuda()
    ref.load_state_dict(fast.state_dict())
    ids = torch.randint(3, 8196, (32, 37), device="cuda")
    outs = {}
    for name, m in (("cuda", fast), ("torch", ref)):
        m.zero_grad()
        logits = m(ids).logits
        logits.float().square().mean().backward()
        outs[name] = (logits.detach(), {n: p.grad.clone() for n, p in m.named_parameters()})
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20):
            m(ids).logits.float().square().mean().backward()
        torch.cuda.synchronize()
        outs[name] += ((time.perf_counter() - t0) / 20,)
    err = (outs["cuda"][0] - outs["torch"][0]).abs().max().item()
    gerr = max((outs["cuda"][1][n] - outs["torch"][1][n]).abs().max().item() for n in outs["cuda"][1])
    print(f"{arch}: forward max|diff| {err:.2e}, grad max|diff| {gerr:.2e}, speed-up {outs['torch'][2] / outs['cuda'][2]:.1f}x")
    assert err < 1e-3 and gerr < 1e-2


def test_based_state_patch_replaces_the_normaliser_too():
    # patching the state at p with the clean run's state = continuing the recurrence (step) from
    # the clean S_p and z_p; the step form is the independent reference
    torch.manual_seed(0)
    mixer = tiny("based").model.layers[1].mixer.double()
    B, L, p = 2, 7, 3
    clean = torch.randn(B, L, mixer.q_proj.in_features, dtype=torch.float64)
    broken = clean.clone()
    broken[:, 1] = torch.randn(B, clean.shape[-1], dtype=torch.float64)        # a different token at 1

    seen = {}
    with_hook = mixer.state.register_forward_hook(lambda m, i, o: seen.setdefault("clean", o))
    mixer(clean)
    with_hook.remove()

    def patch(m, i, o):
        o = o.clone()
        o[:, p] = seen["clean"][:, p]
        return o

    handle = mixer.state.register_forward_hook(patch)
    got = mixer(broken)
    handle.remove()

    def run_steps(x, upto):
        state, ys = None, []
        for t in range(upto):
            y, state = mixer.step(x[:, t], state)
            ys.append(y)
        return ys, state

    ys, _ = run_steps(broken, p)
    _, (S, z) = run_steps(clean, p + 1)                     # the clean state at p
    q, k, v = (t[:, :, 0] for t in mixer._qkv(broken[:, p:p + 1]))
    fk = mixer.feature_map(k)
    # the state before p that makes step(broken token p) land on the clean S_p, z_p
    prev = (S - fk[..., :, None] * v[..., None, :], z - fk)
    y, state = mixer.step(broken[:, p], prev)
    ys.append(y)
    for t in range(p + 1, L):
        y, state = mixer.step(broken[:, t], state)
        ys.append(y)
    torch.testing.assert_close(got, torch.stack(ys, dim=1))


def test_parameter_count_matches_the_model_and_follows_a_changed_config():
    from hf_mecheval.models import build_model, count_parameters

    def real(layers):
        return sum(p.numel() for p in build_model("mamba", vocab_size=40, hidden_size=16,
                                                   num_hidden_layers=layers).parameters())

    config = build_model("mamba", vocab_size=40, hidden_size=16, num_hidden_layers=2).config
    assert count_parameters(config) == real(2)
    # counts are remembered per configuration, by content: the same object changed is counted anew
    config.num_hidden_layers = 3
    assert count_parameters(config) == real(3) != real(2)
