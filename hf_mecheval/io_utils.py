"""Atomic file output: write to a temporary file beside the target, then rename, so a reader
never sees a half-written file and a crash never destroys a previous good copy."""
from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

from .errors import MechEvalError


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike, overwrite: bool = False):
    """Yields a temporary path; on success it is renamed to ``path``.

    Refuses (``MechEvalError``) when ``path`` exists and ``overwrite`` is false, or when the
    folder cannot be written."""
    path = Path(path)
    if path.exists() and not overwrite:
        raise MechEvalError(f"{path} already exists; pass --overwrite to replace it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
    except OSError as exc:
        raise MechEvalError(f"cannot write {path}: {exc.strerror or exc}") from None
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def write_text_atomic(path: str | os.PathLike, text: str, overwrite: bool = False) -> None:
    with atomic_path(path, overwrite) as tmp:
        tmp.write_text(text)


def write_parquet_atomic(table, path: str | os.PathLike, overwrite: bool = False) -> None:
    import pyarrow.parquet as pq

    with atomic_path(path, overwrite) as tmp:
        pq.write_table(table, tmp)
