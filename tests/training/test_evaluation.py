"""Evaluation's answer summary: from our models, the LM head at the answers alone, in pieces
(``AnswerSummary.of_model``), checked for every architecture against the summary of the model's
full forward (logits at every position); the summary's arithmetic by hand; the Trainer's
evaluation through it, without ever padding the logits out to every row's k slots."""
import inspect
import json

import pytest
import torch
from transformers import TrainingArguments

import hf_mecheval  # noqa: F401
from hf_mecheval.models import ARCHITECTURES, build_model
from hf_mecheval.models import modeling_mecheval as modeling
from hf_mecheval.tasks import build_task
from hf_mecheval.training import evaluation
from hf_mecheval.training.data import PaddedTaskDataset, batch_collator
from hf_mecheval.training.evaluation import AnswerSummary, compute_answer_metrics, head_summary, summary_rows
from hf_mecheval.training import trainer as trainer_module
from hf_mecheval.training.trainer import MechEvalTrainer

ARCHS = [name for name, spec in ARCHITECTURES.items() if spec.builtin]


def tiny(arch):
    torch.manual_seed(0)
    return build_model(arch, **ARCHITECTURES[arch].tiny_fields()).double().eval()


def multi_query_batch(vocab: int):
    """6 rows of 16 tokens; answers (labels) at the positions listed, row 5 without any."""
    torch.manual_seed(1)
    ids = torch.randint(3, vocab, (6, 16))
    labels = torch.full_like(ids, -100)
    for row, positions in {0: [3], 1: [5, 15], 2: [4], 3: [2, 8, 12], 4: [15]}.items():
        labels[row, positions] = ids[row, positions]
    return ids, labels


def full_forward_summary(model, ids, labels):
    """The second computation: logits at every position, then each answer's row by hand
    (prediction = argmax, p = softmax at the answer) -> ({(row, position): (prediction, answer, p)},
    the mean cross entropy over the answers)."""
    with torch.no_grad():
        logits = model(ids).logits                                           # (B, L, V)
    rows, nll = {}, []
    for b, t in (labels[:, 1:] != -100).nonzero().tolist():                # position t predicts labels[t + 1]
        answer = int(labels[b, t + 1])
        rows[b, t] = (int(logits[b, t].argmax()), answer, float(torch.softmax(logits[b, t], -1)[answer]))
        nll.append(float(-torch.log_softmax(logits[b, t], -1)[answer]))
    return rows, sum(nll) / len(nll)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("call_tokens", [0, 10 ** 9], ids=["grouped", "one-call"])
def test_summary_from_the_answers_states_equals_the_full_forwards(arch, call_tokens, monkeypatch):
    """For every architecture (float64), with the rows grouped by length or in one call and the LM
    head in pieces of 2 answers: each answer's prediction, answer and p(answer), and the loss, as
    the model's full forward gives them; the slots of each row in order, empty slots IGNORE_INDEX."""
    model = tiny(arch)
    ids, labels = multi_query_batch(model.config.vocab_size)
    monkeypatch.setattr(modeling, "GROUP_CALL_TOKENS", call_tokens)
    monkeypatch.setattr(evaluation, "HEAD_CHUNK_LOGITS", 2 * model.config.vocab_size)
    heads = []
    model.lm_head.register_forward_hook(lambda m, i, o: heads.append(tuple(o.shape)))
    loss, summary = AnswerSummary(multi_query=True).of_model(model, {"input_ids": ids, "labels": labels})
    assert heads == [(2, model.config.vocab_size)] * 4                   # 8 answers, 2 at a time
    want, want_loss = full_forward_summary(model, ids, labels)
    assert summary.shape == (6, 3, 3)
    expected = torch.full((6, 3, 3), -100.0, dtype=summary.dtype)
    for b in range(6):
        for slot, t in enumerate(sorted(t for r, t in want if r == b)):
            expected[b, slot] = torch.tensor(want[b, t], dtype=summary.dtype)
    assert torch.equal(summary[..., :2], expected[..., :2])              # predictions and answers exactly
    assert torch.allclose(summary, expected, rtol=0, atol=1e-12)
    assert float(loss) == pytest.approx(want_loss, abs=1e-12)
    with torch.no_grad():           # the forward's own loss (its cross entropy runs in float32)
        assert float(model(ids, labels=labels).loss) == pytest.approx(float(loss), abs=1e-6)


@pytest.mark.parametrize("arch", ["transformer", "mamba"])
def test_one_answer_per_row_and_an_observed_last_block(arch):
    """One answer per row (AR): (B, 3). A hook on the last block's output sees every position (as in
    the forward) and the summary is the same."""
    model = tiny(arch)
    torch.manual_seed(2)
    ids = torch.randint(3, model.config.vocab_size, (4, 10))
    labels = torch.full_like(ids, -100)
    labels[torch.arange(4), torch.tensor([9, 5, 9, 2])] = ids[torch.arange(4), torch.tensor([9, 5, 9, 2])]
    want, want_loss = full_forward_summary(model, ids, labels)
    expected = torch.tensor([want[b, t] for b, t in sorted(want)], dtype=torch.float64)
    summarize = AnswerSummary(multi_query=False)
    loss, summary = summarize.of_model(model, {"input_ids": ids, "labels": labels})
    assert torch.allclose(summary, expected, rtol=0, atol=1e-12) and float(loss) == pytest.approx(want_loss, abs=1e-12)
    last = len(model.model.layers) - 1
    seen = []
    model.get_site(f"layers.{last}.output").register_forward_hook(lambda m, i, o: seen.append(tuple(o.shape)))
    loss, observed = summarize.of_model(model, {"input_ids": ids, "labels": labels})
    assert seen[0][:2] == (4, 10)                                         # every position, not the answers alone
    assert torch.allclose(observed, expected, rtol=0, atol=1e-12) and float(loss) == pytest.approx(want_loss, abs=1e-12)


def test_summary_rows_and_pieces_by_hand():
    logits = torch.tensor([[0.0, 2.0, 0.0], [1.0, 1.0, 3.0], [0.0, 0.0, 0.0]])
    answers = torch.tensor([1, 0, 2])
    rows, nll = summary_rows(logits, answers)
    e = torch.e
    p = [e ** 2 / (e ** 2 + 2), e / (2 * e + e ** 3), 1 / 3]
    assert rows[:, :2].tolist() == [[1, 1], [2, 0], [0, 2]]             # argmax (the first of equals), answer
    assert rows[:, 2].tolist() == pytest.approx(p, abs=1e-6)
    assert nll.tolist() == pytest.approx([-torch.log(torch.tensor(q)).item() for q in p], abs=1e-6)
    # the LM head in pieces: the same rows, the mean cross entropy
    head = torch.nn.Linear(2, 3, bias=False)
    h = torch.randn(7, 2)
    head.requires_grad_(False)
    whole, whole_loss = summary_rows(head(h), torch.arange(7) % 3)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evaluation, "HEAD_CHUNK_LOGITS", 6)                    # 2 answers a piece
        pieces, loss = head_summary(head, h, torch.arange(7) % 3)
    assert torch.allclose(pieces, whole) and float(loss) == pytest.approx(float(whole_loss.mean()))
    empty, empty_loss = head_summary(head, h[:0], torch.arange(0))
    assert empty.shape == (0, 3) and torch.isnan(empty_loss)


def test_the_trainers_evaluation_never_pads_the_logits_out(tmp_path, monkeypatch):
    """``trainer.evaluate`` on MQAR documents: the metrics the forward's logits give, without the
    forward's (batch, k, vocab) logits ever being made."""
    config = {"vocab_size": 32, "train_mixture": [[8, 2, 1], [12, 3, 1]], "eval_mixture": [[8, 2, 1], [12, 3, 1]]}
    task = build_task("mqar_cpu", **config)
    data = PaddedTaskDataset(task.generate(40, "validation", seed=0))
    torch.manual_seed(0)
    model = build_model("transformer", vocab_size=task.vocab_size, hidden_size=16, num_hidden_layers=2,
                        max_position_embeddings=32)
    args = TrainingArguments(output_dir=str(tmp_path), per_device_eval_batch_size=16, report_to=[],
                             use_cpu=True, disable_tqdm=True, remove_unused_columns=False)

    def evaluate():
        trainer = MechEvalTrainer(model=model, args=args, eval_dataset=data, data_collator=batch_collator,
                                  compute_metrics=compute_answer_metrics, answer_summary=AnswerSummary(True))
        return trainer.evaluate()

    with monkeypatch.context() as mp:
        mp.delattr(modeling.MechEvalForCausalLM, "answer_states")   # as for a model without it: the forward's logits
        want = evaluate()

    def padded_out(*args, **kwargs):
        raise AssertionError("the forward's (batch, k, vocab) logits were made")

    monkeypatch.setattr(modeling, "logits_and_loss_at_answers", padded_out)
    got = evaluate()
    assert got["eval_accuracy"] == want["eval_accuracy"]
    assert got["eval_answer_prob"] == pytest.approx(want["eval_answer_prob"], abs=1e-6)
    assert got["eval_loss"] == pytest.approx(want["eval_loss"], abs=1e-5)
    json.dumps(got)                                                        # plain numbers, as metrics.json takes them


def test_a_training_step_asks_for_the_loss_alone_and_trains_the_same(tmp_path, monkeypatch):
    """The Trainer's training steps call our forward with ``skip_logits`` (no (batch, k, vocab)
    copy of the logits); its evaluation does not; the weights after three steps are the same bits
    as when every step makes the logits."""
    task = build_task("mqar_cpu", vocab_size=32, train_mixture=[[8, 2, 1], [12, 3, 1]],
                      eval_mixture=[[8, 2, 1], [12, 3, 1]])
    data = PaddedTaskDataset(task.generate(24, "train", seed=0))
    args = TrainingArguments(output_dir=str(tmp_path), per_device_train_batch_size=8, max_steps=3, report_to=[],
                             use_cpu=True, disable_tqdm=True, remove_unused_columns=False, save_strategy="no",
                             logging_strategy="no", learning_rate=1e-2)
    calls = []
    forward = modeling.MechEvalForCausalLM.forward

    def spy(self, *a, **kw):
        out = forward(self, *a, **kw)
        calls.append((kw.get("skip_logits", False), out.logits is None))
        return out

    monkeypatch.setattr(modeling.MechEvalForCausalLM, "forward", spy)
    monkeypatch.setattr(modeling.MechEvalForCausalLM.forward, "__signature__", inspect.signature(forward),
                        raising=False)

    def trained():
        torch.manual_seed(0)
        model = build_model("mamba", vocab_size=task.vocab_size, hidden_size=16, num_hidden_layers=2)
        MechEvalTrainer(model=model, args=args, train_dataset=data, data_collator=batch_collator).train()
        return model

    skipping = trained()
    assert calls == [(True, True)] * 3
    calls.clear()
    with monkeypatch.context() as mp:                   # as for a forward without skip_logits
        mp.setattr(trainer_module, "takes_skip_logits", lambda model: False)
        making = trained()
    assert calls == [(False, False)] * 3
    for (name, a), b in zip(skipping.named_parameters(), making.parameters()):
        assert torch.equal(a, b), name
    calls.clear()
    evaluation = MechEvalTrainer(model=skipping, args=args, eval_dataset=data, data_collator=batch_collator)
    evaluation.evaluate()
    assert calls and all(call == (False, False) for call in calls)
