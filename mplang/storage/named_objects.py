"""Named objects: tensors a party's owner uploaded to its own worker (``mplang put``),
which programs read with ``simp.load(party, name)``.

Each object keeps a count of the executions that used it, so a party's policy can
limit how often one input takes part in a computation.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from mplang.edsl.errors import MPRuntimeError
from mplang.edsl.typing import DTYPES, TensorType
from mplang.storage.data_root import MissingData

NAME = re.compile(r"[A-Za-z0-9_.-]{1,128}")
"""A valid object name: 1 to 128 letters, digits or ``_.-``."""


def check_name(name: Any, op: str = "simp.load") -> str:
    """``name`` if it is a valid object name, else an `MPRuntimeError` saying why."""
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise MPRuntimeError(f"{op}: object name {name!r} is not 1 to 128 letters, digits "
                             "or '_.-'")
    return name


@dataclass
class _Entry:
    array: np.ndarray
    type: TensorType
    uses: int = 0
    executions: set[str] = field(default_factory=set)


class NamedObjects:
    """One worker's uploaded tensors by name (thread-safe); ``node`` names the worker in
    errors."""

    def __init__(self, node: str = "this node"):
        self.node = node
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()

    def put(self, name: str, array: Any) -> TensorType:
        """Store ``array`` (read-only copy) as ``name``, replacing an object of that name
        (its use count starts again at 0); returns its type."""
        check_name(name, "upload")
        arr = np.array(array)
        if arr.dtype.hasobject or arr.dtype.name not in DTYPES:
            raise MPRuntimeError(f"upload: {name!r} has dtype {arr.dtype}; only numeric and "
                                 "bool tensors can be uploaded")
        arr.setflags(write=False)
        vtype = TensorType(arr.dtype.name, tuple(arr.shape))
        with self._lock:
            self._entries[name] = _Entry(arr, vtype)
        return vtype

    def _entry(self, name: str) -> _Entry:
        check_name(name)
        with self._lock:
            entry = self._entries.get(name)
        if entry is None:
            raise MissingData(f"simp.load: {self.node} has no uploaded object {name!r}")
        return entry

    def get(self, name: str) -> np.ndarray:
        """The array stored as ``name``."""
        return self._entry(name).array

    def describe(self, name: str) -> TensorType:
        """The type of the object stored as ``name``."""
        return self._entry(name).type

    def record_use(self, name: str, exec_id: str | None = None) -> int:
        """Count execution ``exec_id`` as a use of ``name`` (once per execution; None: a use
        of its own); returns the new count."""
        entry = self._entry(name)
        with self._lock:
            if exec_id is None or exec_id not in entry.executions:
                entry.uses += 1
                if exec_id is not None:
                    entry.executions.add(exec_id)
            return entry.uses

    def uses(self, name: str) -> int:
        """How many executions have used ``name`` since it was uploaded."""
        return self._entry(name).uses

    def names(self) -> list[str]:
        with self._lock:
            return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._entries
