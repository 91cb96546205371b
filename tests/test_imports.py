"""The package's layers, read from its source: no two modules import each other, directly or
around a loop (lazy imports inside functions included, since they only postpone a cycle), and
lower layers never import higher ones (training never imports the reports)."""
import ast
from pathlib import Path

import hf_mecheval

ROOT = Path(hf_mecheval.__file__).parent


def modules() -> dict[str, Path]:
    found = {}
    for path in ROOT.rglob("*.py"):
        parts = ("hf_mecheval", *path.relative_to(ROOT).with_suffix("").parts)
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def imports(name: str, path: Path, known: dict) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name in known}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[:len(package.split(".")) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else []))
            for alias in node.names:       # `from . import x` imports the module x
                full = f"{target}.{alias.name}"
                out.add(full if full in known else target)
    # a package importing its own submodules (re-exports) is not a dependency on them
    return {m for m in out if m in known and m != name and not m.startswith(name + ".")}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def cycle_from(graph: dict, start: str) -> list[str] | None:
    """A path start -> ... -> start, if there is one (depth first)."""
    stack, seen = [(start, [start])], set()
    while stack:
        node, path = stack.pop()
        for nxt in graph[node]:
            if nxt == start:
                return path + [start]
            if nxt not in seen:
                seen.add(nxt)
                stack.append((nxt, path + [nxt]))
    return None


def test_the_graph_sees_known_imports():
    g = graph()       # the checks below would pass vacuously on an empty graph
    assert "hf_mecheval.training.stacked" in g["hf_mecheval.training.run"]
    assert "hf_mecheval.runs.run_dir" in g["hf_mecheval.runs.model_card"]
    assert "hf_mecheval.models.modeling_mecheval" in g["hf_mecheval.runs.run_dir"]     # a lazy import


def test_no_import_cycles():
    g = graph()
    cycles = [c for c in (cycle_from(g, name) for name in sorted(g)) if c]
    assert not cycles, " -> ".join(cycles[0])


def test_layers_import_only_downwards():
    forbidden = {"hf_mecheval.training": ("hf_mecheval.reports", "hf_mecheval.cli"),
                 "hf_mecheval.runs": ("hf_mecheval.training", "hf_mecheval.reports", "hf_mecheval.cli"),
                 "hf_mecheval.models": ("hf_mecheval.training", "hf_mecheval.reports", "hf_mecheval.interventions",
                                        "hf_mecheval.runs", "hf_mecheval.cli"),
                 "hf_mecheval.tasks": ("hf_mecheval.training", "hf_mecheval.reports", "hf_mecheval.models"),
                 "hf_mecheval.interventions": ("hf_mecheval.training", "hf_mecheval.reports", "hf_mecheval.cli")}
    wrong = [f"{name} imports {target}" for name, targets in graph().items() for target in targets
             for layer, above in forbidden.items()
             if name.startswith(layer + ".") and target.startswith(above)]
    assert not wrong, wrong


def names_used(path: Path) -> set[str]:
    """Every module imported and every ``a.b`` attribute read in ``path`` (``sys.argv``), and every
    name imported from a module (``values_as_flags``)."""
    used = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            used |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            used |= {node.module or ""} | {a.name for a in node.names}
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            used.add(f"{node.value.id}.{node.attr}")
    return used


def test_only_the_command_line_modules_know_the_command_line():
    # flags are read in cli.py (mecheval's commands) and training/command_line.py (a run's
    # arguments); a process's own argv only by the entry points of processes we start
    known = modules()
    parsers = {name for name, path in known.items() if {"argparse", "HfArgumentParser"} & names_used(path)}
    assert parsers == {"hf_mecheval.cli", "hf_mecheval.training.command_line"}
    argv = {name for name, path in known.items() if "sys.argv" in names_used(path)}
    assert argv == {"hf_mecheval.cli", "hf_mecheval.training.command_line", "hf_mecheval.training.run",
                    "hf_mecheval.sweep_job", "hf_mecheval.training.launchers"}


def test_processes_hand_each_other_runs_as_job_files_not_flags():
    # a run's values become flags only to be read (command_line.parse), to be shown (a dry run's
    # listing, command.txt), never to start a process: a job file carries them (training/jobs.py)
    known = modules()
    users = {name for name, path in known.items() if "values_as_flags" in names_used(path)}
    assert users == {"hf_mecheval.cli", "hf_mecheval.training.run"}
    jobs = (ROOT / "training" / "jobs.py").read_text()
    assert '"--job", str(job_file)' in jobs and "values_as_flags" not in jobs
