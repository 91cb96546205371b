"""Every file the commands read, damaged the ways a disk, an editor or a hostile user damages it:
truncated, of the wrong type, null, huge, and (YAML) an anchor bomb or a syntax error. Each is refused with exit 2
and one line naming the file, no traceback, and nothing written."""
import json
import shutil
from pathlib import Path

import pytest

from hf_mecheval.cli import main as mecheval
from hf_mecheval.training.run import main as train
from hostile_inputs import BOMB

TINY = ["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--architecture", "transformer",
        "--hidden_size", "16", "--max_position_embeddings", "16", "--train_size", "16", "--eval_size", "8",
        "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true"]


def variants(text: str, yaml: bool) -> dict[str, str]:
    out = {"truncated": text[: len(text) // 2], "wrong type": "[1, 2, 3]", "null": "null",
           "huge": "[" + "0, " * 300_000 + "0]", "empty": ""}
    if yaml:
        out["anchor bomb"] = BOMB
        out["syntax error"] = text + "\n{unclosed: [1, 2\n"      # an editor's half-saved line
    return out


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("file_probe") / "run"
    assert train([*TINY, "--output_dir", str(run)]) == 0
    assert mecheval(["evaluate", str(run), "-n", "8", "--resamples", "10"]) == 0
    return run


def files_below(folder: Path) -> set[str]:
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*")}


def refused(code: int, capsys, name: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (code, err[-3:])
    assert len(err) == 1 and name in err[0] and "Traceback" not in err[0], err[-3:]


RUN_FILES = ["run.json", "metrics.json", "config.json", "interventions/interventions.json"]


@pytest.mark.parametrize("name", RUN_FILES)
@pytest.mark.parametrize("variant", ["truncated", "wrong type", "null", "huge", "empty"])
def test_a_damaged_run_file_is_one_line_for_report_and_evaluate(run_dir, tmp_path, capsys, name, variant):
    run = shutil.copytree(run_dir, tmp_path / "run")
    path = run / name
    path.write_text(variants(path.read_text(), yaml=False)[variant])
    before = files_below(tmp_path)
    capsys.readouterr()
    if name != "config.json":          # the report reads run.json, metrics.json and the grid, not the model
        refused(mecheval(["report", str(run), "--out", str(tmp_path / "report")]), capsys, str(path))
    if name != "interventions/interventions.json":     # evaluate makes the grid again: it reads the others
        refused(mecheval(["evaluate", str(run), "-n", "8", "--out", str(tmp_path / "grid")]), capsys, str(path))
    assert files_below(tmp_path) == before


PLAIN = ["truncated", "wrong type", "null", "huge", "empty"]


@pytest.mark.parametrize("suffix, variant", [(".yaml", v) for v in [*PLAIN, "anchor bomb", "syntax error"]]
                         + [(".json", v) for v in PLAIN])      # JSON has no aliases
def test_a_damaged_run_config_is_one_line(tmp_path, capsys, suffix, variant):
    good = {"task": "ar_32", "hidden_size": 16, "max_steps": 1}
    text = json.dumps(good) if suffix == ".json" else "task: ar_32\nhidden_size: 16\nmax_steps: 1\n"
    path = tmp_path / f"run{suffix}"
    path.write_text(variants(text, yaml=suffix == ".yaml")[variant])
    refused(train([str(path), "--output_dir", str(tmp_path / "out")]), capsys, str(path))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variant", ["truncated", "wrong type", "null", "huge", "empty", "anchor bomb", "syntax error"])
def test_a_damaged_sweep_file_is_one_line(tmp_path, capsys, variant):
    text = "name: s\ntask: ar_32\ngrids:\n  - architecture: [transformer]\n    learning_rate: [0.001]\n"
    path = tmp_path / "s.yaml"
    path.write_text(variants(text, yaml=True)[variant])
    refused(mecheval(["sweep", str(path), "--out", str(tmp_path / "out"), "--dry-run"]), capsys, str(path))
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("variant", ["truncated", "wrong type", "null", "huge", "empty"])
def test_a_damaged_job_file_is_one_line(tmp_path, capsys, variant):
    text = json.dumps({"stack_dir": str(tmp_path / "stack"),
                       "runs": [{"name": "a", "output_dir": str(tmp_path / "a"), "args": {"task": "ar_32"}}]})
    path = tmp_path / "s.json"
    path.write_text(variants(text, yaml=False)[variant])
    code = train(["--job", str(path)])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "Traceback" not in err[0], err[-3:]
    assert not (tmp_path / "stack").exists() and not (tmp_path / "a").exists()
