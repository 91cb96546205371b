"""Input read safely: numbers NaN and infinity refused wherever a file or flag is read, YAML and
JSON documents bounded in size and nesting (an alias bomb is refused before it is walked), and
JSON files checked against the shape the caller relies on, so a damaged file is named in one
clear error instead of a KeyError deep inside whatever reads it.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from .errors import ConfigError, MechEvalError


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
    def mapping(pairs):                  # json keeps the last of a key given twice, without a word
        value = dict(pairs)
        if len(value) < len(pairs):
            repeated = next(k for i, (k, _) in enumerate(pairs) if k in {key for key, _ in pairs[:i]})
            raise MechEvalError(f"{source}: the key {repeated!r} is given twice in one object (only one can count)")
        return value
    try:
        value = json.loads(text, parse_constant=refuse, parse_float=number, object_pairs_hook=mapping)
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

    try:
        loader = yaml.SafeLoader(text)       # refuses a control character here, before any parsing
    except yaml.YAMLError as exc:
        raise MechEvalError(f"{source}: not valid YAML: {(str(exc).splitlines() or [''])[0]}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_shape_size(node, _node_children, source)
        _refuse_repeated_keys(node, source)
        return loader.construct_document(node)
    except RecursionError:
        raise MechEvalError(f"{source}: nested more than {MAX_NESTING} levels deep") from None
    except yaml.YAMLError as exc:        # a syntax error: where, and what (an editor's half-saved file)
        mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        raise MechEvalError(f"{source}: not valid YAML: {where}{problem or (str(exc).splitlines() or [''])[0]}") from None
    finally:
        loader.dispose()


def _node_children(node) -> list:
    import yaml

    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []


def _refuse_repeated_keys(root, source: str) -> None:
    """Refuse a YAML mapping that gives one key twice: PyYAML keeps the last without a word, so
    ``defaults:`` written twice in a sweep file would drop the first. Each node is walked once
    (aliases share theirs); ``_check_shape_size`` has bounded them already."""
    import yaml

    seen, stack = set(), [root]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys = set()
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in keys:
                        raise MechEvalError(f"{source}: line {key.start_mark.line + 1}: the key {key.value!r} is given "
                                            "twice in one mapping (only one can count)")
                    keys.add((key.tag, key.value))
        stack.extend(_node_children(node))


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


NAME_MAX = 255               # bytes in one file name (Linux, macOS)
PATH_MAX = 4096              # bytes in a path


def path_problem(value) -> str | None:
    """Why ``value`` cannot name a file or folder here (not text, empty, a NUL character, a name
    or a path longer than file systems allow), or None."""
    if not isinstance(value, str):
        return "is not a path"
    if "\0" in value:
        return "holds a NUL character"
    if not value:
        return "is empty"
    try:
        parts = [os.fsencode(part) for part in value.split("/")]
    except UnicodeEncodeError:
        return "is not a file name"
    if any(len(part) > NAME_MAX for part in parts) or sum(len(p) + 1 for p in parts) > PATH_MAX:
        return "is longer than a path may be"
    return None


def check_path(field: str, value) -> None:
    """One ``ConfigError`` naming ``field`` where ``value`` cannot be a path (``path_problem``)."""
    problem = path_problem(value)
    if problem:
        shown = repr(value) if len(repr(value)) <= 80 else repr(value)[:60] + "...'"
        raise ConfigError(field, f"{shown} {problem}")
