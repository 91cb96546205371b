"""Every flag of every command, probed with values a careless or hostile user might give: wrong
types, negatives, zero, huge numbers, NaN and infinity, empty and deeply nested strings.

The flags are read from the parsers themselves (``mecheval``'s subcommands, and the argument
dataclasses behind ``mecheval train``), so a flag added tomorrow is probed tomorrow. Each value is
either accepted or refused with argparse's usage error (exit 2) or one ``MechEvalError`` line
naming the problem; never a traceback. ``mecheval train``'s values also go through ``validate``,
which checks everything before a run starts (nothing is written there)."""
import argparse
import dataclasses

import pytest

from hf_mecheval.cli import build_parser
from hf_mecheval.errors import MechEvalError
from hf_mecheval.training.arguments import (DataArguments, MechEvalTrainingArguments, ModelArguments, RunArguments,
                                            validate)
from hf_mecheval.training.command_line import parse

BAD_VALUES = ["-1", "0", "1e400", "nan", "-inf", "", "9" * 30, "[" * 2000, "x"]


def subcommands(parser: argparse.ArgumentParser, path=()):
    """(command path, its parser) for every leaf command."""
    found = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not found:
        yield path, parser
        return
    for name, sub in found[0].choices.items():
        yield from subcommands(sub, (*path, name))


def value_flags(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and a.nargs != 0 and a.dest != "help"]


CLI_CASES = [(path, action.option_strings[0]) for path, sub in subcommands(build_parser())
             for action in value_flags(sub)]


def test_the_probe_sees_every_command():
    commands = {" ".join(path) for path, _ in subcommands(build_parser())}
    assert {"data generate", "data publish", "evaluate", "report", "sweep", "quickstart", "reproduce", "push"} <= commands
    assert {" ".join(path) for path, _ in CLI_CASES} >= {"data generate", "evaluate", "report", "sweep", "reproduce"}
    assert len(CLI_CASES) >= 30


def positionals(parser: argparse.ArgumentParser) -> list[str]:
    """A value for each required positional argument (it may be refused later: only parsing is probed here)."""
    out = []
    for action in parser._actions:
        if not action.option_strings and action.nargs not in ("?", "*") and not isinstance(
                action, argparse._SubParsersAction):
            out.append(sorted(action.choices)[0] if action.choices else "missing")
    return out


@pytest.mark.parametrize("path, flag", CLI_CASES, ids=[f"{' '.join(p)} {f}" for p, f in CLI_CASES])
def test_every_cli_flag_takes_bad_values_without_a_traceback(path, flag, capsys):
    parser = build_parser()
    sub = dict(subcommands(parser))[path]
    for value in BAD_VALUES:
        argv = [*path, *positionals(sub), flag, value]
        try:
            parser.parse_args(argv)
        except SystemExit as exc:               # argparse's usage error: one line after the usage
            assert exc.code == 2, (argv, exc.code)
            err = capsys.readouterr().err.strip().splitlines()
            assert err[-1].startswith("mecheval") and "error:" in err[-1] and "Traceback" not in "\n".join(err)
            assert len(err[-1]) < 2000, "the error repeats a huge value"
        capsys.readouterr()


TRAINING_FIELDS = [f.name for cls in (ModelArguments, DataArguments, RunArguments, MechEvalTrainingArguments)
                   for f in dataclasses.fields(cls) if f.init and f.name not in ("output_dir",)]
BASE = ["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--hidden_size", "16",
        "--train_size", "16", "--eval_size", "8", "--output_dir", "never-written"]


def test_the_probe_sees_every_training_argument():
    assert {"hidden_size", "learning_rate", "logging_steps", "optim", "report_to", "label_names",
            "restoration_every_n_steps", "task_config"} <= set(TRAINING_FIELDS)


@pytest.mark.parametrize("field", TRAINING_FIELDS)
def test_every_training_flag_takes_bad_values_without_a_traceback(field, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    for value in BAD_VALUES:
        argv = [*BASE, f"--{field}", value]
        try:
            validate(*parse(argv))
        except SystemExit as exc:               # argparse: a value of the wrong type, one usage error
            assert exc.code == 2, (argv, exc.code)
        except MechEvalError as exc:            # includes ConfigError: one line naming the problem
            assert "\n" not in str(exc) and len(str(exc)) < 2000, (argv, str(exc)[:300])
        capsys.readouterr()
    assert list(tmp_path.iterdir()) == []       # checking arguments writes nothing


# ------------------------------------------------------------------ values a field's type invites
# Beyond the nine values above, each training argument gets the hostile values its type and its
# neighbours invite: every member of an enum, alone (its companions missing: a schedule without
# the arguments it needs, a sharding plan in one process), JSON of the wrong shape where a field
# takes JSON, zero and negative counts and rates, an unknown name where it takes one. A value
# that `validate` accepts is then trained with, for two steps that evaluate, log and save at
# every step (so that a value which only trips the evaluation or saving loop trips here too): it
# must train, or stop with one line; never a traceback from inside the Trainer.
import enum
import io
import contextlib
import typing

from transformers import TrainingArguments

from hf_mecheval.training.run import main as train_main

TINY_RUN = ["--task", "ar_32", "--task_config", '{"num_kv": 16, "num_pairs": 2}', "--architecture", "transformer",
            "--hidden_size", "8", "--max_position_embeddings", "16", "--train_size", "8", "--eval_size", "4",
            "--per_device_train_batch_size", "4", "--max_steps", "2", "--eval_strategy", "steps", "--eval_steps", "1",
            "--save_strategy", "steps", "--save_steps", "1", "--logging_steps", "1", "--disable_tqdm", "true"]
# validated only, with the reason they are not trained with
NOT_TRAINED = {
    "push_to_hub": "it reaches the Hub", "hub_model_id": "the Hub", "hub_strategy": "the Hub",
    "hub_token": "the Hub", "hub_private_repo": "the Hub", "hub_always_push": "the Hub", "hub_revision": "the Hub",
    "torch_compile": "compiling takes minutes on a CPU", "torch_compile_backend": "compiling",
    "torch_compile_mode": "compiling", "output_dir": "the probe's own folder", "overwrite": "the probe's folder",
    "resume": "the probe's folder",
}


def _members(name: str) -> list[str]:
    """The members of the enum a field takes, in our arguments or in transformers' own (``fsdp``
    is typed as text there: its options are ``FSDPOption``'s)."""
    from transformers.trainer_utils import FSDPOption

    found = [str(m.value) for m in FSDPOption] if name == "fsdp" else []
    for cls in (*ARGUMENT_CLASSES, TrainingArguments):
        hint = typing.get_type_hints(cls).get(name)
        for arg in typing.get_args(hint) or (hint,):
            for inner in (arg, *typing.get_args(arg)):          # list[FSDPOption] too
                if isinstance(inner, type) and issubclass(inner, enum.Enum):
                    found += [str(m.value) for m in inner]
    return sorted(set(found))


ARGUMENT_CLASSES = (ModelArguments, DataArguments, RunArguments, MechEvalTrainingArguments)


def invited_values(field: dataclasses.Field, hint) -> list[str]:
    values = list(_members(field.name)) + list((field.metadata or {}).get("choices") or [])
    args = typing.get_args(hint) or (hint,)
    if any(a is dict or typing.get_origin(a) is dict for a in args) or field.name.endswith(("_kwargs", "_config",
                                                                                           "_args")):
        values += ['{"x": 1}', "[]", '"text"', "{}", "null", "[1, 2]"]
    if int in args and bool not in args:
        values += ["0", "-1", "2"]
    if float in args:
        values += ["0", "-1", "1e-12"]
    if str in args and not values:
        values += ["bad", ""]
    return list(dict.fromkeys(values))


INVITED = [(f.name, value) for cls in ARGUMENT_CLASSES for f in dataclasses.fields(cls)
           if f.init and f.name not in ("output_dir",)
           for value in invited_values(f, typing.get_type_hints(cls)[f.name])]


def test_the_probe_invites_what_each_type_invites():
    names = {name for name, _ in INVITED}
    assert {"lr_scheduler_type", "lr_scheduler_kwargs", "eval_accumulation_steps", "neftune_noise_alpha", "fsdp",
            "optim", "save_strategy", "torch_compile_backend"} <= names
    assert ("lr_scheduler_type", "cosine_with_min_lr") in INVITED and ("lr_scheduler_kwargs", "[]") in INVITED
    assert ("fsdp", "full_shard") in INVITED and ("eval_accumulation_steps", "0") in INVITED


@pytest.mark.parametrize("field", sorted({name for name, _ in INVITED}))
def test_every_training_argument_takes_the_values_its_type_invites(field, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for i, value in enumerate(v for name, v in INVITED if name == field):
        argv = [*TINY_RUN, f"--{field}", value, "--output_dir", f"run{i}"]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                validate(*parse(argv))
            except SystemExit as exc:
                assert exc.code == 2, (argv, exc.code)
                continue
            except MechEvalError as exc:
                assert "\n" not in str(exc) and len(str(exc)) < 2000, (argv, str(exc)[:300])
                continue
            if field in NOT_TRAINED:
                continue
            try:
                code = train_main(argv)
            except Exception as exc:        # a traceback the command line would have printed
                pytest.fail(f"--{field} {value!r}: {type(exc).__name__}: {str(exc)[:300]}")
        lines = [line for line in err.getvalue().splitlines() if line.startswith("mecheval train: error")]
        assert code in (0, 1, 2), (argv, code)
        if code:
            assert len(lines) == 1, (argv, err.getvalue()[-500:])
