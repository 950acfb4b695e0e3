"""Tracing: running Python functions on trace objects to record a `Graph`.

A `Tracer` owns the graph being built. Nested tracers build regions; an outer
value used inside a region is captured: it becomes an explicit region input,
and the region's op receives the outer value as an extra operand.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mplang.edsl.context import Context, current_context
from mplang.edsl.errors import MPConcreteValueError, MPTraceError
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.location import locate_error
from mplang.edsl.object import USES, MPObject, type_attributes
from mplang.edsl.pytree import TreeDef, tree_flatten, tree_unflatten
from mplang.edsl.typing import Mask, MPType, ValueType


class NeedsJaxTrace(MPTraceError, AttributeError):
    """An array attribute (``x.sum``) was used on an MPLang value. In a pcall body this
    means the body is a JAX function, traced by `tensor.run_jax` instead; elsewhere,
    run JAX code on MPLang values through ``simp.pcall`` or ``tensor.run_jax``."""


class TraceObject(MPObject):
    """A value of the graph being traced by ``tracer``."""

    __slots__ = ("_device", "tracer", "value")

    def __init__(self, tracer: Tracer, value: Value, device: str | None = None):
        self.tracer = tracer
        self.value = value
        self._device = device

    @property
    def device(self) -> str | None:
        return self._device

    def placed(self, device: str | None) -> TraceObject:
        """The same value tagged as living on ``device``."""
        return TraceObject(self.tracer, self.value, device)

    @property
    def mptype(self) -> ValueType:
        return self.value.type

    def __getattr__(self, name: str) -> Any:
        if name in TraceObject.__slots__:
            raise AttributeError(name)
        attributes = type_attributes(self.base_type)
        if attributes is not None:  # a dialect's values: its own methods, never JAX's
            return attributes(self, name)
        if name.startswith("__"):
            raise AttributeError(name)
        raise NeedsJaxTrace(
            f"{self!r} has no attribute {name!r}; array methods run inside "
            "simp.pcall(parties, fn, ...) or tensor.run_jax(fn, ...)")

    def _needs_value(self, use: str) -> Exception:
        """The error for Python needing this traced value's concrete value (``use``: a key
        of `USES`), naming the structured construct to use instead. In a party-local
        region a conversion JAX may support asks for the body to be traced by JAX."""
        if not self.tracer.local:
            return MPConcreteValueError(f"{USES[use]} {self!r}, a traced value known only when "
                                        f"the program runs; {_REMEDIES.get(use, _COMPUTE)}")
        if use not in _LOCAL_REMEDIES:
            return NeedsJaxTrace(f"{USES[use]} {self!r}, a traced party-local value; compute "
                                 "with jax.numpy instead")
        return MPConcreteValueError(f"{USES[use]} {self!r}, a traced value of a device function "
                                    f"or pcall body, known only when the program runs; "
                                    f"{_LOCAL_REMEDIES[use]}")

    def __repr__(self) -> str:
        return f"TraceObject(%{self.value.name}: {self.value.type})"


_COMPUTE = ("compute with it inside a device function or simp.pcall body (with jax.numpy), "
            "and bring results to Python with mp.fetch after mp.evaluate")
_REMEDIES = {
    "bool": "branch with simp.uniform_cond(pred, then_fn, else_fn, *args), loop with "
            "simp.while_loop(cond_fn, body_fn, init), or select with jnp.where(pred, a, b) "
            "inside a device function",
    "iter": "index it explicitly (x[i] for i in range(len(x))), or loop inside a device "
            "function",
}
_LOCAL_REMEDIES = {
    "bool": "select with jnp.where(pred, a, b) or branch with jax.lax.cond(pred, true_fn, "
            "false_fn, *args)",
    "iter": "index it explicitly (x[i] for i in range(len(x))), or loop with "
            "jax.lax.fori_loop",
}


class _Counter:
    def __init__(self) -> None:
        self.next = 0

    def take(self) -> str:
        name = str(self.next)
        self.next += 1
        return name


class Tracer(Context):
    """Records primitive calls as operations.

    ``local`` tracers build party-local regions (``pcall`` bodies), whose values
    carry bare base types; the others build simp-level graphs of `MPType` values.
    """

    def __init__(self, world_size: int, *, cluster: Any = None, parent: Tracer | None = None,
                 local: bool = False, parties: Mask | None = None, executor: Any = None):
        self.world_size = world_size
        self.cluster = parent.cluster if parent is not None else cluster
        self.executor: Any = parent.executor if parent is not None else executor
        """The execution context the traced program is for (None: not known)."""
        self.parties: Mask | None = \
            parties if parties is not None or parent is None else parent.parties
        """The parties that run this local region (None: not known statically)."""
        self.parent = parent
        self.local = local
        self._names: _Counter = parent._names if parent is not None else _Counter()
        self._ids: _Counter = parent._ids if parent is not None else _Counter()
        self._symbols: _Counter = parent._symbols if parent is not None else _Counter()
        self._row_symbols: dict[int, tuple[Value, str]] = (
            parent._row_symbols if parent is not None else {})
        self.inputs: list[Value] = []
        self.operations: list[Operation] = []
        self.captured: list[MPObject] = []
        self._capture_values: dict[int, Value] = {}
        self.memo: dict[Any, Any] = {}
        """What a library made once in this region, by what made it (it dies with the
        trace): e.g. a group-by's digits of a keys value."""

    def child(self, *, local: bool, parties: Mask | None = None) -> Tracer:
        """A tracer for a region; ``parties`` run it (a pcall body's parties)."""
        return Tracer(self.world_size, parent=self, local=local or self.local, parties=parties)

    def row_symbol(self, obj: MPObject) -> str:
        """The symbol of the row count of ``obj``, a value whose row count is known at run
        time only: a new one (`fresh_symbol`) the first time, then the same one, in every
        region of this trace."""
        value = obj.value if isinstance(obj, TraceObject) else self.lift(obj)
        known = self._row_symbols.get(id(value))
        if known is None:
            known = self._row_symbols[id(value)] = (value, self.fresh_symbol())
        return known[1]

    def fresh_symbol(self) -> str:
        """A new symbol for a size known only at run time (``n0``, ``n1``, ...), unique
        within this trace and the same each time the program is traced."""
        return "n" + self._symbols.take()

    def fresh_id(self, prefix: str) -> str:
        """An identifier unique within this trace (all its regions) and the same each time
        the program is traced: ``prefix`` and a counter, e.g. a key pair's ``k0``."""
        return prefix + self._ids.take()

    def new_value(self, vtype: ValueType) -> Value:
        if self.local and isinstance(vtype, MPType):
            vtype = vtype.base
        return Value(self._names.take(), vtype)

    def new_input(self, vtype: ValueType) -> TraceObject:
        value = self.new_value(vtype)
        self.inputs.append(value)
        return TraceObject(self, value)

    def lift(self, obj: MPObject) -> Value:
        """The value ``obj`` stands for in this graph, capturing it if it is from outside."""
        if isinstance(obj, TraceObject) and obj.tracer is self:
            return obj.value
        if isinstance(obj, TraceObject) and not self._is_ancestor(obj.tracer):
            raise MPTraceError(
                f"{obj!r} escaped the function that traced it; values of one trace cannot be "
                "used in another (return it from the function instead)"
            )
        key = id(obj)
        value = self._capture_values.get(key)
        if value is None:
            value = self.new_value(obj.mptype)
            self._capture_values[key] = value
            self.captured.append(obj)
        return value

    def _is_ancestor(self, tracer: Tracer) -> bool:
        node = self.parent
        while node is not None:
            if node is tracer:
                return True
            node = node.parent
        return False

    def add_op(
        self,
        opcode: str,
        inputs: Sequence[Value],
        out_types: Sequence[ValueType],
        attrs: dict[str, Any],
        regions: Sequence[Graph] = (),
        loc: str | None = None,
    ) -> list[TraceObject]:
        outputs = tuple([self.new_value(t) for t in out_types])
        self.operations.append(Operation(opcode, tuple(inputs), outputs, attrs, tuple(regions),
                                         loc))
        return [TraceObject(self, v) for v in outputs]

    def build(self, outputs: Sequence[Value]) -> Graph:
        """The finished graph; captured values follow the declared inputs."""
        capture_inputs = [self._capture_values[id(o)] for o in self.captured]
        return Graph(self.inputs + capture_inputs, list(self.operations), list(outputs))


def current_tracer(opname: str) -> Tracer:
    ctx = current_context()
    if not isinstance(ctx, Tracer):
        error = MPTraceError(
            f"{opname} was called outside a trace; run it through mp.evaluate / mp.compile, "
            "an @mp.function, or inside `with simulator:`")
        locate_error(error)
        raise error
    return ctx


@dataclass
class TracedFunction:
    """A function traced into a graph.

    ``graph.inputs`` are the declared inputs followed by one input per captured
    outer object (``captured``, in first-use order).
    """

    graph: Graph
    in_tree: TreeDef
    out_tree: TreeDef
    captured: list[MPObject]
    out_devices: list[str | None]


def check_output_leaf(leaf: Any, where: str, local: bool = False) -> MPObject:
    """``leaf`` of what ``where`` returned, if it is an MPLang value; else an `MPTraceError`
    naming the caller's line. ``local``: ``where`` is a party-local body (a device function,
    a pcall body), whose concrete numbers and arrays are already constants."""
    if isinstance(leaf, MPObject):
        return leaf
    if callable(leaf):
        error = MPTraceError(
            f"{where} returned a Python function ({getattr(leaf, '__name__', leaf)!r}); traced "
            "functions return only MPLang values, since a program's control flow must be static"
        )
    elif local:
        error = MPTraceError(
            f"{where} returned a plain Python value of type {type(leaf).__name__} "
            f"({_short(leaf)}); a device function or pcall body returns numbers, arrays (numpy, "
            "jax.numpy) or tuples, lists and dicts of them")
    else:
        error = MPTraceError(
            f"{where} returned a plain Python value of type {type(leaf).__name__}; return MPLang "
            "values only (e.g. make a constant with simp.constant or inside a pcall body)")
    locate_error(error)
    raise error


def _short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def trace_function(tracer: Tracer, fn: Callable[..., Any], args: Sequence[Any],
                   kwargs: dict[str, Any] | None = None) -> TracedFunction:
    """Trace ``fn(*args, **kwargs)`` in ``tracer`` (a fresh root or child tracer).

    MPObject leaves of the arguments become graph inputs; other leaves are passed
    to ``fn`` unchanged as compile-time constants.
    """
    leaves, in_tree = tree_flatten((tuple(args), kwargs or {}))
    call_leaves: list[Any] = []
    with tracer:
        for leaf in leaves:
            if isinstance(leaf, MPObject):
                if tracer.parent is None and not isinstance(leaf, TraceObject):
                    call_leaves.append(TraceObject(tracer, tracer.lift(leaf), leaf.device))
                else:
                    call_leaves.append(tracer.new_input(leaf.mptype).placed(leaf.device))
            else:
                call_leaves.append(leaf)
        call_args, call_kwargs = tree_unflatten(in_tree, call_leaves)
        result = fn(*call_args, **call_kwargs)
        out_leaves, out_tree = tree_flatten(result)
        name = getattr(fn, "__name__", "function")
        out_objects = [check_output_leaf(x, f"function {name!r}", tracer.local)
                       for x in out_leaves]
        out_values = [tracer.lift(x) for x in out_objects]
    graph = tracer.build(out_values)
    return TracedFunction(graph, in_tree, out_tree, list(tracer.captured),
                          [x.device for x in out_objects])


def mp_leaves(tree: Any) -> list[MPObject]:
    """The MPObject leaves of ``tree``, in flattening order."""
    leaves, _ = tree_flatten(tree)
    return [x for x in leaves if isinstance(x, MPObject)]
