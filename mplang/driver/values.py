"""Driver-side values: `HostVar` (where each party keeps its piece) and `DriverObject`."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mplang.edsl.object import MPObject
from mplang.edsl.typing import ValueType


@dataclass(frozen=True)
class HostVar:
    """One URI per party (``None`` where the party holds nothing)."""

    uris: tuple[str | None, ...]

    def holders(self) -> tuple[int, ...]:
        return tuple(r for r, u in enumerate(self.uris) if u is not None)


class DriverObject(MPObject):
    """A runtime value living on the parties of ``owner``; its data never passes the driver
    unless fetched. Parties free their pieces when the object is garbage collected."""

    __slots__ = ("__weakref__", "_device", "_type", "owner", "var")

    def __init__(self, owner: Any, var: HostVar, vtype: ValueType,
                 release: Callable[[Sequence[str | None]], None], device: str | None = None):
        self.owner = owner
        self.var = var
        self._type = vtype
        self._device = device
        weakref.finalize(self, release, var.uris)

    @property
    def mptype(self) -> ValueType:
        return self._type

    @property
    def device(self) -> str | None:
        return self._device

    def __repr__(self) -> str:
        where = f"on {self._device}" if self._device else f"held by {list(self.var.holders())}"
        return f"DriverObject({self._type}, {where})"
