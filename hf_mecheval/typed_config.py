"""Typed, strict configuration dataclasses.

Task, sweep and run configs derive from :class:`StrictConfig`: building one from a mapping
rejects unknown fields (naming them and listing the allowed ones), and every subclass
validates its values in ``validate`` so that errors name the field and the allowed range.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, TypeVar

from .errors import ConfigError

C = TypeVar("C", bound="StrictConfig")


@dataclasses.dataclass(frozen=True)
class StrictConfig:
    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:  # overridden by subclasses
        pass

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls: type[C], values: Mapping[str, Any]) -> C:
        allowed = cls.field_names()
        unknown = sorted(set(values) - set(allowed))
        if unknown:
            raise ConfigError(
                unknown[0], f"unknown field for {cls.__name__}; allowed fields: {', '.join(allowed)}"
            )
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        return {k: list(v) if isinstance(v, tuple) else v for k, v in out.items()}

    def replace(self: C, **changes: Any) -> C:
        unknown = sorted(set(changes) - set(self.field_names()))
        if unknown:
            raise ConfigError(
                unknown[0],
                f"unknown field for {type(self).__name__}; allowed fields: {', '.join(self.field_names())}",
            )
        return dataclasses.replace(self, **changes)


def check_int(field: str, value: Any, minimum: int | None = None, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(field, f"must be an integer, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(field, f"must be >= {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(field, f"must be <= {maximum}, got {value}")


def check_float(field: str, value: Any, minimum: float | None = None, maximum: float | None = None,
                exclusive_min: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(field, f"must be a number, got {value!r}")
    if not math.isfinite(value):
        raise ConfigError(field, f"must be a finite number, got {value}")
    if minimum is not None and (value <= minimum if exclusive_min else value < minimum):
        raise ConfigError(field, f"must be {'>' if exclusive_min else '>='} {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise ConfigError(field, f"must be <= {maximum}, got {value}")


def check_choice(field: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ConfigError(field, f"must be one of {', '.join(map(repr, allowed))}, got {value!r}")
