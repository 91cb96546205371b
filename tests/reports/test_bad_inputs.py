"""`mecheval report` and `mecheval push` on damaged run and results folders, and push's Hub errors:
one clear line naming the file (or the repository) and exit 2, never a traceback."""
import json
import shutil
import socket

import pytest

from hf_mecheval.cli import main as mecheval
from hf_mecheval.training.run import main as train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("bad_inputs") / "transformer"
    assert train(["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--architecture",
                  "transformer", "--hidden_size", "16", "--train_size", "16", "--eval_size", "8", "--max_steps", "1",
                  "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true",
                  "--output_dir", str(run)]) == 0
    return run


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mecheval"), err
    return err[0]


CELL = ('{"corruptions": {"key": {"clean_accuracy": 1, "cells": [{"site": "layers.0.input", "layer": %s, '
        '"position": "key", "restoration": 0.5, "restoration_ci": null}]}}, '
        '"mechanism": {"label": "failed", "confidence": "high", "reason": "r"}}')


def without_model(text: str) -> str:
    record = json.loads(text)
    del record["model"]
    return json.dumps(record)


@pytest.mark.parametrize("name, content, message", [
    ("run.json", without_model, '"model" is missing'),
    ("run.json", lambda text: text.replace('"hidden_size": 16', '"hidden_size": "16"'),
     '"model.hidden_size" should be an integer, not a string'),
    ("run.json", lambda text: text.replace('"learning_rate": 0.001', '"learning_rate": "fast"'),
     '"training.learning_rate" should be a number, not a string'),
    ("run.json", lambda text: text.replace('"architecture": "transformer"', '"architecture": 3'),
     '"model.architecture" should be a string, not an integer'),
    ("metrics.json", '{"final": {}}', '"final.validation_accuracy" is missing'),
    ("metrics.json", "[1]", "the top level should be an object, not an array"),
    ("metrics.json", '{"final": {"validation_accuracy": "high", "test_accuracy": 1}}',
     '"final.validation_accuracy" should be a number from 0 to 1, not a string'),
    ("metrics.json", '{"final": {"validation_accuracy": 0.5, "test_accuracy": 1e308}}',
     '"final.test_accuracy" should be a number from 0 to 1, not 1e+308'),
    ("metrics.json", '{"final": {"validation_accuracy": true, "test_accuracy": 0.5}}',
     '"final.validation_accuracy" should be a number from 0 to 1, not true/false'),
    ("interventions/interventions.json", "garbage", "is not valid JSON"),
    ("interventions/interventions.json", "{}", '"corruptions" is missing'),
    ("interventions/interventions.json", '{"corruptions": {"key": {"clean_accuracy": 1, "cells": []}}}',
     '"corruptions.key.cells" should be a non-empty array, not an empty array'),
    # a layer index no model has (the report looped up to it) or not the one its site names
    ("interventions/interventions.json", CELL % "-5", "a key-corrupted cell has layer -5 for site 'layers.0.input'"),
    ("interventions/interventions.json", CELL % "1000000000", "a key-corrupted cell has layer 1000000000"),
    ("interventions/interventions.json", CELL % "1", "a key-corrupted cell has layer 1 for site 'layers.0.input'"),
])
def test_report_names_the_bad_file(run_dir, tmp_path, capsys, name, content, message):
    run = shutil.copytree(run_dir, tmp_path / "run")
    path = run / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(content(path.read_text()) if callable(content) else content)
    assert mecheval(["report", str(run), "--out", str(tmp_path / "report")]) == 2
    line = one_error(capsys)
    assert f"{path}" in line and message in line


def test_push_checks_the_run_before_the_hub(run_dir, tmp_path, capsys):
    run = shutil.copytree(run_dir, tmp_path / "run")
    (run / "run.json").write_text(without_model((run / "run.json").read_text()))
    assert mecheval(["push", str(run), "me/repo"]) == 2
    assert f'{run / "run.json"}: "model" is missing' in one_error(capsys)


@pytest.mark.parametrize("config, message", [("{}", '"model_type" is missing'),
                                             ('{"model_type": "no_such_model"}', "cannot read the model configuration")])
def test_push_refuses_a_config_it_cannot_read_before_the_hub(run_dir, tmp_path, capsys, config, message):
    run = shutil.copytree(run_dir, tmp_path / "run")
    (run / "config.json").write_text(config)
    assert mecheval(["push", str(run), "me/repo"]) == 2
    assert message in one_error(capsys)


def test_push_refuses_a_bad_repository_name(run_dir, capsys):
    assert mecheval(["push", str(run_dir), "bad repo name!!"]) == 2
    assert "bad repository name 'bad repo name!!'" in one_error(capsys)


def test_push_without_a_connection(run_dir, capsys, monkeypatch):
    """A refused connection (a closed port on this machine stands in for no network)."""
    import huggingface_hub.constants

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]          # free, and closed once the socket is
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", f"http://127.0.0.1:{port}")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    assert mecheval(["push", str(run_dir), "me/repo"]) == 2
    assert f"cannot push {run_dir} to me/repo" in one_error(capsys)


def test_push_offline(run_dir, capsys, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    assert mecheval(["push", str(run_dir), "me/repo"]) == 2
    assert "offline" in one_error(capsys)
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before      # no Hub card written locally


@pytest.mark.parametrize("content, message", [
    ("garbage", "is not valid JSON"),
    ("{}", "the top level should be a non-empty array, not an object"),
    ('[{"x": 1}]', '"[0].label" is missing'),
    ('[{"label": "m", "architecture": "mamba", "task": "ar_32", "hidden_size": "64", "layers": 2, "conv_kernel": 4,'
     ' "validation_accuracy": 1, "test_accuracy": 1}]', '"[0].hidden_size" should be an integer, not a string'),
])
def test_results_runs_json_is_checked(tmp_path, capsys, content, message):
    path = tmp_path / "cpu_ar" / "runs.json"
    path.parent.mkdir()
    path.write_text(content)
    assert mecheval(["report", "--results", str(tmp_path)]) == 2
    line = one_error(capsys)
    assert str(path) in line and message in line


def test_shape_problem_messages():
    from hf_mecheval.inputs import NUMBER, OPTIONAL_NUMBER, shape_problem

    shape = {"a": {"b": NUMBER}, "c": [{"d": str}], "e": OPTIONAL_NUMBER}
    assert shape_problem({"a": {"b": 1.5}, "c": [{"d": "x"}], "e": None}, shape) is None
    assert shape_problem({"a": {"b": 1}, "c": [{"d": "x"}, {}], "e": 1}, shape) == '"c[1].d" is missing'
    assert shape_problem({"a": {"b": None}}, shape) == '"a.b" should be a number, not null'
    assert shape_problem({"a": {"b": 1}, "c": [{"d": "x"}], "e": "x"}, shape) == \
        '"e" should be a number or null, not a string'
    assert shape_problem(3, object) is None


def test_report_out_never_replaces_a_persons_files_unasked(run_dir, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    assert mecheval(["report", str(run_dir), "--out", str(out)]) == 2
    assert "holds files hf-mecheval did not write there (report.md)" in one_error(capsys)
    assert (out / "report.md").read_text() == "my notes"
    assert mecheval(["report", str(run_dir), "--out", str(out), "--overwrite"]) == 0
    # a folder the report wrote is its own: written again without asking
    assert mecheval(["report", str(run_dir), "--out", str(tmp_path / "fresh")]) == 0
    assert mecheval(["report", str(run_dir), "--out", str(tmp_path / "fresh")]) == 0
