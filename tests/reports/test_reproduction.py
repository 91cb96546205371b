"""REPRODUCTION.md's tables come from the committed results/ JSON, and the generator is right."""
import json
import shutil
from pathlib import Path


from hf_mecheval.cli import main as mecheval
from hf_mecheval.reports.reproduction import check_document, claim_tables, load_results, update_document

REPO = Path(__file__).resolve().parents[2]


def test_committed_reproduction_tables_match_the_committed_results():
    tables = claim_tables(load_results(REPO / "results"))
    assert {"claim1", "claim2", "claim3", "claim4", "claim5", "claim6", "claim7", "claim8"} <= set(tables)
    assert check_document(REPO / "REPRODUCTION.md", tables) == []
    assert (REPO / "results" / "claims.md").exists()
    claims = (REPO / "results" / "claims.md").read_text()
    assert all(table in claims for table in tables.values())


def row(label, arch, acc, seed, task="ar_32", key=None, value=None, query=None, mechanism=None, **extra):
    return {"run": f"{label}_{seed}", "label": label, "architecture": arch, "hidden_size": 64, "layers": 2,
            "conv_kernel": None, "task": task, "learning_rate": 1e-3, "seed": seed, "validation_accuracy": acc,
            "test_accuracy": acc, "train_seconds": 60.0, "@key": key, "@value": value, "@query": query,
            "mechanism": mechanism, **extra}


def test_tables_are_means_and_sample_sds_over_seeds():
    ar = [row("transformer", "transformer", a, s, value=v, key=0.0, query=0.0, mechanism="induction")
          for s, (a, v) in enumerate([(1.0, 1.0), (0.9, 0.8), (0.8, 0.9)])]
    ar += [row("mamba (conv 4)", "mamba", 0.5, 0, mechanism="failed",
               component_scores={"layers.1.mixer.state@query": 0.75, "layers.1.mixer.state@key": 0.0,
                                 "layers.1.mixer.state@value": 0.25})]
    tables = claim_tables({"cpu_ar": ar})
    # accuracies .9 ± .1 (sample sd of 1, .9, .8), @value mean .9 sd .1
    assert "| transformer | 3 | 90.0 ± 10.0 | 90.0 ± 10.0 | 100.0, 90.0, 80.0 |" in tables["claim1"]
    assert "| transformer | 3 | 90.0 ± 10.0 | 0.00 ± 0.00 | 0.90 ± 0.10 | 0.00 ± 0.00 | induction ×3 |" in tables["claim2"]
    assert "| mamba (conv 4) | 1 | SSM state | 0.00 | 0.25 | 0.75 |" in tables["claim4"]
    assert "| cpu_ar | 4 | 4.0 |" in tables["compute"]
    assert "claim5" not in tables                                             # no ATR results given


def test_report_results_command_regenerates_and_checks(tmp_path, capsys):
    results = tmp_path / "results"
    shutil.copytree(REPO / "results", results, ignore=shutil.ignore_patterns("*.png"))
    doc = tmp_path / "DOC.md"
    doc.write_text("intro\n<!-- table:claim1 -->\nold\n<!-- /table:claim1 -->\nend\n")
    assert mecheval(["report", "--results", str(results), "--check", str(doc)]) == 1
    assert "claim1" in capsys.readouterr().err
    assert (results / "cpu_ar" / "accuracy.png").exists() and (results / "cpu_ar" / "mamba_inner_sites.png").exists()
    assert mecheval(["report", "--results", str(results), "--update", str(doc)]) == 0
    text = doc.read_text()
    assert text.startswith("intro\n") and text.endswith("end\n") and "old" not in text
    tables = claim_tables(load_results(results))
    assert check_document(doc, {"claim1": tables["claim1"]}) == []
    # a number changed in the JSON makes the document stale
    runs = json.loads((results / "cpu_ar" / "runs.json").read_text())
    runs[0]["test_accuracy"] = 0.123
    (results / "cpu_ar" / "runs.json").write_text(json.dumps(runs))
    assert check_document(doc, claim_tables(load_results(results))) != []
    assert mecheval(["report", "--results", str(tmp_path / "empty")]) == 2
    assert update_document(doc, {}) == []
