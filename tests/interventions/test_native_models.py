"""transformers' own causal LMs (--architecture hf:<model_type>): trained by our Trainer path,
saved as plain transformers checkpoints, evaluated through the residual-stream sites of
``adapters.native_sites``."""
import json
import subprocess
import sys

import pytest
import torch

from hf_mecheval.adapters import native_config, native_sites
from hf_mecheval.cli import main as mecheval
from hf_mecheval.errors import ConfigError, MechEvalError
from hf_mecheval.interventions import FullForwardEngine, run_grid
from hf_mecheval.tasks import build_task, corrupt
from hf_mecheval.training.run import main as train

TASK = build_task("ar_32", num_kv=16, num_pairs=2)
TINY = ["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--train_size", "64", "--eval_size",
        "16", "--max_steps", "3", "--hidden_size", "16", "--num_hidden_layers", "2", "--eval_strategy", "no",
        "--save_strategy", "no", "--disable_tqdm", "true"]


def tiny_model(model_type: str, layers: int = 2):
    from hf_mecheval.adapters import build_native_model

    torch.manual_seed(0)
    config = native_config(f"hf:{model_type}", vocab_size=TASK.vocab_size, hidden_size=16, num_hidden_layers=layers)
    return build_native_model(config).eval()


@pytest.mark.parametrize("model_type, layers_path", [("gpt2", "transformer.h"), ("llama", "model.layers"),
                                                     ("mamba", "backbone.layers"), ("mamba2", "backbone.layers")])
def test_sites_one_set_per_decoder_layer(model_type, layers_path):
    sites = native_sites(tiny_model(model_type, layers=3))
    assert sites.layers_path == layers_path and sites.num_layers == 3
    assert sites.site_names() == [f"layers.{layer}.{kind}" for layer in range(3)
                                  for kind in ("input", "mixer_output", "output")]


@pytest.mark.parametrize("model_type", ["gpt2", "llama", "mamba", "mamba2"])
def test_patching_every_position_of_an_input_gives_the_source_run(model_type):
    # independent invariant: the residual stream entering layer L is all that the rest of the
    # model sees of the tokens, so replacing it everywhere by another document's must give that
    # document's final hidden states exactly
    engine = FullForwardEngine(native_sites(tiny_model(model_type)))
    data = TASK.generate(6, "test", 0)
    width = int(data.lengths.max())
    ids = torch.as_tensor(data.padded())[:, :width].long()
    base, source = ids[:3], ids[3:]
    every = torch.arange(width)[None].expand(3, width)                    # (R, L): all positions
    for layer in range(2):
        site = f"layers.{layer}.input"
        final_source, cached = engine.cache(source, [site])
        patched = engine.patched_final(site, base, every, cached[site])
        torch.testing.assert_close(patched, final_source, rtol=0, atol=0)
        assert not torch.equal(engine.model.final_hidden(base), final_source)
    # a layer's output is the next layer's input, so the two sites name the same tensor
    _, cached = engine.cache(base, ["layers.0.output", "layers.1.input"])
    assert torch.equal(cached["layers.0.output"], cached["layers.1.input"])


# where each model keeps its decoder layers and, in each, its token mixer (transformers' own names)
LAYERS = {"gpt2": ("transformer.h", "attn"), "llama": ("model.layers", "self_attn"),
          "mamba": ("backbone.layers", "mixer"), "mamba2": ("backbone.layers", "mixer")}


@pytest.mark.parametrize("model_type", list(LAYERS))
def test_every_cell_equals_a_hooked_forward_of_the_model_itself(model_type):
    # a second, naive implementation that knows nothing of native_sites: for each cell, the model's
    # own forward on the corrupted document with a plain torch hook on its decoder layer (input,
    # output) or token mixer (output) writing the clean activation at the position, and the answer's
    # probability from its logits at the query (its final norm and LM head). In float64: at this
    # initialisation half of Mamba's cells move p(answer) by under 1e-5, which float32's tolerance
    # could not tell from no patch; the logits are the LM head's on the base model's last hidden
    # states, as each of these four families computes them, because Mamba's and Mamba-2's own
    # forward casts them to float32
    model = tiny_model(model_type).double()
    engine = FullForwardEngine(native_sites(model))
    data = TASK.generate(6, "test", 1)
    ids = torch.as_tensor(data.padded()).long()
    broken = torch.as_tensor(corrupt(data.padded(), data.columns["key_pos"], TASK.token_classes, seed=0).input_ids).long()
    col = lambda c: torch.as_tensor(data.columns[c]).long()             # noqa: E731
    names, rows = ("key", "value", "query"), torch.arange(len(ids))
    sites = native_sites(model).site_names()
    ours = engine.run(ids, broken, {p: col(f"{p}_pos") for p in names}, col("query_pos"), col("answer"), sites)
    layers_path, mixer_name = LAYERS[model_type]
    layers = model.get_submodule(layers_path)

    def first(value):                       # a module's output: a tensor, or a tuple led by one
        return value[0] if isinstance(value, tuple) else value

    def forward(document, module=None, kind=None, write=None):
        """The model's probability of the answer at the query on ``document``; with ``write``, the
        activation at ``module`` passed through it first (input: the layer's hidden states)."""
        handles = []
        if kind == "input":
            def pre(mod, args, kwargs):
                if args:
                    return (write(args[0]), *args[1:]), kwargs
                return args, {**kwargs, "hidden_states": write(kwargs["hidden_states"])}
            handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        elif kind == "output":
            def post(mod, args, output):
                return (write(output[0]), *output[1:]) if isinstance(output, tuple) else write(output)
            handles.append(module.register_forward_hook(post))
        try:
            with torch.no_grad():
                logits = model.lm_head(model.base_model(document).last_hidden_state)
        finally:
            for handle in handles:
                handle.remove()
        return torch.softmax(logits[rows, col("query_pos")], -1)[rows, col("answer")]

    def naive_site(site):                   # layers.L.input / mixer_output / output -> (module, hook kind)
        _, layer, kind = site.split(".")
        block = layers[int(layer)]
        return (block, "input") if kind == "input" else (getattr(block, mixer_name), "output") \
            if kind == "mixer_output" else (block, "output")

    torch.testing.assert_close(ours["p_clean"], forward(ids), rtol=0, atol=1e-12)
    torch.testing.assert_close(ours["p_corrupt"], forward(broken), rtol=0, atol=1e-12)
    for site in sites:
        module, kind = naive_site(site)
        seen = {}

        def keep(x):
            seen["clean"] = x.clone()
            return x
        forward(ids, module, kind, keep)                  # the clean activation, read by the same hook
        for name in names:
            pos = col(f"{name}_pos")

            def write(x, pos=pos):
                x = x.clone()
                x[rows, pos] = seen["clean"][rows, pos]
                return x
            torch.testing.assert_close(ours["p_patched"][site][name], forward(broken, module, kind, write),
                                       rtol=0, atol=1e-12, msg=f"{site} @{name}")


def test_grid_on_an_adapted_model_has_every_cell():
    model = tiny_model("gpt2")
    result = run_grid(model, TASK, TASK.generate(8, "test", 0), n_resamples=10, progress=False)
    assert result["sites"] == native_sites(model).site_names()
    assert len(result["corruptions"]["key"]["cells"]) == 6 * 5
    # the label is the last (second) layer's input's, as classify gives it from those cells: read
    # where the adapter's layer count says the last layer is, not "the grid lacks ..." a site
    from hf_mecheval.interventions.grid import cell
    from hf_mecheval.metrics.mechanism import classify

    last = {p: cell(result, "key", "layers.1.input", p) for p in ("key", "value", "query")}
    assert result["mechanism"] == classify(last, result["corruptions"]["key"]["clean_accuracy"]).to_dict()
    assert not result["mechanism"]["reason"].startswith("the grid lacks")


@pytest.mark.parametrize("architecture, field, message", [
    ("hf:t5", "architecture", "not a causal language model"),
    ("hf:no_such_model", "architecture", "transformers has no model type"),
])
def test_refused_model_types(architecture, field, message):
    with pytest.raises(ConfigError, match=message) as info:
        native_config(architecture, vocab_size=20, hidden_size=16, num_hidden_layers=2)
    assert info.value.field == field


def test_layers_that_cannot_be_found():
    model = tiny_model("gpt2")
    model.config.num_hidden_layers = 5          # no ModuleList of 5 blocks
    with pytest.raises(MechEvalError, match="cannot find the decoder layers of GPT2LMHeadModel"):
        native_sites(model)


def mamba2(hidden_size=16, **extra):
    config = native_config("hf:mamba2", vocab_size=TASK.vocab_size, hidden_size=hidden_size, num_hidden_layers=2,
                           extra=extra)
    return {k: getattr(config, k) for k in ("expand", "num_heads", "head_dim", "n_groups", "state_size", "chunk_size")}


def test_mamba2_sizes_fit_the_width_and_what_model_config_sets():
    # heads of 16 channels over the inner width expand * hidden = 32, a state of 64, chunks of 64
    assert mamba2() == dict(expand=2, num_heads=2, head_dim=16, n_groups=1, state_size=64, chunk_size=64)
    assert mamba2(hidden_size=20)["num_heads"] == 1 and mamba2(hidden_size=20)["head_dim"] == 40
    # one of head_dim / num_heads given: the other follows; expand changes the inner width
    assert (mamba2(head_dim=8)["num_heads"], mamba2(num_heads=8)["head_dim"]) == (4, 4)
    assert mamba2(expand=3) == dict(expand=3, num_heads=3, head_dim=16, n_groups=1, state_size=64, chunk_size=64)
    assert mamba2(n_groups=2, state_size=8, chunk_size=16)["n_groups"] == 2
    # every chosen size builds a model that runs (n_groups that do not divide the heads would
    # only fail inside the forward)
    for extra in ({}, {"head_dim": 8, "n_groups": 4}, {"expand": 1, "num_heads": 16}):
        from hf_mecheval.adapters import build_native_model

        config = native_config("hf:mamba2", vocab_size=TASK.vocab_size, hidden_size=16, num_hidden_layers=1,
                               extra=extra)
        logits = build_native_model(config)(torch.tensor([[1, 3, 4, 2, 5]])).logits
        assert logits.shape == (1, 5, TASK.vocab_size)


@pytest.mark.parametrize("extra, message", [
    ({"head_dim": 12}, "model_config: head_dim must divide expand × --hidden_size (2 × 16 = 32) for hf:mamba2, "
                       "got 12; one of 1, 2, 4, 8, 16, 32"),
    ({"num_heads": 5}, "model_config: num_heads must divide expand × --hidden_size (2 × 16 = 32)"),
    ({"head_dim": 8, "num_heads": 3}, "model_config: num_heads × head_dim (3 × 8) must equal expand × --hidden_size"),
    ({"n_groups": 3}, "model_config: n_groups must divide the number of heads (2 = expand × --hidden_size / "
                      "head_dim = 32 / 16) for hf:mamba2, got 3; one of 1, 2"),
    ({"chunk_size": 0}, "model_config: chunk_size must be a positive integer for hf:mamba2, got 0"),
    ({"expand": 1.5}, "model_config: expand must be a positive integer for hf:mamba2, got 1.5"),
])
def test_mamba2_sizes_that_cannot_fit_are_one_error(extra, message):
    with pytest.raises(ConfigError) as info:
        mamba2(**extra)
    assert str(info.value).startswith(message) and "\n" not in str(info.value)


def test_a_field_transformers_refuses_is_one_line():
    # transformers' strict configs raise their own error type, its reason on the second line
    with pytest.raises(ConfigError, match=r"^model_config: hf:llama refuses these fields: The hidden size \(16\) is "
                                          r"not a multiple of the number of attention heads \(3\)\.$"):
        native_config("hf:llama", vocab_size=20, hidden_size=16, num_hidden_layers=2, extra={"num_attention_heads": 3})


@pytest.mark.parametrize("extra, message", [
    (["--architecture", "hf:t5"], "architecture: 'hf:t5' is not a causal language model"),
    (["--architecture", "hf:mamba2", "--model_config", '{"n_groups": 3}'], "model_config: n_groups must divide"),
    (["--architecture", "hf:gpt2", "--model_config", '{"n_embed": 8}'], "model_config: unknown field 'n_embed'"),
    (["--architecture", "hf:mamba", "--max_position_embeddings", "64"], "max_position_embeddings: hf:mamba has no"),
    (["--architecture", "hf:gpt2", "--model_config", '{"vocab_size": 8}'], "vocab_size comes from the task"),
    # BertLMHeadModel without is_decoder attends both ways: at the query it would see the answer
    (["--architecture", "hf:bert"], "architecture: hf:bert as configured attends to later tokens (bidirectional)"),
])
def test_bad_native_arguments_one_line(tmp_path, capsys, extra, message):
    assert train([*TINY, *extra, "--output_dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "run").exists()


def test_only_causal_models_are_built():
    from hf_mecheval.adapters.native_config import build_native_model

    sizes = dict(vocab_size=20, hidden_size=16, num_hidden_layers=1, max_position_embeddings=16)
    build_native_model(native_config("hf:gpt2", **sizes))
    build_native_model(native_config("hf:bert", **sizes, extra={"is_decoder": True}))     # causal as a decoder
    with pytest.raises(ConfigError, match="hf:bert as configured attends to later tokens"):
        build_native_model(native_config("hf:bert", **sizes))


# loads the checkpoint in a fresh Python that never imports hf_mecheval; no CUDA kernel package
# is imported by transformers' Mamba on a CPU
LOAD_PLAIN = """
import sys, torch
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained(sys.argv[1])
out = model(torch.tensor([[1, 3, 4, 2]]))
assert out.logits.shape[-1] == model.config.vocab_size
banned = [m for m in sys.modules if m.split('.')[0] in ('hf_mecheval', 'mamba_ssm', 'fla', 'causal_conv1d')]
assert not banned, banned
print(type(model).__name__)
"""


@pytest.mark.parametrize("model_type, class_name", [("gpt2", "GPT2LMHeadModel"), ("llama", "LlamaForCausalLM"),
                                                    ("mamba", "MambaForCausalLM"), ("mamba2", "Mamba2ForCausalLM")])
def test_train_and_evaluate_end_to_end(tmp_path, capsys, model_type, class_name):
    run = tmp_path / model_type
    extra = ["--restoration_every_n_steps", "3", "--restoration_examples", "8"] if model_type == "gpt2" else []
    assert train([*TINY, "--architecture", f"hf:{model_type}", "--output_dir", str(run), *extra]) == 0
    config = json.loads((run / "config.json").read_text())
    assert config["model_type"] == model_type and "auto_map" not in config
    # generate() and pipeline answer one token greedily, as for hf-mecheval's own models
    generation = json.loads((run / "generation_config.json").read_text())
    assert generation["max_new_tokens"] == 1 and generation.get("do_sample", False) is False
    record = json.loads((run / "run.json").read_text())["model"]
    assert record["architecture"] == f"hf:{model_type}" and record["hidden_size"] == 16
    loaded = subprocess.run([sys.executable, "-c", LOAD_PLAIN, str(run)], capture_output=True, text=True)
    assert loaded.returncode == 0 and loaded.stdout.strip() == class_name, loaded.stderr[-2000:]
    capsys.readouterr()
    assert mecheval(["evaluate", str(run), "-n", "16", "--resamples", "20"]) == 0
    result = json.loads((run / "interventions" / "interventions.json").read_text())
    assert result["run"]["architecture"] == f"hf:{model_type}"
    assert result["sites"] == [f"layers.{layer}.{kind}" for layer in range(2)
                               for kind in ("input", "mixer_output", "output")]
    assert len(result["corruptions"]["value"]["cells"]) == 6 * 5 and result["mechanism"]["label"]
    card = (run / "README.md").read_text()       # the card tells users to load it without remote code
    assert "trust_remote_code" not in card and f"transformers' own `{model_type}`" in card
