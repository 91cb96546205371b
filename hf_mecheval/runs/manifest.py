"""The files a run wrote into its folder, so that replacing the run (``--overwrite``) removes
exactly those and nothing a person put there — at the top level or in any subfolder.

``.mecheval-written.json`` lists them (paths relative to the run folder). Files whose names we
choose are added by name (``add_written``); what transformers' Trainer writes (checkpoints, the
final model) and the intervention grid's figures are found by comparing the folder before and
after the write (``recording``). A run folder from before the manifest existed is judged by the
names a run writes (``run_dir.check_replaceable``).
"""
from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path
from typing import Iterable

from ..errors import MechEvalError, some_of
from ..atomic_files import is_temporary, write_text_atomic

MANIFEST = ".mecheval-written.json"


def files_under(folder: Path) -> dict[str, tuple[int, int]]:
    """Every file (and link: never followed) below ``folder``, as its relative path -> (size,
    modification time), temporaries and the manifest aside."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = Path(root, name)
            relative = path.relative_to(folder).as_posix()
            if relative == MANIFEST or is_temporary(name):
                continue
            info = path.lstat()
            found[relative] = (info.st_size, info.st_mtime_ns)
    return found


def written(folder: str | os.PathLike) -> set[str] | None:
    """The files the run in ``folder`` wrote, or None for a folder without a manifest."""
    path = Path(folder) / MANIFEST
    try:
        listed = json.loads(path.read_text())["files"]
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError):
        return set()           # a damaged manifest vouches for nothing: every file counts as a person's
    return {f for f in listed if isinstance(f, str)}


def unlisted(folder: Path, ours: set[str], below: str = "") -> list[str]:
    """The files below ``folder`` (only those under the relative path prefix ``below``, when
    given) that ``ours`` does not list: a person's, sorted."""
    return sorted(path for path in files_under(folder) if path.startswith(below) and path not in ours)


def add_written(folder: str | os.PathLike, paths: Iterable[str | os.PathLike]) -> None:
    """Record ``paths`` (inside ``folder``) as written by the run."""
    folder = Path(folder)
    new = {Path(p).relative_to(folder).as_posix() if Path(p).is_absolute() else Path(p).as_posix() for p in paths}
    files = (written(folder) or set()) | new
    write_text_atomic(folder / MANIFEST, json.dumps({"files": sorted(files)}, indent=0) + "\n", overwrite=True)


@contextlib.contextmanager
def recording(folder: str | os.PathLike):
    """Record every file below ``folder`` that the enclosed code creates or changes (also when it
    fails part-way)."""
    folder = Path(folder)
    before = files_under(folder) if folder.is_dir() else {}
    try:
        yield
    finally:        # a write cut short (a full disk) leaves files that are the run's all the same
        if folder.is_dir():
            changed = [p for p, signature in files_under(folder).items() if before.get(p) != signature]
            if changed:
                add_written(folder, changed)


def remove_written(folder: Path, files: set[str]) -> None:
    """Delete ``files`` (the run's) below ``folder``, temporaries beside them (a write cut short),
    then the folders they leave empty, then the manifest. ``folder`` itself stays."""
    remove_written_below(folder, files)
    with contextlib.suppress(FileNotFoundError):
        (folder / MANIFEST).unlink()


def remove_written_below(folder: Path, files: set[str]) -> None:
    """``remove_written`` without removing the manifest, which keeps listing the files removed
    (harmless: a listed file that is missing is simply not there to remove)."""
    touched = {folder}
    for relative in files:
        path = folder / relative
        if path.is_symlink() or path.is_file():
            path.unlink()
        touched.update(parent for parent in path.parents if folder in parent.parents)
    for place in sorted(touched, key=lambda p: -len(p.parts)):       # deepest first
        if place.is_dir() and not place.is_symlink():
            for entry in place.iterdir():
                if is_temporary(entry.name) and not entry.is_dir():
                    entry.unlink()
            if place != folder and not any(place.iterdir()):
                place.rmdir()


def claim_output_folder(out: Path, overwrite: bool, flag: str = "--overwrite") -> None:
    """Before a command writes its files into the folder ``out`` (``--out``): refuse when ``out``
    holds files hf-mecheval did not write there (its manifest does not list them), unless
    ``overwrite``: a report or a grid would replace a person's file of the same name."""
    if not out.is_dir() or overwrite:
        return
    foreign = unlisted(out, written(out) or set())
    if foreign:
        raise MechEvalError(f"{out} holds files hf-mecheval did not write there ({some_of(foreign)}); choose another "
                            f"folder, or pass {flag} to write beside them (files of the same name are replaced)")
