"""A run's arguments as typed objects: from a command line (``parse``: flags, after an optional
YAML/JSON file of defaults), from a mapping (``parse_dict``: a sweep's or a stack's run, checked
in-process), and back to a command to type again (``as_flags``, ``this_command``).
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import functools
import json
import os
import shlex
import sys
import types
import typing
from pathlib import Path
from typing import Sequence

import yaml
from transformers import HfArgumentParser
from transformers.trainer_utils import SchedulerType

from ..errors import ConfigError, MechEvalError
from ..io_utils import load_yaml, loads_finite, refuse_non_finite
from ..tasks.presets import PRESETS, get_preset
from .arguments import DataArguments, MechEvalTrainingArguments, ModelArguments, RunArguments, validate

ARGUMENT_TYPES = (ModelArguments, DataArguments, RunArguments, MechEvalTrainingArguments)


@functools.lru_cache(maxsize=1)
def _parser() -> HfArgumentParser:
    # built once: building it is most of the cost of checking a sweep's runs (~25 ms each)
    return HfArgumentParser(
        ARGUMENT_TYPES, allow_abbrev=False, exit_on_error=False,
        description="Train one model into a run directory. A stacked run (several runs that differ only in "
                    "learning rate and seed, trained together) is started instead with: --stack STACK.json "
                    "[--resume | --overwrite]; see hf_mecheval/training/stacked.py.")


@functools.cache
def _numeric_fields() -> frozenset[str]:
    """The arguments whose values are numbers (read once: ``parse`` runs for every run of a sweep)."""
    from .arguments import DataArguments, MechEvalTrainingArguments, ModelArguments, RunArguments

    hints = {}
    for cls in (ModelArguments, DataArguments, RunArguments, MechEvalTrainingArguments):
        hints.update(typing.get_type_hints(cls))
    numeric = set()
    for name, hint in hints.items():
        options = typing.get_args(hint) or (hint,)
        if any(o in (int, float) for o in options):
            numeric.add(name)
    return frozenset(numeric)


# TrainingArguments flags whose value may name a JSON file, which it opens while it is built
FILE_FLAGS = ("deepspeed", "accelerator_config", "fsdp_config")


def _flag_values(argv: list[str]):
    """(field name, value) for each ``--flag value`` and ``--flag=value`` in ``argv``."""
    for i, token in enumerate(argv):
        if not token.startswith("--"):
            continue
        name, equals, value = token[2:].partition("=")
        if not equals:
            value = argv[i + 1] if i + 1 < len(argv) else ""
        yield name.replace("-", "_"), value


def _refuse_missing_files(argv: list[str]) -> None:
    for name, value in _flag_values(argv):
        if name in FILE_FLAGS and not value.lstrip().startswith("{") and not _is_file(value):
            raise ConfigError(name, f"no such file: {value!r} (a JSON file, or a JSON object)")


def _is_file(name: str) -> bool:
    try:
        return bool(name) and Path(name).is_file()
    except (OSError, ValueError):           # a name too long for the file system, a NUL byte
        return False


def _refuse_non_finite_flags(argv: list[str]) -> None:
    """NaN or infinity given to a numeric flag, named: TrainingArguments turns some of them
    (``--logging_steps inf``) into integers, which fails without naming the flag."""
    numeric = _numeric_fields()
    for name, value in _flag_values(argv):
        if name in numeric and value:
            try:
                number = float(value)
            except ValueError:
                continue                     # argparse names a value that is not a number
            if number != number or number in (float("inf"), float("-inf")):
                raise ConfigError(name, f"must be a finite number, got {value}")


def parse(argv: Sequence[str]):
    """Arguments from the command line; a leading .yaml/.json file supplies defaults that later
    flags override. Unknown keys in the file or on the command line are errors, and so are NaN
    and infinite numbers in the file."""
    parser = _parser()
    argv = list(argv)
    if argv and argv[0].endswith((".yaml", ".yml", ".json")):
        path = Path(argv.pop(0))
        try:
            text = path.read_text()
            values = load_yaml(text, str(path)) if path.suffix != ".json" else loads_finite(text, str(path))
        except (OSError, yaml.YAMLError, ValueError) as exc:     # ValueError: not UTF-8 text, not JSON
            raise MechEvalError(f"cannot read the run config {path}: {(str(exc).splitlines() or [''])[0]}") from None
        if not isinstance(values, dict):
            raise MechEvalError(f"the run config {path} must be a mapping of argument names to values")
        refuse_non_finite(values, str(path))
        argv = as_flags(values) + argv
    _refuse_non_finite_flags(argv)
    _refuse_missing_files(argv)
    try:
        model_args, data_args, run_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    except argparse.ArgumentError as exc:    # a value of the wrong type or not among the choices
        raise MechEvalError(str(exc)) from None
    except (ValueError, OverflowError) as exc:   # unknown keys; a value TrainingArguments cannot convert
        raise MechEvalError(str(exc).splitlines()[0]) from None
    chosen = any(a.split("=")[0] in ("--lr_scheduler_type", "--lr-scheduler-type") for a in argv)
    _preset_schedule(data_args, training_args, chosen)
    return model_args, data_args, run_args, training_args


def _preset_schedule(data_args: DataArguments, training_args: MechEvalTrainingArguments, chosen: bool) -> None:
    # the reference decays linearly on some tasks (ATR-gen, ATR-sibling): their default, unless
    # the schedule was chosen explicitly
    if not chosen and data_args.task in PRESETS:
        training_args.lr_scheduler_type = SchedulerType(get_preset(data_args.task).lr_scheduler)


def parse_dict(values: dict, source: str = "the run's arguments"):
    """The four argument objects from a mapping of argument names to values (a sweep's run, a
    stack member), as ``parse`` would make them from the same values given as flags: unknown
    names, NaN/infinite numbers and values of the wrong kind are one error naming ``source`` and
    the field. Numbers may be given as text ("1e-4": YAML reads that as a string); mappings and
    lists for a text field (``task_config``, ``model_config``) are written as JSON."""
    if not isinstance(values, dict):
        raise MechEvalError(f"{source} must be a mapping of argument names to values")
    refuse_non_finite(values, source)
    known = {f.name for dtype in ARGUMENT_TYPES for f in dataclasses.fields(dtype) if f.init}
    unknown = sorted(set(values) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise MechEvalError(f"{source}: unknown argument {unknown[0]!r}{hint}")
    groups = []
    for dtype in ARGUMENT_TYPES:
        hints = _type_hints(dtype)
        names = {f.name for f in dataclasses.fields(dtype) if f.init}
        try:
            kwargs = {k: _coerce(k, v, hints[k]) for k, v in values.items() if k in names}
            groups.append(dtype(**kwargs))
        except ConfigError as exc:
            raise MechEvalError(f"{source}: {exc}") from None
        except (TypeError, ValueError) as exc:      # refused by the dataclass itself (TrainingArguments' checks)
            raise MechEvalError(f"{source}: {(str(exc).splitlines() or [''])[0]}") from None
    model_args, data_args, run_args, training_args = groups
    _preset_schedule(data_args, training_args, "lr_scheduler_type" in values)
    return model_args, data_args, run_args, training_args


@functools.lru_cache(maxsize=None)
def _type_hints(dtype) -> dict:
    return typing.get_type_hints(dtype)


TRUE, FALSE = ("true", "yes", "t", "y", "1"), ("false", "no", "f", "n", "0")     # as transformers' string_to_bool


def _coerce(name: str, value, hint):
    """``value`` as the field ``name`` (declared ``hint``) would hold it had it come as a flag."""
    if value is None:
        return None
    union = typing.get_origin(hint) in (typing.Union, types.UnionType)
    kinds = {k for k in (typing.get_args(hint) if union else (hint,)) if k is not type(None)}
    if str in kinds or any(isinstance(k, type) and issubclass(k, enum.Enum) for k in kinds):
        # text (or a choice that TrainingArguments converts itself): flags carry text, JSON for mappings
        if isinstance(value, (dict, list)):
            return json.dumps(value)
        if isinstance(value, bool):
            return str(value).lower()
        return str(value) if isinstance(value, (int, float)) and str in kinds and not kinds & {int, float} else value
    if bool in kinds:
        if isinstance(value, bool):
            return value
        if isinstance(value, (str, int)) and str(value).lower() in TRUE + FALSE:
            return str(value).lower() in TRUE
        raise ConfigError(name, f"expected true or false, got {value!r}")
    if kinds & {int, float}:
        if isinstance(value, str):
            try:
                return int(value) if int in kinds else float(value)
            except ValueError:
                if float in kinds:
                    try:
                        return float(value)
                    except ValueError:
                        pass
                raise ConfigError(name, f"expected {'an integer' if float not in kinds else 'a number'}, "
                                        f"got {value!r}") from None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(name, f"expected a number, got {value!r}")
        if isinstance(value, float) and float not in kinds:
            raise ConfigError(name, f"expected an integer, got {value!r}")
        return float(value) if int not in kinds else value
    return value


def resolve_run_args(args: dict) -> dict:
    """A run's arguments (as in a sweep file) checked like ``mecheval train`` would check them
    (``parse_dict``, then ``validate``), before any run starts; numbers given as strings ("1e-4",
    as YAML reads that) come back as numbers."""
    parsed = parse_dict({**args, "output_dir": "."})
    validate(*parsed)
    resolved = {}
    for key, value in args.items():
        typed = next(getattr(group, key) for group in parsed if hasattr(group, key))
        numeric = isinstance(typed, (int, float)) and not isinstance(typed, bool)
        resolved[key] = typed if numeric else value
    return resolved


def as_flags(values: dict) -> list[str]:
    """Command-line flags for a mapping of training arguments (dicts and lists as JSON)."""
    flags = []
    for key, value in values.items():
        if isinstance(value, (dict, list)):
            value = json.dumps(value)
        flags += [f"--{key}", str(value).lower() if isinstance(value, bool) else str(value)]
    return flags


def invocation() -> str:
    """How this process was started, as a command to type: ``python -m MODULE`` or ``python
    SCRIPT``, under ``accelerate launch`` with its process count, CPU and precision flags."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name and spec.name != "__main__":
        target = f"-m {spec.name.removesuffix('.__main__')}"
    else:
        target = shlex.quote(sys.argv[0])
    if "ACCELERATE_MIXED_PRECISION" not in os.environ:          # set in every process accelerate launches
        return f"python {target}"
    processes = int(os.environ.get("WORLD_SIZE", "1"))
    flags = (["--multi_gpu"] if processes > 1 else []) + [f"--num_processes {processes}"]
    flags += ["--cpu"] if os.environ.get("ACCELERATE_USE_CPU", "").lower() == "true" else []
    precision = os.environ["ACCELERATE_MIXED_PRECISION"]
    flags += [f"--mixed_precision {precision}"] if precision != "no" else []
    return " ".join(["accelerate launch", *flags, target])


def this_command(argv: Sequence[str] | None = None, prog: str | None = None) -> str:
    """The command that started this training, to be typed again (command.txt): ``prog`` (e.g.
    ``mecheval train``, default: how this process was started) and the arguments (default: sys.argv's)."""
    argv = sys.argv[1:] if argv is None else argv
    return " ".join([prog or invocation(), *map(shlex.quote, argv)])
