"""MQAR training: the loss on every answer position, accuracy as Zoology counts it (per document,
then over documents) and per setting, checked against a second computation from full forwards;
stacked copies equal lone runs; the AR metrics' arithmetic is unchanged."""
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM
from transformers.trainer_utils import EvalPrediction

import hf_mecheval  # noqa: F401
from hf_mecheval.tasks import build_task
from hf_mecheval.training.data import PaddedTaskDataset
from hf_mecheval.training.evaluation import (accuracy_by_key_position, accuracy_by_length, compute_answer_metrics,
                                             query_logits_summary)
from hf_mecheval.training.run import main, train
from hf_mecheval.training.spec import RunSpec
from hf_mecheval.training.stacked import Member, train_stacked

# 12 keys (ids 4-15) and 16 values (16-31), random filler over ids 3-31; training at (8 tokens,
# 2 pairs) and (12, 3), evaluation there and at (12, 2), twice as often
TASK_CONFIG = {"vocab_size": 32, "train_mixture": [[8, 2, 1], [12, 3, 1]],
               "eval_mixture": [[8, 2, 1], [12, 3, 1], [12, 2, 2]]}
TINY = ["--task", "mqar_cpu", "--task_config", json.dumps(TASK_CONFIG), "--architecture", "transformer",
        "--max_position_embeddings", "32", "--disable_tqdm", "true", "--eval_strategy", "no", "--save_strategy", "no"]


def recomputed_accuracy(run_dir: Path, data) -> tuple[float, dict, float]:
    """Each test document's share of right answers from the model's full forward (logits at every
    position, argmax where a label is), then the mean over documents, overall and per setting; and
    the share of all queries answered right."""
    model = AutoModelForCausalLM.from_pretrained(run_dir).eval()
    shares, settings, queries = [], [], []
    for doc in data:
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([doc["input_ids"]])).logits[0]          # (L, V)
        right = [int(logits[pos - 1].argmax()) == answer for pos, answer in zip(doc["answer_pos"], doc["answer"])]
        shares.append(sum(right) / len(right))
        settings.append((doc["seq_len"], doc["num_pairs"]))
        queries += right
    by = {s: float(np.mean([a for a, t in zip(shares, settings) if t == s])) for s in set(settings)}
    return float(np.mean(shares)), by, float(np.mean(queries))


def test_a_tiny_mqar_is_learned_and_scored_per_setting(tmp_path):
    # 4 000 steps: the loss leaves its plateau (a value of the context, 1/P right) near step 2 000
    # and ends below 0.01; about 25 s on two idle cores
    run = tmp_path / "run"
    argv = TINY + ["--output_dir", str(run), "--train_size", "16000", "--eval_size", "60", "--num_train_epochs", "8",
                   "--learning_rate", "1e-3", "--hidden_size", "32", "--logging_steps", "1000"]
    assert main(argv) == 0
    final = json.loads((run / "metrics.json").read_text())["final"]
    test = build_task("mqar_cpu", **TASK_CONFIG).generate(60, "test", seed=0)
    accuracy, by_setting, per_query = recomputed_accuracy(run, test)
    assert final["test_accuracy"] == pytest.approx(accuracy, abs=1e-6)
    assert final["test_accuracy"] >= 0.9                   # every answer position was trained on
    # settings in the order of (seq_len, num_pairs); 60 documents of weights 1, 1, 2: 15, 30, 15
    assert [(s["seq_len"], s["num_pairs"], s["documents"]) for s in final["test_by_setting"]] == [
        (8, 2, 15), (12, 2, 30), (12, 3, 15)]
    for s in final["test_by_setting"]:
        assert s["accuracy"] == pytest.approx(by_setting[(s["seq_len"], s["num_pairs"])], abs=1e-6)
    # every key of these documents stands before position 16: one bucket, every query of the split
    assert [(b["key_from"], b["key_to"], b["queries"]) for b in final["test_by_key_position"]] == [
        (0, 16, int(test.query_offsets[-1]))]
    assert final["test_by_key_position"][0]["accuracy"] == pytest.approx(per_query, abs=1e-6)


def test_stacked_mqar_copies_equal_runs_trained_alone(tmp_path):
    # evaluation every epoch: the stack's own per-copy evaluation, beside each lone run's Trainer
    common = TINY + ["--train_size", "64", "--eval_size", "16", "--max_steps", "12", "--hidden_size", "16",
                     "--per_device_train_batch_size", "8", "--logging_steps", "4", "--eval_strategy", "epoch"]
    copies = [(1e-3, 0), (3e-3, 1)]
    members = [Member(f"c{i}", RunSpec.from_flags(common + ["--learning_rate", str(lr), "--seed", str(seed),
                                                            "--output_dir", str(tmp_path / "stacked" / f"c{i}")]))
               for i, (lr, seed) in enumerate(copies)]
    finals = train_stacked(members, tmp_path / "stack")
    for i, ((lr, seed), final) in enumerate(zip(copies, finals)):
        alone = train(RunSpec.from_flags(common + ["--learning_rate", str(lr), "--seed", str(seed),
                                                   "--output_dir", str(tmp_path / "alone" / f"c{i}")]))
        for key in ("validation_loss", "validation_accuracy", "validation_answer_prob", "test_accuracy"):
            assert final[key] == pytest.approx(alone[key], abs=1e-4), key
        for got, want in zip(final["test_by_setting"], alone["test_by_setting"], strict=True):
            assert got == {**want, "accuracy": pytest.approx(want["accuracy"], abs=1e-6)}
        evals = [[(e["eval_accuracy"], e["eval_answer_prob"], e["eval_loss"]) for e in json.loads(
            (root / f"c{i}" / "metrics.json").read_text())["history"] if "eval_accuracy" in e]
            for root in (tmp_path / "stacked", tmp_path / "alone")]
        assert len(evals[0]) == len(evals[1]) == 3          # epochs 1 and 1.5, then the final validation
        assert np.allclose(evals[0], evals[1], atol=1e-4)


def test_query_summary_and_per_document_accuracy_by_hand():
    # two documents of 6 tokens: answers at positions 2 and 4 (document 0), 3 (document 1)
    labels = torch.full((2, 6), -100)
    labels[0, 2], labels[0, 4], labels[1, 3] = 7, 8, 9
    logits = torch.zeros(2, 5, 10)          # position t predicts labels[t + 1]
    logits[0, 1, 7] = 5.0                   # right
    logits[0, 3, 2] = 5.0                   # wrong (8 expected)
    logits[1, 2, 9] = 5.0                   # right
    summary = query_logits_summary(logits, labels)                 # full logits (B, L - 1, V)
    assert summary.shape == (2, 2, 3)
    assert summary[0, :, :2].tolist() == [[7, 7], [2, 8]] and summary[1, 0, :2].tolist() == [9, 9]
    assert summary[1, 1].tolist() == [-100, -100, -100]            # document 1 has one answer
    p = float(torch.softmax(logits[0, 1], -1)[7])
    assert float(summary[0, 0, 2]) == pytest.approx(p)
    metrics = compute_answer_metrics(EvalPrediction(predictions=summary.numpy(), label_ids=None))
    assert metrics["accuracy"] == pytest.approx((0.5 + 1.0) / 2)   # per document, then the mean
    # the answer probability likewise: document 0's two answers averaged, document 1's padding left out
    p01 = float(torch.softmax(logits[0, 3], -1)[8])
    p10 = float(torch.softmax(logits[1, 2], -1)[9])
    assert metrics["answer_prob"] == pytest.approx(((p + p01) / 2 + p10) / 2)
    # the model's own (B, k, V) logits at the scored positions give the same summary
    kept = torch.stack([logits[0, [1, 3]], logits[1, [2, 0]]])
    assert torch.equal(query_logits_summary(kept, labels), summary)


def test_one_answer_per_document_keeps_the_arithmetic():
    summary = np.array([[3, 3, 0.5], [4, 5, 0.25], [6, 6, 0.75], [1, 2, 0.0]])
    metrics = compute_answer_metrics(EvalPrediction(predictions=summary, label_ids=None))
    assert metrics == {"accuracy": 0.5, "answer_prob": 0.375}


def test_accuracy_by_key_position_by_hand():
    """Buckets [0, 16), [16, 32), [32, 64): each query's bucket from its key's position, padding
    (-1) left out, the share right in each."""
    right, wrong = [7.0, 7.0, 0.9], [3.0, 7.0, 0.1]                    # (prediction, answer, p)
    pad = [-100.0, -100.0, -100.0]
    summary = np.array([[right, wrong, right], [wrong, right, pad]])  # (2 documents, 3 queries, 3)
    key_pos = np.array([[0, 15, 40], [16, 63, -1]])
    assert accuracy_by_key_position(summary, key_pos) == [
        {"key_from": 0, "key_to": 16, "queries": 2, "accuracy": 0.5},
        {"key_from": 16, "key_to": 32, "queries": 1, "accuracy": 0.0},
        {"key_from": 32, "key_to": 64, "queries": 2, "accuracy": 1.0}]


def test_accuracy_by_length_by_hand():
    """One answer per document: each document in its length's bucket, the share right in each."""
    summary = np.array([[7, 7, 0.9], [3, 7, 0.1], [5, 5, 0.8], [2, 4, 0.0], [6, 6, 0.7]])     # (5 documents, 3)
    lengths = np.array([3, 15, 16, 40, 200])
    assert accuracy_by_length(summary, lengths) == [
        {"length_from": 0, "length_to": 16, "documents": 2, "accuracy": 0.5},
        {"length_from": 16, "length_to": 32, "documents": 1, "accuracy": 1.0},
        {"length_from": 32, "length_to": 64, "documents": 1, "accuracy": 0.0},
        {"length_from": 128, "length_to": 256, "documents": 1, "accuracy": 1.0}]
    assert accuracy_by_length(summary[:, None, :], lengths) == accuracy_by_length(summary, lengths)   # (N, 1, 3)


def test_query_key_positions_are_each_documents_keys_in_query_order():
    data = build_task("mqar_cpu", **TASK_CONFIG).generate(9, "test", seed=2)
    rows = PaddedTaskDataset(data).query_key_positions
    assert rows.shape == (9, 3)
    for i, doc in enumerate(data):
        n = len(doc["key_pos"])
        assert rows[i, :n].tolist() == list(doc["key_pos"]) and (rows[i, n:] == -1).all()
