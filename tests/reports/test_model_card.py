"""Model cards beside saved models, and pushing a run (against a local folder standing in for the Hub)."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import ModelCard

from hf_mecheval.errors import MechEvalError
from hf_mecheval.runs import model_card
from hf_mecheval.training.run import main as train


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run = tmp_path_factory.mktemp("cards") / "h3"
    assert train(["--task", "atr_easy", "--architecture", "h3", "--hidden_size", "8", "--model_config",
                  '{"d_state": 8}', "--train_size", "64", "--eval_size", "16", "--max_steps", "4",
                  "--eval_strategy", "no", "--save_strategy", "no", "--disable_tqdm", "true",
                  "--output_dir", str(run)]) == 0
    return run


def test_card_is_written_after_training(run_dir):
    card = ModelCard.load(run_dir / "README.md")
    final = json.loads((run_dir / "metrics.json").read_text())["final"]
    assert card.data.library_name == "transformers" and "mecheval-h3" in card.data.tags
    assert card.data.pipeline_tag == "text-generation" and "custom_code" in card.data.tags
    # a local run's card loads through hf-mecheval (a copy without the model's *.py loads too);
    # the Hub's copy carries the code and its card passes trust_remote_code (test_push_run...)
    assert 'pipeline("text-generation"' in card.text and "import hf_mecheval" in card.text
    assert f'model="{run_dir}")' in card.text
    assert "<bos> t" in card.text                   # an example document as text
    assert "`<pad>`, `<bos>`, `<eos>` and `t0`… (terminals)" in card.text and "A document ends with the query" in card.text
    assert "pypi.org" not in card.text and "pip install hf-mecheval" not in card.text      # not published there
    results = card.data.eval_results
    test = next(r for r in results if r.dataset_split == "test" and r.metric_type == "accuracy")
    assert test.metric_value == final["test_accuracy"] and test.dataset_config == "atr_easy"
    assert "Not evaluated yet" in card.text


def _quoted_restoration(card) -> dict:
    """{position: value} of the card's restoration entries ("restoration @value (last layer ...)")."""
    return {r.metric_name.split()[1].lstrip("@"): r.metric_value
            for r in card.data.eval_results if r.metric_type == "restoration"}


def test_card_gains_restoration_after_evaluate(run_dir, tmp_path, monkeypatch):
    from hf_mecheval.reports.evaluate_run import evaluate_run

    result = evaluate_run(run_dir, n=16, n_resamples=20, progress=False, overwrite=True)
    card = ModelCard.load(run_dir / "README.md")
    assert card.data.to_dict()["mechanism"] == result["mechanism"]["label"]
    # the card quotes the key-corruption cells at the last layer's input as the grid holds them,
    # leaving out those without a restoration (a denominator too small to divide by)
    cells = result["corruptions"]["key"]["cells"]
    last = f"layers.{max(c['layer'] for c in cells)}.input"
    assert _quoted_restoration(card) == {c["position"]: round(c["restoration"], 4) for c in cells
                                         if c["site"] == last and c["restoration"] is not None}
    # this 4-step model hardly moves its answer when the key is corrupted (no restoration to
    # quote), so a grid with one is stood in for: each number is quoted to 4 places, a missing one left out
    summary = {"@key": 0.123456, "@value": 0.87654321, "@query": None, "mechanism": "induction",
               "confidence": "high", "reason": "restored at the value"}
    monkeypatch.setattr(model_card, "last_layer_summary", lambda result: summary)
    copy = shutil.copytree(run_dir, tmp_path / "copy")
    model_card.write_model_card(copy)
    card = ModelCard.load(copy / "README.md")
    assert _quoted_restoration(card) == {"key": 0.1235, "value": 0.8765}
    assert card.data.to_dict()["mechanism"] == "induction" and "Label: **induction** (high confidence)" in card.text


def test_push_run_uploads_to_the_hub_api(run_dir, tmp_path, monkeypatch):
    """The Hub is replaced by a local folder: create_repo/upload_folder copy files there."""
    hub = tmp_path / "hub"

    class LocalHub:
        def create_repo(self, repo_id, repo_type="model", private=False, exist_ok=False):
            (hub / repo_id).mkdir(parents=True, exist_ok=exist_ok)

        def upload_folder(self, folder_path, repo_id, repo_type, allow_patterns, ignore_patterns):
            import fnmatch
            for path in Path(folder_path).rglob("*"):
                rel = str(path.relative_to(folder_path))
                if path.is_file() and any(fnmatch.fnmatch(rel, p) for p in allow_patterns) \
                        and not any(fnmatch.fnmatch(rel, p) for p in ignore_patterns):
                    (hub / repo_id / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy(path, hub / repo_id / rel)

    monkeypatch.setattr("huggingface_hub.HfApi", LocalHub)
    from hf_mecheval.cli import main as mecheval

    # temporaries that killed writers left (an atomic write's, a staged folder's) are never uploaded
    run = shutil.copytree(run_dir, tmp_path / "run")
    (run / ".metrics.json.a1b2c3d4.tmp").write_text("{")
    (run / "interventions").mkdir(exist_ok=True)
    (run / "interventions" / ".interventions.json.0f0f0f0f.tmp").write_text("[")
    assert mecheval(["push", str(run), "mecheval/h3-atr-easy"]) == 0
    pushed = hub / "mecheval" / "h3-atr-easy"
    assert not [p for p in pushed.rglob("*.tmp")]
    assert {"config.json", "model.safetensors", "README.md"} <= {p.name for p in pushed.iterdir()}
    # the card links the task's dataset repository: the project's by default, or the one given
    assert ModelCard.load(pushed / "README.md").data.datasets == ["mecheval/atr"]
    assert mecheval(["push", str(run), "mecheval/h3-atr-easy", "--dataset", "you/atr-documents"]) == 0
    card = ModelCard.load(pushed / "README.md")
    assert card.data.datasets == ["you/atr-documents"]
    assert {r.dataset_type for r in card.data.eval_results} == {"you/atr-documents"}
    # a bad dataset name is refused before the Hub is reached
    with pytest.raises(MechEvalError, match="bad repository name 'you/atr documents'"):
        model_card.push_run(run, "mecheval/never-made", dataset_repo="you/atr documents")
    assert not (hub / "mecheval" / "never-made").exists()
    # a run saved before runs carried their code and tokenizer: push adds them
    old = tmp_path / "old"
    shutil.copytree(run_dir, old)
    for path in list(old.glob("*.py")) + list(old.glob("tokenizer*")):
        path.unlink()
    config = json.loads((old / "config.json").read_text())
    del config["auto_map"]
    (old / "config.json").write_text(json.dumps(config))
    before = {p: p.read_bytes() for p in old.rglob("*") if p.is_file()}
    assert mecheval(["push", str(old), "mecheval/h3-atr-easy"]) == 0
    # the Hub's copy was completed and carded in a stage: the run folder is as it was
    assert {p: p.read_bytes() for p in old.rglob("*") if p.is_file()} == before
    assert {"config.json", "generation_config.json", "model.safetensors", "README.md", "modeling_mecheval.py",
            "mixer_h3.py", "tokenizer.json"} <= {p.name for p in pushed.iterdir()}
    assert "auto_map" in json.loads((pushed / "config.json").read_text())
    assert 'pipeline("text-generation", model="mecheval/h3-atr-easy", trust_remote_code=True)' in \
        (pushed / "README.md").read_text()
    from transformers import AutoModelForCausalLM, pipeline

    assert AutoModelForCausalLM.from_pretrained(pushed).config.model_type == "mecheval-h3"
    # text in, text out, as the model card shows it
    out = pipeline("text-generation", model=str(pushed))("<bos> t3 t5 t3 <eos> t5")[0]["generated_text"]
    assert out.startswith("<bos> t3 t5 t3 <eos> t5 ") and len(out.split()) == 7      # one answer token


def test_a_failed_run_says_so_and_a_grid_on_another_split_is_labelled_with_it(run_dir, tmp_path, monkeypatch):
    from hf_mecheval.reports.evaluate_run import evaluate_run

    failed = shutil.copytree(run_dir, tmp_path / "failed", ignore=shutil.ignore_patterns("interventions"))
    metrics = json.loads((failed / "metrics.json").read_text())
    metrics["final"]["failed"] = "it diverged: its weights held NaN or infinity at step 3, where it stopped"
    (failed / "metrics.json").write_text(json.dumps(metrics))
    model_card.write_model_card(failed)
    text = ModelCard.load(failed / "README.md").text
    assert ("**Training failed:** it diverged: its weights held NaN or infinity at step 3, where it stopped; "
            "the weights are those of its last step\n") in text           # said once
    assert "Not evaluated yet" not in text and "mecheval evaluate RUN_DIR" not in text    # no grid to make
    with pytest.raises(MechEvalError, match="is a failed run .*it diverged.*not a model to push"):
        model_card.push_run(failed, "mecheval/diverged")       # refused before anything reaches the Hub

    validation = shutil.copytree(run_dir, tmp_path / "validation", ignore=shutil.ignore_patterns("interventions"))
    evaluate_run(validation, n=16, split="validation", n_resamples=20, progress=False)
    # the tiny model's key hardly moves its logits (no restoration to quote): the card is written
    # again with the grid's summary standing in for a model that has one
    summary = {"@key": 0.0, "@value": 1.0, "@query": 0.0, "mechanism": "induction", "confidence": "high",
               "reason": "restored at the value"}
    monkeypatch.setattr(model_card, "last_layer_summary", lambda result: summary)
    model_card.write_model_card(validation)
    card = ModelCard.load(validation / "README.md")
    restoration = [r for r in card.data.eval_results if r.metric_type == "restoration"]
    assert restoration and {r.dataset_split for r in restoration} == {"validation"}
    assert "Key corrupted on validation documents" in card.text and "**Training failed:**" not in card.text


def test_a_local_cards_examples_run_on_a_copy_of_the_run_without_its_code(run_dir, tmp_path, monkeypatch):
    """A repository commits its runs without the model's *.py: the card's two examples, run as
    written from the folder the card names the run from, still load it and answer one token."""
    import re

    copy = shutil.copytree(run_dir, tmp_path / "repo" / "results" / "h3", ignore=shutil.ignore_patterns("*.py"))
    monkeypatch.chdir(tmp_path / "repo")
    model_card.write_model_card(copy)
    blocks = re.findall(r"```python\n(.*?)```", (copy / "README.md").read_text(), re.S)
    assert len(blocks) == 2 and 'model="results/h3"' in blocks[0]
    assert not list(copy.glob("*.py"))

    def run(code: str) -> str:
        """``code`` in a fresh interpreter, as a reader would run it (this one imported hf_mecheval)."""
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip().splitlines()[-1]

    prompt = re.search(r'generate\("(.*)"\)', blocks[0]).group(1)
    answer = run(blocks[0].replace("generate(", "print(generate(", 1).replace(f'"{prompt}")', f'"{prompt}")[0]["generated_text"])'))
    assert answer.startswith(prompt + " ") and len(answer.split()) == len(prompt.split()) + 1     # one answer token
    assert run(blocks[1] + "print(model.config.model_type, len(model.site_names()) > 0)") == "mecheval-h3 True"


def test_card_needs_a_finished_run(tmp_path):
    with pytest.raises(MechEvalError, match="not a finished run"):
        model_card.write_model_card(tmp_path)


def test_card_names_a_run_inside_the_working_directory_by_its_relative_path(run_dir, tmp_path, monkeypatch):
    outside = str(run_dir)
    monkeypatch.chdir(run_dir.parent.parent)                # the run is <cwd>/<folder>/h3
    model_card.write_model_card(run_dir.resolve())         # given absolute, as sweeps give it
    text = (run_dir / "README.md").read_text()
    relative = f"{run_dir.parent.name}/h3"
    assert f'model="{relative}"' in text and f'from_pretrained("{relative}")' in text and outside not in text
    monkeypatch.chdir(tmp_path)
    model_card.write_model_card(run_dir)                   # outside the working directory: as given
    assert f'from_pretrained("{run_dir}")' in (run_dir / "README.md").read_text()
