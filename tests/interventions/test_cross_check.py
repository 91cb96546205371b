"""The engine's probabilities equal those of the same cells done with nnsight and with pyvene
(both in the `interp` extra)."""
import importlib.util
import warnings

import pytest
import torch

from hf_mecheval.interventions import InterventionEngine
from hf_mecheval.models import build_model
from hf_mecheval.tasks import ARConfig, ARTask, corrupt

TASK = ARTask(ARConfig(num_kv=24, num_pairs=4, vocab_size=27))


def setup(arch):
    # in float64: at this initialisation some cells move p(answer) by under 1e-6 (the Transformer's
    # at the value), which float32's tolerance could not tell from no patch
    torch.manual_seed(0)
    extra = {"max_position_embeddings": 16} if arch == "transformer" else {}
    model = build_model(arch, vocab_size=TASK.vocab_size, hidden_size=16, **extra).eval().double()
    d = TASK.generate(16, "test", seed=3)
    ids = torch.from_numpy(d.padded()).long()
    bad = torch.from_numpy(corrupt(d.padded(), d.columns["key_pos"], TASK.token_classes, seed=0).input_ids).long()
    col = lambda c: torch.from_numpy(d.columns[c]).long()
    ours = InterventionEngine(model).run(ids, bad, {"value": col("value_pos"), "query": col("query_pos")},
                                         col("query_pos"), col("answer"), ["layers.1.input", "layers.0.mixer_output"])
    return model, ids, bad, col, ours


def prob(logits, col):
    rows = torch.arange(len(logits))
    return torch.softmax(logits[rows, col("query_pos")], -1)[rows, col("answer")]


@pytest.mark.skipif(importlib.util.find_spec("nnsight") is None, reason="nnsight not installed (the interp extra)")
@pytest.mark.parametrize("arch", ["transformer", "mamba"])
def test_engine_equals_nnsight(arch):
    from nnsight import NNsight

    model, ids, bad, col, ours = setup(arch)
    rows = torch.arange(len(ids))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")          # nnsight notes that blocks have submodules named input/output
        nm = NNsight(model)
    for position in ("value", "query"):
        pos = col(f"{position}_pos")
        with nm.trace(ids):                                       # (in execution order)
            clean_mix = nm.model.layers[0].mixer.output.save()    # layer 0's mixer output
            clean_resid = nm.model.layers[1].input.save()         # residual entering block 1
        with nm.trace(bad):
            nm.model.layers[1].input[rows, pos] = clean_resid[rows, pos]
            logits_resid = nm.output.logits.save()
        with nm.trace(bad):
            nm.model.layers[0].mixer.output[rows, pos] = clean_mix[rows, pos]
            logits_mix = nm.output.logits.save()
        torch.testing.assert_close(prob(logits_resid, col), ours["p_patched"]["layers.1.input"][position],
                                   rtol=0, atol=1e-12)
        torch.testing.assert_close(prob(logits_mix, col), ours["p_patched"]["layers.0.mixer_output"][position],
                                   rtol=0, atol=1e-12)


@pytest.mark.skipif(importlib.util.find_spec("pyvene") is None, reason="pyvene not installed (the interp extra)")
def test_engine_equals_pyvene():
    import pyvene as pv

    from hf_mecheval.interventions.pyvene_support import register_pyvene

    register_pyvene()
    model, ids, bad, col, ours = setup("mamba")
    for position in ("value", "query"):
        pos = col(f"{position}_pos")
        config = pv.IntervenableConfig(representations=[
            pv.RepresentationConfig(layer=1, component="input", unit="pos", max_number_of_units=1)],
            intervention_types=pv.VanillaIntervention)
        intervenable = pv.IntervenableModel(config, model)
        _, out = intervenable({"input_ids": bad}, [{"input_ids": ids}],
                              {"sources->base": (pos[None, :, None].tolist(), pos[None, :, None].tolist())})
        torch.testing.assert_close(prob(out.logits, col), ours["p_patched"]["layers.1.input"][position],
                                   rtol=0, atol=1e-12)
