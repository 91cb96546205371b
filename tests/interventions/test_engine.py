"""The engine on hand-built models with known mechanisms, golden properties, and errors."""
import pytest
import torch

from hf_mecheval.errors import MechEvalError
from hf_mecheval.interventions import InterventionEngine, run_grid
from hf_mecheval.interventions.grid import cell
from hf_mecheval.models import build_model
from hf_mecheval.models.registry import ARCHITECTURES
from hf_mecheval.tasks import ARConfig, ARTask, corrupt

from handbuilt import direct_model, induction_model

TASK = ARTask(ARConfig(num_kv=24, num_pairs=4, vocab_size=27))


def data(n=96):
    return TASK.generate(n, "test", seed=1)


@pytest.mark.parametrize("make, expected", [(induction_model, "induction"), (direct_model, "direct_query")])
def test_hand_built_mechanisms_have_their_signature(make, expected):
    model = make(TASK.vocab_size, 16)
    result = run_grid(model, TASK, data(), progress=False, n_resamples=200)
    key = result["corruptions"]["key"]
    assert key["clean_accuracy"] == 1.0 and key["denominator"] > 0.8
    at = {p: cell(result, "key", "layers.1.input", p)["restoration"] for p in ("key", "value", "query", "answer")}
    # (the other positions move p only through the diffuse attention of the corrupted run: < 0.1)
    if expected == "induction":
        assert at["value"] > 0.95 and abs(at["query"]) < 0.1 and abs(at["key"]) < 0.1
    else:
        assert at["query"] > 0.95 and abs(at["value"]) < 0.1 and abs(at["key"]) < 0.1
    assert at["answer"] == pytest.approx(0.0, abs=1e-9)      # after the query: never matters
    assert result["mechanism"]["label"] == expected and result["mechanism"]["confidence"] == "high"
    # at layer 0's input the key itself carries the information, for both mechanisms
    assert cell(result, "key", "layers.0.input", "key")["restoration"] > 0.95
    # the value corrupted: both models copy the token at the value position into the answer
    # (induction finds it by its PREV, direct retrieval by the MATCH written at the query, which
    # holds a position, not the value), so only the value position restores, at either layer
    value = result["corruptions"]["value"]
    assert value["clean_accuracy"] == 1.0 and value["denominator"] > 0.8
    for layer in ("layers.0.input", "layers.1.input"):
        at = {p: cell(result, "value", layer, p)["restoration"] for p in ("key", "value", "query")}
        assert at["value"] > 0.95 and abs(at["key"]) < 0.1 and abs(at["query"]) < 0.1, (layer, at)


@pytest.mark.parametrize("make, expected, layer", [(induction_model, "induction", 1), (direct_model, "direct_query", None)])
def test_a_third_layer_moves_the_answer_on_and_the_label_stays_the_mechanisms(make, expected, layer):
    """With a block of zero weights appended (an identity layer), the last layer's input holds the
    answer at the query for both models: induction is read at layer 1's input, where it happened
    (as a 3-layer run of the depth sweep needs), and direct retrieval stays direct retrieval."""
    from handbuilt import HandBlock

    model = make(TASK.vocab_size, 16)
    model.model.layers.append(HandBlock(model.model.d))
    result = run_grid(model, TASK, data(), progress=False, n_resamples=200)
    last = {p: cell(result, "key", "layers.2.input", p)["restoration"] for p in ("key", "value", "query")}
    assert last["query"] > 0.95 and abs(last["value"]) < 0.1 and abs(last["key"]) < 0.1
    mechanism = result["mechanism"]
    assert (mechanism["label"], mechanism["confidence"]) == (expected, "high")
    assert mechanism["evidence"].get("layer") == layer
    if layer is not None:
        assert mechanism["evidence"]["@value"]["restoration"] > 0.95 and "layer 1" in mechanism["reason"]


def _batch(model, n=32):
    d = data(n)
    ids = torch.from_numpy(d.padded()).long()
    broken = torch.from_numpy(corrupt(d.padded(), d.columns["key_pos"], TASK.token_classes, seed=0).input_ids).long()
    col = lambda c: torch.from_numpy(d.columns[c]).long()
    return d, ids, broken, col


@pytest.mark.parametrize("arch", [name for name, spec in ARCHITECTURES.items() if spec.builtin])
def test_golden_properties_on_real_models(arch):
    torch.manual_seed(0)
    extra = {"max_position_embeddings": 16} if arch == "transformer" else {}
    model = build_model(arch, vocab_size=TASK.vocab_size, hidden_size=16, **extra).eval()
    engine = InterventionEngine(model)
    d, ids, broken, col = _batch(model)
    B, L = ids.shape
    final_clean, clean = engine.cache(ids, ["layers.0.input", "layers.1.input"])
    final_corrupt, corrupt_cache = engine.cache(broken, ["layers.0.input"])
    every = torch.arange(L).expand(B, L)
    # patching every position at layers.0.input reproduces the clean output exactly
    out = engine.patched_final("layers.0.input", corrupt_cache["layers.0.input"], every, clean["layers.0.input"])
    assert torch.equal(out, final_clean)
    # patching nothing reproduces the corrupted output
    none = torch.full((B, 1), -1)
    out = engine.patched_final("layers.0.input", corrupt_cache["layers.0.input"], none, clean["layers.0.input"])
    assert torch.equal(out, final_corrupt)
    # a patch at position p changes no output before p; the answer position never moves the query.
    # (Compared with an empty patch of the same site: observing a state site switches some mixers
    # to their state-materialising path, equal to the fast one only up to rounding.)
    for site in model.site_names():
        layer_input = f"layers.{site.split('.')[1]}.input"
        _, src = engine.cache(ids, [site])
        _, base = engine.cache(broken, [layer_input])
        reference = engine.patched_final(site, base[layer_input], none, src[site])
        assert torch.allclose(reference, final_corrupt, atol=1e-5), site
        p = col("value_pos")
        out = engine.patched_final(site, base[layer_input], p[:, None], src[site])
        before = torch.arange(L)[None, :] < p[:, None]
        assert torch.equal(out[before], reference[before]), site
        out = engine.patched_final(site, base[layer_input], col("answer_pos")[:, None], src[site])
        q = col("query_pos")
        assert torch.equal(out[torch.arange(B), q], reference[torch.arange(B), q]), site


def test_engine_probabilities_match_full_forward():
    torch.manual_seed(0)
    model = build_model("mamba", vocab_size=TASK.vocab_size, hidden_size=16).eval()
    d, ids, broken, col = _batch(model, 8)
    out = InterventionEngine(model).run(ids, broken, {"value": col("value_pos")}, col("query_pos"), col("answer"),
                                        ["layers.1.input"])
    with torch.no_grad():
        logits = model(broken).logits
    rows = torch.arange(8)
    p = torch.softmax(logits[rows, col("query_pos")], -1)[rows, col("answer")]
    assert torch.allclose(out["p_corrupt"], p, atol=1e-6)


def test_bad_input():
    model = build_model("mamba", vocab_size=TASK.vocab_size, hidden_size=16)
    with pytest.raises(MechEvalError, match="valid sites: layers.0.input"):
        run_grid(model, TASK, data(8), sites=["layers.7.input"], progress=False)
    d = data(8)
    del d.columns["value_pos"]
    with pytest.raises(MechEvalError, match="value_pos"):
        run_grid(model, TASK, d, progress=False)
    with pytest.raises(MechEvalError, match="not an hf-mecheval model"):
        InterventionEngine(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("arch, extra", [
    ("transformer", {"max_position_embeddings": 16}), ("mamba", {}),
    # H3's state is read and patched in closed form (Site.entry_access), not through the hook. At
    # the default initialisation its state patches move p(answer) by ~1e-7, under the tolerance;
    # ten times wider weights make it 1e-4 to 2e-2
    ("h3", {"d_state": 8, "initializer_range": 0.2}),
    ("h3", {"d_state": 8, "initializer_range": 0.2, "ssm_form": "mecheval-v1"}),
    ("baseconv", {}), ("based", {}), ("hyena", {}), ("deltanet", {}), ("mamba2", {}), ("gated_deltanet", {})],
    ids=["transformer", "mamba", "h3", "h3_v1", "baseconv", "based", "hyena", "deltanet", "mamba2", "gated_deltanet"])
def test_every_cell_equals_a_full_forward_with_one_hook(arch, extra):
    # a second, naive implementation: for each cell, the whole corrupted forward with a hook that
    # writes the clean activation at the position (covers the engine's shortcuts: outputs patched
    # as the next layer's input, the last output without any layer, positions after the query)
    # in float64: at the default initialisation many cells move p(answer) by only 1e-7 to 1e-5
    # (Mamba's state, the Transformer's MLP), which float32's tolerance could not tell from no patch
    torch.manual_seed(0)
    model = build_model(arch, vocab_size=TASK.vocab_size, hidden_size=16, **extra).eval().double()
    engine = InterventionEngine(model)
    d, ids, broken, col = _batch(model, n=6)
    names = ("key", "value", "query", "answer")
    sites = model.site_names()
    ours = engine.run(ids, broken, {p: col(f"{p}_pos") for p in names}, col("query_pos"), col("answer"), sites)
    _, clean = engine.cache(ids, sites)
    rows = torch.arange(len(ids))
    for site in sites:
        for name in names:
            pos = col(f"{name}_pos")

            def hook(module, inputs, output, site=site, pos=pos):
                output = output.clone()
                output[rows, pos] = clean[site][rows, pos]
                return output

            handle = model.get_site(site).register_forward_hook(hook)
            with torch.no_grad():
                logits = model(broken).logits
            handle.remove()
            p = torch.softmax(logits[rows, col("query_pos")], -1)[rows, col("answer")]
            assert ours["p_patched"][site][name].dtype == torch.float64
            assert torch.allclose(ours["p_patched"][site][name], p, rtol=0, atol=1e-12), (site, name)


def test_answer_position_check_is_measured_and_catches_a_model_that_reads_the_future():
    torch.manual_seed(0)
    model = build_model("transformer", vocab_size=TASK.vocab_size, hidden_size=16, max_position_embeddings=16).eval()
    engine = InterventionEngine(model)
    d, ids, broken, col = _batch(model, n=6)
    # (at layers.0.input the answer token's embedding is the same in both documents: nothing to patch)
    sites = ["layers.1.input", "layers.0.mlp_output"]
    rows = torch.arange(len(ids))
    _, clean = engine.cache(ids, sites)

    def answer_cells():
        out = engine.run(ids, broken, {"answer": col("answer_pos")}, col("query_pos"), col("answer"), sites)
        return out["p_corrupt"], {s: out["p_patched"][s]["answer"] for s in sites}

    def naive(site):          # the whole corrupted forward with the clean activation at the answer
        def hook(module, inputs, output):
            output = output.clone()
            output[rows, col("answer_pos")] = clean[site][rows, col("answer_pos")]
            return output
        handle = model.get_site(site).register_forward_hook(hook)
        with torch.no_grad():
            logits = model(broken).logits
        handle.remove()
        return torch.softmax(logits[rows, col("query_pos")], -1)[rows, col("answer")]

    p_corrupt, at_answer = answer_cells()
    for site in sites:                      # a causal model: no effect at the answer position
        assert torch.allclose(at_answer[site], p_corrupt, atol=1e-7)
    # now break causality: the last mixer's output at t also sees (amplified) its input at t + 1
    leak = model.get_site("layers.1.mixer_output").register_forward_hook(
        lambda module, inputs, output: output + 100 * torch.roll(inputs[0], -1, dims=1))
    try:
        p_corrupt, at_answer = answer_cells()
        want = naive("layers.1.input")
    finally:
        leak.remove()
    # measured at the residual stream: it equals the naive forward and shows the leak (the effect
    # of an untrained model is small in probability, but far above float32 rounding)
    assert torch.allclose(at_answer["layers.1.input"], want, atol=1e-8)
    assert (at_answer["layers.1.input"] - p_corrupt).abs().min() > 1e-6
    assert torch.equal(at_answer["layers.0.mlp_output"], p_corrupt)         # elsewhere: the exact shortcut


@pytest.mark.parametrize("make, position", [(induction_model, "value"), (direct_model, "query")])
def test_the_training_callback_measures_the_last_layers_input_as_the_whole_grid_does(make, position):
    # the mechanism over training (RestorationCallback) on models whose mechanism is known: its
    # entry is the key-corrupted grid's cell at the last layer's input, and names the mechanism
    from types import SimpleNamespace

    from hf_mecheval.training.callbacks import RestorationCallback

    model, documents, logged = make(TASK.vocab_size, 16), data(48), []
    callback = RestorationCallback(SimpleNamespace(model=model, log=logged.append), TASK, documents, every_n_steps=10)
    entry = callback.measure(model, step=10)
    grid = run_grid(model, TASK, documents, progress=False, n_resamples=0)
    assert entry["step"] == 10 and entry["restoration_accuracy"] == grid["corruptions"]["key"]["clean_accuracy"] == 1.0
    for p in ("key", "value", "query"):
        assert entry[f"restoration@{p}"] == pytest.approx(cell(grid, "key", "layers.1.input", p)["restoration"], abs=1e-6)
    assert entry[f"restoration@{position}"] > 0.95
    assert logged == [{k: v for k, v in entry.items() if k != "step"}] and callback.history == [entry]
