"""Atomic file output: write to a temporary file beside the target, then rename, so a reader
never sees a half-written file and a crash never destroys a previous good copy. Locks, so that
two processes never write one output. And JSON input checked against the shape the caller relies
on, so a damaged file is named in one clear error instead of a KeyError deep inside whatever reads it."""
from __future__ import annotations

import contextlib
import errno
import json
import math
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


def _new_temporary_file(path: Path) -> Path:
    """An empty temporary file beside ``path``. It gets the mode of a new file (0666 less the
    umask: mkstemp's 0600 would make every output private) or, when ``path`` exists, ``path``'s
    own mode, so that replacing a file keeps who may read it."""
    for _ in range(100):
        tmp = temporary_beside(path)
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
def atomic_path(path: str | os.PathLike, overwrite: bool = False):
    """Yields a temporary path; on success it is renamed to ``path``.

    Refuses (``MechEvalError``) when ``path`` exists and ``overwrite`` is false (checked again
    at the rename: a file that appeared meanwhile is not replaced), or when the folder cannot
    be written."""
    path = Path(path)
    if path.is_dir():
        raise MechEvalError(f"{path} is a folder; give a file name")
    refuse_special_file(path)
    if path.exists() and not overwrite:
        raise MechEvalError(f"{path} already exists; pass --overwrite to replace it")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = _new_temporary_file(path)
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


def write_text_atomic(path: str | os.PathLike, text: str, overwrite: bool = False) -> None:
    with atomic_path(path, overwrite) as tmp:
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


# ------------------------------------------------------------------------------ locks
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


# ------------------------------------------------------------------------------ JSON input
def non_finite(value, where: str = "") -> str | None:
    """The dotted place of the first NaN or infinite number inside ``value`` (dicts, lists,
    numbers), or None. ``where``: the place of ``value`` itself."""
    if isinstance(value, float) and not math.isfinite(value):
        return where or "the value"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else ()
    for key, item in items:
        found = non_finite(item, f"{where}.{key}" if where and isinstance(key, str) else
                           f"{where}[{key}]" if where else str(key))
        if found:
            return found
    return None


def refuse_non_finite(value, source: str) -> None:
    """One clear error when input read from ``source`` (a file, a flag) holds NaN or infinity,
    which YAML (.nan, .inf) and Python's JSON (NaN, Infinity) read as numbers."""
    place = non_finite(value)
    if place:
        raise MechEvalError(f"{source}: {place} is not a finite number (NaN and infinity are not allowed)")


def loads_finite(text: str, source: str):
    """``json.loads`` for input: NaN and Infinity, which Python's JSON accepts, are refused, and
    so is nesting deeper than ``MAX_NESTING``."""
    def refuse(constant):
        raise MechEvalError(f"{source}: {constant} is not a finite number (NaN and infinity are not allowed)")

    def number(text):                    # 1e999 reads as infinity
        value = float(text)
        return value if math.isfinite(value) else refuse(text)
    try:
        value = json.loads(text, parse_constant=refuse, parse_float=number)
    except RecursionError:
        raise MechEvalError(f"{source}: nested more than {MAX_NESTING} levels deep") from None
    _check_shape_size(value, _value_children, source)
    return value


MAX_NESTING = 64            # levels of lists and mappings in any input file or flag: far more than any config has
MAX_INPUT_VALUES = 100_000  # values in one input document, aliases expanded


def load_yaml(text: str, source: str):
    """``yaml.safe_load`` for input, refusing a document whose aliases would expand to more than
    ``MAX_INPUT_VALUES`` values (an "anchor bomb": 9 aliases of 9 aliases ... is 9^9 values to
    walk), a recursive alias, or nesting deeper than ``MAX_NESTING`` — checked on the composed
    nodes, before any value is built."""
    import yaml

    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_shape_size(node, _node_children, source)
        return loader.construct_document(node)
    except RecursionError:
        raise MechEvalError(f"{source}: nested more than {MAX_NESTING} levels deep") from None
    finally:
        loader.dispose()


def _node_children(node) -> list:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _value_children(value) -> list:
    if isinstance(value, dict):
        return list(value.values())
    return list(value) if isinstance(value, list) else []


_END = object()


def _check_shape_size(root, children, source: str) -> None:
    """Refuse ``root`` when, expanded as a tree, it holds more than ``MAX_INPUT_VALUES`` values,
    nests deeper than ``MAX_NESTING``, or contains itself. Shared parts (YAML aliases) are sized
    once each (depth first, without recursion), so a bomb is found in time linear in its text."""
    size: dict[int, int] = {}
    height: dict[int, int] = {}
    open_ = {id(root)}
    first = children(root)
    stack = [(root, first, iter(first))]      # (node, its children, those not yet visited)
    while stack:
        node, kids, pending = stack[-1]
        child = next(pending, _END)
        if child is not _END:
            if id(child) in open_:
                raise MechEvalError(f"{source}: a recursive alias (a value that contains itself)")
            if id(child) not in size:
                open_.add(id(child))
                grandchildren = children(child)
                stack.append((child, grandchildren, iter(grandchildren)))
                if len(stack) > MAX_NESTING:
                    raise MechEvalError(f"{source}: nested more than {MAX_NESTING} levels deep")
            continue
        stack.pop()
        open_.discard(id(node))
        size[id(node)] = 1 + sum(size[id(c)] for c in kids)
        height[id(node)] = 1 + max((height[id(c)] for c in kids), default=0)
        if size[id(node)] > MAX_INPUT_VALUES:
            raise MechEvalError(f"{source}: more than {MAX_INPUT_VALUES:,} values once its aliases are expanded")
        if height[id(node)] > MAX_NESTING:
            raise MechEvalError(f"{source}: nested more than {MAX_NESTING} levels deep")


NUMBER = (int, float)
OPTIONAL_NUMBER = (int, float, type(None))
_JSON_NAMES = {dict: "an object", list: "an array", str: "a string", int: "an integer", float: "a number",
               bool: "true/false", type(None): "null"}


def _json_name(kind) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    kinds = [k for k in kinds if not (k is int and float in kinds)]      # JSON has one kind of number
    return " or ".join(_JSON_NAMES.get(k, k.__name__) for k in kinds)


def _place(where: str) -> str:
    return f'"{where}"' if where else "the top level"


class between:
    """A shape: a number (not true/false) from ``low`` to ``high``, e.g. an accuracy."""

    def __init__(self, low: float, high: float):
        self.low, self.high = low, high


FRACTION = between(0, 1)


class maybe:
    """In a dict shape: a key that may be missing, whose value has ``shape`` when present."""

    def __init__(self, shape):
        self.shape = shape


def shape_problem(value, shape, where: str = "") -> str | None:
    """What is wrong with ``value`` against ``shape``, or None.

    ``shape`` is ``object`` (anything), a type or tuple of types, a dict of required keys (each
    with its own shape, or ``maybe(shape)`` for an optional one; other keys are allowed) or
    ``[item shape]`` for a non-empty array. ``where`` is the dotted path of ``value`` in the
    file, used in the message."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{_place(where)} should be an object, not {_json_name(type(value))}"
        for key, inner in shape.items():
            inner_where = f"{where}.{key}" if where else key
            if key not in value:
                if isinstance(inner, maybe):
                    continue
                return f'"{inner_where}" is missing'
            inner = inner.shape if isinstance(inner, maybe) else inner
            problem = shape_problem(value[key], inner, inner_where)
            if problem:
                return problem
        return None
    if isinstance(shape, list):
        if not isinstance(value, list) or not value:
            what = "an empty array" if isinstance(value, list) else _json_name(type(value))
            return f"{_place(where)} should be a non-empty array, not {what}"
        for i, item in enumerate(value):
            problem = shape_problem(item, shape[0], f"{where}[{i}]")
            if problem:
                return problem
        return None
    if isinstance(shape, between):
        wanted = f"{_place(where)} should be a number from {shape.low} to {shape.high}"
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{wanted}, not {_json_name(type(value))}"
        if not shape.low <= value <= shape.high:          # (NaN compares false too)
            return f"{wanted}, not {value}"
        return None
    if shape is object or isinstance(value, shape):
        return None
    return f"{_place(where)} should be {_json_name(shape)}, not {_json_name(type(value))}"


def read_json(path: str | os.PathLike, shape=object):
    """The JSON value in ``path``, checked against ``shape`` (see ``shape_problem``).

    Every way the file can be bad (missing, unreadable, not JSON, another shape) is one
    ``MechEvalError`` that names the file and what is wrong."""
    path = Path(path)
    try:
        value = json.loads(path.read_text())
    except FileNotFoundError:
        raise MechEvalError(f"{path} is missing") from None
    except OSError as exc:
        raise MechEvalError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MechEvalError(f"{path} is not valid JSON ({exc})") from None
    problem = shape_problem(value, shape)
    if problem:
        raise MechEvalError(f"{path}: {problem}")
    return value
