"""Tracing the regions of simp ops: party-local pcall bodies (as MPLang code or as JAX
functions) and the branches and loop bodies that must share one list of inputs."""

from __future__ import annotations

import contextlib
import functools
import weakref
from collections.abc import Callable, Sequence
from typing import Any

from mplang.dialects import tensor
from mplang.edsl.errors import MPLangError, MPTypeError
from mplang.edsl.graph import Graph, Value
from mplang.edsl.object import MPObject
from mplang.edsl.pytree import tree_map
from mplang.edsl.tracer import NeedsJaxTrace, TracedFunction, Tracer, mp_leaves, trace_function
from mplang.edsl.typing import Mask, TensorType


def _constant_leaf(leaf: Any) -> Any:
    """A concrete array or number a body returns, as a local constant."""
    if isinstance(leaf, MPObject) or callable(leaf) or leaf is None \
            or isinstance(leaf, str | bytes):
        return leaf
    return tensor.constant(leaf)


_JAX_BODIES: weakref.WeakSet[Callable[..., Any]] = weakref.WeakSet()
"""Bodies found to be JAX functions: later pcalls trace them with JAX directly."""


def _known_jax(fn: Callable[..., Any]) -> bool:
    module = getattr(fn, "__module__", None) or ""
    if module == "jax" or module.startswith(("jax.", "jaxlib")):
        return True
    try:
        return fn in _JAX_BODIES
    except TypeError:  # not weakly referenceable
        return False


def trace_body(tracer: Tracer, fn: Callable[..., Any], args: Sequence[Any],
                parties: Mask | None = None) -> TracedFunction:
    """Trace a pcall body.

    JAX's own functions, and bodies found earlier to be JAX functions, are traced
    once, by JAX, as ``tensor.run_jax(fn, *args)``. Other bodies run as MPLang
    code (concrete arrays they return become local constants); if JAX rejects an
    MPLang value on the way, the partial trace is dropped and the body is traced
    by JAX instead, and remembered as a JAX function.
    """
    def as_jax() -> TracedFunction:
        return trace_function(tracer.child(local=True, parties=parties),
                              lambda *a: tensor.run_jax(fn, *a), args)

    if _known_jax(fn):
        return as_jax()

    @functools.wraps(fn)
    def body(*a: Any) -> Any:
        return tree_map(_constant_leaf, fn(*a))

    try:
        return trace_function(tracer.child(local=True, parties=parties), body, args)
    except MPLangError as e:
        if not isinstance(e, NeedsJaxTrace):
            raise
        error: Exception = e
    except Exception as e:  # JAX refused an MPLang value: a JAX function
        error = e
    try:
        traced = as_jax()
    except MPTypeError as jax_error:
        name = getattr(fn, "__name__", "fn")
        others = [x.base_type for x in mp_leaves(args) if not isinstance(x.base_type, TensorType)]
        if others and not isinstance(error, MPLangError):  # e.g. table.to_tensor, then jnp
            raise MPTypeError(
                f"simp.pcall: body {name!r} gave a JAX function the result of an MPLang op on "
                f"its {others[0]} input ({type(error).__name__}: {error}); one device function "
                "cannot mix the two: convert in one device function and compute with "
                "jax.numpy in the next, e.g. m = mp.device(D)(lambda t: table.to_tensor(t, "
                "columns))(t), then mp.device(D)(lambda m: jnp.sum(m))(m)") from error
        raise MPTypeError(
            f"simp.pcall: body {name!r} could not be traced, neither as an MPLang function "
            f"({type(error).__name__}: {error}) nor as a JAX function ({jax_error})"
        ) from error
    with contextlib.suppress(TypeError):
        _JAX_BODIES.add(fn)
    return traced


def holders(args: Sequence[Any]) -> Mask | None:
    """The parties holding every MPLang value among ``args`` (None: not known statically)."""
    held: Mask | None = None
    for x in mp_leaves(args):
        mask: Mask | None = getattr(x.mptype, "pmask", None)
        if mask is None:
            return None
        held = mask if held is None else held & mask
    return held


def unify_regions(tracer: Tracer, traced: list[TracedFunction], num_args: int
                   ) -> tuple[list[Graph], list[MPObject]]:
    """Give every region the same inputs: the explicit ones, then the union of captures."""
    union: list[MPObject] = []
    seen: set[int] = set()
    for t in traced:
        for obj in t.captured:
            if id(obj) not in seen:
                seen.add(id(obj))
                union.append(obj)
    graphs = []
    for t in traced:
        own = {id(o): v for o, v in zip(t.captured, t.graph.inputs[num_args:], strict=True)}
        capture_inputs: list[Value] = [own.get(id(o)) or tracer.new_value(o.mptype) for o in union]
        graphs.append(Graph(t.graph.inputs[:num_args] + capture_inputs,
                            t.graph.operations, t.graph.outputs))
    return graphs, union
