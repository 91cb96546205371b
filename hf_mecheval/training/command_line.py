"""A run's arguments as typed objects: from a command line (``parse``: flags, after an optional
YAML/JSON file of defaults) and from a mapping (``parse_values``: a sweep's run, a job file's),
which ``parse`` reads as the flags that ask for the same values; and the command that started a
run, to type again (``this_command``). ``spec.RunSpec`` is what the rest of training uses.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import functools
import json
import os
import shlex
import sys
import typing
from pathlib import Path
from typing import Sequence

from transformers import HfArgumentParser
from transformers.trainer_utils import SchedulerType

from ..errors import ConfigError, MechEvalError
from ..inputs import load_yaml, loads_finite, non_finite, refuse_non_finite
from ..tasks.presets import PRESETS, get_preset
from .arguments import DataArguments, MechEvalTrainingArguments, ModelArguments, RunArguments

ARGUMENT_TYPES = (ModelArguments, DataArguments, RunArguments, MechEvalTrainingArguments)


class _DefaultsWhereSet(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` gives a flag's default where it has one: a default of None means "not given" (the
    architecture's, the preset's, the reference recipe's), which the flag's own help says."""

    def _get_help_string(self, action: argparse.Action) -> str:
        return action.help if action.default is None else super()._get_help_string(action)


@functools.lru_cache(maxsize=1)
def _parser() -> HfArgumentParser:
    # built once: building it is most of the cost of checking a sweep's runs (~25 ms each)
    return HfArgumentParser(
        ARGUMENT_TYPES, allow_abbrev=False, exit_on_error=False, formatter_class=_DefaultsWhereSet,
        description="Train one model into a run directory. A stacked run (several runs that differ only in "
                    "learning rate and seed, trained together), or any run a job file describes, is started "
                    "instead with: --job JOB.json [--resume | --overwrite]; see hf_mecheval/training/jobs.py.")


def name_the_command(prog: str) -> None:
    """Usage and error lines of the training flags start with ``prog`` (``mecheval train``), not
    this process's script name (``mecheval``, which reads as if the flags were its own)."""
    _parser().prog = prog


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
        except (OSError, ValueError) as exc:     # ValueError: not UTF-8 text, not JSON
            raise MechEvalError(f"cannot read the run config {path}: {(str(exc).splitlines() or [''])[0]}") from None
        if not isinstance(values, dict):
            raise MechEvalError(f"the run config {path} must be a mapping of argument names to values")
        refuse_non_finite(values, str(path))
        argv = values_as_flags(values) + argv
    _refuse_non_finite_flags(argv)
    _refuse_missing_files(argv)
    try:
        model_args, data_args, run_args, training_args = parser.parse_args_into_dataclasses(args=argv)
    except argparse.ArgumentError as exc:    # a value of the wrong type or not among the choices
        # named as the field (a sweep file or a job file gives fields, not flags), as ConfigError names it
        name = (exc.argument_name or "").split("/")[0].removeprefix("--")
        raise MechEvalError(f"{name}: {exc.message}" if name else str(exc)) from None
    except (ValueError, OverflowError) as exc:   # unknown keys; a value TrainingArguments cannot convert
        message = str(exc).splitlines()[0]
        # its choices ("foo is not a valid SchedulerType, please select one of [...]") name no flag
        named = [name for name, value in _flag_values(argv) if message.startswith(f"{value} is not a valid ")]
        raise MechEvalError(f"{named[-1]}: {message}" if named else message) from None
    except (TypeError, KeyError) as exc:     # JSON of another shape (--accelerator_config '{"x": 1}')
        raise MechEvalError(f"a flag's value does not fit: {(str(exc).splitlines() or [''])[0]}") from None
    except ImportError as exc:      # a flag whose package is missing (--deepspeed without deepspeed)
        raise MechEvalError(f"a flag needs a package that is not installed: {(str(exc).splitlines() or [''])[0]}") \
            from None
    chosen = any(a.split("=")[0] in ("--lr_scheduler_type", "--lr-scheduler-type") for a in argv)
    _preset_schedule(data_args, training_args, chosen)
    return model_args, data_args, run_args, training_args


def _preset_schedule(data_args: DataArguments, training_args: MechEvalTrainingArguments, chosen: bool) -> None:
    # the reference decays linearly on some tasks (ATR-gen, ATR-sibling): their default, unless
    # the schedule was chosen explicitly
    if not chosen and data_args.task in PRESETS:
        training_args.lr_scheduler_type = SchedulerType(get_preset(data_args.task).lr_scheduler)


def parse_values(values: dict):
    """The four argument objects from a mapping of argument names to values (a sweep's run, a job
    file's), made by ``parse`` from the same values as flags: one reading of every value, however
    the run was asked for. Unknown names and NaN/infinite numbers are one error naming the field. Numbers may be given as text ("1e-4": YAML reads that as a string); mappings
    for a text field (``task_config``, ``model_config``) are written as JSON."""
    if not isinstance(values, dict):
        raise MechEvalError("a run's arguments must be a mapping of argument names to values")
    place = non_finite(values)
    if place:
        raise MechEvalError(f"{place} is not a finite number (NaN and infinity are not allowed)")
    known = {f.name for dtype in ARGUMENT_TYPES for f in dataclasses.fields(dtype) if f.init}
    unknown = sorted(set(values) - known)
    if unknown:
        close = difflib.get_close_matches(unknown[0], known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise MechEvalError(f"unknown argument {unknown[0]!r}{hint}")
    return parse(values_as_flags(values))


@functools.cache
def _defaults() -> dict:
    return {f.name: f.default for dtype in ARGUMENT_TYPES for f in dataclasses.fields(dtype) if f.init}


def values_as_flags(values: dict) -> list[str]:
    """The flags that ask for ``values`` (argument names to values, as a YAML file or a sweep
    gives them): mappings as JSON, a list as one value per item where the flag takes several (a
    list of one as its item elsewhere), true/false for booleans. A null value asks for the default where that is null, and is
    refused elsewhere (a flag cannot say null)."""
    flags = []
    for key, value in values.items():
        if value is None:
            if _defaults().get(key, dataclasses.MISSING) is None:
                continue
            raise ConfigError(key, "null is not a value of this argument; leave it out for its default")
        action = _parser()._option_string_actions.get(f"--{key}")
        if isinstance(value, list) and action is not None and action.nargs in ("+", "*"):
            flags += [f"--{key}", *(_flag_text(v) for v in value)]
        elif isinstance(value, list) and len(value) == 1 and not isinstance(value[0], (dict, list)):
            flags += [f"--{key}", _flag_text(value[0])]         # report_to: [none], as the flag takes it
        else:
            flags += [f"--{key}", _flag_text(value)]
    return flags


def _flag_text(value) -> str:
    if isinstance(value, (dict, list)):
        return json.dumps(value)
    return str(value).lower() if isinstance(value, bool) else str(value)


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
