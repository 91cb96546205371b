"""`mecheval evaluate` on damaged run directories and bad flags: one clear error line and exit 2,
found before the intervention grid runs."""
import json
import re
import shutil

import pytest

from hf_mecheval.cli import main as mecheval
from hf_mecheval.errors import MechEvalError
from hf_mecheval.tasks import build_task
from hf_mecheval.training.run import main as train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("bad_inputs") / "transformer"
    assert train(["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--architecture",
                  "transformer", "--hidden_size", "16", "--max_position_embeddings", "16", "--train_size", "16",
                  "--eval_size", "8", "--max_steps", "1", "--eval_strategy", "no", "--save_strategy", "no",
                  "--disable_tqdm", "true", "--output_dir", str(run)]) == 0
    return run


@pytest.fixture
def no_grid(monkeypatch):
    """Every bad input must be found before the grid, the slow part: reaching it fails the test."""
    def grid(*args, **kwargs):
        raise AssertionError("the intervention grid ran before the bad input was found")

    monkeypatch.setattr("hf_mecheval.interventions.run_grid", grid)


def copy_run(run_dir, tmp_path, name="copy"):
    return shutil.copytree(run_dir, tmp_path / name)


def edit_json(path, change):
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def one_error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mecheval"), err
    return err[0]


@pytest.mark.parametrize("damage", [lambda b: b[:20], lambda b: b""], ids=["truncated", "empty"])
def test_damaged_weights_are_named(run_dir, tmp_path, capsys, no_grid, damage):
    run = copy_run(run_dir, tmp_path)
    weights = run / "model.safetensors"
    weights.write_bytes(damage(weights.read_bytes()))
    assert mecheval(["evaluate", str(run), "-n", "8"]) == 2
    assert f"{weights} is damaged" in one_error(capsys)


def test_weights_missing_from_the_file_are_not_silently_random(run_dir, tmp_path, capsys, no_grid):
    from safetensors.torch import load_file, save_file

    run = copy_run(run_dir, tmp_path)
    weights = load_file(run / "model.safetensors")
    dropped = sorted(weights)[-1]
    del weights[dropped]
    save_file(weights, run / "model.safetensors", metadata={"format": "pt"})
    assert mecheval(["evaluate", str(run), "-n", "8"]) == 2
    line = one_error(capsys)
    assert "model.safetensors does not match" in line and f"{dropped} (missing)" in line


@pytest.mark.parametrize("name, change, message", [
    ("run.json", lambda d: d.pop("model"), '"model" is missing'),
    ("run.json", lambda d: d["task"].pop("preset"), '"task.preset" is missing'),
    ("run.json", lambda d: d["task"].update(preset="ar_99"), "unknown preset 'ar_99'"),
    ("metrics.json", lambda d: d.update(final={}), '"final.validation_accuracy" is missing'),
])
def test_bad_run_files_are_found_before_the_grid(run_dir, tmp_path, capsys, no_grid, name, change, message):
    run = copy_run(run_dir, tmp_path)
    edit_json(run / name, change)
    assert mecheval(["evaluate", str(run), "-n", "8"]) == 2
    line = one_error(capsys)
    assert str(run / name) in line and message in line


def test_run_json_that_is_not_json(run_dir, tmp_path, capsys, no_grid):
    run = copy_run(run_dir, tmp_path)
    (run / "run.json").write_text("{not json")
    assert mecheval(["evaluate", str(run), "-n", "8"]) == 2
    assert f"{run / 'run.json'} is not valid JSON" in one_error(capsys)


def test_a_task_that_does_not_match_the_model(run_dir, tmp_path, capsys, no_grid):
    """An ar_32 model (vocabulary 20) whose run.json says atr_easy (23): the ids would index past
    the embedding table."""
    run = copy_run(run_dir, tmp_path)
    edit_json(run / "run.json", lambda d: d["task"].update(preset="atr_easy",
                                                             config=build_task("atr_easy").config.to_dict()))
    assert mecheval(["evaluate", str(run), "-n", "8"]) == 2
    line = one_error(capsys)
    assert "atr_easy (vocabulary of 23 tokens)" in line and "vocab_size 20" in line


def test_documents_longer_than_the_position_embeddings(run_dir, tmp_path, capsys, no_grid):
    run = copy_run(run_dir, tmp_path)
    edit_json(run / "run.json", lambda d: d["task"]["config"].update(num_pairs=6))   # same vocabulary
    assert mecheval(["evaluate", str(run), "-n", "8"]) == 2
    assert "has 16 position embeddings but these test documents are up to" in one_error(capsys)


def test_a_file_is_not_a_run_directory(tmp_path, capsys):
    parquet = tmp_path / "x.parquet"
    parquet.write_bytes(b"PAR1")
    assert mecheval(["evaluate", str(parquet)]) == 2
    assert f"{parquet} is not a run directory" in one_error(capsys)


@pytest.mark.parametrize("out, message", [("file", "it is a file, not a folder"),
                                          ("file/below", "cannot write to")])
def test_output_location_is_checked_before_the_grid(run_dir, tmp_path, capsys, no_grid, out, message):
    (tmp_path / "file").write_text("precious")
    assert mecheval(["evaluate", str(run_dir), "-n", "8", "--out", str(tmp_path / out)]) == 2
    assert message in one_error(capsys)
    assert (tmp_path / "file").read_text() == "precious"


@pytest.mark.parametrize("flags, keyword, message", [(["-n", "0"], "n", "-n must be at least 1, got 0"),
                                                     (["--batch-size", "0"], "batch_size",
                                                      "--batch-size must be at least 1, got 0")])
def test_zero_documents_or_batch_size(run_dir, capsys, no_grid, flags, keyword, message):
    with pytest.raises(SystemExit) as info:        # refused by the command line's argument types
        mecheval(["evaluate", str(run_dir)] + flags)
    assert info.value.code == 2 and "expected a positive integer" in capsys.readouterr().err
    from hf_mecheval.reports.evaluate_run import evaluate_run

    with pytest.raises(MechEvalError, match=re.escape(message)):   # and by the function it calls
        evaluate_run(run_dir, **{keyword: 0}, progress=False)


@pytest.mark.parametrize("flags, message", [(["-n", str(10**12)], "resamples of 1,000,000,000,000 documents"),
                                            (["-n", "64", "--resamples", str(10**12)], "1,000,000,000,000 resamples"),
                                            (["-n", str(10**10), "--resamples", "0"], "10,000,000,000 documents of ar")])
def test_sizes_beyond_memory_are_refused_with_the_estimate(run_dir, capsys, no_grid, flags, message):
    assert mecheval(["evaluate", str(run_dir), *flags]) == 2
    line = one_error(capsys)
    assert message in line and "would need about" in line
    assert not (run_dir / "interventions").exists()


def test_run_grid_refuses_empty_data_and_zero_batches(run_dir):
    from hf_mecheval.interventions import run_grid
    from hf_mecheval.reports.evaluate_run import load_run

    model, task, _ = load_run(run_dir)
    with pytest.raises(MechEvalError, match="at least one document"):
        run_grid(model, task, task.generate(0, "test", 0), progress=False)
    with pytest.raises(MechEvalError, match="batch size must be at least 1"):
        run_grid(model, task, task.generate(4, "test", 0), batch_size=0, progress=False)


def test_a_grid_beyond_memory_is_one_clear_error(run_dir, tmp_path, capsys, monkeypatch):
    """One document whose activations (measured) do not fit in the memory free for the grid: exit
    2 with the estimate, not an OOM kill in the middle of the grid."""
    import torch

    from hf_mecheval.interventions.engine import engine_for
    from hf_mecheval.interventions.memory import TensorMemory
    from hf_mecheval.reports.evaluate_run import load_run

    model, task, _ = load_run(run_dir)
    data = task.generate(8, "test", 0)
    ids = torch.as_tensor(data.padded()[:1]).long()
    col = lambda c: torch.as_tensor(data.columns[c][:1]).long()
    engine = engine_for(model)
    with TensorMemory() as memory:
        engine.run(ids, ids, {"key": col("key_pos")}, col("query_pos"), col("answer"), engine.site_names())
    # a machine with as much memory as one document's cached activations and patched runs (of one
    # position name; the grid has five): the grid gets half of it. The other checks still pass.
    assert memory.peak > task.memory_estimate(8) + 8 * 4 * 10 * 8
    monkeypatch.setattr("hf_mecheval.resources.memory_limit", lambda: memory.peak)
    # the model's own size is checked first, against the same memory: at this size it is the grid
    # that must be refused, so that check is left out here (it has its own test)
    from transformers import AutoConfig

    monkeypatch.setattr("hf_mecheval.reports.evaluate_run._config_that_fits", AutoConfig.from_pretrained)
    out = tmp_path / "out"
    assert mecheval(["evaluate", str(run_dir), "-n", "8", "--resamples", "10", "--out", str(out)]) == 2
    line = one_error(capsys)
    assert "the intervention grid (" in line and "on one document would need about" in line, line
    assert "free for it" in line and "evaluate fewer sites" in line
    assert not (out / "interventions.json").exists()


def test_a_config_that_is_not_an_object_is_named(run_dir, tmp_path, capsys, no_grid):
    run = copy_run(run_dir, tmp_path)
    (run / "config.json").write_text("null")
    assert mecheval(["evaluate", str(run), "-n", "8"]) == 2
    assert "config.json: the top level should be an object, not null" in one_error(capsys)


def test_pickled_weights_alone_are_never_loaded(run_dir, tmp_path, capsys, no_grid):
    import torch
    from safetensors.torch import load_file

    run = copy_run(run_dir, tmp_path)
    torch.save(load_file(run / "model.safetensors"), run / "pytorch_model.bin")
    (run / "model.safetensors").unlink()
    assert mecheval(["evaluate", str(run), "-n", "8"]) == 2
    assert "is not a finished run: model.safetensors is missing" in one_error(capsys)


def test_a_model_too_large_for_memory_is_refused_before_it_is_built(run_dir, tmp_path, capsys, no_grid):
    run = copy_run(run_dir, tmp_path)
    edit_json(run / "config.json", lambda c: c.update(num_hidden_layers=10**7))
    assert mecheval(["evaluate", str(run), "-n", "8"]) == 2
    assert re.search(r"the model in .* \([\d,]+ parameters\) would need about", one_error(capsys))


def test_evaluate_out_never_replaces_a_persons_files_unasked(run_dir, tmp_path, capsys, no_grid):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "sites_key.png").write_bytes(b"my figure")
    assert mecheval(["evaluate", str(run_dir), "-n", "8", "--out", str(out)]) == 2
    assert "holds files hf-mecheval did not write there (sites_key.png)" in one_error(capsys)
    assert (out / "sites_key.png").read_bytes() == b"my figure"
