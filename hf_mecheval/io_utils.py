"""Atomic file output: write to a temporary file beside the target, then rename, so a reader
never sees a half-written file and a crash never destroys a previous good copy. And JSON input
checked against the shape the caller relies on, so a damaged file is named in one clear error
instead of a KeyError deep inside whatever reads it."""
from __future__ import annotations

import contextlib
import json
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
    if path.is_dir():
        raise MechEvalError(f"{path} is a folder; give a file name")
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


# ------------------------------------------------------------------------------ JSON input
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


def shape_problem(value, shape, where: str = "") -> str | None:
    """What is wrong with ``value`` against ``shape``, or None.

    ``shape`` is ``object`` (anything), a type or tuple of types, a dict of required keys (each
    with its own shape; other keys are allowed) or ``[item shape]`` for a non-empty array.
    ``where`` is the dotted path of ``value`` in the file, used in the message."""
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{_place(where)} should be an object, not {_json_name(type(value))}"
        for key, inner in shape.items():
            inner_where = f"{where}.{key}" if where else key
            if key not in value:
                return f'"{inner_where}" is missing'
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
