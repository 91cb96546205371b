"""A plug-in architecture from another package: found through its entry point, trained with
``mecheval train --architecture NAME`` and evaluated with ``mecheval evaluate`` without editing
hf-mecheval; its checkpoint names the plug-in where it is missing."""
import json
import os
import re
import subprocess
import sys

import pytest

from hf_mecheval.errors import ConfigError

from plugin_package import ARCHITECTURE, MODEL_TYPE, write_plugin


def mecheval(*args, pythonpath):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(pythonpath), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "hf_mecheval.cli", *map(str, args)], capture_output=True,
                          text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)


def test_train_and_evaluate_a_plugin_architecture_from_the_command_line(tmp_path):
    plugin = write_plugin(tmp_path / "site")
    run = tmp_path / "run"
    trained = mecheval("train", "--task", "ar_32", "--task_config", '{"num_kv":16,"num_pairs":2}',
                       "--architecture", ARCHITECTURE, "--hidden_size", "8", "--train_size", "64", "--eval_size", "16",
                       "--max_steps", "3", "--disable_tqdm", "true", "--output_dir", run, pythonpath=plugin)
    assert trained.returncode == 0, trained.stderr[-3000:]
    config = json.loads((run / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE and config["mecheval_plugin"] == "mecheval-cummean"
    assert "auto_map" not in config and not (run / "modeling_mecheval.py").exists()
    assert json.loads((run / "run.json").read_text())["model"]["architecture"] == ARCHITECTURE
    # its model card loads it through the plug-in, not through remote code, and its code runs
    card = (run / "README.md").read_text()
    assert "trust_remote_code" not in card and "custom_code" not in card and "`mecheval-cummean`" in card
    snippet = re.search(r"```python\n(.*?)```", card, re.S).group(1)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    loaded = subprocess.run([sys.executable, "-c", snippet + "\nprint(generate.model.config.model_type)"],
                            capture_output=True, text=True, env=env, timeout=600, stdin=subprocess.DEVNULL)
    assert loaded.returncode == 0 and loaded.stdout.split()[-1] == MODEL_TYPE, loaded.stderr[-3000:]
    evaluated = mecheval("evaluate", run, "-n", "8", pythonpath=plugin)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    grid = json.loads((run / "interventions" / "interventions.json").read_text())
    assert grid["examples"] == 8 and {"layers.0.input", "layers.1.input"} <= set(grid["sites"])
    for corruption in ("key", "value"):          # a cell for every site at every position
        cells = grid["corruptions"][corruption]["cells"]
        assert {(c["site"], c["position"]) for c in cells} == {(s, p) for s in grid["sites"] for p in grid["positions"]}

    # without the plug-in: one line that names it
    missing = mecheval("evaluate", run, "-n", "8", pythonpath=tmp_path / "empty")
    assert missing.returncode != 0
    assert "mecheval-cummean" in missing.stderr and "not installed" in missing.stderr, missing.stderr[-2000:]
    unknown = mecheval("train", "--architecture", ARCHITECTURE, "--output_dir", tmp_path / "x",
                       pythonpath=tmp_path / "empty")
    assert unknown.returncode != 0 and "unknown architecture 'cummean'" in unknown.stderr


def test_unknown_names_and_clashing_registrations_are_refused():
    from hf_mecheval import ArchitectureSpec, get_architecture, register_architecture
    from hf_mecheval.models import ARCHITECTURES, require_checkpoint_architecture

    with pytest.raises(ConfigError, match="unknown architecture 'rwkv'"):
        get_architecture("rwkv")
    mamba = ARCHITECTURES["mamba"]
    assert register_architecture(mamba) is mamba                          # the same spec again: nothing to do
    with pytest.raises(ConfigError) as info:
        register_architecture(ArchitectureSpec(name="mamba_again", config_class=mamba.config_class,
                                               mixers=mamba.mixers, class_stem="MambaAgain"))
    assert info.value.field == "config_class"
    with pytest.raises(ConfigError) as info:
        ArchitectureSpec(name="bad", config_class=mamba.config_class, mixers=mamba.mixers,
                         kernel_packages={"attention": ("x",)})
    assert info.value.field == "kernel_packages"
    assert require_checkpoint_architecture("/nonexistent") is None       # left to transformers
    # a config class named like one of transformers' would be taken for it (pipeline, from_config)
    named_like_theirs = type("MambaConfig", (mamba.config_class,), {"model_type": "mecheval-mamba-clash"})
    with pytest.raises(ConfigError, match="MambaConfig is the name of a transformers config class") as info:
        ArchitectureSpec(name="clash", config_class=named_like_theirs, mixers=mamba.mixers, class_stem="Clash")
    assert info.value.field == "config_class" and "clash" not in ARCHITECTURES
