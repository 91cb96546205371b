"""The README and docs/ keep working: every link reaches a file that exists (and the heading its
anchor names), every command line they show parses with the current command line (nothing is
run: argparse and the training parser only), the README's quick start is the two commands that
work on a fresh machine, and docs/commands.md names every command and flag there is.

What counts as a command line: a line of a fenced block (bash, sh, console or none) or an inline
code span that starts — after ``VAR=value`` settings — with ``mecheval``, ``python``,
``accelerate launch``, ``make`` or ``bash``. Where such a line holds ``...`` ("and further
flags"), or is an inline span, it is a synopsis: its command must exist and each flag it names
must be one of that command's, but required values may be left out. In a synopsis ``[x]`` is
optional and ``a|b`` offers alternatives (the first is checked).
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import runpy
import shutil
import shlex
import sys
from pathlib import Path

import pytest

from hf_mecheval.cli import build_parser
from hf_mecheval.errors import MechEvalError

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^(\s*)(```+|~~~+)\s*([\w+-]*)")
COMMAND_LANGUAGES = ("", "bash", "sh", "shell", "console")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")


# ---------------------------------------------------------------------------------- reading markdown
def split_markdown(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str, str]]]:
    """(prose lines, code lines): (line number, text), and (line number, the fence's language, text)."""
    prose, code, fence = [], [], None
    for number, line in enumerate(text.splitlines(), start=1):
        match = FENCE.match(line)
        if fence is None and match:
            fence = (match.group(2), match.group(3).lower())
        elif fence is not None and line.strip().startswith(fence[0]) and line.strip().strip(fence[0][0]) == "":
            fence = None
        elif fence is not None:
            code.append((number, fence[1], line))
        else:
            prose.append((number, line))
    return prose, code


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: inline markup dropped, lower case, punctuation other than
    '-' and '_' removed, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)            # [text](link) -> text
    text = re.sub(r"<[^>]+>", "", text).replace("`", "").replace("*", "")
    return re.sub(r"[^\w\- ]", "", text.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for _, line in split_markdown(path.read_text())[0]:
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            base = slug(match.group(1))
            count = seen.get(base, 0)
            seen[base] = count + 1
            out.add(base if count == 0 else f"{base}-{count}")
    return out


def prose_without_code(line: str) -> str:
    return INLINE_CODE.sub("", line)


def links(path: Path) -> list[tuple[int, str]]:
    return [(number, target) for number, line in split_markdown(path.read_text())[0]
            for target in LINK.findall(prose_without_code(line))]


def link_problem(doc: Path, target: str) -> str | None:
    """Why ``target`` (a link of ``doc``) leads nowhere, or None."""
    if re.match(r"^[a-z][a-z0-9+.-]*:", target):              # https:, mailto: ... (nothing outside is reached)
        return None
    path, _, anchor = target.partition("#")
    file = (doc.parent / path).resolve() if path else doc
    if not file.exists():
        return f"{path}: no such file"
    if path and ROOT not in file.parents and file != ROOT:
        return f"{path}: outside the repository"
    if anchor:
        if file.suffix != ".md":
            return f"#{anchor}: {path} is not a Markdown file"
        if anchor not in anchors(file):
            return f"#{anchor}: no such heading in {path or file.name}"
    return None


# ---------------------------------------------------------------------------------- command lines
def command_lines(path: Path) -> list[tuple[int, str, bool]]:
    """(line number, the command, whether it is a synopsis) of every command line in ``path``."""
    prose, code = split_markdown(path.read_text())
    found = [(n, line.strip(), "..." in line) for n, language, line in code if language in COMMAND_LANGUAGES]
    found += [(n, span, True) for n, line in prose for _, span in INLINE_CODE.findall(line)]
    return [(n, line, synopsis) for n, line, synopsis in found if is_command(line)]


def words(line: str) -> list[str]:
    try:
        tokens = shlex.split(line, comments=True)
    except ValueError:                      # an unbalanced quote: not a line of shell
        return []
    while tokens and re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", tokens[0]):
        tokens.pop(0)
    return tokens


def is_command(line: str) -> bool:
    tokens = words(line)                    # a program's name alone (`mecheval`) is no command line
    return len(tokens) > 1 and (tokens[0] in ("mecheval", "python", "make", "bash")
                                or tokens[:2] == ["accelerate", "launch"])


def synopsis_words(tokens: list[str]) -> list[str]:
    """``[x]`` -> x, ``a|b`` -> a, ``...`` (and ``PATTERN...``) -> nothing."""
    out, skip = [], False
    for token in tokens:
        if skip or token == "|":                 # `a | b`: the alternative after the bar is not checked
            skip = token == "|"
            continue
        token = token.strip("[]")
        if not token or token == "..." or token.endswith("..."):
            continue
        if "|" in token and not token.startswith("-"):
            token = token.split("|")[0]
        out.append(token)
    return out


class _Parsed(Exception):
    pass


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def _subparser(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser | None:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def check_flags_known(options: set[str], argv: list[str], where: str) -> None:
    unknown = [a.split("=")[0] for a in argv if a.startswith("-") and not re.fullmatch(r"-\d.*", a)
               and a.split("=")[0] not in options]
    assert not unknown, f"{where}: unknown flag(s) {unknown}"


def check_training(argv: list[str], synopsis: bool, where: str) -> None:
    """``mecheval train`` / ``python -m hf_mecheval.training.run`` flags, read as training reads them."""
    from hf_mecheval.training.command_line import _parser
    from hf_mecheval.training.jobs import Run, write_job_file
    from hf_mecheval.training.run import job_arguments

    if argv[:1] == ["--job"]:
        write_job_file(Path(argv[1]), Run("r", {"task": "ar_32"}), Path("runs"), None, None)
        job_arguments(argv)
        return
    options = _options(_parser())
    check_flags_known(options | {"-h", "--help"}, argv, where)
    if synopsis or "--help" in argv or "-h" in argv:
        return
    from hf_mecheval.training.spec import RunSpec

    if argv and argv[0].endswith((".yaml", ".yml", ".json")) and not Path(argv[0]).exists():
        Path(argv[0]).write_text("task: ar_32\noutput_dir: runs/from_the_file\n")    # the config file it names
    try:
        RunSpec.from_flags(argv)
    except MechEvalError as exc:
        pytest.fail(f"{where}: {exc}")


def check_mecheval(argv: list[str], synopsis: bool, where: str) -> None:
    if argv[:1] == ["train"]:
        return check_training(argv[1:], synopsis, where)
    parser = build_parser()
    if synopsis or "--help" in argv:
        names = [a for a in argv if not a.startswith("-")][:2]
        if not names:                            # mecheval --help, mecheval --version
            return check_flags_known(_options(parser), argv, where)
        command = _subparser(parser, names[0])
        assert command is not None, f"{where}: no command {names[:1]}"
        sub = _subparser(command, names[1]) if len(names) > 1 else None
        check_flags_known(_options(sub or command), argv, where)
        return
    try:
        args = parser.parse_args(argv)
    except SystemExit:
        pytest.fail(f"{where}: mecheval {shlex.join(argv)} does not parse")
    if args.command == "sweep":
        from hf_mecheval.training.sweep import sweep_file

        sweep_file(args.file)                  # a packaged sweep of that name exists
    if args.command == "report" and args.results is None:
        check_report_folder(args.out, args.overwrite, where)


def check_report_folder(out: str, overwrite: bool, where: str) -> None:
    """A report written into a folder the repository commits (``results/<sweep>``) must be
    accepted in a fresh clone, where the record of what a report wrote (the manifest) is not
    committed: the folder is copied without it and claimed as the report would claim it."""
    from hf_mecheval.runs.manifest import MANIFEST, claim_output_folder

    committed = ROOT / out
    if not committed.is_dir():
        return
    clone = Path.cwd() / "as_cloned" / out
    shutil.copytree(committed, clone, ignore=shutil.ignore_patterns(MANIFEST))
    try:
        claim_output_folder(clone, overwrite)
    except MechEvalError as exc:
        pytest.fail(f"{where}: refused in a fresh clone: {exc}")
    finally:
        shutil.rmtree(Path.cwd() / "as_cloned")


def check_script(script: str, argv: list[str], synopsis: bool, where: str, monkeypatch) -> None:
    """A script of the repository: it exists, and (unless a synopsis) its argparse parser reads
    ``argv`` — the script is run up to its ``parse_args`` and stopped there."""
    path = ROOT / script
    assert path.is_file(), f"{where}: no such script {script}"
    if synopsis:
        return
    real = argparse.ArgumentParser.parse_args

    def parse_and_stop(self, args=None, namespace=None):
        real(self, args, namespace)
        raise _Parsed

    monkeypatch.setattr(argparse.ArgumentParser, "parse_args", parse_and_stop)
    monkeypatch.setattr(sys, "argv", [str(path), *argv])
    monkeypatch.syspath_prepend(str(path.parent))
    try:
        runpy.run_path(str(path), run_name="__main__")
    except _Parsed:
        return
    except SystemExit as exc:
        pytest.fail(f"{where}: {script} {shlex.join(argv)} does not parse (exit {exc.code})")
    pytest.fail(f"{where}: {script} never reached its argument parser")


def check_command(line: str, synopsis: bool, where: str, monkeypatch) -> None:
    tokens = words(line)
    if synopsis:
        tokens = synopsis_words(tokens)
    if tokens[:2] == ["accelerate", "launch"]:       # its own flags, then the module or script it launches
        rest = tokens[2:]
        start = next(i for i, t in enumerate(rest) if t == "-m" or t.endswith(".py"))
        tokens = ["python", *rest[start:]]
    program, argv = tokens[0], tokens[1:]
    if program == "mecheval":
        check_mecheval(argv, synopsis, where)
    elif program == "make":
        targets = set(re.findall(r"^([\w.-]+):", (ROOT / "Makefile").read_text(), re.M))
        assert set(a for a in argv if "=" not in a) <= targets, f"{where}: no make target in {argv}"
    elif program == "bash":
        assert (ROOT / argv[0]).is_file(), f"{where}: no such script {argv[0]}"
    elif argv[:1] == ["-m"]:
        module, rest = argv[1], argv[2:]
        assert module == "hf_mecheval.training.run", f"{where}: a module the docs do not teach: {module}"
        check_training(rest, synopsis, where)
    elif argv and argv[0] == "training/train.py":
        check_training(argv[1:], synopsis, where)
    else:
        check_script(argv[0], argv[1:], synopsis, where, monkeypatch)


# ---------------------------------------------------------------------------------- the tests
def test_the_docs_pages_exist_and_the_readme_links_every_one():
    assert len(DOCS) >= 8
    linked = {(ROOT / target.partition("#")[0]).resolve() for _, target in links(ROOT / "README.md")}
    assert {p.resolve() for p in DOCS[1:]} <= linked, "a docs/ page the README does not link"
    assert {(ROOT / "REPRODUCTION.md").resolve(), (ROOT / "ARCHITECTURE.md").resolve()} <= linked


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_link_reaches_a_file_and_its_heading(doc):
    problems = [f"{doc.name}:{n}: {problem}" for n, target in links(doc) if (problem := link_problem(doc, target))]
    assert not problems, "\n".join(problems)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.name)
def test_every_command_line_parses_with_the_current_command_line(doc, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)                  # what a check writes (a job file, a config file) stays here
    lines = command_lines(doc)
    for number, line, synopsis in lines:
        check_command(line, synopsis, f"{doc.relative_to(ROOT)}:{number}: {line}", monkeypatch)
    if doc.name in ("README.md", "commands.md", "training.md", "reproducing.md"):
        assert lines, f"{doc.name} shows no command line"


def test_the_readme_quick_start_is_the_two_commands():
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    assert [words(line) for line in block.strip().splitlines()] == [["make", "quickstart"], ["make", "test"]]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^quickstart:", makefile, re.M) and re.search(r"^test:", makefile, re.M)


def test_the_readme_findings_quote_figures_the_reproduction_tables_hold():
    """Each figure the README's "What the reproduction found" gives ("91.1 ± 3.6", "33.7") stands
    in one of REPRODUCTION.md's tables, which ``mecheval report --update`` writes from results/:
    a table that moves on leaves the README's figure behind, and this fails."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## What the reproduction found", 1)[1].split("\n## ", 1)[0]
    reproduction = (ROOT / "REPRODUCTION.md").read_text()
    tables = " ".join(re.findall(r"<!-- table:\w+ -->(.*?)<!-- /table:\w+ -->", reproduction, re.S))
    figures = re.findall(r"\d+\.\d+(?: ± \d+\.\d+)?", section)
    assert len(figures) >= 8
    cells = set(re.findall(r"\d+\.\d+(?: ± \d+\.\d+)?", tables))
    assert not [f for f in figures if f not in cells], "README figures no table holds"


def test_the_parameter_counts_docs_models_gives_are_the_models_built_here():
    """docs/models.md's parameter counts (vocabulary 26, 2 layers, no positions, hidden 64 / 128 /
    256), in the default forms and in BaseConv's, H3's and Hyena's `mecheval-v1` forms, are what
    the models have today (counted on the meta device): a mixer that gains or loses a parameter
    leaves the page behind."""
    from hf_mecheval.models import count_parameters, model_classes

    text = " ".join((ROOT / "docs" / "models.md").read_text().split())
    defaults = text.split("Parameter counts (vocabulary 26, 2 layers, no positions, default forms, hidden 64 / 128 / 256): ")[1]
    defaults = defaults.split("; the Transformer")[0]
    names = {"Based": "based", "BaseConv": "baseconv", "H3": "h3", "Hyena": "hyena", "Mamba": "mamba",
             "DeltaNet": "deltanet", "Mamba-2": "mamba2", "Gated DeltaNet": "gated_deltanet"}
    number = r"(\d{1,3}(?:,\d{3})*)"
    quoted = {}
    for name, *counts in re.findall(rf"([A-Z][\w -]*?) {number} / {number} / {number}", defaults):
        quoted[(names[name], None)] = counts
    old = re.search(rf"forms of BaseConv, H3 and Hyena .*? have {number} / {number} / {number}, "
                    rf"{number} / {number} / {number} and {number} / {number} / {number}\.", text).groups()
    forms = {"baseconv": "long_conv_form", "h3": "ssm_form", "hyena": "filter_form"}
    for i, arch in enumerate(forms):
        quoted[(arch, "mecheval-v1")] = list(old[3 * i:3 * i + 3])
    assert {arch for arch, form in quoted if form is None} == set(names.values())

    def count(arch, form, width):
        config = model_classes(arch)[0](vocab_size=26, num_hidden_layers=2, hidden_size=width,
                                        **({forms[arch]: form} if form else {}))
        return f"{count_parameters(config):,}"

    assert {key: [count(*key, width) for width in (64, 128, 256)] for key in quoted} == quoted


def test_the_command_reference_names_every_command_and_flag():
    from hf_mecheval.training.arguments import DataArguments, ModelArguments, RunArguments

    reference = (ROOT / "docs" / "commands.md").read_text()
    missing = []

    def walk(parser, path):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    if f"mecheval {' '.join(path + [name])}" not in reference:
                        missing.append(" ".join(path + [name]))
                    walk(sub, path + [name])
            else:
                missing.extend(f"{' '.join(path)} {o}" for o in action.option_strings
                               if o not in ("-h", "--help", "--version") and f"`{o}`" not in reference)

    walk(build_parser(), [])
    for cls in (ModelArguments, DataArguments, RunArguments):
        missing += [f"train --{f.name}" for f in dataclasses.fields(cls) if f"`--{f.name}`" not in reference]
    assert not missing, f"docs/commands.md does not name: {missing}"


def test_the_checks_themselves_fail_on_what_is_broken(tmp_path, monkeypatch):
    """A broken link, a missing heading and a flag the command line does not have are caught."""
    doc = tmp_path / "page.md"
    doc.write_text("# A page\n\n## Its part\n\n[ok](#its-part) [gone](nowhere.md) [no heading](#elsewhere)\n"
                   "`[code](not/a/link.md)`\n\n```bash\nmecheval sweep cpu/ar --no-such-flag\n```\n")
    assert anchors(doc) == {"a-page", "its-part"}
    assert [link_problem(doc, t) for _, t in links(doc)] == [None, "nowhere.md: no such file",
                                                             "#elsewhere: no such heading in page.md"]
    assert link_problem(ROOT / "README.md", "../") == "../: outside the repository"     # it exists, elsewhere
    (number, line, synopsis), = command_lines(doc)
    with pytest.raises(pytest.fail.Exception, match="does not parse"):
        check_command(line, synopsis, "page.md", monkeypatch)
    with pytest.raises(AssertionError, match="unknown flag"):
        check_command("mecheval train --learning_rate 1e-3 --no_such_field 1 ...", True, "page.md", monkeypatch)
    with pytest.raises(pytest.fail.Exception, match="learning_rate"):
        monkeypatch.chdir(tmp_path)
        check_command("mecheval train --learning_rate fast --output_dir runs/x", False, "page.md", monkeypatch)
    with pytest.raises(pytest.fail.Exception, match="does not parse"):
        check_command("python benchmarks/bench_models.py --hidden sixty-four", False, "page.md", monkeypatch)
    assert slug("The `mecheval report` command: HTML!") == "the-mecheval-report-command-html"
    assert slug("transformers' own models") == "transformers-own-models"
