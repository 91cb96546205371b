"""mecheval halve: a committed run's weights in float16, with what they reproduce."""
import json
import shutil
from pathlib import Path

from safetensors import safe_open

from hf_mecheval.cli import main as mecheval
from hf_mecheval.reports.weights import halve_weights, measured_test_accuracy, sha256

RUN = Path(__file__).resolve().parents[2] / "results/reference/ref_recipe_ar/runs/transformer_lr1e-03_s0_pos1024"


def test_halved_weights_reproduce_the_runs_test_accuracy(tmp_path, capsys):
    run = shutil.copytree(RUN, tmp_path / "run")
    recorded = json.loads((run / "metrics.json").read_text())["final"]["test_accuracy"]
    # read here as the Trainer read it at the run's end (one document of 1 024 at most apart: float sums)
    assert abs(measured_test_accuracy(run) - recorded) <= 1 / 1024
    before = (run / "model.safetensors").stat().st_size
    record = halve_weights(run)
    assert record["float32_sha256"] == sha256(RUN / "model.safetensors")
    assert record["float16_sha256"] == sha256(run / "model.safetensors")
    assert abs(record["float16_test_accuracy"] - recorded) <= 2 / 1024
    assert json.loads((run / "weights.json").read_text()) == record
    with safe_open(str(run / "model.safetensors"), framework="pt") as f:
        assert {str(f.get_tensor(k).dtype) for k in f.keys()} == {"torch.float16"}
    assert (run / "model.safetensors").stat().st_size < 0.55 * before
    # the halved run is still a run: evaluated, and never halved twice
    assert mecheval(["evaluate", str(run), "-n", "16", "--resamples", "10", "--overwrite"]) == 0
    capsys.readouterr()
    assert mecheval(["halve", str(run)]) == 2
    assert "already holds half-precision weights" in capsys.readouterr().err


def test_a_run_that_cannot_be_halved_keeps_its_float32_weights(tmp_path, capsys):
    run = shutil.copytree(RUN, tmp_path / "run")
    float32 = sha256(run / "model.safetensors")
    # a config the model cannot be built from: refused in one line, found before anything is replaced
    (run / "config.json").write_text(json.dumps({**json.loads((RUN / "config.json").read_text()), "hidden_size": -4}))
    assert mecheval(["halve", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "mecheval: error:" in err[0], err
    assert sha256(run / "model.safetensors") == float32 and not (run / "weights.json").exists()
    # a config that cannot be read is named as the run's own file, not the copy measured in
    (run / "config.json").write_text("{}")
    assert mecheval(["halve", str(run)]) == 2
    assert f'{run / "config.json"}: "model_type" is missing' in capsys.readouterr().err
    # weights that are not a safetensors file (a Git LFS pointer where the file should be)
    shutil.copyfile(RUN / "config.json", run / "config.json")
    (run / "model.safetensors").write_text("version https://git-lfs.github.com/spec/v1\noid sha256:0\nsize 1\n")
    assert mecheval(["halve", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a readable safetensors file" in err[0], err
    assert not (run / "weights.json").exists()
