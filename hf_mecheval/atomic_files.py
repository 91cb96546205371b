"""Atomic file output: write to a temporary file beside the target, then rename, so a reader
never sees a half-written file and a crash never destroys a previous good copy; the names of
those temporaries, the mode new files get, and a folder checked writable before any work.
"""
from __future__ import annotations

import contextlib
import errno
import os
import re
import secrets
import stat
import tempfile
from pathlib import Path

from .errors import MechEvalError


# Temporaries are named ".NAME.XXXXXXXX.tmp" beside their target (folders staged beside their
# target too). A killed process leaves them behind: uploads leave them out (these patterns, in
# huggingface_hub's fnmatch syntax, where "*" also matches "/"), and commands that own a folder
# remove stale ones.
TEMPORARY_PATTERNS = [".*.tmp", "*/.*.tmp", ".*.tmp/*", "*/.*.tmp/*"]
_TEMPORARY_NAME = re.compile(r"\..+\.[A-Za-z0-9_]{8}\.tmp")


def is_temporary(name: str) -> bool:
    """Whether ``name`` is a temporary's (``.NAME.XXXXXXXX.tmp``, as this module and mkstemp name them)."""
    return _TEMPORARY_NAME.fullmatch(name) is not None


def temporary_beside(path: str | os.PathLike) -> Path:
    """A fresh name ``.NAME.XXXXXXXX.tmp`` beside ``path`` (nothing is created)."""
    path = Path(path)
    return path.parent / f".{path.name}.{secrets.token_hex(4)}.tmp"


def _new_temporary_file(path: Path, name: Path | None = None) -> Path:
    """An empty temporary file beside ``path`` (named ``name`` when given: a name chosen, and
    recorded, beforehand). It gets the mode of a new file (0666 less the umask: mkstemp's 0600
    would make every output private) or, when ``path`` exists, ``path``'s own mode, so that
    replacing a file keeps who may read it."""
    for _ in range(1 if name is not None else 100):
        tmp = name if name is not None else temporary_beside(path)
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        try:
            if path.exists():
                os.fchmod(fd, stat.S_IMODE(path.stat().st_mode))
        finally:
            os.close(fd)
        return tmp
    raise FileExistsError(errno.EEXIST, "no free temporary name", str(path))


def new_file_mode() -> int:
    """The mode a new file gets here: 0666 less the process's umask."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def give_new_file_mode(paths) -> None:
    """Set ``paths`` (files) to ``new_file_mode()``: for files a library wrote private (safetensors
    writes its files 0600, whatever the umask), so that a run folder reads like any other output."""
    mode = new_file_mode()
    for path in paths:
        os.chmod(path, mode)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, overwrite: bool = False, temporary: Path | None = None):
    """Yields a temporary path; on success it is renamed to ``path``.

    Refuses (``MechEvalError``) when ``path`` exists and ``overwrite`` is false (checked again
    at the rename: a file that appeared meanwhile is not replaced), or when the folder cannot
    be written. ``temporary``: the temporary's name, chosen beforehand (``temporary_beside``)."""
    path = Path(path)
    if path.is_dir():
        raise MechEvalError(f"{path} is a folder; give a file name")
    refuse_special_file(path)
    if path.exists() and not overwrite:
        raise MechEvalError(f"{path} already exists; pass --overwrite to replace it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _new_temporary_file(path, temporary)
    except OSError as exc:
        raise MechEvalError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        yield tmp
        if overwrite:
            os.replace(tmp, path)
        else:
            _rename_no_replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def refuse_special_file(path: Path) -> None:
    """Refuse to write over ``path`` when it is not a regular file: a device (``/dev/null``), a
    FIFO or a socket is never replaced by a file, even with ``--overwrite``."""
    try:
        mode = path.lstat().st_mode
    except OSError:
        return                               # missing (or unreadable: the write will say so)
    if not (stat.S_ISREG(mode) or stat.S_ISLNK(mode) or stat.S_ISDIR(mode)):
        kind = ("a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a FIFO" if stat.S_ISFIFO(mode)
                else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")
        raise MechEvalError(f"{path} is {kind}, not a regular file; give a file name to write")


def _rename_no_replace(tmp: Path, path: Path) -> None:
    """Rename ``tmp`` to ``path`` unless ``path`` exists, atomically where the file system has
    hard links (a link fails on an existing name; a rename would replace it)."""
    try:
        os.link(tmp, path)
    except FileExistsError:
        raise MechEvalError(f"{path} already exists; pass --overwrite to replace it") from None
    except OSError:                      # no hard links here: check, then rename
        if path.exists():
            raise MechEvalError(f"{path} already exists; pass --overwrite to replace it") from None
        os.replace(tmp, path)
    else:
        os.unlink(tmp)


def write_text_atomic(path: str | os.PathLike, text: str, overwrite: bool = False,
                      temporary: Path | None = None) -> None:
    with atomic_path(path, overwrite, temporary) as tmp:
        tmp.write_text(text)


def write_parquet_atomic(table, path: str | os.PathLike, overwrite: bool = False) -> None:
    import pyarrow.parquet as pq

    with atomic_path(path, overwrite) as tmp:
        pq.write_table(table, tmp)


def writable_folder(path: str | os.PathLike) -> Path:
    """Create the output folder ``path`` (if needed) and make sure files can be written in it.

    Commands that compute for a long time call this first, so a bad output location fails in
    a second rather than after the work."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise MechEvalError(f"cannot write to {path}: it is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".probe.", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise MechEvalError(f"cannot write to {path}: {exc.strerror or exc}") from None
    return path
