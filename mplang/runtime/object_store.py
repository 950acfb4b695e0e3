"""A party's object store: values that outlive one execution, addressed by URI."""

from __future__ import annotations

import itertools
import threading
from typing import Any

from mplang.frontend.errors import MPRuntimeError


class ObjectStore:
    """Thread-safe map from URIs (``mem://<owner>/<n>``) to values."""

    def __init__(self, owner: str):
        self._owner = owner
        self._values: dict[str, Any] = {}
        self._ids = itertools.count()
        self._lock = threading.Lock()

    def put(self, value: Any) -> str:
        uri = f"mem://{self._owner}/{next(self._ids)}"
        with self._lock:
            self._values[uri] = value
        return uri

    def get(self, uri: str) -> Any:
        with self._lock:
            try:
                return self._values[uri]
            except KeyError:
                raise MPRuntimeError(f"object {uri} is not in the store of {self._owner}") from None

    def delete(self, uri: str) -> None:
        with self._lock:
            self._values.pop(uri, None)

    def __contains__(self, uri: object) -> bool:
        with self._lock:
            return uri in self._values

    def __len__(self) -> int:
        with self._lock:
            return len(self._values)
