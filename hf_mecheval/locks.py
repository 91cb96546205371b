"""Locks, so that two processes never write one output (a run directory, a published dataset, a
file): held on an open file, they vanish with the process that holds them.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .errors import MechEvalError


# flock locks belong to an open file and vanish with the process that holds them, even when it
# is killed: a lock never outlives its writer, and nothing has to be cleaned up after a crash.
def _in_use(path: Path) -> MechEvalError:
    return MechEvalError(f"{path} is in use by another mecheval process; wait for it to finish (or stop it) "
                         "and try again")


def _try_lock(fd: int) -> bool:
    try:
        import fcntl
    except ImportError:                  # no flock on this platform: no protection, as before
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


@contextlib.contextmanager
def locked_folder(path: str | os.PathLike):
    """Hold an exclusive lock on the folder ``path`` (created if missing) for the block; another
    process asking for it meanwhile gets one clear error. The folder itself is locked, so its
    contents may be replaced freely; a folder created here and still empty at the end is removed."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise MechEvalError(f"{path} is a file, not a folder")
    created = not path.exists()
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError as exc:
        raise MechEvalError(f"cannot write to {path}: {exc.strerror or exc}") from None
    locked = False
    try:
        if not _try_lock(fd):
            raise _in_use(path)
        locked = True
        yield path
    finally:
        # only the holder may remove it: a process refused here may have "created" the folder in
        # the same instant as the one that holds it
        if created and locked:
            with contextlib.suppress(OSError):       # not empty (the normal case) or already gone
                path.rmdir()
        os.close(fd)


@contextlib.contextmanager
def locked_file(path: str | os.PathLike):
    """Hold an exclusive lock on the output file ``path`` (which may not exist yet) for the block,
    through a lock file ``.NAME.lock`` beside it, removed at the end. Whoever holds the lock holds
    it on the lock file that is at that name now (checked after locking), so removing it is safe."""
    path = Path(path)
    lock = path.parent / f".{path.name}.lock"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise MechEvalError(f"cannot write {path}: {exc.strerror or exc}") from None
    for _ in range(100):
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as exc:
            raise MechEvalError(f"cannot write {path}: {exc.strerror or exc}") from None
        if not _try_lock(fd):
            os.close(fd)
            raise _in_use(path)
        try:
            current = os.stat(lock).st_ino
        except FileNotFoundError:
            current = None
        if current == os.fstat(fd).st_ino:
            break
        os.close(fd)                     # the holder before us removed it as we opened it: again
    else:
        raise _in_use(path)
    try:
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(lock)
        os.close(fd)


def try_lock_file(path: str | os.PathLike) -> int | None:
    """An open descriptor holding an exclusive lock on the file ``path`` (created, with its folder,
    if missing), or None where another process holds it. The caller closes the descriptor to let
    go (or exits); the file stays, empty, for the next holder."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as exc:
        raise MechEvalError(f"cannot write {path}: {exc.strerror or exc}") from None
    if _try_lock(fd):
        return fd
    os.close(fd)
    return None
