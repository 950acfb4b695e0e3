"""Dialect backends: one registration per dialect gives its kernels for each
runtime and the per-worker state its kernels use.

A backend module creates its `DialectBackend` once at import time::

    backend = register_backend("mydialect")

    @backend.kernel("mydialect.op")
    def _run(interp, op, args, key): ...

    @backend.state
    def _state(env: WorkerEnv) -> MyState: ...

    @backend.payload_check("mydialect.op")
    def _check(op): ...  # raise MPSerializationError if op's native bytes are unsafe

Interpreters, workers and drivers read kernel tables and states from here;
nothing else lists dialects or op names. Value codecs for the wire are
registered with `mplang.backends.wire.register_value_codec`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from mplang.edsl.graph import Graph, Operation
from mplang.frontend.registry import get_op, is_registered, list_primitives
from mplang.runtime.interpreter import Kernel, KernelTable

KernelRuntime = Literal["worker", "driver", "launch"]
"""``worker``: a party's interpreter. ``driver``: the driver's interpreter in standard
mode. ``launch``: driver kernels that replace the ``driver`` ones in launch mode."""

Tag = tuple[str, str]
"""A message tag: (execution id, op key). Every message of a run carries one."""


class Communicator(Protocol):
    """Point-to-point messages between the parties of one world."""

    def send(self, dst: int, tag: Tag, value: Any) -> None:
        """Send ``value`` to party ``dst``, who receives it with `recv` and the same ``tag``."""
        ...

    def recv(self, src: int, tag: Tag, timeout: float | None = None) -> Any:
        """The message of ``src`` tagged ``tag``; waits at most ``timeout`` seconds
        (None: the communicator's default)."""
        ...


@dataclass(frozen=True)
class WorkerEnv:
    """What a dialect's state factory knows about the worker it serves.

    ``in_process``: every party of the world lives in this process (the
    simulator without a network model), so dialects may use in-memory links.
    """

    rank: int
    world_size: int
    communicator: Communicator
    timeout: float
    in_process: bool


StateFactory = Callable[[WorkerEnv], Any]
"""``factory(env)``: builds a dialect's state for the worker ``env`` describes."""
PayloadCheck = Callable[[Operation], None]
"""``check(op)`` raises `MPSerializationError`, naming the op, unless the native payloads
among ``op``'s attributes (bytes that C++ code parses) are safe to run."""


class DialectBackend:
    """The runtime half of one dialect: kernels per runtime and a worker state factory."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.tables: dict[KernelRuntime, KernelTable] = {
            "worker": KernelTable(), "driver": KernelTable(), "launch": KernelTable()}
        self.state_factory: StateFactory | None = None
        self.payload_checks: dict[str, PayloadCheck] = {}

    def kernel(self, name: str, *, runtime: KernelRuntime = "worker",
               override: bool = False) -> Callable[[Kernel], Kernel]:
        """Register the kernel of op ``name`` (an op of this dialect) for ``runtime``."""
        if not name.startswith(self.dialect + "."):
            raise ValueError(f"backend {self.dialect!r} cannot register a kernel for {name!r}")
        register = self.tables[runtime].register(name, override=override)

        def deco(kernel: Kernel) -> Kernel:
            register(kernel)
            _invalidate()
            return kernel

        return deco

    def state(self, factory: StateFactory) -> StateFactory:
        """Register the factory of this dialect's per-worker state (``interp.states[dialect]``)."""
        if self.state_factory is not None:
            raise ValueError(f"backend {self.dialect!r} already has a state factory")
        self.state_factory = factory
        return factory

    def payload_check(self, name: str) -> Callable[[PayloadCheck], PayloadCheck]:
        """Register the check of op ``name``'s native payloads (see `check_payloads`)."""
        if not name.startswith(self.dialect + ".") or name in self.payload_checks:
            raise ValueError(f"backend {self.dialect!r} cannot register a payload check "
                             f"for {name!r}")

        def deco(check: PayloadCheck) -> PayloadCheck:
            self.payload_checks[name] = check
            return check

        return deco


_BACKENDS: dict[str, DialectBackend] = {}
_LOCK = threading.Lock()
_MERGED: dict[KernelRuntime, KernelTable] = {}
_DRIVER_TABLES: dict[tuple[bool, Kernel], KernelTable] = {}


def register_backend(dialect: str) -> DialectBackend:
    """Create the backend of ``dialect``; a dialect has one backend."""
    with _LOCK:
        if dialect in _BACKENDS:
            raise ValueError(f"dialect {dialect!r} already has a backend")
        backend = _BACKENDS[dialect] = DialectBackend(dialect)
        _MERGED.clear()
        _DRIVER_TABLES.clear()
    return backend


def get_backend(dialect: str) -> DialectBackend | None:
    """The backend registered for ``dialect`` (None: it has none)."""
    return _BACKENDS.get(dialect)


def _invalidate() -> None:
    with _LOCK:
        _MERGED.clear()
        _DRIVER_TABLES.clear()


def _merged(runtime: KernelRuntime) -> KernelTable:
    with _LOCK:
        table = _MERGED.get(runtime)
        if table is None:
            table = KernelTable.merge(b.tables[runtime] for b in _BACKENDS.values())
            _MERGED[runtime] = table
        return table


def worker_kernels() -> KernelTable:
    """Every worker kernel registered so far; an op outside it is refused by workers."""
    return _merged("worker")


def _dispatch_fallback(dispatch: Kernel) -> Callable[[str], Kernel | None]:
    def resolve(name: str) -> Kernel | None:
        if is_registered(name) and get_op(name).execution_model == "multi_party":
            return dispatch
        return None

    return resolve


def driver_kernels(launch: bool, dispatch: Kernel) -> KernelTable:
    """The driver's kernel table: ``driver`` kernels (with ``launch`` overrides in launch
    mode); a multi-party op without a driver kernel goes to ``dispatch``, which runs it
    on the parties."""
    key = (launch, dispatch)
    table = _DRIVER_TABLES.get(key)
    if table is None:
        table = KernelTable(_merged("driver").items(), _dispatch_fallback(dispatch))
        if launch:
            table = table.with_overrides(_merged("launch"))
        with _LOCK:
            _DRIVER_TABLES[key] = table
    return table


def check_payloads(graph: Graph) -> None:
    """Run the payload check of every op of ``graph`` that has one (regions included).

    Workers call it on every program received from another process before running
    it; programs traced in this process need no check.
    """
    checks = {name: check for b in list(_BACKENDS.values())
              for name, check in b.payload_checks.items()}
    for op in graph.walk():
        check = checks.get(op.opcode)
        if check is not None:
            check(op)


class WorkerStates(dict[str, Any]):
    """One worker's dialect states, by dialect. A state is made by its dialect's factory
    on first use, so a plugin loaded after the worker started still gets its state."""

    def __init__(self, env: WorkerEnv, **given: Any):
        super().__init__(given)
        self.env = env
        self._lock = threading.Lock()

    def __missing__(self, dialect: str) -> Any:
        backend = _BACKENDS.get(dialect)
        if backend is None or backend.state_factory is None:
            raise KeyError(f"dialect {dialect!r} has no worker state (its backend registers "
                           "none, or its plugin is not loaded)")
        with self._lock:
            if dialect not in self:
                self[dialect] = backend.state_factory(self.env)
            return dict.__getitem__(self, dialect)


def missing_kernels() -> list[tuple[str, str]]:
    """``(op, runtime)`` for every registered op lacking a kernel its traits claim."""
    dispatch: Kernel = lambda interp, op, args, key: []  # noqa: E731 - resolution only
    tables = {"worker": worker_kernels(), "driver": driver_kernels(False, dispatch)}
    return [(info.name, runtime) for info in list_primitives() for runtime in info.traits.runtimes
            if tables[runtime].get(info.name) is None]
