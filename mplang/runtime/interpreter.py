"""The interpreter: runs a graph by dispatching each op through its primitive to the
kernel registered on it for this runtime. Backends only register kernels; nothing
overrides this loop.
"""

from __future__ import annotations

import functools
import inspect
import queue
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mplang.edsl.errors import MPLangError, MPRefusedError, MPRuntimeError
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.primitive import Primitive
from mplang.edsl.traits import Runtime
from mplang.runtime.object_store import LOCAL_OWNER
from mplang.runtime.options import DEFAULT_OPTIONS, RunOptions
from mplang.runtime.scheduler import Scheduler, blocking, may_block, plan
from mplang.runtime.timeline import DRIVER

_RETRY_SECONDS = 0.005
"""How often a dataflow run with ops waiting for a free slot tries to start them."""

Kernel = Callable[["Interpreter", Operation, list[Any], str], list[Any]]
"""``kernel(interp, op, input values, key) -> output values``.

``key`` names this execution of ``op`` uniquely within a run (its path through
regions and loop iterations), so parties tag their messages with it.
"""

Contain = Callable[[Operation, str, Exception], Exception]
"""``contain(op, key, error)``: the error that ``op``'s failure ``error`` (naming the op)
leaves its party as. Workers give their interpreters one: a kernel's message may quote
the party's data."""


class KernelTable:
    """Resolves an op's kernel through its primitive: the kernel the primitive registered
    for the first of ``runtimes`` that has one, else ``fallback(primitive)``."""

    def __init__(self, runtimes: tuple[Runtime, ...],
                 fallback: Callable[[Primitive], Kernel | None] | None = None):
        self.runtimes = runtimes
        self.fallback = fallback

    def get(self, prim: Primitive | None) -> Kernel | None:
        """The kernel of ``prim`` in these runtimes (None: it has none, or no primitive)."""
        if prim is None:
            return None
        kernels = prim.kernels
        for runtime in self.runtimes:
            kernel = kernels.get(runtime)
            if kernel is not None:
                return kernel
        return None if self.fallback is None else self.fallback(prim)


class Interpreter:
    """Runs graphs with one kernel table and per-dialect state (``states["simp"]`` …).

    ``party`` is the rank this interpreter runs for (None on the driver); it
    appears in error messages. ``exec_id`` identifies the run for message tags;
    ``owner`` is whose run it is (the driver's certificate fingerprint on workers).
    ``options`` are the execution's `RunOptions`: with ``options.parallel`` and a
    ``scheduler``, graphs run as dataflow (an op starts as soon as its inputs are
    ready); otherwise op by op in program order. ``options.progress`` hears of each
    completed op, ``options.monitor`` of each op started and finished. Every op
    failure passes through ``contain`` (`Contain`) if given.
    """

    def __init__(self, kernels: KernelTable, states: Mapping[str, Any], *,
                 party: int | None, exec_id: str, options: RunOptions = DEFAULT_OPTIONS,
                 scheduler: Scheduler | None = None, contain: Contain | None = None,
                 owner: str = LOCAL_OWNER):
        self.kernels = kernels
        self.owner = owner
        self.contain = contain
        self.states = states
        self.party = party
        self.exec_id = exec_id
        self.options = options
        self.scheduler = scheduler if options.parallel else None
        self._where = "the driver" if party is None else f"party {party}"
        self._track = DRIVER if party is None else party

    def run(self, graph: Graph, inputs: Sequence[Any], scope: str = "") -> list[Any]:
        """Evaluate ``graph`` on ``inputs``; ``scope`` prefixes the ops' message keys."""
        if len(inputs) != len(graph.inputs):
            raise MPRuntimeError(f"graph takes {len(graph.inputs)} inputs, got {len(inputs)}",
                                 party=self.party)
        env: dict[Any, Any] = dict(zip(graph.inputs, inputs, strict=True))
        if self.scheduler is not None and len(graph.operations) > 1 and plan(graph).parallel:
            self._run_dataflow(graph, env, scope)
        else:
            for index, op in enumerate(graph.operations):
                outs = self._execute(op, [env[v] for v in op.inputs], f"{scope}/{index}")
                env.update(zip(op.outputs, outs, strict=True))
        return [env[v] for v in graph.outputs]

    def _run_dataflow(self, graph: Graph, env: dict[Any, Any], scope: str) -> None:
        assert self.scheduler is not None
        ops = graph.operations
        deps = plan(graph)
        waiting = [len(d) for d in deps.deps]
        ready = [i for i, n in enumerate(waiting) if n == 0]
        finished: queue.SimpleQueue[tuple[int, list[Any] | None, BaseException | None]] = \
            queue.SimpleQueue()

        def execute(index: int, args: list[Any]) -> None:
            try:
                finished.put((index, self._execute(ops[index], args, f"{scope}/{index}"), None))
            except BaseException as e:  # delivered to the coordinating thread
                finished.put((index, None, e))

        remaining = len(ops)
        deferred: list[int] = []  # ready ops that may wait on a peer, and found no slot
        while remaining:
            pending, deferred = sorted(deferred + ready), []
            for index in pending:
                args = [env[v] for v in ops[index].inputs]
                if self.scheduler.try_submit(execute, index, args) is not None:
                    continue
                if may_block(ops[index]):  # run here, it would stop this loop from starting
                    deferred.append(index)  # the ops a peer's waiting op needs: deadlock
                else:
                    execute(index, args)
            ready = []
            with blocking():
                try:
                    index, outs, error = finished.get(timeout=_RETRY_SECONDS if deferred
                                                      else None)
                except queue.Empty:  # a slot may be free now (an op went to wait)
                    continue
            if error is not None:
                # ops still running fail or finish on their own once the execution is aborted
                raise error
            assert outs is not None
            env.update(zip(ops[index].outputs, outs, strict=True))
            remaining -= 1
            for user in deps.users[index]:
                waiting[user] -= 1
                if waiting[user] == 0:
                    ready.append(user)

    def _execute(self, op: Operation, args: list[Any], key: str) -> list[Any]:
        kernel = self.kernels.get(op.prim)
        where = self._where
        if kernel is None:
            raise MPRuntimeError(f"{where} has no kernel for op {op.opcode}",
                                 party=self.party, op=op.opcode, key=key, loc=op.loc)
        monitor = self.options.monitor
        started = 0 if monitor is None else monitor.op_started(self._track, op, key)
        try:
            outs = kernel(self, op, args, key)
        except Exception as e:
            failure: Exception | None = self._failure(op, key, e)
        else:
            failure = None
        if failure is not None:  # raised here, it carries no other exception's text
            raise failure
        if len(outs) != len(op.outputs):
            raise MPRuntimeError(f"{where}: kernel of {op.opcode} returned {len(outs)} values "
                                 f"for {len(op.outputs)} outputs", party=self.party,
                                 op=op.opcode, key=key, loc=op.loc)
        if monitor is not None:
            monitor.op_finished(self._track, op, key, started)
        if self.options.progress is not None:
            who = "driver" if self.party is None else where
            self.options.progress(f"{who}: {op.opcode} {key} done")
        return outs

    def _failure(self, op: Operation, key: str, e: Exception) -> Exception:
        """The error that ``op``'s kernel raising ``e`` leaves this interpreter with: one
        naming the op and its run, through ``contain`` if given."""
        error = e
        if isinstance(e, MPRuntimeError):
            if e.op is None:  # name the op a communication wait belonged to
                e.op = op.opcode
                e.args = (f"{e.args[0]} (in op {op.opcode} at {key}{_at(op)})", *e.args[1:])
            elif e.op == op.opcode and e.key is None:  # the kernel named its op: add where
                traced = "" if op.loc and op.loc in e.args[0] else _at(op)
                e.args = (f"{e.args[0]} (at {key}{traced})", *e.args[1:])
            if e.op == op.opcode:
                e.key = e.key or key
                e.loc = e.loc or op.loc
        elif type(e) is MPRefusedError and e.op is None and self.party is not None:
            # a party's run met a refusal (of a message it needed): name where
            e.op, e.party = op.opcode, self.party
            e.args = (f"{e.args[0]} (in op {op.opcode} at {key}{_at(op)})", *e.args[1:])
        elif not isinstance(e, MPLangError):
            results = ", ".join(f"%{v.name}" for v in op.outputs) or "no results"
            error = MPRuntimeError(
                f"{self._where}: op {op.opcode} at {key} (defining {results}{_at(op)}) failed: "
                f"{type(e).__name__}: {e}", party=self.party, op=op.opcode, key=key,
                loc=op.loc)
            error.__cause__ = e
        nested = isinstance(error, MPRuntimeError) and error.key not in (None, key)
        if self.contain is None or nested:  # a nested op's failure was contained already
            return error
        return self.contain(op, key, error)


def _at(op: Operation) -> str:
    return f", traced at {op.loc}" if op.loc else ""


def op_error(interp: Interpreter, op: Operation, message: str,
             kind: type[MPRuntimeError] = MPRuntimeError) -> MPRuntimeError:
    """An error of this party's run of ``op``, naming both (``kind``: `MPPublicError`
    for a message that holds none of the party's data)."""
    return kind(f"party {interp.party}: op {op.opcode}: {message}", party=interp.party,
                op=op.opcode, loc=op.loc)


class Call:
    """One run of an op by its kernel: the interpreter running it, the op, and its key
    (unique within the run: its path through regions and loop iterations). Made for
    every op run, so a plain slotted object (a frozen dataclass costs 2.5x)."""

    __slots__ = ("interp", "key", "op")

    def __init__(self, interp: Interpreter, op: Operation, key: str):
        self.interp, self.op, self.key = interp, op, key

    @property
    def tag(self) -> tuple[str, str]:
        """The tag of this op's messages: (execution id, key)."""
        return (self.interp.exec_id, self.key)

    def state(self, dialect: str) -> Any:
        """This process's state of ``dialect`` (``"simp"``: the party itself)."""
        return self.interp.states[dialect]

    def in_type(self, index: int) -> Any:
        """The declared type of operand ``index``."""
        return self.op.inputs[index].type

    def out_type(self, index: int = 0) -> Any:
        """The declared type of result ``index``."""
        return self.op.outputs[index].type

    def error(self, message: str, kind: type[MPRuntimeError] = MPRuntimeError
              ) -> MPRuntimeError:
        """`op_error` of this op."""
        return op_error(self.interp, self.op, message, kind)


def by_name(prim: Primitive, fn: Callable[..., list[Any]]) -> Kernel:
    """The `Kernel` calling ``fn(call, *operands, **attributes)``: operands by position,
    the attributes ``fn`` names as keyword-only parameters by name (their declared
    default when an op lacks one). ``fn`` naming an attribute ``prim`` does not declare
    is refused here, where it is registered."""
    params = inspect.signature(fn).parameters.values()
    names = [p.name for p in params if p.kind is p.KEYWORD_ONLY]
    unknown = [n for n in names if n not in prim.attrs]
    if unknown:
        raise ValueError(f"kernel {fn.__qualname__} of {prim.name} names {unknown}, not "
                         f"attributes of {prim.name} (it declares {sorted(prim.attrs)})")
    defaults = tuple((n, prim.attrs[n].default) for n in names)

    @functools.wraps(fn)
    def kernel(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
        if not defaults:
            return fn(Call(interp, op, key), *args)
        attrs = op.attrs
        return fn(Call(interp, op, key), *args, **{n: attrs.get(n, d) for n, d in defaults})

    return kernel
