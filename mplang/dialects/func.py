"""The `func` dialect: opaque calls.

``func.func(fn)`` makes a function whose calls appear in the caller's graph as
one ``func.call`` op with the traced body as its region, instead of inlining.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from mplang.edsl.function import function
from mplang.edsl.graph import Graph
from mplang.edsl.graph import Operation
from mplang.edsl.primitive import Primitive, Signature
from mplang.policy.flows import Analysis, PartyLabels
from mplang.policy.labels import Label
from mplang.edsl.pytree import tree_unflatten
from mplang.edsl.tracer import current_tracer, mp_leaves, trace_function
from mplang.edsl.typing import ValueType
from mplang.edsl.errors import MPTypeError
from mplang.frontend.feop import feop
from mplang.edsl.traits import OpTraits

call_p = Primitive("func.call", kind="call", execution_model="any",
                   traits=OpTraits(pure=True, communicates=False, regions="call",
                                   runtimes=("worker", "driver")),
                   doc="Call a function body (its region) as one opaque node.")


@call_p.def_type_rule
def _call_rule(sig: Signature) -> list[ValueType]:
    (body,) = sig.regions
    for i, (t, v) in enumerate(zip(sig.inputs, body.inputs, strict=True)):
        if t != v.type:
            raise MPTypeError(f"func.call @{sig.attrs['callee']}: argument {i} is {t}, "
                              f"the body expects {v.type}")
    return [v.type for v in body.outputs]


@feop(call_p, name="func.func", op_kind="transform", example="f = func.func(body); y = f(x)", execution_model="in_controller")
def func(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Decorate ``fn`` so each call is traced as a single ``func.call`` op."""
    callee = getattr(fn, "__name__", "fn")

    @function
    @functools.wraps(fn)
    def call(*args: Any) -> Any:
        tracer = current_tracer(f"func.call @{callee}")
        traced = trace_function(tracer.child(local=tracer.local), fn, args)
        outs = call_p.bind(mp_leaves(args) + traced.captured, {"callee": callee}, [traced.graph])
        return tree_unflatten(traced.out_tree, outs)

    return call


@call_p.def_flow
def _call_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Labels follow the body."""
    return a.graph(op.regions[0], ins)


@call_p.def_local_flow
def _local_call_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Labels follow the body."""
    return a.local(op.regions[0], ins, own)

__all__ = ["func"]
