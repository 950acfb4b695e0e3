"""The primitive registry: op name -> its declared `Primitive`, filled as dialects load.

Kept apart from `mplang.edsl.primitive` so the graph IR can resolve an op's primitive
without importing the tracer that primitives bind into.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mplang.edsl.primitive import Primitive

PRIMITIVES: dict[str, Primitive] = {}
"""Every declared primitive by name (a primitive adds itself when it is created)."""


def get_primitive(name: str) -> Primitive | None:
    """The primitive called ``name`` (None if no dialect declares it)."""
    return PRIMITIVES.get(name)


def primitive(name: str) -> Primitive:
    """The primitive called ``name``; KeyError naming it if none is declared."""
    prim = PRIMITIVES.get(name)
    if prim is None:
        raise KeyError(f"unknown primitive {name!r}")
    return prim


def primitives(dialect: str | None = None) -> list[Primitive]:
    """Every declared primitive (of one dialect if given), sorted by name."""
    return sorted((p for p in PRIMITIVES.values() if dialect is None or p.dialect == dialect),
                  key=lambda p: p.name)
