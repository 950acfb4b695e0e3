"""Bounded, inspectable compile caches keyed by signature, with an opt-in determinism check.

A frontend op that compiles (``tensor.run_jax`` exports StableHLO; a secure
device's dialect compiles for its engine) keeps its results in a `CompileCache`. The key is the
op's signature: the function, its static arguments and its input types. Only
plain data may be cached (bytes, types, tree definitions), never MPLang objects.

With the determinism check on (`determinism_check`), a miss compiles twice and
raises `FeDeterminismError` when the two results differ.
"""

from __future__ import annotations

import contextlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from mplang.edsl.errors import FeDeterminismError, FeStateError
from mplang.frontend.feop import holds_mplang_object

V = TypeVar("V")
_MISSING: Any = object()

_CHECK = threading.local()


@contextlib.contextmanager
def determinism_check(enabled: bool = True) -> Iterator[None]:
    """Within the block (this thread), every cache miss compiles twice and compares."""
    previous = getattr(_CHECK, "on", False)
    _CHECK.on = enabled
    try:
        yield
    finally:
        _CHECK.on = previous


def _checking() -> bool:
    return bool(getattr(_CHECK, "on", False))


@dataclass(frozen=True)
class CacheStats:
    """A snapshot of one cache."""

    name: str
    size: int
    limit: int
    hits: int
    misses: int


class CompileCache(Generic[V]):
    """A thread-safe LRU map from signatures to compiled artifacts.

    ``same(a, b)`` decides whether two compilations of one signature agree (the
    determinism check); the default compares with ``==``.
    """

    def __init__(self, name: str, limit: int,
                 same: Callable[[V, V], bool] | None = None):
        if limit < 1:
            raise ValueError("a compile cache holds at least one entry")
        self.name = name
        self.limit = limit
        self._same = same or (lambda a, b: bool(a == b))
        self._entries: OrderedDict[Hashable, V] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        _CACHES[name] = self

    def get_or_compile(self, key: Hashable | None, compile: Callable[[], V],
                       what: str = "") -> V:
        """The cached value of ``key``, compiled on a miss; ``key=None`` never caches."""
        if key is not None:
            try:
                value = self._entries.get(key, _MISSING)
            except TypeError:  # an unhashable signature: compile without caching
                key = None
            else:
                if value is not _MISSING:
                    # lock-free hit (the tracing hot path); the LRU order and the hit
                    # count are best effort while several threads trace at once
                    try:  # noqa: SIM105 - contextlib.suppress costs an object per hit
                        self._entries.move_to_end(key)
                    except KeyError:  # evicted by another thread meanwhile
                        pass
                    self.hits += 1
                    return value
        # Both compilations run from this one call site: compilers that record their
        # caller's stack (JAX puts it in the StableHLO locations) see the same stack.
        runs = [compile() for _ in range(2 if _checking() else 1)]
        value = runs[0]
        _check_plain(self.name, value)
        if len(runs) == 2:
            again = runs[1]
            if not self._same(value, again):
                raise FeDeterminismError(
                    f"{what or self.name}: compiling the same signature twice gave different "
                    "IR; the function depends on hidden state (globals, randomness, "
                    "iteration order): pass it as an argument or configuration")
        if key is not None:
            with self._lock:
                self.misses += 1
                self._entries[key] = value
                self._entries.move_to_end(key)
                while len(self._entries) > self.limit:
                    self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def stats(self) -> CacheStats:
        """The cache's size, limit, hits and misses now."""
        with self._lock:
            return CacheStats(self.name, len(self._entries), self.limit, self.hits, self.misses)

    def keys(self) -> list[Hashable]:
        """The cached signatures, least recently used first."""
        with self._lock:
            return list(self._entries)

    def clear(self) -> None:
        """Drop every entry and reset the hit and miss counts."""
        with self._lock:
            self._entries.clear()
            self.hits = self.misses = 0


def _check_plain(name: str, value: Any) -> None:
    """Refuse MPLang objects (runtime- or trace-bound) in process-wide caches."""
    if holds_mplang_object(value):
        raise FeStateError(f"compile cache {name!r}: an MPLang object cannot be cached "
                           "process-wide; keep runtime objects in context state")


_CACHES: dict[str, CompileCache[Any]] = {}


def compile_caches() -> dict[str, CacheStats]:
    """Stats of every compile cache, by name."""
    return {name: cache.stats() for name, cache in sorted(_CACHES.items())}
