"""A saved model carries its own code: it loads with trust_remote_code=True in a Python that
cannot import hf_mecheval, and computes what the package's model computes."""
import ast
import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers.dynamic_module_utils import get_imports

import hf_mecheval  # noqa: F401  (registers the Auto classes)
from hf_mecheval.models import ARCHITECTURES, MODEL_CLASSES, auto_map
from hf_mecheval.models.modeling_mecheval import remote_code_files

from test_models import ARCHS, tiny

# what the remote code may import besides its own files: the standard library and torch + transformers
ALLOWED = {"__future__", "contextlib", "dataclasses", "functools", "importlib", "math", "pathlib", "shutil", "torch", "transformers"}


def test_the_remote_code_is_self_contained():
    files = remote_code_files()
    folder = files[0].parent
    names = {f.stem for f in files}
    assert {"modeling_mecheval", "configuration_mecheval", "recurrent_cache", "mixers"} <= names
    # every built-in architecture's mixer files and config travel with the checkpoint
    assert {"registry", "builtin_architectures"} <= names
    # the compiled CPU scan stays out: a checkpoint carries Python files only, not its C++ source
    assert "cpu_kernels" not in names
    for spec in ARCHITECTURES.values():
        if spec.builtin:
            assert {c.__module__.rpartition(".")[2] for c in (spec.config_class, *spec.mixers.values())} <= names
    for f in files:
        assert f.parent == folder
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                # transformers finds (and copies) only `from .module import ...` in the same folder
                assert node.level == 1 and node.module in names, f"{f.name}: from {'.' * node.level}{node.module}"
        # the packages transformers requires before it runs the file (imports in try blocks are optional)
        assert set(get_imports(f)) <= ALLOWED, f"{f.name} needs {set(get_imports(f)) - ALLOWED}"


def test_save_pretrained_writes_the_code_and_auto_map(tmp_path):
    model = tiny("mamba")
    model.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["auto_map"] == auto_map(MODEL_CLASSES["mamba"][0]) == {
        "AutoConfig": "mixer_mamba.MechEvalMambaConfig",
        "AutoModel": "modeling_mecheval.MechEvalMambaModel",
        "AutoModelForCausalLM": "modeling_mecheval.MechEvalMambaForCausalLM"}
    for f in remote_code_files():
        assert (tmp_path / f.name).read_bytes() == f.read_bytes()


PROMPT = "<bos> k0 v1 k2 v3 <eos> k2"
LOADER = r"""
import importlib.util, json, os, sys
sys.path[1:1] = json.loads(sys.argv[1])            # site-packages, but not the .pth files that find hf_mecheval
assert importlib.util.find_spec("hf_mecheval") is None, "hf_mecheval is importable"
import torch
from transformers import AutoModel, AutoModelForCausalLM
results = {}
for folder in json.loads(sys.argv[2]):
    try:
        AutoModelForCausalLM.from_pretrained(folder)
        refused = ""
    except ValueError as exc:
        refused = str(exc)
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True).double().eval()
    base = AutoModel.from_pretrained(folder, trust_remote_code=True)
    ids = torch.load(folder + "/ids.pt")
    with torch.no_grad():
        logits = model(ids).logits
    generated = model.generate(ids, max_new_tokens=3, eos_token_id=None)
    torch.save({"logits": logits, "generated": generated}, folder + "/out.pt")
    results[folder] = {"refused": refused, "class": type(model).__name__, "base": type(base).__name__,
                       "module": type(model).__module__}
    if os.path.exists(folder + "/tokenizer.json"):         # text in, text out
        from transformers import pipeline
        generate = pipeline("text-generation", model=folder, trust_remote_code=True)
        results[folder]["text"] = generate(PROMPT, max_new_tokens=3)[0]["generated_text"]
assert not any(m.startswith("hf_mecheval") for m in sys.modules)
with open("results.json", "w") as f:
    json.dump(results, f)
"""


def test_a_python_without_hf_mecheval_loads_the_checkpoint_and_gets_the_same_logits(tmp_path):
    folders = []
    for arch in ARCHS:
        model = tiny(arch).double().eval()
        folder = tmp_path / arch
        model.save_pretrained(folder)
        ids = torch.randint(3, 11, (2, 9))
        torch.save(ids, folder / "ids.pt")
        folders.append((arch, folder, model, ids))
    # one checkpoint with the tokenizer of an AR task of its vocabulary (8 keys and values)
    from hf_mecheval.tasks import build_task
    from hf_mecheval.tasks.tokenizer import build_tokenizer

    build_tokenizer(build_task("ar_32", num_kv=8, num_pairs=2, vocab_size=11)).save_pretrained(tmp_path / "mamba")
    script = tmp_path / "load.py"
    script.write_text(LOADER.replace("PROMPT", repr(PROMPT)))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # -S: no site module, so no .pth file (an editable install of hf_mecheval is one) is processed
    proc = subprocess.run([sys.executable, "-S", str(script), json.dumps(site.getsitepackages()),
                           json.dumps([str(f) for _, f, _, _ in folders])],
                          capture_output=True, text=True, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    for arch, folder, model, ids in folders:
        result = results[str(folder)]
        assert result["class"] == MODEL_CLASSES[arch][2].__name__ and result["base"] == MODEL_CLASSES[arch][1].__name__
        assert result["module"].startswith("transformers_modules.")
        # without trust_remote_code: transformers asks for it (not "upgrade transformers")
        assert "trust_remote_code=True" in result["refused"] and "upgrade" not in result["refused"]
        out = torch.load(folder / "out.pt")
        with torch.no_grad():
            torch.testing.assert_close(out["logits"], model(ids).logits, rtol=0, atol=1e-12)
        assert torch.equal(out["generated"], model.generate(ids, max_new_tokens=3, eos_token_id=None))
    from transformers import pipeline

    here = pipeline("text-generation", model=str(tmp_path / "mamba"))
    assert results[str(tmp_path / "mamba")]["text"] == here(PROMPT, max_new_tokens=3)[0]["generated_text"]


@pytest.mark.parametrize("arch", ["deltanet"])
def test_the_package_loads_a_remote_code_checkpoint_with_its_own_classes(arch, tmp_path):
    tiny(arch).save_pretrained(tmp_path)
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path, trust_remote_code=True)
    assert type(loaded) is MODEL_CLASSES[arch][2]          # registered classes win over the copy


# In a Python without hf_mecheval: every documented way to load a run (pipeline, AutoTokenizer,
# AutoConfig, each with trust_remote_code=True) is read through the run's own config class, whose
# model_type is the checkpoint's. transformers warns "You are using a model of type
# `mecheval-mamba` to instantiate a model of type ``" only where it falls back to its bare
# PreTrainedConfig (model_type ""): AutoTokenizer without trust_remote_code, which must read
# config.json to learn the model type and may not run the code that defines it.
QUIET_LOADER = r"""
import importlib.util, json, logging, sys
sys.path[1:1] = json.loads(sys.argv[1])
assert importlib.util.find_spec("hf_mecheval") is None, "hf_mecheval is importable"
from transformers import AutoConfig, AutoTokenizer, pipeline
from transformers.utils import logging as hf_logging

folder, step, seen = sys.argv[2], None, {}

class Capture(logging.Handler):                   # every record of transformers' loggers, by step
    def emit(self, record):
        seen.setdefault(step, []).append(record.getMessage())

hf_logging.get_logger().addHandler(Capture(level=logging.DEBUG))
step = "probe"       # the capture sees the logger the warning comes from
hf_logging.get_logger("transformers.configuration_utils").warning("probe")
step = "pipeline"
generate = pipeline("text-generation", model=folder, trust_remote_code=True)
text = generate(sys.argv[3], max_new_tokens=1)[0]["generated_text"]
step = "tokenizer"
AutoTokenizer.from_pretrained(folder, trust_remote_code=True)
step = "config"
model_type = AutoConfig.from_pretrained(folder, trust_remote_code=True).model_type
step = "tokenizer without trust_remote_code"
AutoTokenizer.from_pretrained(folder)
with open("quiet.json", "w") as f:
    json.dump({"seen": seen, "model_type": model_type, "text": text}, f)
"""


def test_loading_a_run_as_remote_code_does_not_warn_about_its_model_type(tmp_path):
    from hf_mecheval.tasks import build_task
    from hf_mecheval.tasks.tokenizer import build_tokenizer

    folder = tmp_path / "mamba"
    tiny("mamba").save_pretrained(folder)
    build_tokenizer(build_task("ar_32", num_kv=8, num_pairs=2, vocab_size=11)).save_pretrained(folder)
    script = tmp_path / "quiet.py"
    script.write_text(QUIET_LOADER)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "TRANSFORMERS_VERBOSITY")}
    proc = subprocess.run([sys.executable, "-S", str(script), json.dumps(site.getsitepackages()), str(folder),
                           PROMPT], capture_output=True, text=True, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads((tmp_path / "quiet.json").read_text())
    assert out["model_type"] == "mecheval-mamba" and out["text"].startswith(PROMPT)
    seen = out["seen"]
    assert seen["probe"] == ["probe"]
    wrong_type = "to instantiate a model of type"
    for step in ("pipeline", "tokenizer", "config"):
        assert not [m for m in seen.get(step, []) if wrong_type in m], (step, seen.get(step))
    # the same capture sees the warning where transformers does emit it (hence the docs' advice to
    # pass trust_remote_code=True to AutoTokenizer too)
    untrusted = [m for m in seen["tokenizer without trust_remote_code"] if wrong_type in m]
    assert untrusted and "`mecheval-mamba` to instantiate a model of type ``" in untrusted[0]


# The whole path a Hub user takes with only torch and transformers: load -> generate -> fine-tune
# with Trainer (checkpoints included) -> save_pretrained -> load again -> the same logits.
HUB_USER = r"""
import importlib.util, json, sys
sys.path[1:1] = json.loads(sys.argv[1])
assert importlib.util.find_spec("hf_mecheval") is None, "hf_mecheval is importable"
import torch
from transformers import AutoConfig, AutoModelForCausalLM, Trainer, TrainingArguments

results = {}
for folder in json.loads(sys.argv[2]):
    model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    # a config of its own name: from_config builds this model, not transformers' namesake
    built = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder, trust_remote_code=True),
                                             trust_remote_code=True)
    ids = torch.load(folder + "/ids.pt")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    answer = model.generate(ids)                                         # the checkpoint's own generation config
    with torch.no_grad():
        greedy = model(ids).logits[:, -1].argmax(-1)
    labels = torch.full_like(ids, -100)
    labels[:, -1] = ids[:, -1]
    docs = [{"input_ids": i, "labels": l} for i, l in zip(ids, labels)]
    args = TrainingArguments(output_dir=folder + "-ft", max_steps=2, per_device_train_batch_size=2,
                             learning_rate=1e-2, save_steps=1, report_to="none", use_cpu=True, disable_tqdm=True)
    Trainer(model=model, args=args, train_dataset=docs).train()
    changed = any(not torch.equal(before[k], v) for k, v in model.state_dict().items())
    model.save_pretrained(folder + "-saved")
    again = AutoModelForCausalLM.from_pretrained(folder + "-saved", trust_remote_code=True)
    checkpoint = AutoModelForCausalLM.from_pretrained(folder + "-ft/checkpoint-2", trust_remote_code=True)
    model.eval()
    with torch.no_grad():
        logits = model(ids).logits
        same = torch.equal(logits, again.eval()(ids).logits) and torch.equal(logits, checkpoint.eval()(ids).logits)
    torch.save(logits, folder + "-saved/logits.pt")
    results[folder] = {"answer": answer[:, -1].tolist(), "greedy": greedy.tolist(),
                       "new_tokens": answer.shape[1] - ids.shape[1],
                       "changed": changed, "same": same, "from_config": type(built).__name__}
with open("hub_user.json", "w") as f:
    json.dump(results, f)
"""


def test_a_hub_user_fine_tunes_saves_and_reloads_without_hf_mecheval(tmp_path):
    from transformers import AutoModelForCausalLM

    folders = {}
    for arch in ARCHS:
        folder = tmp_path / arch
        tiny(arch).save_pretrained(folder)
        torch.save(torch.randint(3, 11, (4, 9), generator=torch.Generator().manual_seed(1)), folder / "ids.pt")
        folders[arch] = folder
    script = tmp_path / "hub_user.py"
    script.write_text(HUB_USER)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-S", str(script), json.dumps(site.getsitepackages()),
                           json.dumps([str(f) for f in folders.values()])],
                          capture_output=True, text=True, cwd=tmp_path, env=env, stdin=subprocess.DEVNULL)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "hub_user.json").read_text())
    for arch, folder in folders.items():
        result = results[str(folder)]
        ids = torch.load(folder / "ids.pt")
        # one token, the argmax of its own logits (compared within the process: this package's
        # Mamba may run the compiled scan, whose float rounding can flip a near-tie)
        assert result["new_tokens"] == 1 and result["answer"] == result["greedy"]
        assert result["from_config"] == MODEL_CLASSES[arch][2].__name__
        assert result["changed"] and result["same"], (arch, result)
        # what the user saved is a checkpoint like ours: code, auto_map, and the package reads it too
        saved = Path(f"{folder}-saved")
        config = json.loads((saved / "config.json").read_text())
        assert config["auto_map"] == auto_map(MODEL_CLASSES[arch][0])
        assert {f.name for f in remote_code_files()} <= {p.name for p in saved.glob("*.py")}
        reloaded = AutoModelForCausalLM.from_pretrained(saved)
        assert type(reloaded) is MODEL_CLASSES[arch][2]
        with torch.no_grad():      # (the package's Mamba scan may be the compiled one: float32 rounding apart)
            torch.testing.assert_close(reloaded.eval()(ids).logits, torch.load(saved / "logits.pt"), rtol=1e-4, atol=1e-5)
