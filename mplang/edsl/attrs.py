"""Typed attributes: the schema of an op's attributes, which is also its configuration schema.

A `ConfigField` states one field's Python type, whether it is required, its
default and optional bounds or choices; a `ConfigSchema` names its fields.
Primitives declare their attributes with them (`Attr` is the same class), frontend
ops and device kinds validate user configuration with them.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mplang.edsl.errors import FeConfigError

NoneType = type(None)


def _type_names(types: type | tuple[type, ...]) -> list[str]:
    return [("None" if t is NoneType else t.__name__)
            for t in (types if isinstance(types, tuple) else (types,))]


@dataclass(frozen=True)
class ConfigField:
    """One field: its Python type(s) (``type(None)`` among them: may be None), whether it
    is required, its default, and optional bounds or choices."""

    type: type | tuple[type, ...]
    required: bool = False
    default: Any = None
    choices: tuple[Any, ...] | None = None
    min: Any = None
    max: Any = None
    doc: str = ""
    optional: bool = False
    """An op attribute left out of the op's attributes unless given (its default is not
    filled in, so ops that do not use it print and hash as before)."""

    @property
    def types(self) -> tuple[builtins.type, ...]:
        """The field's Python types as a tuple."""
        return self.type if isinstance(self.type, tuple) else (self.type,)

    @property
    def simple(self) -> bool:
        """Whether an instance of `types` that is not a bool always fits (no choices, no
        bounds, bool not among the types)."""
        return (self.choices is None and self.min is None and self.max is None
                and bool not in self.types)

    def problem(self, value: Any) -> str | None:
        """Why ``value`` does not fit this field (None: it fits)."""
        types = self.types
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            return f"must be {' or '.join(_type_names(self.type))}, got {value!r}"
        if self.choices is not None and value not in self.choices:
            return f"must be one of {list(self.choices)}, got {value!r}"
        if value is not None and ((self.min is not None and value < self.min)
                                  or (self.max is not None and value > self.max)):
            return f"must lie in [{self.min}, {self.max}], got {value!r}"
        return None

    def to_dict(self) -> dict[str, Any]:
        """The field as plain data (type names, required, default, choices, bounds, doc)."""
        return {"type": _type_names(self.type), "required": self.required,
                "default": plain(self.default),
                "choices": None if self.choices is None else [plain(c) for c in self.choices],
                "min": self.min, "max": self.max, "doc": self.doc}


Attr = ConfigField
"""An op attribute's declaration (the same schema as a configuration field)."""


def plain(value: Any) -> Any:
    """``value`` as data JSON can hold: dicts and lists of scalars (tuples as lists),
    anything else as its repr."""
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return repr(value)


@dataclass(frozen=True)
class ConfigSchema:
    """The configuration an op or device accepts, by field name; `validate` fills defaults."""

    fields: Mapping[str, ConfigField]

    def validate(self, op: str, config: Mapping[str, Any]) -> dict[str, Any]:
        """``config`` checked and completed; raise `FeConfigError` naming op and field."""
        unknown = sorted(set(config) - set(self.fields))
        if unknown:
            raise FeConfigError(f"{op}: unknown config field(s) {unknown}; the schema has "
                                f"{sorted(self.fields)}")
        out: dict[str, Any] = {}
        for name, spec in self.fields.items():
            if name not in config:
                if spec.required:
                    raise FeConfigError(f"{op}: config field {name!r} is required")
                out[name] = spec.default
                continue
            problem = spec.problem(config[name])
            if problem is not None:
                raise FeConfigError(f"{op}: config field {name!r} {problem}")
            out[name] = config[name]
        return out

    def to_dict(self) -> dict[str, Any]:
        """Each field as plain data (see `ConfigField.to_dict`)."""
        return {name: f.to_dict() for name, f in self.fields.items()}
