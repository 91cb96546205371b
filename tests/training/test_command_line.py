"""A run asked for by a mapping (a sweep's run, a job file's: ``RunSpec.from_values``) is the run
``mecheval train`` makes of the same values typed as flags (``RunSpec.from_flags``): one reading
of every value, however the run was asked for."""
import dataclasses
import json

import pytest
import yaml

from hf_mecheval.errors import MechEvalError
from hf_mecheval.training.command_line import parse, parse_values, values_as_flags
from hf_mecheval.training.spec import RunSpec
from hf_mecheval.training.sweep import SWEEPS_DIR


def as_values(groups) -> list[dict]:
    model_args, data_args, run_args, training_args = groups
    return [dataclasses.asdict(model_args), dataclasses.asdict(data_args), dataclasses.asdict(run_args),
            json.loads(training_args.to_json_string())]


def sweep_values():
    """Every (argument, value) that a packaged sweep file gives, as YAML read it (numbers in
    exponent notation are strings there), once each."""
    seen = {}
    for path in sorted(SWEEPS_DIR.rglob("*.yaml")):
        spec = yaml.safe_load(path.read_text())
        pairs = [(k, v) for k, v in (spec.get("defaults") or {}).items()] + [("task", spec.get("task"))] * ("task" in spec)
        for grid in spec.get("grids") or []:
            pairs += [(k, v) for k, values in grid.items() for v in (values if isinstance(values, list) else [values])]
        pairs += [("seed", seed) for seed in spec.get("seeds", [])]
        for key, value in pairs:
            seen.setdefault(json.dumps([key, value], sort_keys=True), (key, value, path.stem))
    return [pytest.param(key, value, id=f"{stem}-{key}={value}") for key, value, stem in seen.values()]


def expected(value):
    """What the argument holds for a value YAML gave: a number written as text is that number, a
    mapping its JSON text (the field is text), anything else itself."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return json.dumps(value) if isinstance(value, dict) else value


@pytest.mark.parametrize("key, value", sweep_values())
def test_every_value_a_packaged_sweep_gives_is_read_as_written(key, value):
    # read only (a model_config alone may not fit the default architecture; the sweeps' runs are
    # checked whole by tests/training/test_sweep.py)
    groups = parse_values({key: value, "output_dir": "out"})
    held = next(getattr(g, key) for g in groups if hasattr(g, key))
    held = getattr(held, "value", held)             # an enum (lr_scheduler_type) as its text
    if isinstance(value, dict):
        assert json.loads(held) == value
    else:
        assert held == expected(value)


def test_values_are_read_as_the_same_flags_typed_by_hand():
    values = {"learning_rate": "1e-4", "num_train_epochs": 3, "seed": "7", "test_head_size": "0",
              "task_config": {"num_kv": 16, "num_pairs": 2}, "model_config": {"conv_kernel": 2},
              "architecture": "mamba", "resume": "false", "overwrite": 1, "report_to": ["none"],
              "num_hidden_layers": 2, "output_dir": "out"}
    spec = RunSpec.from_values(values)
    assert spec.training.learning_rate == 1e-4 and isinstance(spec.training.learning_rate, float)
    assert spec.training.num_train_epochs == 3.0 and isinstance(spec.training.num_train_epochs, float)
    assert spec.training.seed == 7 and spec.run.test_head_size == 0
    assert json.loads(spec.data.task_config) == {"num_kv": 16, "num_pairs": 2}
    assert json.loads(spec.model.model_config) == {"conv_kernel": 2} and spec.config.conv_kernel == 2
    assert spec.run.resume is False and spec.run.overwrite is True and spec.training.report_to == []
    typed = ["--learning_rate", "1e-4", "--num_train_epochs", "3", "--seed", "7", "--test_head_size", "0",
             "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--model_config", '{"conv_kernel": 2}',
             "--architecture", "mamba", "--resume", "false", "--overwrite", "1", "--report_to", "none",
             "--num_hidden_layers", "2", "--output_dir", "out"]
    assert values_as_flags(values) == typed
    assert spec.record == RunSpec.from_flags(typed).record
    assert as_values(spec.groups) == as_values(RunSpec.from_flags(typed).groups)


def test_null_asks_for_a_null_default_and_is_refused_elsewhere():
    assert RunSpec.from_values({"max_position_embeddings": None}).model.max_position_embeddings is None
    with pytest.raises(MechEvalError, match="save_total_limit: null is not a value of this argument"):
        RunSpec.from_values({"save_total_limit": None})


@pytest.mark.parametrize("values, message", [
    ({"learning_rat": 1e-3}, "unknown argument 'learning_rat' (did you mean 'learning_rate'?)"),
    ({"learning_rate": "fast"}, "run r: learning_rate: invalid float value: 'fast'"),
    ({"seed": 1.5}, "run r: seed: invalid int value: '1.5'"),
    ({"seed": True}, "run r: seed: invalid int value: 'true'"),
    ({"resume": "maybe"}, "run r: resume: Truthy value expected: got maybe"),
    ({"learning_rate": float("nan")}, "learning_rate is not a finite number"),
    ({"architecture": "no_such_mixer"}, "architecture: unknown architecture 'no_such_mixer'"),
    ({"hidden_size": 0}, "hidden_size"),
])
def test_bad_values_are_one_error_naming_the_source_and_the_field(values, message):
    with pytest.raises(MechEvalError) as info:
        RunSpec.from_values(values, "run r")
    assert str(info.value).startswith("run r: ") and message in str(info.value)
    assert "\n" not in str(info.value)


def test_a_presets_schedule_is_the_default_unless_chosen():
    # the reference decays ATR-gen linearly; a run that names its schedule keeps it
    assert RunSpec.from_values({"task": "atr_gen"}).training.lr_scheduler_type.value == "linear"
    chosen = {"task": "atr_gen", "lr_scheduler_type": "cosine"}
    assert RunSpec.from_values(chosen).training.lr_scheduler_type.value == "cosine"
    assert parse(values_as_flags(chosen) + ["--output_dir", "o"])[3].lr_scheduler_type.value == "cosine"


def test_a_spec_is_built_once_and_moved_without_being_checked_again(monkeypatch):
    spec = RunSpec.from_values({"architecture": "mamba", "task_config": {"num_kv": 16, "num_pairs": 2}})
    # the recipe's sizes are resolved on the spec: the reference's documents and AR's 16 epochs
    assert (spec.train_size, spec.eval_size, spec.training.num_train_epochs) == (100_032, 1_024, 16.0)
    assert spec.record["task"]["train_size"] == 100_032 and spec.record["model"]["architecture"] == "mamba"
    import hf_mecheval.training.spec as spec_module

    monkeypatch.setattr(spec_module, "validate", lambda *a: pytest.fail("checked again"))
    moved = spec.at("elsewhere")
    assert moved.output_dir == "elsewhere" and spec.output_dir == "."
    assert moved.config is spec.config and moved.record["training"]["output_dir"] == "elsewhere"
    assert {k: v for k, v in moved.record.items() if k != "training"} == \
        {k: v for k, v in spec.record.items() if k != "training"}
