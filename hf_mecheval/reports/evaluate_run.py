"""``mecheval evaluate RUN_DIR``: the intervention grid on a trained run -> JSON + PNG.

Writes ``RUN_DIR/interventions/`` (or ``--out``): ``interventions.json`` (schema in
:mod:`hf_mecheval.interventions.grid`, plus ``run``), ``residual_<corruption>.png`` (layer x
position heatmap of the residual stream) and ``sites_<corruption>.png`` (every other site).
The documents are the run's own test split (same task, same dataset seed) unless told otherwise.
"""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import MechEvalError
from ..io_utils import write_text_atomic
from ..tasks.presets import get_preset, task_from_dict
from . import plots


def load_run(run_dir: str | Path):
    """(model, task, run record) of a finished run directory, with clear errors."""
    from transformers import AutoModelForCausalLM

    import hf_mecheval  # noqa: F401  (registers the model types)

    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise MechEvalError(f"run directory {run_dir} does not exist")
    for name in ("config.json", "run.json"):
        if not (run_dir / name).exists():
            raise MechEvalError(f"{run_dir} is not a finished run: {name} is missing")
    try:
        record = json.loads((run_dir / "run.json").read_text())
        task = task_from_dict(get_preset(record["task"]["preset"]).task, record["task"]["config"])
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise MechEvalError(f"{run_dir / 'run.json'} is unreadable: {exc}") from None
    try:
        model = AutoModelForCausalLM.from_pretrained(run_dir)
    except (ValueError, OSError, KeyError) as exc:
        raise MechEvalError(f"cannot load the model in {run_dir}: {str(exc).splitlines()[0]}") from None
    if not hasattr(model, "site_names"):
        raise MechEvalError(f"{run_dir} holds a {type(model).__name__}, not an hf-mecheval model")
    return model, task, record


def evaluate_run(run_dir: str | Path, out: str | Path | None = None, n: int = 320, split: str = "test",
                 seed: int | None = None, sites: list[str] | None = None, batch_size: int = 64,
                 n_resamples: int = 1000, overwrite: bool = False, progress: bool = True) -> dict:
    from ..interventions import run_grid

    model, task, record = load_run(run_dir)
    out = Path(out) if out is not None else Path(run_dir) / "interventions"
    target = out / "interventions.json"
    if target.exists() and not overwrite:
        raise MechEvalError(f"{target} already exists; pass --overwrite to replace it")
    seed = record["task"].get("dataset_seed", 0) if seed is None else seed
    data = task.generate(n, split, seed)
    result = run_grid(model, task, data, sites=sites, batch_size=batch_size, n_resamples=n_resamples,
                      progress=progress)
    result["run"] = {"run_dir": str(run_dir), "architecture": record["model"].get("architecture"),
                     "task": record["task"]["preset"], "split": split, "dataset_seed": seed}
    out.mkdir(parents=True, exist_ok=True)
    name = f"{result['run']['architecture']} on {result['run']['task']}"
    for corruption in result["corruptions"]:
        plots.residual_heatmap(result, corruption, out / f"residual_{corruption}.png",
                               f"{name}: restoration, {corruption} corrupted")
        plots.component_bars(result, corruption, out / f"sites_{corruption}.png",
                             f"{name}: restoration by site, {corruption} corrupted")
    history = Path(run_dir) / "restoration_history.json"
    if history.exists():  # written by the RestorationCallback during training
        plots.restoration_curves(json.loads(history.read_text()), out / "restoration_history.png",
                                 f"{name}: restoration at the last layer's input over training")
    write_text_atomic(target, json.dumps(result, indent=1) + "\n", overwrite=True)
    from .model_card import write_model_card

    write_model_card(run_dir)          # the card now carries the restoration scores and the label
    return result


def format_score(value) -> str:
    """A restoration score for tables and text: two decimals, or n/a."""
    return "n/a" if value is None else f"{value:.2f}"


def last_layer_summary(result: dict) -> dict:
    """@key/@value/@query (and their intervals) at the input of the last layer, key corrupted,
    and the mechanism."""
    from ..interventions.grid import cell

    last = max(c["layer"] for c in result["corruptions"]["key"]["cells"])
    site = f"layers.{last}.input"
    row = {"accuracy": result["corruptions"]["key"]["clean_accuracy"]}
    for p in ("key", "value", "query"):
        c = cell(result, "key", site, p)
        row[f"@{p}"] = c["restoration"] if c else None
        row[f"@{p}_ci"] = c["restoration_ci"] if c else None
    row["mechanism"] = result["mechanism"]["label"]
    row["confidence"] = result["mechanism"]["confidence"]
    return row
