"""A run's arguments from a mapping (``parse_dict``: sweeps and stacks, in-process) are the
arguments ``mecheval train`` makes of the same values as flags (``parse``), which is how a
sweep's child processes receive them."""
import dataclasses
import json

import pytest
import yaml

from hf_mecheval.errors import MechEvalError
from hf_mecheval.training.command_line import as_flags, parse, parse_dict
from hf_mecheval.training.sweep import SWEEPS_DIR


def as_values(parsed) -> list[dict]:
    model_args, data_args, run_args, training_args = parsed
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
    return [pytest.param({key: value}, id=f"{stem}-{key}={value}") for key, value, stem in seen.values()]


@pytest.mark.parametrize("args", sweep_values())
def test_sweep_values_parse_alike_from_a_mapping_and_from_flags(args):
    from_dict = parse_dict({**args, "output_dir": "out"})
    from_flags = parse(as_flags(args) + ["--output_dir", "out"])
    assert as_values(from_dict) == as_values(from_flags)


def test_values_are_read_as_their_fields_would_read_them_as_flags():
    values = {"learning_rate": "1e-4", "num_train_epochs": 3, "seed": "7", "test_head_size": "0",
              "task_config": {"num_kv": 16, "num_pairs": 2}, "model_config": {"conv_kernel": 2},
              "architecture": "mamba", "resume": "false", "overwrite": 1, "output_dir": "out"}
    model_args, data_args, run_args, training_args = parse_dict(values)
    assert training_args.learning_rate == 1e-4 and isinstance(training_args.learning_rate, float)
    assert training_args.num_train_epochs == 3.0 and isinstance(training_args.num_train_epochs, float)
    assert training_args.seed == 7 and run_args.test_head_size == 0
    assert json.loads(data_args.task_config) == {"num_kv": 16, "num_pairs": 2}
    assert json.loads(model_args.model_config) == {"conv_kernel": 2}
    assert run_args.resume is False and run_args.overwrite is True
    assert as_values(parse_dict(values)) == as_values(parse(as_flags(values)))


@pytest.mark.parametrize("values, message", [
    ({"learning_rat": 1e-3}, "unknown argument 'learning_rat' (did you mean 'learning_rate'?)"),
    ({"learning_rate": "fast"}, "learning_rate: expected a number, got 'fast'"),
    ({"seed": 1.5}, "seed: expected an integer, got 1.5"),
    ({"seed": True}, "seed: expected a number, got True"),
    ({"resume": "maybe"}, "resume: expected true or false, got 'maybe'"),
    ({"learning_rate": float("nan")}, "NaN"),
])
def test_bad_values_are_one_error_naming_the_field(values, message):
    with pytest.raises(MechEvalError) as info:
        parse_dict({**values, "output_dir": "out"}, "run r")
    assert str(info.value).startswith("run r") and message in str(info.value)


def test_a_presets_schedule_is_the_default_unless_chosen():
    # the reference decays ATR-gen linearly; a run that names its schedule keeps it
    assert parse_dict({"task": "atr_gen", "output_dir": "o"})[3].lr_scheduler_type.value == "linear"
    chosen = {"task": "atr_gen", "lr_scheduler_type": "cosine", "output_dir": "o"}
    assert parse_dict(chosen)[3].lr_scheduler_type.value == "cosine"
    assert parse(as_flags(chosen))[3].lr_scheduler_type.value == "cosine"
