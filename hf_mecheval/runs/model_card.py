"""Model cards: a ``README.md`` with YAML metadata beside every saved model.

Metadata: library name (transformers: the model loads with ``AutoModelForCausalLM`` and
``trust_remote_code=True``, or without it once hf-mecheval is imported: a card pushed to the Hub
shows the first, a local run's card the second, which also loads a copy of the run without its
``*.py``, as the repository commits them; a plug-in's model once
the plug-in is registered; transformers' own models as they are), the text-generation pipeline
tag, tags, the task as dataset (its preset as the dataset's config; the task's own settings are in
the card's text, not in ``dataset.args``, which the Hub reads as ``load_dataset`` arguments), a
``model-index`` with the test and validation
accuracy and — once ``mecheval evaluate`` ran — the restoration scores at the last layer's input
on the grid's split and the mechanism label. A run that failed (it diverged) says so, and shows
no way to use its weights. ``mecheval push`` writes the Hub's card into a staged copy: the run's
own card stays local. The text comes from ``model_card_template.md`` beside this file.
"""
from __future__ import annotations

import fnmatch
import json
import os
import shutil
import tempfile
from pathlib import Path

from ..adapters.native_config import is_native
from ..atomic_files import is_temporary
from ..errors import ConfigError, MechEvalError
from .files import format_score, last_layer_summary
from .run_dir import RunDir, read_model_config
from .manifest import write_run_file

TEMPLATE = Path(__file__).with_name("model_card_template.md")
# what `mecheval push` uploads: the model with its code, generation config and tokenizer; the card; the run's records
HUB_FILES = ["config.json", "generation_config.json", "model.safetensors", "*.py", "tokenizer.json",
             "tokenizer_config.json", "special_tokens_map.json", "README.md", "run.json", "metrics.json",
             RunDir.HALF_WEIGHTS, "interventions/*"]


def write_model_card(run_dir: str | Path | RunDir, repo_id: str | None = None, dataset_repo: str | None = None) -> Path:
    """Write (or refresh) ``RUN_DIR/README.md``; returns its path. ``dataset_repo``: the dataset
    repository the card links for the task's documents (default ``mecheval/<ar|atr|mqar>``)."""
    from huggingface_hub import EvalResult, ModelCard, ModelCardData

    run = RunDir(run_dir)
    record, metrics = run.finished_run()
    final = metrics["final"]
    model, task = record["model"], record["task"]
    task_kind = _task_kind(task["preset"])
    dataset = dataset_repo or f"mecheval/{task_kind}"      # default: where dataset_scripts/ publish each kind
    common = dict(task_type="text-generation", task_name="in-context retrieval", dataset_type=dataset,
                  dataset_name=task["preset"], dataset_config=task["preset"])     # its config: in the card's text
    results = [EvalResult(metric_type="accuracy", metric_value=final["test_accuracy"], dataset_split="test",
                          metric_name="test accuracy", **common),
               EvalResult(metric_type="accuracy", metric_value=final["validation_accuracy"],
                          dataset_split="validation", metric_name="validation accuracy", **common)]
    failure = final.get("failed")
    mechanism = ("No intervention grid: its training failed." if failure else
                 "Not evaluated yet: run `mecheval evaluate` on the run directory.")
    extra = {}
    result = run.interventions()
    if result is not None:
        row = last_layer_summary(result)
        split = result.get("run", {}).get("split", "test")
        for p in ("key", "value", "query"):
            if row[f"@{p}"] is not None:
                results.append(EvalResult(metric_type="restoration", metric_value=round(row[f"@{p}"], 4) + 0.0,     # + 0.0: no -0.0
                                          dataset_split=split, metric_name=f"restoration @{p} (last layer input, "
                                                                           f"key corrupted)", **common))
        extra["mechanism"] = row["mechanism"]
        mechanism = (f"Key corrupted on {split} documents, residual stream patched at the input of the last layer: restoration "
                     f"@key {format_score(row['@key'])}, @value {format_score(row['@value'])}, @query {format_score(row['@query'])}. Label: "
                     f"**{row['mechanism']}** ({row['confidence']} confidence) — {row['reason']}.")
    name = repo_id or run.name
    loading, plugin_package = _loading(model.get("architecture") or "")
    data = ModelCardData(library_name="transformers", license="apache-2.0", model_name=name,
                         tags=["hf-mecheval", "mechanistic-interpretability",
                               *(["custom_code"] if loading == "remote_code" else []),
                               model.get("model_type", ""),
                               task["preset"]],
                         datasets=[dataset], metrics=["accuracy"], eval_results=results, pipeline_tag="text-generation",
                         **extra)
    card = ModelCard.from_template(
        data, template_str=TEMPLATE.read_text(), model_name=name, architecture=model.get("architecture"),
        model_type=model.get("model_type"), num_layers=model.get("num_hidden_layers"),
        hidden_size=model.get("hidden_size"), vocab_size=model.get("vocab_size"), task=task["preset"],
        task_config=json.dumps(task["config"]), train_size=task.get("train_size"), dataset_seed=task.get("dataset_seed"),
        learning_rate=record["training"].get("learning_rate"), epochs=_epochs(final.get("epochs")),
        seed=record["training"].get("seed"), validation_accuracy=f"{final['validation_accuracy']:.4f}",
        test_accuracy=f"{final['test_accuracy']:.4f}", mechanism_section=mechanism, repo_or_path=repo_id or shown_path(run.path),
        failure=failure, loading=loading, plugin_package=plugin_package, task_kind=task_kind, on_hub=repo_id is not None,
        halved=_halved(run.path), **_example(task))
    path = run.path / RunDir.CARD
    write_run_file(run.path, RunDir.CARD, str(card))
    return path


def shown_path(path: Path) -> str:
    """How a card names a local run: relative to the working directory when the run lies inside
    it (a committed run reads ``results/...``, usable from the repository's root, instead of one
    machine's absolute path), else as given."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _halved(run_dir: Path) -> str:
    """For weights stored in float16 (``mecheval halve`` writes weights.json), the test accuracy
    in float16 and in float32, as the card says it; else ""."""
    from ..inputs import FRACTION, read_json

    path = run_dir / RunDir.HALF_WEIGHTS
    if not path.is_file():
        return ""
    record = read_json(path, {"float16_test_accuracy": FRACTION, "float32_test_accuracy": FRACTION})
    return (f"{100 * record['float16_test_accuracy']:.2f} % in float16, "
            f"{100 * record['float32_test_accuracy']:.2f} % in float32 (the accuracy above)")


def _epochs(epochs: float | None) -> str:
    """16.0 -> "16"; a run stopped part-way (6.014075...) -> "6.01"."""
    return "?" if epochs is None else f"{epochs:.2f}".rstrip("0").rstrip(".")


def _loading(architecture: str) -> tuple[str, str]:
    """How the card loads the model, and the plug-in package where it is one: ("native", "") for
    transformers' own models (``hf:...``), ("plugin", package) for an architecture from another
    package (its checkpoint carries no code, ``complete_for_hub``), else ("remote_code", "")."""
    from ..models import get_architecture

    if is_native(architecture):
        return "native", ""
    try:
        spec = get_architecture(architecture)          # loads the plug-ins if it is not registered yet
    except ConfigError:
        spec = None
    if spec is not None and not spec.builtin:
        return "plugin", spec.package
    return "remote_code", ""


def _task_kind(preset: str) -> str:
    """ar, atr or mqar: the kind of task a preset is (a preset this version does not know: by its name)."""
    from ..tasks.presets import PRESETS

    if preset in PRESETS:
        return PRESETS[preset].task
    return "ar" if preset.startswith("ar") else "mqar" if preset.startswith("mqar") else "atr"


def _example(task_record: dict) -> dict:
    """The card's example: the shortest of a few test documents of the run's task, as text (with
    one answer per query: up to its first query), its right answer, and the tokens the card names."""
    from ..tasks.presets import get_preset, task_from_dict

    task = task_from_dict(get_preset(task_record["preset"]).task, task_record["config"])
    data = task.generate(8, "test", task_record.get("dataset_seed", 0)).per_query()
    doc = data.document(int(data.lengths.argmin()))
    names = task.token_names()
    vocabulary = ", ".join(f"`{prefix}0`… ({name}s)" for name, prefix in task.token_prefixes.items())
    # <pad>, <bos>, <eos> (and MQAR's <blank>); not the ids that pad the vocabulary to the reference's size
    special = [f"`{n}`" for n in names if n.startswith("<") and not n.startswith("<unused")]
    return {"vocabulary": vocabulary, "special_tokens": ", ".join(special),
            "example_prompt": " ".join(names[t] for t in doc["input_ids"][:doc["answer_pos"]]),
            "example_answer": names[doc["answer"]]}


def push_run(run_dir: str | Path, repo_id: str, private: bool = False, dataset_repo: str | None = None) -> str:
    """Upload a run directory's model, config and card as a model repository; the card links
    ``dataset_repo`` (see ``write_model_card``) as the task's documents."""
    from ..hub import check_repo_id, create_repo, upload_folder

    check_repo_id(repo_id)
    if dataset_repo is not None:
        check_repo_id(dataset_repo)
    run = RunDir(run_dir)
    run.require("config.json", "model.safetensors", RunDir.RECORD, RunDir.METRICS)
    failure = run.metrics()["final"].get("failed")
    if failure:         # a diverged run's weights hold NaN or infinity: nothing anyone could load and use
        raise MechEvalError(f"{run_dir} is a failed run ({failure}): its weights are not a model to push")
    read_checkpoint(run.path)         # refused here, naming the run's own files, before the Hub is reached
    # what the Hub gets (the code, the tokenizer, a card for the repository) is made in a copy:
    # the run's own folder keeps its local card, and a committed run stays as committed
    with tempfile.TemporaryDirectory(prefix="mecheval-push-") as tmp:
        stage = Path(tmp) / run.name
        copy_for_hub(run.path, stage)
        complete_for_hub(stage)
        write_model_card(stage, repo_id, dataset_repo)
        api = create_repo(repo_id, private=private, what=f"push {run_dir} to {repo_id}")
        upload_folder(api, stage, repo_id, allow_patterns=HUB_FILES)
    return f"https://huggingface.co/{repo_id}"


def copy_for_hub(run_dir: Path, stage: Path) -> None:
    """The files of ``run_dir`` that ``HUB_FILES`` names, temporaries left out, into ``stage``;
    the weights linked where the file system allows (nothing writes to them: the card and the
    code are new files, config.json is replaced, not written through)."""
    for path in sorted(run_dir.rglob("*")):
        relative = path.relative_to(run_dir).as_posix()
        if not path.is_file() or path.is_symlink() or any(is_temporary(part) for part in relative.split("/")) \
                or not any(fnmatch.fnmatch(relative, pattern) for pattern in HUB_FILES):
            continue
        target = stage / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        if relative != "model.safetensors" or not _linked(path, target):     # the others may be rewritten there
            shutil.copy2(path, target)


def _linked(source: Path, target: Path) -> bool:
    """Hard-link ``target`` to ``source``; False where the file systems do not allow it."""
    try:
        os.link(source, target)
    except OSError:
        return False
    return True


def read_checkpoint(run_dir: str | Path) -> tuple[dict, object]:
    """A finished run's run.json and model configuration, each refused in one line naming the
    file where it cannot be read."""
    from ..models import require_checkpoint_architecture

    record, _ = RunDir(run_dir).finished_run()
    require_checkpoint_architecture(run_dir)
    return record, read_model_config(run_dir)


def complete_for_hub(run_dir: str | Path) -> None:
    """What a checkpoint on the Hub needs besides the weights, for a run saved before hf-mecheval
    wrote it: the model's code with the ``auto_map`` in config.json (``save_remote_code``), and
    the tokenizer of the run's task."""
    from ..models import auto_map, save_remote_code
    from ..tasks.presets import get_preset, task_from_dict
    from ..tasks.tokenizer import build_tokenizer

    run_dir = Path(run_dir)
    record, config = read_checkpoint(run_dir)
    # transformers' own models (hf:...) need no code beside the weights, a plug-in's model needs
    # its package rather than remote code: only built-in architectures carry theirs (_loading)
    if _loading(record["model"].get("architecture") or "")[0] == "remote_code":
        if getattr(config, "auto_map", None) != auto_map(type(config)):
            config.auto_map = auto_map(type(config))
            config.save_pretrained(run_dir)
        save_remote_code(run_dir)
    if not (run_dir / "tokenizer.json").exists():
        task = task_from_dict(get_preset(record["task"]["preset"]).task, record["task"]["config"])
        build_tokenizer(task).save_pretrained(run_dir)

