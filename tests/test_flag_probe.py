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
