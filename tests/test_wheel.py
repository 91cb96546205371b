"""The installed wheel stands alone: built from this tree, installed into a fresh virtual environment
(its dependencies taken from the current one), and used from a directory outside the clone."""
import json
import shlex
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = ["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--architecture", "mamba",
            "--hidden_size", "8", "--train_size", "64", "--eval_size", "16", "--max_steps", "2",
            "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true", "--report_to", "none"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(python of a fresh venv with the wheel installed, a working directory outside the clone)."""
    root = tmp_path_factory.mktemp("wheel")
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    source = root / "src"                        # a copy, so that building leaves nothing in the clone
    for name in files:
        path, copy = ROOT / name, source / name
        copy.parent.mkdir(parents=True, exist_ok=True)
        if path.is_symlink():
            copy.symlink_to(path.readlink())
        elif path.is_file():
            copy.write_bytes(path.read_bytes())
    pip = [sys.executable, "-m", "pip"]
    subprocess.run(pip + ["wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(root / "dist"), str(source)],
                   check=True, capture_output=True)
    wheel = next((root / "dist").glob("hf_mecheval-*.whl"))
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "venv")], check=True)
    python = root / "venv" / "bin" / "python"
    # the dependencies (torch, transformers, ...) as installed here, read from this environment's
    # site-packages as a plain path (its .pth files, e.g. an editable hf_mecheval, are not run)
    new_site = subprocess.run([str(python), "-c", "import site; print(site.getsitepackages()[0])"],
                              capture_output=True, text=True, check=True).stdout.strip()
    Path(new_site, "dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run(pip + ["--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)],
                   check=True, capture_output=True)
    work = root / "work"
    work.mkdir()
    return python, work


def run(installed, *args, check=True):
    python, work = installed
    env = {"PATH": f"{python.parent}:/usr/bin:/bin", "HOME": str(work), "HF_HUB_OFFLINE": "1",
           "HF_DATASETS_OFFLINE": "1", "HF_HOME": str(work / "hf"), "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(list(args), cwd=work, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check:
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_the_wheel_is_what_runs(installed):
    python, work = installed
    out = run(installed, str(python), "-c", "import hf_mecheval; print(hf_mecheval.__file__)").stdout
    assert str(python.parent.parent) in out and str(ROOT) not in out
    # the licence as an SPDX expression (core metadata 2.4), not the deprecated table form
    metadata = run(installed, str(python), "-c", "from importlib.metadata import metadata; "
                                                 "print(metadata('hf-mecheval')['License-Expression'])").stdout
    assert metadata.strip() == "Apache-2.0"


@pytest.mark.slow
def test_sweeps_by_name(installed):
    python, _ = installed
    # (ar_main works the same way; its 735 runs take minutes to check on a CPU)
    out = run(installed, str(python.parent / "mecheval"), "sweep", "reference/ar", "--dry-run").stdout
    assert out.splitlines()[-1] == "20 runs" and "transformer" in out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")
def test_the_wheel_ships_and_builds_the_compiled_scan(installed):
    python, work = installed
    code = ("from hf_mecheval.models import cpu_kernels; "
            "print(all(p.exists() for p in cpu_kernels.SOURCES), cpu_kernels.available())")
    assert run(installed, str(python), "-c", code).stdout.split() == ["True", "True"]
    assert list((work / ".cache" / "hf-mecheval" / "kernels").glob("cpu_kernels-*.so"))


@pytest.mark.slow
def test_the_restoration_metric_loads_with_evaluate(installed):
    python, _ = installed
    code = ("import evaluate, json; from hf_mecheval.metrics import interchange_restoration_path; "
            "m = evaluate.load(interchange_restoration_path()); "
            "print(json.dumps(m.compute(p_clean=[0.9, 0.7], p_corrupt=[0.1, 0.3], p_patched=[0.5, 0.5], n_resamples=10)))")
    assert json.loads(run(installed, str(python), "-c", code).stdout.splitlines()[-1])["restoration"] == pytest.approx(0.5)


@pytest.mark.slow
def test_training_by_module_and_accelerate_records_a_command_to_type_again(installed):
    python, work = installed
    run(installed, str(python), "-m", "hf_mecheval.training.run", *TINY_RUN, "--output_dir", "by_module")
    command = (work / "by_module" / "command.txt").read_text().strip()
    assert command.startswith("python -m hf_mecheval.training.run --task ar_32 ")
    # the run carries its code, its tokenizer and its generation config
    assert {"modeling_mecheval.py", "tokenizer.json", "generation_config.json"} <= {
        p.name for p in (work / "by_module").iterdir()}
    # typed again (with --overwrite, as the run directory is taken)
    words = shlex.split(command)
    run(installed, str(python), *words[1:], "--overwrite")

    run(installed, str(python), "-m", "accelerate.commands.launch", "--cpu", "--num_processes", "1",
        "-m", "hf_mecheval.training.run", *TINY_RUN, "--output_dir", "by_accelerate")
    command = (work / "by_accelerate" / "command.txt").read_text().strip()
    assert command.startswith("accelerate launch --num_processes 1 --cpu -m hf_mecheval.training.run --task ar_32 ")
    assert json.loads((work / "by_accelerate" / "metrics.json").read_text())["final"]["global_step"] == 2


@pytest.mark.slow
def test_dataset_scripts_run_from_anywhere(installed):
    python, work = installed
    run(installed, str(python), str(ROOT / "dataset_scripts" / "ar" / "materialize.py"), "--train-size", "16",
        "--eval-size", "4")
    code = ("import datasets; ds = datasets.load_dataset('data/ar', 'ar_32_gen', cache_dir='cache'); "
            "print(len(ds['train']), len(ds['test']))")
    assert run(installed, str(python), "-c", code).stdout.split()[-2:] == ["16", "4"]
