"""Interventions on MQAR: one example per query, its own pair corrupted and its own positions
patched; the label per query distance; `mecheval evaluate`, the restoration callback and the
`evaluate` metric on MQAR documents."""
import json

import evaluate
import numpy as np
import pytest
import torch

from hf_mecheval.cli import main as mecheval
from hf_mecheval.interventions import run_grid
from hf_mecheval.interventions.grid import QUERY_POSITIONS, cell
from hf_mecheval.metrics import interchange_restoration_path, summarize_restoration
from hf_mecheval.metrics.mechanism import classify
from hf_mecheval.tasks.mqar import MQARConfig, MQARTask
from hf_mecheval.training.run import main as train

from handbuilt import direct_model, induction_model

# 28 keys (ids 4-31), 32 values (32-63); blank filler, so that the hand-built heads, which match
# tokens exactly, meet no filler copy of a key
TASK = MQARTask(MQARConfig(vocab_size=64, train_mixture=[[32, 4, 1]], eval_mixture=[[32, 4, 1], [32, 6, 1]],
                           random_filler=False))


@pytest.mark.parametrize("make, expected", [(induction_model, "induction"), (direct_model, "direct_query")])
def test_hand_built_mechanisms_per_query_and_per_distance(make, expected):
    model = make(TASK.vocab_size, 32)
    data = TASK.generate(24, "test", seed=2)                  # 12 documents of 4 queries, 12 of 6: 120 queries
    result = run_grid(model, TASK, data, progress=False, n_resamples=100)
    assert result["examples"] == 120 and result["positions"] == list(QUERY_POSITIONS)
    key = result["corruptions"]["key"]
    # each query's own pair is corrupted: every query was right, none is after
    assert key["clean_accuracy"] == 1.0 and key["corrupt_accuracy"] == 0.0 and key["denominator"] > 0.8
    at = {p: cell(result, "key", "layers.1.input", p)["restoration"] for p in QUERY_POSITIONS}
    if expected == "induction":
        assert at["value"] > 0.95 and abs(at["query"]) < 0.1 and abs(at["key"]) < 0.1
    else:
        assert at["query"] > 0.95 and abs(at["value"]) < 0.1 and abs(at["key"]) < 0.1
    assert at["answer"] == pytest.approx(0.0, abs=1e-9)
    assert result["mechanism"]["label"] == expected
    # near and far: split at the median distance of the 120 queries, each labelled from its own examples
    rows = data.per_query()
    distance = rows.columns["query_pos"] - rows.columns["key_pos"]
    by = result["mechanism_by_distance"]
    assert by["boundary"] == float(np.median(distance)) and by["site"] == "layers.1.input"
    per = key["per_example"]
    f32 = lambda values: np.array(values, dtype=np.float32)      # the grid's values, as written
    for name, chosen in (("near", distance <= by["boundary"]), ("far", distance > by["boundary"])):
        group = by["groups"][name]
        assert group["examples"] == int(chosen.sum()) > 0
        assert group["distance"] == [int(distance[chosen].min()), int(distance[chosen].max())]
        for p in ("key", "value", "query"):
            want = summarize_restoration(f32(per["p_clean"])[chosen], f32(per["p_corrupt"])[chosen],
                                         f32(per["p_patched"][f"layers.1.input@{p}"])[chosen], 0.01, 100, 0)
            assert group["cells"][p] == want
        assert group["mechanism"]["label"] == expected == classify(group["cells"], group["clean_accuracy"]).label


def test_each_example_is_its_query():
    data = TASK.generate(6, "test", seed=0)
    rows = data.per_query()
    model = induction_model(TASK.vocab_size, 32)
    result = run_grid(model, TASK, data, corruptions=("key",), sites=["layers.1.input"], progress=False,
                      n_resamples=0)
    p_clean = np.array(result["corruptions"]["key"]["per_example"]["p_clean"])
    with torch.no_grad():
        for r in range(len(rows)):
            doc = rows.document(r)
            logits = model(torch.tensor([doc["input_ids"]])).logits[0, doc["query_pos"]]
            assert float(torch.softmax(logits, -1)[doc["answer"]]) == pytest.approx(p_clean[r], abs=1e-6)


@pytest.fixture(scope="module")
def mqar_run(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "mamba"
    config = {"vocab_size": 64, "train_mixture": [[16, 2, 1], [16, 4, 1]], "eval_mixture": [[16, 2, 1], [32, 6, 1]]}
    assert train(["--task", "mqar_cpu", "--task_config", json.dumps(config), "--architecture", "mamba",
                  "--hidden_size", "16", "--train_size", "128", "--eval_size", "16", "--max_steps", "10",
                  "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true", "--output_dir", str(run),
                  "--restoration_every_n_steps", "5", "--restoration_examples", "12"]) == 0
    return run


def test_evaluate_counts_queries_and_labels_near_and_far(mqar_run, capsys):
    assert mecheval(["evaluate", str(mqar_run), "-n", "30", "--resamples", "20"]) == 0
    out = capsys.readouterr().out
    assert "near queries (distance" in out and "far queries (distance" in out
    result = json.loads((mqar_run / "interventions" / "interventions.json").read_text())
    assert result["examples"] == 30 and result["positions"] == list(QUERY_POSITIONS)
    groups = result["mechanism_by_distance"]["groups"]
    assert groups["near"]["examples"] + groups["far"]["examples"] == 30
    # the restoration callback read queries too: 12 of them, from the first validation documents
    history = json.loads((mqar_run / "restoration_history.json").read_text())
    assert [h["step"] for h in history] == [5, 10]
    # the model card names MQAR's dataset and carries the near and far run's label
    card = (mqar_run / "README.md").read_text()
    assert "- mecheval/mqar\n" in card and result["mechanism"]["label"] in card
    # MQAR's layout: a blank token, many queries, no document-ending query
    assert "`<blank>`" in card and "query region" in card and "A document ends with the query" not in card


def test_the_evaluate_metric_takes_query_distances():
    metric = evaluate.load(interchange_restoration_path(), "mqar")
    p_clean, p_corrupt = [0.9, 0.8, 0.7, 0.9, 0.6], [0.1, 0.0, 0.1, 0.2, 0.1]
    p_patched = [0.9, 0.8, 0.1, 0.2, 0.1]            # restored near (distances 3, 5), not far (9, 12, 20)
    out = metric.compute(p_clean=p_clean, p_corrupt=p_corrupt, p_patched=p_patched, query_distance=[3, 5, 9, 12, 20],
                         n_resamples=50)
    assert out["by_distance"]["boundary"] == 9.0            # the median; 9 itself is near
    assert out["by_distance"]["near"]["examples"] == 3 and out["by_distance"]["far"]["examples"] == 2
    # near: (0.9 + 0.8 + 0.1) / 3 against clean 0.8 and corrupt 0.0667: (0.6 - 0.0667) / (0.8 - 0.0667)
    assert out["by_distance"]["near"]["restoration"] == pytest.approx((0.6 - 0.2 / 3) / (0.8 - 0.2 / 3))
    assert out["by_distance"]["far"]["restoration"] == pytest.approx(0.0)
    assert out["restoration"] == pytest.approx(summarize_restoration(p_clean, p_corrupt, p_patched)["restoration"])
    # the default configuration has no such input: refused, not read as if it were "mqar"'s
    with pytest.raises(ValueError, match="query_distance is an input of the 'mqar' configuration"):
        evaluate.load(interchange_restoration_path()).compute(p_clean=p_clean, p_corrupt=p_corrupt, p_patched=p_patched,
                                                              query_distance=[3, 5, 9, 12, 20], n_resamples=50)


def test_report_of_an_evaluated_mqar_run(mqar_run, tmp_path):
    if not (mqar_run / "interventions" / "interventions.json").exists():
        assert mecheval(["evaluate", str(mqar_run), "-n", "30", "--resamples", "20"]) == 0
    assert mecheval(["report", str(mqar_run), "--out", str(tmp_path / "report")]) == 0
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## MQAR" in report and "| mqar_cpu | mamba (conv 4) | 16 |" in report
    row = json.loads((tmp_path / "report" / "runs.json").read_text())[0]
    assert [(s["seq_len"], s["num_pairs"]) for s in row["test_by_setting"]] == [(16, 2), (32, 6)]
    assert set(row["by_distance"]) == {"near", "far"}
    assert "test_by_setting" not in (tmp_path / "report" / "runs.csv").read_text().splitlines()[0]
    for name in ("mqar_pairs.png", "mqar_length.png"):
        assert (tmp_path / "report" / name).read_bytes().startswith(b"\x89PNG")
    # ten steps answer nothing, so no restoration is measured near or far: no empty plane is drawn
    assert row["by_distance"]["near"]["@value"] is None and not (tmp_path / "report" / "mqar_near_far.png").exists()
