"""StackedCausalLM: K copies under vmap compute what each model computes alone."""
import pytest
import torch

from hf_mecheval.errors import MechEvalError
from hf_mecheval.models import ARCHITECTURES, build_model
from hf_mecheval.models.stacked import StackedCausalLM, answer_positions
from hf_mecheval.tasks.presets import build_task
from hf_mecheval.training.data import PaddedTaskDataset

TASK = build_task("ar_32", num_kv=16, num_pairs=2)
DATA = PaddedTaskDataset(TASK.generate(24, "train", 0))


def copies(arch, K=3, vocab_size=TASK.vocab_size, kernels="torch", **fields):
    models = []
    for k in range(K):
        torch.manual_seed(k)
        models.append(build_model(arch, vocab_size=vocab_size, hidden_size=16, num_hidden_layers=2,
                                  kernels=kernels, **fields))
    return models


def assert_each_copy_is_its_model(stacked, out, models, batch_of, atol):
    """Each copy's loss, logits and every parameter's gradient equal its model's alone on its batch
    (``batch_of(k)``), after ``out.loss.backward()``."""
    for k, model in enumerate(models):
        ref = model(**batch_of(k))
        ref.loss.backward()
        torch.testing.assert_close(out.losses[k], ref.loss, rtol=0, atol=atol)
        torch.testing.assert_close(out.logits[k], ref.logits.reshape(out.logits[k].shape), rtol=0, atol=atol)
        grads = dict(model.named_parameters())
        for name, p in stacked.named_stacked_parameters():
            torch.testing.assert_close(p.grad[k], grads[name].grad, rtol=0, atol=atol, msg=name)


@pytest.mark.parametrize("arch", [name for name, spec in ARCHITECTURES.items() if spec.builtin])
@pytest.mark.parametrize("per_copy", [False, True])
def test_losses_and_gradients_equal_each_model_alone(arch, per_copy):
    # in float64: some gradients are under 1e-6 at this initialisation (Hyena's filter and norms,
    # H3's kernel, Gated DeltaNet's A_log), which float32's tolerance could not tell from zero
    models = [model.double() for model in copies(arch)]
    stacked = StackedCausalLM(models)
    batch = DATA.__getitems__(list(range(24 if per_copy else 8)))
    if per_copy:                                                   # (K, 8, L): a batch per copy
        batch = {k: v.view(3, 8, -1) for k, v in batch.items()}
    out = stacked(**batch)
    out.loss.backward()
    assert_each_copy_is_its_model(stacked, out, models, lambda k: {key: v[k] if per_copy else v
                                                                  for key, v in batch.items()}, atol=1e-12)


MQAR = build_task("mqar_cpu", vocab_size=32, train_mixture=[[12, 2, 1], [16, 4, 1]], eval_mixture=[[16, 4, 1]])
MQAR_DATA = PaddedTaskDataset(MQAR.generate(24, "train", 0))


@pytest.mark.parametrize("arch", [name for name, spec in ARCHITECTURES.items() if spec.builtin])
def test_several_answers_per_row_equal_each_model_alone(arch):
    # MQAR batches, one per copy: 2 or 4 answers per row, the loss over all of them (float64 as above)
    models = [model.double() for model in copies(arch, vocab_size=32)]
    stacked = StackedCausalLM(models)
    batch = {k: v.view(3, 8, -1) for k, v in MQAR_DATA.__getitems__(list(range(24))).items()}
    out = stacked(**batch)
    out.loss.backward()
    assert out.logits.shape == (3, 8, 4, 32)
    assert_each_copy_is_its_model(stacked, out, models, lambda k: {key: v[k] for key, v in batch.items()}, atol=1e-12)


def test_unstack_gives_back_the_models_and_finite_copies_flags_nan():
    models = copies("mamba")
    stacked = StackedCausalLM(models)
    for model, back in zip(models, stacked.unstack()):
        a, b = model.state_dict(), back.state_dict()
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        assert back.lm_head.weight is back.model.embed_tokens.weight       # still tied
    with torch.no_grad():
        stacked.stacked["model__layers__1__mixer__D"][2, 0] = float("nan")
    assert stacked.finite_copies().tolist() == [True, True, False]


def test_bad_input_is_refused():
    with pytest.raises(MechEvalError, match="same architecture"):
        StackedCausalLM(copies("mamba", 1) + copies("mamba", 1, conv_kernel=2))
    stacked = StackedCausalLM(copies("based", 2))
    batch = DATA.__getitems__(list(range(6)))
    with pytest.raises(MechEvalError, match="leading dimension of 2"):
        stacked(**{k: v.view(3, 2, -1) for k, v in batch.items()})
    no_label = batch["labels"].clone()
    no_label[0] = -100
    with pytest.raises(MechEvalError, match="an answer's label"):
        answer_positions(no_label)


@pytest.mark.parametrize("data", ["ar", "mqar"])
def test_h3_stacked_on_its_compiled_kernels_equals_each_model_alone(data, monkeypatch):
    """H3 (reference form) as stacked sweeps train it, kernels "auto": the compiled CPU kernels run
    under vmap (a spy checks the heads at the answers did) and every copy's loss and gradients are
    its own, on one answer per row and on MQAR's several, a batch per copy."""
    from hf_mecheval.models import cpu_kernels

    if not cpu_kernels.available():
        pytest.skip("no C++ compiler: the kernels are not built")
    calls = []
    real = cpu_kernels.h3_kept_heads_cpu
    monkeypatch.setattr(cpu_kernels, "h3_kept_heads_cpu", lambda *a: calls.append(a[4].shape) or real(*a))
    task, dataset = (TASK, DATA) if data == "ar" else (MQAR, MQAR_DATA)
    # in float64 (the kernels' other dtype), as the tests above
    models = [model.double() for model in copies("h3", vocab_size=task.vocab_size, kernels="auto", d_state=8)]
    stacked = StackedCausalLM(models)
    batch = {k: v.view(3, 8, -1) for k, v in dataset.__getitems__(list(range(24))).items()}
    out = stacked(**batch)
    out.loss.backward()
    assert calls
    assert_each_copy_is_its_model(stacked, out, models, lambda k: {key: v[k] for key, v in batch.items()}, atol=1e-12)
