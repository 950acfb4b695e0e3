"""The `func` dialect: opaque calls.

``func.func(fn)`` makes a function whose calls appear in the caller's graph as
one ``func.call`` op with the traced body as its region, instead of inlining.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from mplang.analysis.cost_model import CostModel, OpCost
from mplang.edsl.attrs import Attr
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.graph import Operation
from mplang.edsl.primitive import Operand, Primitive, Result, Signature
from mplang.edsl.pytree import tree_unflatten
from mplang.edsl.tracer import current_tracer, mp_leaves, trace_function
from mplang.edsl.traits import WORKER_AND_DRIVER, OpTraits
from mplang.edsl.typing import ValueType
from mplang.flows.engine import Analysis, PartyLabels
from mplang.flows.labels import Label
from mplang.frontend.feop import feop


def _body_cost(op: Operation, model: CostModel) -> OpCost:
    """A call costs what its body costs (`mplang.analysis.schedule`); by itself nothing."""
    return OpCost(0.0)


call_p = Primitive(
    "func.call", kind="call", execution_model="any",
    traits=OpTraits(pure=True, communicates=False, regions="call", runtimes=WORKER_AND_DRIVER),
    operands=[Operand("args", variadic=True)], results=[Result("outs", variadic=True)],
    regions=["body"], attrs={"callee": Attr(str, required=True, doc="the function's name")},
    cost=_body_cost, doc="Call a function body (its region) as one opaque node.")


@call_p.def_type_rule
def _call_rule(sig: Signature) -> list[ValueType]:
    (body,) = sig.regions
    if len(body.inputs) != len(sig.args):
        raise MPTypeError(f"func.call @{sig.callee}: {len(sig.args)} arguments but the body "
                          f"takes {len(body.inputs)}")
    for i, (t, v) in enumerate(zip(sig.args, body.inputs, strict=True)):
        if t != v.type:
            raise MPTypeError(f"func.call @{sig.callee}: argument {i} is {t}, "
                              f"the body expects {v.type}")
    return [v.type for v in body.outputs]


@feop(call_p, name="func.func", op_kind="transform", execution_model="in_controller",
      example="f = func.func(body); y = f(x)")
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
