"""Dialect backends: kernels register on their primitive, per runtime; a dialect's
backend adds the per-worker state its kernels use.

A backend module creates its `DialectBackend` once at import time::

    backend = register_backend("mydialect")

    @backend.kernel(mydialect.op_p)
    def _run(call: Call, x, y, *, scale): ...  # operands by position, attributes by name

    @backend.state
    def _state(env: WorkerEnv) -> MyState: ...

    @backend.payload_check(mydialect.op_p)
    def _check(op): ...  # raise MPSerializationError if op's native bytes are unsafe

Interpreters resolve kernels through each op's primitive (`KernelTable`); nothing
lists dialects or op names. Value codecs for the wire are registered with
`mplang.transport.wire.register_value_codec`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from mplang.edsl.errors import MPSerializationError
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.primitive import Primitive, primitives
from mplang.edsl.program import Program
from mplang.edsl.traits import Runtime as KernelRuntime
from mplang.runtime.interpreter import Kernel, KernelTable, by_name

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


KernelFn = Callable[..., list[Any]]
"""A kernel as written: ``fn(call, *operands, **attributes) -> results`` (`by_name`)."""
StateFactory = Callable[[WorkerEnv], Any]
"""``factory(env)``: builds a dialect's state for the worker ``env`` describes."""
PayloadCheck = Callable[[Operation], None]
"""``check(op)`` raises `MPSerializationError`, naming the op, unless the native payloads
among ``op``'s attributes (bytes that C++ code parses) are safe to run."""


class DialectBackend:
    """The runtime half of one dialect: kernels (registered on its primitives), payload
    checks and a worker state factory."""

    def __init__(self, dialect: str):
        self.dialect = dialect
        self.state_factory: StateFactory | None = None

    def _own(self, prim: Primitive, what: str) -> Primitive:
        if not isinstance(prim, Primitive) or prim.dialect != self.dialect:
            raise ValueError(f"backend {self.dialect!r} cannot register a {what} for {prim!r}: "
                             "register on a primitive of its own dialect")
        return prim

    def kernel(self, prim: Primitive, *, runtime: KernelRuntime = "worker",
               override: bool = False) -> Callable[[KernelFn], KernelFn]:
        """Register the kernel of ``prim`` (an op of this dialect) for ``runtime``:
        ``fn(call, *operands, **attributes) -> results`` (`by_name`). Returns ``fn``, so
        one function may be registered for several ops or runtimes."""
        register = self._own(prim, "kernel").def_kernel(runtime, override=override)

        def deco(fn: KernelFn) -> KernelFn:
            register(by_name(prim, fn))
            return fn
        return deco

    def state(self, factory: StateFactory) -> StateFactory:
        """Register the factory of this dialect's per-worker state (``interp.states[dialect]``)."""
        if self.state_factory is not None:
            raise ValueError(f"backend {self.dialect!r} already has a state factory")
        self.state_factory = factory
        return factory

    def payload_check(self, prim: Primitive) -> Callable[[PayloadCheck], PayloadCheck]:
        """Register the check of ``prim``'s native payloads (see `check_payloads`)."""
        return self._own(prim, "payload check").def_payload_check


_BACKENDS: dict[str, DialectBackend] = {}
_LOCK = threading.Lock()


def register_backend(dialect: str) -> DialectBackend:
    """Create the backend of ``dialect``; a dialect has one backend."""
    with _LOCK:
        if dialect in _BACKENDS:
            raise ValueError(f"dialect {dialect!r} already has a backend")
        backend = _BACKENDS[dialect] = DialectBackend(dialect)
    return backend


def get_backend(dialect: str) -> DialectBackend | None:
    """The backend registered for ``dialect`` (None: it has none)."""
    return _BACKENDS.get(dialect)


_WORKER = KernelTable(("worker",))


def worker_kernels() -> KernelTable:
    """The workers' kernels; an op without one is refused by workers."""
    return _WORKER


def driver_kernels(launch: bool, dispatch: Kernel) -> KernelTable:
    """The driver's kernels: ``driver`` kernels (``launch`` ones first in launch mode); a
    multi-party op without one goes to ``dispatch``, which runs it on the parties."""
    def resolve(prim: Primitive) -> Kernel | None:
        return dispatch if prim.execution_model == "multi_party" else None

    return KernelTable(("launch", "driver") if launch else ("driver",), resolve)


def payload_refusal(message: str, field: str) -> MPSerializationError:
    """The refusal of a payload check: ``message`` (starting with the op), raised from the
    op's attribute ``field`` (`check_payloads` adds the field path and the user's line)."""
    error = MPSerializationError(message)
    error.field = field  # type: ignore[attr-defined]
    return error


def check_payloads(graph: Graph, path: str = "graph") -> None:
    """Run the payload check of every op of ``graph`` that has one (regions included).

    A refusal is an `MPSerializationError`; one made by `payload_refusal` ends with the
    field path of the payload (``graph.ops[0].regions[0].ops[2].attrs.module``, as the serialized
    program names it) and the user's line that traced the op. Workers call it on every
    program received from another process before running it, the simulator on every
    received program (`vet_program`); programs traced in this process need no check.
    """
    for index, op in enumerate(graph.operations):
        here = f"{path}.ops[{index}]"
        check = None if op.prim is None else op.prim.rule("payload_check")
        if check is not None:
            try:
                check(op)
            except MPSerializationError as e:
                field = getattr(e, "field", None)
                if field is not None:
                    traced = f", traced at {op.loc}" if op.loc else ""
                    e.args = (f"{e.args[0]} ({here}.attrs.{field}{traced})", *e.args[1:])
                raise
        for i, region in enumerate(op.regions):
            check_payloads(region, f"{here}.regions[{i}]")


_VETTED: weakref.WeakKeyDictionary[Program, Graph] = weakref.WeakKeyDictionary()
"""Each received program vetted by this process, with the graph that was vetted."""


def vet_program(program: Program) -> None:
    """Check the native payloads of ``program`` (`check_payloads`) before this process
    runs any of its ops, unless its tracer is this process's (``program.received`` is
    False) or its graph was vetted already."""
    if not program.received or _VETTED.get(program) is program.graph:
        return
    check_payloads(program.graph)
    _VETTED[program] = program.graph


class WorkerStates(dict[str, Any]):
    """One worker's dialect states, by dialect. A state is made by its dialect's factory
    on first use, so a plugin loaded after the worker started still gets its state."""

    def __init__(self, env: WorkerEnv, **given: Any):
        super().__init__(given)
        self.env = env
        self._lock = threading.Lock()

    def spec_changed(self) -> None:
        """Tell each state that has a ``spec_changed`` method that the cluster spec
        changed (kept sessions and links are dropped)."""
        self._tell("spec_changed")

    def driver_closed(self, owner: str) -> None:
        """Tell each state that has a ``driver_closed`` method that the driver with
        certificate fingerprint ``owner`` closed (what is kept for it is dropped)."""
        self._tell("driver_closed", owner)

    def _tell(self, hook: str, *args: Any) -> None:
        for state in list(self.values()):
            method = getattr(state, hook, None)
            if callable(method):
                method(*args)

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
    """``(op, runtime)`` for every declared op lacking a kernel its traits claim."""
    dispatch: Kernel = lambda interp, op, args, key: []  # noqa: E731 - resolution only
    tables = {"worker": worker_kernels(), "driver": driver_kernels(False, dispatch),
              "launch": driver_kernels(True, dispatch)}
    return [(prim.name, runtime) for prim in primitives() for runtime in prim.traits.runtimes
            if tables[runtime].get(prim) is None]
