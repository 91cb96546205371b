"""`mecheval evaluate RUN_DIR` and the RestorationCallback, on a small trained run."""
import json

import numpy as np
import pytest

from hf_mecheval.cli import main as mecheval
from hf_mecheval.interventions.grid import float32_list
from hf_mecheval.training.run import main as train

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("runs") / "mamba"
    assert train(["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--architecture", "mamba",
                  "--hidden_size", "16", "--train_size", "256", "--eval_size", "32", "--max_steps", "20",
                  "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true", "--output_dir", str(run),
                  "--restoration_every_n_steps", "10", "--restoration_examples", "16"]) == 0
    return run


def test_restoration_history_is_logged(run_dir):
    history = json.loads((run_dir / "restoration_history.json").read_text())
    assert [h["step"] for h in history] == [10, 20]
    assert set(history[0]) == {"step", "restoration_accuracy", "restoration@key", "restoration@value", "restoration@query"}
    state = json.loads((run_dir / "trainer_state.json").read_text())
    # logged through Trainer.log (scores that are None, nothing to restore, are left out)
    logged = [e for e in state["log_history"] if "restoration_accuracy" in e]
    assert [e["step"] for e in logged] == [10, 20]


def test_evaluate_writes_json_and_plots(run_dir, capsys, monkeypatch):
    assert mecheval(["evaluate", str(run_dir), "-n", "48", "--resamples", "50"]) == 0
    out = capsys.readouterr().out
    assert "@value" in out and "->" in out
    folder = run_dir / "interventions"
    result = json.loads((folder / "interventions.json").read_text())
    assert result["examples"] == 48 and set(result["corruptions"]) == {"key", "value"}
    assert "layers.1.mixer.state" in result["sites"] and result["run"]["architecture"] == "mamba"
    n_cells = len(result["sites"]) * len(result["positions"])
    assert len(result["corruptions"]["key"]["cells"]) == n_cells
    # per-example probabilities read back as float32 are the grid's own: their float32 mean is the one
    # the grid recorded
    for entry in result["corruptions"].values():
        for name in ("p_clean", "p_corrupt"):
            assert float(np.array(entry["per_example"][name], dtype=np.float32).mean()) == entry[f"{name}_mean"]
    # what the grid took, the part of a run's cost that training's clock does not see
    assert set(result["seconds"]) == {"wall", "cpu"} and all(result["seconds"][k] > 0 for k in ("wall", "cpu"))
    for name in ("residual_key.png", "residual_value.png", "sites_key.png", "sites_value.png",
                 "restoration_history.png"):
        data = (folder / name).read_bytes()
        assert data.startswith(PNG) and len(data) > 5000, name
    # never overwritten without being asked
    assert mecheval(["evaluate", str(run_dir), "-n", "8"]) == 2
    assert "already exists" in capsys.readouterr().err
    # the model card carries the label of the run's own grid ...
    card = (run_dir / "README.md").read_text()
    assert result["mechanism"]["label"] in card
    # ... and a grid written elsewhere (here on training documents) leaves the run directory alone
    # (named by a relative path: a card written again would name the run by that path)
    before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    other = run_dir.parent / "train_grid"
    monkeypatch.chdir(run_dir.parent)
    assert mecheval(["evaluate", run_dir.name, "-n", "16", "--resamples", "20", "--split", "train",
                     "--out", str(other)]) == 0
    assert (other / "interventions.json").exists()
    assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before
    # ... on training documents indeed: its first is the first of the run's training split
    from hf_mecheval.reports.evaluate_run import load_run

    grid = json.loads((other / "interventions.json").read_text())
    _, task, record = load_run(run_dir)
    assert grid["run"]["split"] == grid["settings"]["split"] == "train" and grid["examples"] == 16
    first = {split: task.generate(16, split, record["task"].get("dataset_seed", 0)).document(0) for split in ("train", "test")}
    names = task.token_names()
    shown = {split: " ".join(names[t] for t in doc["input_ids"][:doc["answer_pos"]]) for split, doc in first.items()}
    assert shown["train"] != shown["test"] and grid["run"]["example"].split(" -> ")[0] == shown["train"]


@pytest.mark.parametrize("make, message", [
    (lambda tmp: tmp / "missing", "does not exist"),
    (lambda tmp: tmp, "is not a finished run"),
])
def test_evaluate_errors(tmp_path, capsys, make, message):
    assert mecheval(["evaluate", str(make(tmp_path))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_unknown_site_lists_the_valid_ones(run_dir, tmp_path, capsys):
    assert mecheval(["evaluate", str(run_dir), "--out", str(tmp_path / "grid"), "--sites", "layers.0.attention"]) == 2
    assert "valid sites: layers.0.input" in capsys.readouterr().err
    assert not (tmp_path / "grid").exists()          # refused before its output folder was made


def test_per_example_values_are_written_short_and_read_back_exactly():
    tiny = np.finfo(np.float32).smallest_subnormal
    values = np.array([0.0, 1.0, 0.1, 1 / 3, tiny, np.nextafter(np.float32(1), np.float32(0)), 3.0e-38,
                       *np.random.default_rng(0).random(1000)], dtype=np.float32)
    written = json.dumps(float32_list(values))
    assert np.array_equal(np.array(json.loads(written), dtype=np.float32), values)
    # at most 9 significant digits (float32's round-trip bound), against 17 for the float64 repr
    assert len(written) < 0.7 * len(json.dumps(values.tolist()))
    assert json.loads(written)[:4] == [0.0, 1.0, 0.1, 0.33333334]
