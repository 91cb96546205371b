"""Which code trained a run: metrics.json's ``train_code`` gives, for each segment of a run (a run
resumed from a checkpoint has several), the package version, a digest of the package's source
files, and the git commit they were checked out from where the package is a git checkout.

The digest is what identifies the code: two segments with the same digest ran the same Python and
C++ sources. The commit says where to find them; ``git_modified`` true means the sources differed
from that commit (the digest still names them). Sweep files, docs and data are not in the digest:
they do not change how a run trains (a run's arguments are in its run.json).
"""
from __future__ import annotations

import functools
import hashlib
import subprocess
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]           # hf_mecheval/
SOURCE_SUFFIXES = (".py", ".cpp", ".h")


def source_files(package: Path = PACKAGE) -> list[Path]:
    """The package's Python and C++ sources, in a fixed order."""
    return sorted(p for p in package.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file()
                  and "__pycache__" not in p.parts)


def source_digest(package: Path = PACKAGE) -> str:
    """sha256 (first 16 hex digits) over every source file's path relative to the package and its bytes."""
    digest = hashlib.sha256()
    for path in source_files(package):
        name = path.relative_to(package).as_posix().encode()
        data = path.read_bytes()
        digest.update(len(name).to_bytes(8, "little") + name + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()[:16]


def _git(package: Path, *args: str) -> subprocess.CompletedProcess | None:
    try:
        return subprocess.run(["git", "-C", str(package), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):       # no git, or it hung
        return None


def git_state(package: Path = PACKAGE) -> tuple[str | None, bool | None]:
    """(commit, modified): the commit checked out where the package is a git checkout, and whether
    its sources differ from that commit (tracked files changed, or source files git does not know);
    (None, None) elsewhere (an installed wheel, no git)."""
    head = _git(package, "rev-parse", "HEAD")
    if head is None or head.returncode != 0:
        return None, None
    specs = [f":(glob)**/*{suffix}" for suffix in SOURCE_SUFFIXES]
    changed = _git(package, "status", "--porcelain", "--untracked-files=all", "--", *specs)
    modified = None if changed is None or changed.returncode != 0 else bool(changed.stdout.strip())
    return head.stdout.strip(), modified


@functools.cache
def code_version() -> dict:
    """This process's code, as metrics.json records it per segment (computed once per process)."""
    from .. import __version__

    commit, modified = git_state()
    return {"version": __version__, "source_sha256": source_digest(), "git_commit": commit, "git_modified": modified}
