"""`LRUCache`: a bounded mapping that evicts the least recently used entry."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any


class LRUCache(OrderedDict[Any, Any]):
    """A bounded mapping that evicts the least recently used entry."""

    def __init__(self, limit: int):
        super().__init__()
        self.limit = limit

    def lookup(self, key: Any) -> Any:
        """The value stored under ``key`` (None if absent), marked as recently used."""
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value

    def store(self, key: Any, value: Any) -> None:
        """Store ``value`` under ``key``, evicting the oldest entry past the limit."""
        self[key] = value
        if len(self) > self.limit:
            self.popitem(last=False)
