"""``mecheval evaluate RUN_DIR``: the intervention grid on a trained run -> JSON + PNG.

Writes ``RUN_DIR/interventions/`` (or ``--out``): ``interventions.json`` (schema in
:mod:`hf_mecheval.interventions.grid`, plus ``run``), ``residual_<corruption>.png`` (layer x
position heatmap of the residual stream) and ``sites_<corruption>.png`` (every other site).
The documents are the run's own test split (same task, same dataset seed) unless told otherwise.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

from ..errors import MechEvalError, some_of
from ..atomic_files import writable_folder, write_text_atomic
from ..inputs import read_json
from ..locks import locked_folder
from ..resources import check_memory
from ..tasks.presets import get_preset, task_from_dict
from . import plots
from ..runs import RunDir
from ..runs.run_dir import read_model_config
from ..runs.files import GridSettings, distance_summary, format_score, last_layer_summary
from ..runs.manifest import claim_output_folder, recording
from ..runs.model_card import write_model_card
from ..runs.files import RESTORATION_HISTORY


def load_run(run_dir: str | Path):
    """(model, task, run record) of a finished run directory, with clear errors."""
    run_dir = Path(run_dir)
    run = RunDir(run_dir)
    # the weights as safetensors only: a pickle (pytorch_model.bin) is never loaded
    run.require("config.json", "model.safetensors", RunDir.RECORD, RunDir.METRICS)
    record, metrics = run.record(), run.metrics()   # both read now: the model card written at the end needs them
    if metrics["final"].get("failed"):
        raise MechEvalError(f"{run_dir} is a failed run ({metrics['final']['failed']}): an intervention grid on it "
                            f"would measure nothing")
    try:
        task = task_from_dict(get_preset(record["task"]["preset"]).task, record["task"]["config"])
    except (MechEvalError, TypeError, ValueError) as exc:
        raise MechEvalError(f"{run_dir / 'run.json'}: bad task: {exc}") from None
    model = _load_model(run_dir)
    if model.config.vocab_size != task.vocab_size:
        # the task's token ids would index past the model's embedding table (or miss part of it)
        raise MechEvalError(f"{run_dir / 'run.json'} says task {record['task']['preset']} (vocabulary of "
                            f"{task.vocab_size} tokens) but the model in {run_dir} has vocab_size "
                            f"{model.config.vocab_size}: run.json does not belong to this model")
    return model, task, record


def _load_model(run_dir: Path):
    """The model of config.json with the weights of model.safetensors, every weight accounted for."""
    from safetensors import SafetensorError
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    import hf_mecheval  # noqa: F401  (registers the model types)
    from hf_mecheval.models import non_finite_parameters, require_checkpoint_architecture

    weights = run_dir / "model.safetensors"
    verbosity, bar = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    # problems are reported below in one line, not as a load-report table under a progress bar
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    require_checkpoint_architecture(run_dir)          # a plug-in's model type: loads it, or names it
    config = _config_that_fits(run_dir)
    try:
        # mismatched shapes are loaded as fresh weights and listed, so they can be named here
        model, info = AutoModelForCausalLM.from_pretrained(run_dir, config=config, output_loading_info=True,
                                                           ignore_mismatched_sizes=True)
    except SafetensorError as exc:
        raise MechEvalError(f"{weights} is damaged (truncated or not a safetensors file): {exc}") from None
    except (ValueError, OSError, KeyError, RuntimeError) as exc:
        raise MechEvalError(f"cannot load the model in {run_dir}: {str(exc).splitlines()[0]}") from None
    finally:
        hf_logging.set_verbosity(verbosity)
        if bar:
            hf_logging.enable_progress_bar()
    if not hasattr(model, "site_names"):
        # transformers' own model (--architecture hf:...): its decoder layers must be found
        from ..adapters.native_sites import native_sites

        try:
            native_sites(model)
        except MechEvalError as exc:
            raise MechEvalError(f"{run_dir} holds a {type(model).__name__}, not an hf-mecheval model, and "
                                f"{exc}") from None
    # without this check, weights absent from the file or of another shape would silently be random ones
    wrong = [f"{key} (missing)" for key in sorted(info["missing_keys"])]
    wrong += [f"{m[0]} ({_shape(m[1])} in the file, {_shape(m[2])} in config.json)" if isinstance(m, tuple)
              else f"{m} (another shape)" for m in sorted(info["mismatched_keys"], key=str)]
    if wrong:
        raise MechEvalError(f"{weights} does not match {run_dir / 'config.json'}: {some_of(wrong, 2)}")
    broken = non_finite_parameters(model)
    if broken:       # a diverged model: every prediction is garbage, and so would the grid be
        raise MechEvalError(f"{weights} holds NaN or infinite weights ({some_of(broken, 1)}): the model diverged")
    return model


def _config_that_fits(run_dir: Path):
    """The model's configuration, once config.json is found to be an object naming a model type
    and the model it describes to fit in memory: counted before it is built (a config edited to
    10^6 layers would otherwise be built first)."""
    from ..adapters.native_config import count_native_parameters
    from ..models import MechEvalConfig, count_parameters

    config = read_model_config(run_dir)
    try:
        params = count_parameters(config) if isinstance(config, MechEvalConfig) else count_native_parameters(config)
    except (ValueError, KeyError, TypeError, AttributeError, OverflowError, RuntimeError) as exc:
        raise MechEvalError(f"cannot read the model configuration in {run_dir}: {(str(exc).splitlines() or [''])[0]}") \
            from None
    check_memory(f"the model in {run_dir} ({params:,} parameters)", {"weights and a forward's activations": 8 * params})
    return config


def _shape(size) -> str:
    return "x".join(map(str, size))


def _check_counts(n: int, batch_size: int) -> None:
    for flag, value in (("-n", n), ("--batch-size", batch_size)):
        if value < 1:
            raise MechEvalError(f"{flag} must be at least 1, got {value}")


def evaluate_run(run_dir: str | Path, out: str | Path | None = None, n: int = 320, split: str = "test",
                 seed: int | None = None, sites: list[str] | None = None, batch_size: int = 64,
                 n_resamples: int = 1000, overwrite: bool = False, progress: bool = True) -> dict:
    # every input and the output folder are checked before the grid, which is the slow part
    _check_counts(n, batch_size)
    model, task, record = load_run(run_dir)
    check_memory(f"the bootstrap ({n_resamples:,} resamples of {n:,} documents)",
                 {"resamples": 8 * 4 * n_resamples * n})      # index and value arrays per resample
    task.check_size(n)
    if sites:             # before the output folder is made: a mistyped site leaves nothing behind
        from ..interventions.engine import engine_for

        engine_for(model).check_sites(sites)
    own = RunDir(run_dir).interventions_path.parent     # the run's own grid folder
    out = Path(out) if out is not None else own
    target = out / "interventions.json"
    if target.exists() and not overwrite:
        raise MechEvalError(f"{target} already exists; pass --overwrite to replace it")
    into_run = out.resolve() == own.resolve()
    if not into_run:      # a folder of the user's: only files we wrote there are replaced
        claim_output_folder(out, overwrite)
    with locked_folder(run_dir):        # it also writes the run's model card: one writer at a time
        # the grid's files go into the run's manifest when they land in the run's folder
        with recording(run_dir if into_run else out):
            result = _evaluate(run_dir, model, task, record, out, n, split, seed, sites, batch_size, n_resamples,
                               progress)
        if into_run:
            write_model_card(run_dir)      # the card now carries the restoration scores and the label
        # a grid written elsewhere (--out) leaves the run directory as it was
        return result


def summary_lines(result: dict) -> list[str]:
    """What ``mecheval evaluate`` (and a sweep's job, into its log) prints of a grid: the run's
    first document answered, the last layer's restoration scores with the mechanism, and why."""
    row = last_layer_summary(result)
    lines = [f"{result['run']['split']} document 0: {result['run']['example']}",
             f"accuracy {row['accuracy']:.3f}; key corrupted, last layer's input: @key {format_score(row['@key'])} "
             f"@value {format_score(row['@value'])} @query {format_score(row['@query'])} -> {row['mechanism']} "
             f"({row['confidence']})",
             f"reason: {row['reason']}"]
    for name, group in distance_summary(result).items():
        lines.append(f"{name} queries ({group['distance']}, {group['examples']}): accuracy {group['accuracy']:.3f}; "
                     f"@key {format_score(group['@key'])} @value {format_score(group['@value'])} "
                     f"@query {format_score(group['@query'])} -> {group['mechanism']} ({group['confidence']})")
    return lines


def _evaluate(run_dir, model, task, record, out, n, split, seed, sites, batch_size, n_resamples, progress) -> dict:
    from ..interventions import run_grid

    writable_folder(out)
    target = out / "interventions.json"
    history_path = Path(run_dir) / "restoration_history.json"
    # written by the RestorationCallback during training
    history = read_json(history_path, RESTORATION_HISTORY) if history_path.exists() else None
    seed = record["task"].get("dataset_seed", 0) if seed is None else seed
    data = task.generate(n, split, seed)
    if data.multi_query:         # -n counts queries: those of the first documents, one example each
        data = data.per_query(limit=n)
    positions = getattr(model.config, "max_position_embeddings", 0) or 0
    if 0 < positions < int(data.lengths.max()):
        raise MechEvalError(f"the model in {run_dir} has {positions} position embeddings but these {split} "
                            f"documents are up to {int(data.lengths.max())} tokens long")
    wall, cpu = time.perf_counter(), time.process_time()
    result = run_grid(model, task, data, sites=sites, batch_size=batch_size, n_resamples=n_resamples,
                      progress=progress)
    # what the grid cost, beside training's in metrics.json: the other part of a run's cost
    result["seconds"] = {"wall": round(time.perf_counter() - wall, 2), "cpu": round(time.process_time() - cpu, 2)}
    result["settings"] = GridSettings(n, split, seed, tuple(sites) if sites else None, n_resamples).record(seed)
    result["run"] = {"run_dir": str(run_dir), "architecture": record["model"].get("architecture"),
                     "task": record["task"]["preset"], "split": split, "dataset_seed": seed,
                     "example": _example(model, task, data)}
    name = f"{result['run']['architecture']} on {result['run']['task']}"
    for corruption in result["corruptions"]:
        plots.residual_heatmap(result, corruption, out / f"residual_{corruption}.png",
                               f"{name}: restoration, {corruption} corrupted")
        plots.component_bars(result, corruption, out / f"sites_{corruption}.png",
                             f"{name}: restoration by site, {corruption} corrupted")
    if history is not None:
        plots.restoration_curves(history, out / "restoration_history.png",
                                 f"{name}: restoration at the last layer's input over training")
    write_text_atomic(target, json.dumps(result, indent=1) + "\n", overwrite=True)
    return result


def _example(model, task, data) -> str:
    """The first document as text with the model's answer (``decoded_example``), read by the task's
    tokenizer (the one training saves beside the model)."""
    from ..tasks.tokenizer import build_tokenizer
    from ..training.evaluation import decoded_example

    tokenizer = build_tokenizer(task)
    doc = data.document(0)
    return decoded_example(model, tokenizer, doc["input_ids"], doc["labels"])
