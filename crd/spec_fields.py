"""How crd/spec.py reads the spec: a field reader that names the field of every wrong value, and the
base of the spec's sections (each readable from its own JSON with its schema defaults applied).

Why apart: the sections in crd/spec.py are many small declarations of what the operator reads; the
machinery they share (type checks, path names in errors, defaults for a fragment) is one concern and
reads better on its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Self

from crd.defaults import apply_schema_defaults, subschema

JsonDict = dict[str, Any]


class SpecError(ValueError):
    """A field the operator cannot read as its schema says."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


def real_number(value: int | float) -> float:
    """`value` as a float; an integer beyond a float's range saturates to infinity."""
    try:
        return float(value)
    except OverflowError:
        return math.inf


class Fields:
    """Reads one JSON object's fields, naming `path.field` in any error."""

    def __init__(self, raw: object, path: str) -> None:
        if not isinstance(raw, Mapping):
            raise SpecError(path, f"must be an object, got {type(raw).__name__}")
        self.raw: Mapping[str, Any] = raw
        self.path = path

    def _value(self, key: str) -> Any:
        return self.raw.get(key)

    def _present(self, key: str) -> Any:
        value = self.raw.get(key)
        if value is None:
            raise SpecError(f"{self.path}.{key}", "is required")
        return value

    def _wrong(self, key: str, expected: str) -> SpecError:
        return SpecError(f"{self.path}.{key}", f"must be {expected}, got {self.raw.get(key)!r:.80}")

    def integer(self, key: str) -> int:
        value = self._present(key)
        whole = isinstance(value, float) and math.isfinite(value) and value.is_integer()
        if isinstance(value, bool) or not (isinstance(value, int) or whole):
            raise self._wrong(key, "an integer")
        return int(value)

    def optional_integer(self, key: str) -> int | None:
        return None if self._value(key) is None else self.integer(key)

    def number(self, key: str) -> int | float:
        value = self._present(key)
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self._wrong(key, "a number")
        if isinstance(value, float) and not math.isfinite(value):
            raise self._wrong(key, "a finite number")
        return value

    def optional_number(self, key: str) -> int | float | None:
        return None if self._value(key) is None else self.number(key)

    def flag(self, key: str) -> bool:
        value = self._present(key)
        if not isinstance(value, bool):
            raise self._wrong(key, "true or false")
        return value

    def optional_flag(self, key: str) -> bool | None:
        return None if self._value(key) is None else self.flag(key)

    def text(self, key: str) -> str:
        value = self._present(key)
        if not isinstance(value, str):
            raise self._wrong(key, "a string")
        return value

    def optional_text(self, key: str) -> str | None:
        return None if self._value(key) is None else self.text(key)

    def texts(self, key: str) -> tuple[str, ...]:
        value = self._value(key) or []
        if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
            raise self._wrong(key, "a list of strings")
        return tuple(value)

    def integers(self, key: str) -> frozenset[int]:
        value = self._value(key) or []
        if not isinstance(value, list) or any(
            isinstance(item, bool) or not isinstance(item, int) for item in value
        ):
            raise self._wrong(key, "a list of integers")
        return frozenset(value)

    def objects(self, key: str) -> tuple[Mapping[str, Any], ...]:
        value = self._value(key) or []
        if not isinstance(value, list) or not all(isinstance(item, Mapping) for item in value):
            raise self._wrong(key, "a list of objects")
        return tuple(value)

    def mapping(self, key: str) -> Mapping[str, Any]:
        value = self._value(key) or {}
        if not isinstance(value, Mapping):
            raise self._wrong(key, "an object")
        return value

    def section(self, key: str) -> Fields:
        return Fields(self.mapping(key), f"{self.path}.{key}")


class Section:
    """A part of the spec that can be read from its own JSON, with its schema defaults applied."""

    SCHEMA_PATH: ClassVar[tuple[str, ...]]

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> Self:
        defaulted = apply_schema_defaults(dict(raw), subschema(*cls.SCHEMA_PATH))
        return cls.read(Fields(defaulted, ".".join(cls.SCHEMA_PATH)))

    @classmethod
    def read(cls, fields: Fields) -> Self:
        raise NotImplementedError
