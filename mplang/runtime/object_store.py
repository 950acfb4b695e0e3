"""A party's object store: values that outlive one execution, addressed by URI.

Names are unguessable (128 random bits) and each object is bound to the party
that created it (a driver's certificate fingerprint): only that party may read
or delete it.
"""

from __future__ import annotations

import secrets
import threading
from typing import Any

from mplang.edsl.errors import MPRuntimeError

LOCAL_OWNER = "local"
"""The owner of objects made by an in-process driver (the simulator)."""


class ObjectStore:
    """Thread-safe map from URIs (``mem://<node>/<random>``) to (owner, value)."""

    def __init__(self, node: str):
        self._node = node
        self._values: dict[str, tuple[str, Any]] = {}
        self._lock = threading.Lock()

    def put(self, value: Any, owner: str = LOCAL_OWNER) -> str:
        uri = f"mem://{self._node}/{secrets.token_hex(16)}"
        with self._lock:
            self._values[uri] = (owner, value)
        return uri

    def get(self, uri: str, owner: str = LOCAL_OWNER) -> Any:
        """The value at ``uri`` if ``owner`` created it; the same error either way
        otherwise, so a stranger learns nothing of other parties' objects."""
        with self._lock:
            entry = self._values.get(uri)
        if entry is None or entry[0] != owner:
            raise MPRuntimeError(f"object {uri[:200]} is not in the store of {self._node}")
        return entry[1]

    def delete(self, uri: str, owner: str = LOCAL_OWNER) -> bool:
        """Drop ``uri`` if ``owner`` created it; whether it did."""
        with self._lock:
            entry = self._values.get(uri)
            if entry is None or entry[0] != owner:
                return False
            del self._values[uri]
            return True

    def __contains__(self, uri: object) -> bool:
        with self._lock:
            return uri in self._values

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)
