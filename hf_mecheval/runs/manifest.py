"""The files a run wrote into its folder, so that replacing the run (``--overwrite``) removes
exactly those and nothing a person put there — at the top level or in any subfolder.

``.mecheval-written.json`` holds ``{"files": [...], "saving": [...]}``: the files the run wrote
(paths relative to the run folder), and the subfolders (checkpoints) whose saving has begun but not
yet been recorded. Every write is recorded *before* it starts: files whose names we choose by
name (``add_written``, then the write), a Trainer's save by marking its folder (``recording``, whose
end lists what the save wrote and clears the mark). So what a run wrote is known whatever stops it
— a SIGKILL mid-save or a full disk: the files of a save that was cut short lie in a marked folder,
and count as the run's where their names are ones a save writes (``SAVED_NAME``).

A run folder is something people copy, share, unpack and commit: its manifest is data from anyone,
never an instruction. Its entries must be plain relative paths (no ``.``/``..`` parts, not
absolute, no NUL, no part longer than a file name may be); a manifest with any other entry, or one
that cannot be read, vouches for nothing. Before anything is removed every entry is resolved
without following a link (``removal_plan``): only a regular file strictly inside the folder, or
one that is missing, may be removed; an entry that is a link, a folder or reached through a link
makes the folder "not only the run's", and the command refuses, as for a person's file. Removal
itself walks down by file descriptors that refuse links (``O_NOFOLLOW``), so nothing outside the
folder is reached even if the folder changes meanwhile. Temporaries (``.NAME.XXXXXXXX.tmp``) are
removed only where the manifest lists them: a person's file named like one stays.

A run folder from before the manifest existed is judged by the names a run writes
(``run_dir.check_replaceable``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import stat
from pathlib import Path
from typing import Iterable

from ..errors import MechEvalError, some_of
from ..atomic_files import is_temporary, temporary_beside, write_text_atomic
from ..inputs import path_problem

MANIFEST = ".mecheval-written.json"
MANIFEST_MAX_BYTES = 64 * 2**20
# what a Trainer's save writes into its folder (a checkpoint, the final model): the model and its
# code (the remote code's modules), configs, the tokenizer, the optimizer's, scheduler's and
# random generators' states, trainer and stack states (``*_state.json``), the training clock
SAVED_NAME = re.compile(r"model\.safetensors|[A-Za-z_][A-Za-z0-9_]*\.py|[\w.-]+\.json|training_args\.bin"
                        r"|optimizer\.pt|scheduler\.pt|scaler\.pt|rng_state(_\d+)?\.pth")


def entry_problem(entry) -> str | None:
    """Why ``entry`` (a manifest entry) is not a plain path inside a folder, or None."""
    problem = path_problem(entry)
    if problem:
        return problem
    if entry.startswith("/"):
        return "is an absolute path"
    if any(part in ("", ".", "..") for part in entry.split("/")):
        return "is not a plain path inside the folder (it has a '.', '..' or empty part)"
    if entry == MANIFEST:
        return "is the manifest itself"
    return None


def _shown(entry) -> str:
    text = repr(entry)
    return text if len(text) <= 80 else text[:60] + "...'"


@dataclasses.dataclass(frozen=True)
class Manifest:
    """A folder's manifest, read: the files listed, the folders being saved, and ``problem``: why
    it vouches for nothing (unreadable, another shape, an entry that is not a plain relative path)."""
    files: frozenset[str] = frozenset()
    saving: frozenset[str] = frozenset()
    problem: str | None = None

    def owns(self, relative: str) -> bool:
        """Whether the file at ``relative`` (a path below the folder) is the run's."""
        if self.problem:
            return False
        if relative in self.files:
            return True
        parent, _, name = relative.rpartition("/")
        return parent in self.saving and SAVED_NAME.fullmatch(name) is not None and not is_temporary(name)


def read_manifest(folder: str | os.PathLike) -> Manifest | None:
    """``folder``'s manifest, or None where it has none."""
    path = Path(folder) / MANIFEST
    try:
        info = path.lstat()
    except FileNotFoundError:
        return None
    except OSError as exc:
        return Manifest(problem=f"{MANIFEST} cannot be read ({exc.strerror or exc})")
    if not stat.S_ISREG(info.st_mode):
        return Manifest(problem=f"{MANIFEST} is not a regular file")
    if info.st_size > MANIFEST_MAX_BYTES:
        return Manifest(problem=f"{MANIFEST} is larger than a manifest can be")
    try:
        data = json.loads(path.read_bytes())
    except (OSError, ValueError, RecursionError):
        return Manifest(problem=f"{MANIFEST} is damaged (not JSON)")
    if not (isinstance(data, dict) and set(data) <= {"files", "saving"} and isinstance(data.get("files"), list)
            and isinstance(data.get("saving", []), list)):
        return Manifest(problem=f'{MANIFEST} is not {{"files": [...], "saving": [...]}}')
    for entry in data["files"] + data.get("saving", []):
        problem = entry_problem(entry)
        if problem:
            return Manifest(problem=f"{MANIFEST} lists {_shown(entry)}, which {problem}")
    return Manifest(frozenset(data["files"]), frozenset(data.get("saving", [])))


def written(folder: str | os.PathLike) -> set[str] | None:
    """The files the manifest of ``folder`` lists, or None for a folder without a manifest (an
    empty set where the manifest vouches for nothing)."""
    manifest = read_manifest(folder)
    return None if manifest is None else set(manifest.files if not manifest.problem else ())


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


def unlisted(folder: Path, manifest: Manifest, below: str = "") -> list[str]:
    """The files below ``folder`` (only those under the relative path prefix ``below``, when
    given) that ``manifest`` does not vouch for: a person's, sorted."""
    return sorted(path for path in files_under(folder) if path.startswith(below) and not manifest.owns(path))


def _write(folder: Path, files: Iterable[str], saving: Iterable[str]) -> None:
    write_text_atomic(folder / MANIFEST, json.dumps({"files": sorted(files), "saving": sorted(saving)}, indent=0)
                      + "\n", overwrite=True)


def _relative(folder: Path, path: str | os.PathLike) -> str:
    """``path`` as an entry of ``folder``'s manifest: a relative ``path`` is taken as relative to
    the folder (never to the current directory), an absolute one must lie inside it."""
    path = Path(path)
    if path.is_absolute():
        path = Path(os.path.relpath(path, Path(folder).absolute()))
    entry = path.as_posix()
    problem = entry_problem(entry)
    if problem:
        raise MechEvalError(f"cannot record {entry!r} as written into {folder}: it {problem}")
    return entry


def _current(folder: Path) -> Manifest:
    manifest = read_manifest(folder)
    return Manifest() if manifest is None or manifest.problem else manifest    # a damaged one is started afresh


def add_written(folder: str | os.PathLike, paths: Iterable[str | os.PathLike]) -> None:
    """Record ``paths`` (relative to ``folder``, or absolute inside it) as written by the run;
    call it *before* writing them, so that a write cut short is the run's all the same. Listed
    temporaries whose write has finished (they are gone) are dropped."""
    folder = Path(folder)
    new = {_relative(folder, p) for p in paths}
    manifest = _current(folder)
    kept = {f for f in manifest.files if not (is_temporary(f.rpartition("/")[2]) and not os.path.lexists(folder / f))}
    _write(folder, kept | new, manifest.saving)


def write_run_file(folder: str | os.PathLike, name: str, text: str) -> None:
    """Write the text file ``name`` (relative to the run folder ``folder``) atomically, its name
    and its temporary recorded in the manifest before either is created."""
    folder = Path(folder)
    tmp = temporary_beside(folder / name)
    add_written(folder, [name, tmp.relative_to(folder)])
    write_text_atomic(folder / name, text, overwrite=True, temporary=tmp)
    add_written(folder, [])                 # the temporary, renamed, leaves the list


@contextlib.contextmanager
def recording(folder: str | os.PathLike, saving: str | None = None, expected: Iterable[str] = ()):
    """Record every file below ``folder`` that the enclosed code creates or changes (also when it
    fails part-way). Recorded before it starts, so that a save stopped by a SIGKILL is the run's
    too: ``saving``, the subfolder (relative) it saves into, is marked; ``expected``, the names
    (relative) it may write, are listed (those it did not write are dropped again at its end)."""
    folder = Path(folder)
    before = files_under(folder) if folder.is_dir() else {}
    mark = _relative(folder, saving) if saving is not None else None
    expected = {_relative(folder, name) for name in expected}
    if mark is not None or expected:
        manifest = _current(folder)
        _write(folder, manifest.files | expected, manifest.saving | ({mark} if mark else set()))
    try:
        yield
    finally:        # a write cut short (a full disk) leaves files that are the run's all the same
        if folder.is_dir():
            present = files_under(folder)
            changed = {p for p, signature in present.items() if before.get(p) != signature}
            if changed or mark is not None or expected:
                manifest = _current(folder)
                unwritten = {name for name in expected if name not in present}
                _write(folder, (manifest.files | changed) - unwritten, manifest.saving - {mark})


# ---------------------------------------------------------------------------------- removal
def removal_plan(folder: Path, entries: Iterable[str], manifest: Manifest | None = None) -> list[str]:
    """The ``entries`` (relative paths) that exist below ``folder``, each checked before anything
    is removed: a plain relative path that resolves, without following any link, to a regular
    file strictly inside ``folder``. Anything else is one ``MechEvalError`` naming the entry."""
    folder = Path(folder)
    plan = []
    for entry in sorted(entries):
        problem = entry_problem(entry)
        if problem:
            raise MechEvalError(f"{folder} is not only the run's: its {MANIFEST} lists {_shown(entry)}, which {problem}")
        place = folder
        kind = None
        for i, part in enumerate(entry.split("/")):
            place = place / part
            try:
                mode = place.lstat().st_mode
            except (FileNotFoundError, NotADirectoryError):
                kind = "missing"
                break
            if stat.S_ISLNK(mode):
                kind = "a link" if i == entry.count("/") else f"reached through the link {place.relative_to(folder)}"
                break
            if i < entry.count("/") and not stat.S_ISDIR(mode):
                kind = "missing"
                break
            if i == entry.count("/"):
                kind = "file" if stat.S_ISREG(mode) else "a folder" if stat.S_ISDIR(mode) else "not a regular file"
        if kind == "file":
            plan.append(entry)
        elif kind != "missing":
            raise MechEvalError(f"{folder} is not only the run's: {entry} is {kind}, and only the run's own files are "
                                "ever removed; move it, or choose another folder")
    return plan


def _unlink_inside(folder: Path, entry: str) -> None:
    """Remove the regular file ``entry`` below ``folder``, walking down by descriptors that refuse
    links: a folder swapped for a link meanwhile is not followed (the entry is then left alone)."""
    parts = entry.split("/")
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        for part in parts[:-1]:
            inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
            os.close(fd)
            fd = inner
        if stat.S_ISREG(os.stat(parts[-1], dir_fd=fd, follow_symlinks=False).st_mode):
            os.unlink(parts[-1], dir_fd=fd)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        if exc.errno != 40:       # ELOOP: a link where a folder was, left alone
            raise
    finally:
        os.close(fd)


def remove_files(folder: Path, entries: Iterable[str]) -> None:
    """Remove ``entries`` (checked first, all of them: ``removal_plan``), then the folders they
    leave empty, deepest first. ``folder`` itself stays."""
    folder = Path(folder)
    plan = removal_plan(folder, entries)
    for entry in plan:
        _unlink_inside(folder, entry)
    parents = {"/".join(e.split("/")[:i]) for e in plan for i in range(1, e.count("/") + 1)}
    for parent in sorted(parents, key=lambda p: -p.count("/")):
        place = folder / parent
        with contextlib.suppress(OSError):           # not empty (a person's file), or gone: it stays
            if place.is_dir() and not place.is_symlink():
                place.rmdir()


def remove_written(folder: Path, manifest: Manifest) -> None:
    """Delete the run's files below ``folder`` (what ``manifest`` lists, and the saved files of
    folders whose saving began), then the folders they leave empty, then the manifest."""
    remove_written_below(folder, manifest)
    with contextlib.suppress(FileNotFoundError):
        (folder / MANIFEST).unlink()


def remove_written_below(folder: Path, manifest: Manifest, below: str = "") -> None:
    """``remove_written`` without removing the manifest, for the files under the relative prefix
    ``below`` only (all: ""). Refused (nothing removed) where a file there is not the run's."""
    if manifest.problem:
        raise MechEvalError(f"{folder} is not only the run's: {manifest.problem}; move its files, or choose another folder")
    foreign = unlisted(folder, manifest, below)
    if foreign:
        raise MechEvalError(f"{folder} holds {some_of(foreign)}, which the run did not write; move it, or choose "
                            "another folder")
    saved = [p for p in files_under(folder) if p.startswith(below) and manifest.owns(p) and p not in manifest.files]
    remove_files(folder, [f for f in manifest.files if f.startswith(below)] + saved)


def claim_output_folder(out: Path, overwrite: bool, flag: str = "--overwrite", beside: str | None = None) -> None:
    """Before a command writes its files into the folder ``out`` (``--out``): refuse when ``out``
    holds files hf-mecheval did not write there (its manifest does not list them), unless
    ``overwrite``: a report or a grid would replace a person's file of the same name (a link of
    that name is replaced by the file, never written through: ``atomic_files``). ``beside``: a
    subfolder of ``out`` the command does not write into itself (the quickstart's ``runs``, each
    run vouched for by its own manifest), left out of the claim."""
    if os.path.lexists(out) and not out.is_dir():
        raise MechEvalError(f"cannot write to {out}: it is a file, not a folder")        # as writable_folder says
    if not out.is_dir():
        return
    if not overwrite:
        foreign = unlisted(out, read_manifest(out) or Manifest(problem="none"))
        if beside is not None:
            foreign = [p for p in foreign if not p.startswith(beside.rstrip("/") + "/")]
        if foreign:
            raise MechEvalError(f"{out} holds files hf-mecheval did not write there ({some_of(foreign)}); choose another "
                                f"folder, or pass {flag} to write beside them (files of the same name are replaced)")
