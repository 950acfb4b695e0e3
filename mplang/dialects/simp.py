"""The `simp` dialect: SPMD primitives across parties.

Each op is declared once here, with its type, flow and cost rules; kernels live in
`mplang.driver.ops` and `mplang.worker.ops`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from mplang.analysis.cost_model import CostModel, OpCost, local_cost, value_bytes
from mplang.dialects import tensor
from mplang.dialects.common import as_array, canonical_type
from mplang.dialects.regions import holders, trace_body, unify_regions
from mplang.edsl.attrs import Attr, NoneType
from mplang.edsl.context import current_context
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.location import locate_error
from mplang.edsl.object import OPERATORS, MPObject, type_operator
from mplang.edsl.primitive import SIMP, Operand, Primitive, Result, Signature
from mplang.edsl.private import Commitment, value_tensor_type
from mplang.edsl.pytree import tree_flatten, tree_unflatten
from mplang.edsl.sources import declared_type, looked_up_type
from mplang.edsl.tracer import (
    Tracer,
    current_tracer,
    mp_leaves,
    trace_function,
)
from mplang.edsl.traits import WORKER_AND_DRIVER, OpTraits
from mplang.edsl.typing import BaseType, Mask, MPType, TensorType, ValueType, scalar
from mplang.flows.engine import Analysis, PartyLabels, everywhere, merge
from mplang.flows.labels import FOREIGN, Label, join, leading_rows, source
from mplang.frontend.feop import feop


def _shuffle_static_cost(op: Operation, model: CostModel) -> OpCost:
    """One message per route, all routes at once; several values share each message."""
    routes: dict[int, int] = op.attrs["routes"]
    if all(dst == src for dst, src in routes.items()):
        return OpCost(0.0)
    return OpCost(model.message_s(sum(value_bytes(v.type, model) for v in op.inputs)), 1)


def _shuffle_cost(op: Operation, model: CostModel) -> OpCost:
    """Every party asks for its index, then the asked parties send the value."""
    x, index = op.inputs
    ask, give = value_bytes(index.type, model), value_bytes(x.type, model)
    return OpCost(model.message_s(ask) + model.message_s(give), 2)


def _region_cost(op: Operation, model: CostModel) -> OpCost:
    """An op that runs regions costs what its regions cost (`mplang.analysis.schedule`);
    by itself nothing."""
    return OpCost(0.0)


_LOCAL = OpTraits(pure=True, communicates=False, runtimes=WORKER_AND_DRIVER)
_ONE = [Result("out", SIMP)]
_MANY = [Result("outs", SIMP, variadic=True)]
constant_p = Primitive(
    "simp.constant", kind="source", execution_model="multi_party", traits=_LOCAL,
    attrs={"parties": Attr(Mask, required=True, doc="the parties that hold the value"),
           "value": Attr((np.ndarray, Commitment), required=True,
                         doc="the value (compile-time; a commitment where it is private)")},
    results=_ONE, cost=local_cost,
    doc="A compile-time constant held by the given parties.")
prank_p = Primitive(
    "simp.prank", kind="source", execution_model="multi_party", traits=_LOCAL,
    results=_ONE, cost=local_cost,
    doc="Each party's own rank, as an int32 scalar held by every party.")
load_p = Primitive(
    "simp.load", kind="source", execution_model="multi_party",
    traits=OpTraits(pure=False, communicates=False, runtimes=WORKER_AND_DRIVER),
    attrs={"party": Attr(int, required=True, doc="the rank whose owner uploaded it"),
           "name": Attr(str, required=True, doc="the uploaded object's name"),
           "type": Attr(TensorType, required=True, doc="its declared type")},
    results=_ONE, cost=local_cost,
    doc="A private input: an object the party's owner uploaded to its worker.")
pcall_p = Primitive(
    "simp.pcall", kind="call", execution_model="multi_party",
    traits=OpTraits(pure=True, communicates=False, regions="call", fusable=True,
                    runtimes=WORKER_AND_DRIVER),
    operands=[Operand("args", SIMP, variadic=True)], results=_MANY, regions=["body"],
    attrs={"parties": Attr((Mask, NoneType), default=None,
                           doc="the parties that run the body (None: all that hold the inputs)"),
           "fn": Attr(str, default="fn", doc="the body's name, for readers")},
    cost=_region_cost,
    doc="Run a party-local region on each of the given parties.")
shuffle_static_p = Primitive(
    "simp.shuffle_static", kind="communication", execution_model="multi_party",
    traits=OpTraits(pure=True, batchable=True, runtimes=WORKER_AND_DRIVER),
    operands=[Operand("values", SIMP, variadic=True)], results=_MANY,
    attrs={"routes": Attr(dict, required=True, doc="{destination: source} ranks")},
    cost=_shuffle_static_cost,
    doc="Move values between parties along static {dst: src} routes.")
shuffle_p = Primitive(
    "simp.shuffle", kind="communication", execution_model="multi_party",
    traits=OpTraits(pure=True, runtimes=WORKER_AND_DRIVER),
    operands=[Operand("x", SIMP), Operand("index", SIMP)], results=_ONE, cost=_shuffle_cost,
    doc="Each party holding an index receives the value of party `index`.")
converge_p = Primitive(
    "simp.converge", kind="compute", execution_model="multi_party", traits=_LOCAL,
    operands=[Operand("xs", SIMP, variadic=True)], results=_ONE, cost=local_cost,
    doc="Merge values held by disjoint sets of parties into one.")
uniform_cond_p = Primitive(
    "simp.uniform_cond", kind="control_flow", execution_model="multi_party",
    traits=OpTraits(pure=True, regions="branch", runtimes=WORKER_AND_DRIVER),
    operands=[Operand("pred", SIMP), Operand("args", SIMP, variadic=True)], results=_MANY,
    regions=["then", "else"],
    attrs={"verify_uniform": Attr(bool, default=True,
                                  doc="check at run time that every party saw one predicate")},
    cost=_region_cost,
    doc="All parties take the same branch, chosen by a uniform predicate.")
while_loop_p = Primitive(
    "simp.while_loop", kind="control_flow", execution_model="multi_party",
    traits=OpTraits(pure=True, regions="loop", runtimes=WORKER_AND_DRIVER),
    operands=[Operand("state", SIMP, variadic=True)], results=_MANY, regions=["cond", "body"],
    cost=_region_cost,
    doc="All parties iterate while a uniform predicate holds.")


def _feop(prim: Primitive, example: str) -> Callable[[Any], Any]:
    """The frontend metadata of a simp primitive's user function."""
    return feop(prim, example=example)


def _check_movable(op: str, t: MPType, what: str) -> None:
    if t.base.confined:
        raise MPTypeError(f"{op}: {what} is {t}, key material that never leaves the party "
                          f"holding it ({t.pmask if t.pmask is not None else 'its owner'}); "
                          "move what it protects instead (a public key, a ciphertext)")


def _check_parties(op: str, parties: Mask, world_size: int) -> None:
    if not parties.issubset(Mask.all(world_size)):
        raise MPTypeError(f"{op}: parties {parties} are outside the world of {world_size} parties"
                          f" (ranks run from 0 to {world_size - 1})")
    if len(parties) == 0:
        raise MPTypeError(f"{op}: the set of parties is empty")


def _to_mask(op: str, parties: Iterable[int] | Mask) -> Mask:
    if isinstance(parties, Mask):
        return parties
    try:
        return Mask.of(parties)
    except (TypeError, ValueError) as e:
        raise MPTypeError(
            f"{op}: parties must be an iterable of ranks, got {parties!r} ({e})") from None


def _is_bool_scalar(t: BaseType) -> bool:
    return isinstance(t, TensorType) and t.is_scalar and t.dtype == "bool"


# ---------------------------------------------------------------- constant / prank


@constant_p.def_type_rule
def _constant_rule(sig: Signature) -> list[ValueType]:
    _check_parties("simp.constant", sig.parties, sig.world_size)
    return [MPType(value_tensor_type("simp.constant", sig.value), sig.parties)]


@constant_p.def_private
def _constant_private(op: Operation) -> dict[str, Mask | None]:
    """A driver constant: only the parties that hold it see its value."""
    return {"value": op.attrs["parties"]}


@_feop(constant_p, "x = simp.constant((0,), 3)")
@function
def constant(parties: Iterable[int] | Mask, value: Any) -> MPObject:
    """``value`` (a Python scalar or array, fixed at compile time) held by ``parties``."""
    mask = _to_mask("simp.constant", parties)
    return constant_p.bind([], {"parties": mask, "value": as_array("simp.constant", value)})[0]


@prank_p.def_type_rule
def _prank_rule(sig: Signature) -> list[ValueType]:
    return [MPType(scalar("int32"), Mask.all(sig.world_size))]


@_feop(prank_p, "r = simp.prank()")
@function
def prank() -> MPObject:
    """Each party's rank (int32), held by all parties."""
    return prank_p.bind([])[0]


@load_p.def_type_rule
def _load_rule(sig: Signature) -> list[ValueType]:
    if not 0 <= sig.party < sig.world_size:
        raise MPTypeError(f"simp.load: party {sig.party!r} is not a party of a "
                          f"{sig.world_size}-party world")
    if not sig.name:
        raise MPTypeError("simp.load: the object name must be a non-empty string, got ''")
    return [MPType(sig.type, Mask.of([sig.party]))]


@_feop(load_p, 'v = simp.load(2, "myvec")')
@function
def load(party: int, name: str, *, dtype: Any = None, shape: Any = None) -> MPObject:
    """A private input: the object ``party``'s owner uploaded to its worker as ``name``.

    The owner uploads it with ``mplang put``; it is held by ``party`` alone and
    never passes through the driver. Its type is ``dtype``/``shape`` when given,
    else looked up while tracing (the simulator or driver asks the party's worker).
    """
    tracer = current_tracer("simp.load")
    if isinstance(party, bool) or not isinstance(party, int | np.integer):
        raise MPTypeError(f"simp.load: party must be a rank, got {party!r}")
    rank = int(party)
    vtype = canonical_type(declared_type("simp.load", dtype, shape) or looked_up_type(
        "simp.load", f"object {name!r}", tracer, [rank],
        lambda ctx, r: ctx.describe_object(r, name)))
    return load_p.bind([], {"party": rank, "name": name, "type": vtype})[0]


# ---------------------------------------------------------------- pcall


@pcall_p.def_type_rule
def _pcall_rule(sig: Signature) -> list[ValueType]:
    op = "simp.pcall"
    args: list[MPType] = sig.args
    (body,) = sig.regions
    world_size = sig.world_size
    if len(body.inputs) != len(args):
        raise MPTypeError(f"{op}: {len(args)} inputs but the body takes {len(body.inputs)}")
    for i, (arg, v) in enumerate(zip(args, body.inputs, strict=True)):
        if arg.base != v.type:
            raise MPTypeError(f"{op}: input {i} is {arg.base} but the body expects {v.type}")
    parties: Mask | None = sig.parties
    known = all(a.pmask is not None for a in args)
    holders: Mask | None = None
    if known and args:
        holders = Mask.all(world_size)
        for a in args:
            assert a.pmask is not None
            holders = holders & a.pmask
    if parties is not None:
        _check_parties(op, parties, world_size)
        if known:
            for i, a in enumerate(args):
                assert a.pmask is not None
                if not parties.issubset(a.pmask):
                    if a.base.confined:
                        _check_movable(f"{op} on parties {parties}", a, f"input {i}")
                    missing = Mask(parties.bits & ~a.pmask.bits)
                    raise MPTypeError(
                        f"{op} on parties {parties}: input {i} ({a}) is held only by "
                        f"{a.pmask}; parties {missing} do not hold it (send it first, e.g. "
                        f"simp.shuffle_static(x, {{{next(iter(missing))}: "
                        f"{next(iter(a.pmask))}}}))"
                    )
        pmask: Mask | None = parties
    elif not args:
        raise MPTypeError(f"{op}: a pcall without inputs needs explicit parties")
    elif known:
        assert holders is not None
        if len(holders) == 0:
            held = ", ".join(str(a) for a in args)
            raise MPTypeError(f"{op}: no party holds all inputs ({held}); bring them to one "
                              "party first with simp.shuffle_static(x, {dst: src})")
        pmask = holders
    else:
        pmask = None
    outs: list[ValueType] = []
    for v in body.outputs:
        if not isinstance(v.type, BaseType):
            raise MPTypeError(f"{op}: the body returned simp-level value {v.type}")
        outs.append(MPType(v.type, pmask))
    return outs


@_feop(pcall_p, "y = simp.pcall((0,), jnp.square, x)")
@function
def pcall(parties: Iterable[int] | Mask | None, fn: Callable[..., Any], *args: Any) -> Any:
    """Run ``fn(*args)`` locally on each of ``parties``.

    ``parties=None`` means every party that holds all inputs. Inside ``fn``,
    values are party-local tensors; ``fn`` may also be any JAX function.
    """
    tracer = current_tracer("simp.pcall")
    mask = None if parties is None else _to_mask("simp.pcall", parties)
    traced = trace_body(tracer, fn, args, mask if mask is not None else holders(args))
    operands = mp_leaves(args) + traced.captured
    name = getattr(fn, "__name__", "fn")
    outs = pcall_p.bind(operands, {"parties": mask, "fn": name}, [traced.graph])
    return tree_unflatten(traced.out_tree, outs)


# ---------------------------------------------------------------- shuffles


@shuffle_static_p.def_type_rule
def _shuffle_static_rule(sig: Signature) -> list[ValueType]:
    """One or more values move along the same routes (several values: one message per
    route carries all of them); output ``i`` is input ``i`` held by the destinations."""
    op = "simp.shuffle_static"
    srcs: list[MPType] = sig.values
    if not srcs:
        raise MPTypeError(f"{op}: needs at least one value to move")
    many = len(srcs) > 1
    for i, src_t in enumerate(srcs):
        _check_movable(op, src_t, f"value {i}" if many else "the value")
    routes: dict[int, int] = sig.routes
    world_size = sig.world_size
    if not routes:
        raise MPTypeError(f"{op}: routes {{dst: src}} must not be empty")
    for dst, src in routes.items():
        for role, rank in (("destination", dst), ("source", src)):
            if type(rank) is not int or not 0 <= rank < world_size:
                raise MPTypeError(f"{op}: {role} {rank!r} is not a party of a "
                                  f"{world_size}-party world")
        for i, src_t in enumerate(srcs):
            if src_t.pmask is not None and src not in src_t.pmask:
                what = f"value {i}" if many else "the value"
                raise MPTypeError(f"{op}: route {dst} <- {src} reads from party {src}, "
                                  f"but {what} ({src_t}) is held only by {src_t.pmask}")
    dsts = Mask.of(routes)
    return [MPType(src_t.base, dsts) for src_t in srcs]


@_feop(shuffle_static_p, "z = simp.shuffle_static(y, {1: 0})")
@function
def shuffle_static(x: MPObject, routes: dict[int, int]) -> MPObject:
    """Party ``dst`` receives party ``src``'s ``x`` for each ``{dst: src}`` entry."""
    if not isinstance(routes, dict):
        raise MPTypeError(
            f"simp.shuffle_static: routes must be a dict {{dst: src}}, got {routes!r}")
    clean = {int(d): int(s) for d, s in sorted(routes.items())}
    return shuffle_static_p.bind([x], {"routes": clean})[0]


@shuffle_p.def_type_rule
def _shuffle_rule(sig: Signature) -> list[ValueType]:
    op = "simp.shuffle"
    x, index = sig.x, sig.index
    _check_movable(op, x, "the value")
    if not (isinstance(index.base, TensorType) and index.base.is_scalar
            and np.issubdtype(np.dtype(index.base.dtype), np.integer)):
        raise MPTypeError(f"{op}: the index must be an integer scalar, got {index}")
    return [MPType(x.base, index.pmask)]


@_feop(shuffle_p, "z = simp.shuffle(x, index)")
@function
def shuffle(x: MPObject, index: MPObject) -> MPObject:
    """Each party holding ``index`` receives ``x`` from party ``index`` (chosen at run time)."""
    return shuffle_p.bind([x, index])[0]


# ---------------------------------------------------------------- converge


@converge_p.def_type_rule
def _converge_rule(sig: Signature) -> list[ValueType]:
    op = "simp.converge"
    xs: list[MPType] = sig.xs
    if not xs:
        raise MPTypeError(f"{op}: needs at least one input")
    for i, x in enumerate(xs):
        _check_movable(op, x, f"input {i}")
    for i, x in enumerate(xs[1:], 1):
        if x.base != xs[0].base:
            raise MPTypeError(f"{op}: inputs must share one type; input 0 is {xs[0].base}, "
                              f"input {i} is {x.base}")
    union: Mask | None = Mask(0)
    for i, x in enumerate(xs):
        if x.pmask is None or union is None:
            union = None
            continue
        for j, y in enumerate(xs[:i]):
            if y.pmask is not None and (x.pmask & y.pmask).bits:
                raise MPTypeError(f"{op}: inputs must be held by disjoint parties; input {j} "
                                  f"({y}) and input {i} ({x}) overlap on {x.pmask & y.pmask}")
        union = union | x.pmask
    return [MPType(xs[0].base, union)]


@_feop(converge_p, "v = simp.converge(a0, a1)")
@function
def converge(*xs: MPObject) -> MPObject:
    """Merge values held by disjoint parties into one value held by all of them."""
    return converge_p.bind(list(xs))[0]


# ---------------------------------------------------------------- control flow


def _check_predicate(op: str, pred: ValueType, world_size: int) -> None:
    if not isinstance(pred, MPType):
        raise MPTypeError(f"{op}: the predicate must be a simp-level value, got {pred}")
    if not _is_bool_scalar(pred.base):
        raise MPTypeError(f"{op}: the predicate must be a boolean scalar, got {pred}")
    world = Mask.all(world_size)
    if pred.pmask is not None and pred.pmask != world:
        raise MPTypeError(f"{op}: the predicate ({pred}) must be held by every party {world}; "
                          "make it uniform first (e.g. shuffle or reveal it to all parties)")


def _check_region_inputs(op: str, operands: Sequence[ValueType], region: Graph, name: str) -> None:
    for i, (t, v) in enumerate(zip(operands, region.inputs, strict=True)):
        if t != v.type:
            raise MPTypeError(f"{op}: {name} input {i} is {v.type} but the operand is {t}")


@uniform_cond_p.def_type_rule
def _uniform_cond_rule(sig: Signature) -> list[ValueType]:
    op = "simp.uniform_cond"
    _check_predicate(op, sig.pred, sig.world_size)
    then_g, else_g = sig.regions
    _check_region_inputs(op, sig.args, then_g, "then-branch")
    _check_region_inputs(op, sig.args, else_g, "else-branch")
    then_t = [v.type for v in then_g.outputs]
    else_t = [v.type for v in else_g.outputs]
    if then_t != else_t:
        raise MPTypeError(
            f"{op}: branches must return the same types; then-branch returns "
            f"({', '.join(map(str, then_t))}), else-branch returns ({', '.join(map(str, else_t))})"
        )
    return then_t


@_feop(uniform_cond_p, "simp.uniform_cond(pred, f, g, x)")
@function
def uniform_cond(pred: MPObject, then_fn: Callable[..., Any], else_fn: Callable[..., Any],
                 *args: Any, verify_uniform: bool = True) -> Any:
    """``then_fn(*args)`` if ``pred`` else ``else_fn(*args)``, the same branch on every party.

    ``pred`` must be a boolean scalar held by all parties. With ``verify_uniform``
    the parties check at run time that they all saw the same predicate.
    """
    tracer = current_tracer("simp.uniform_cond")
    if not isinstance(pred, MPObject):
        error = MPTypeError(
            f"simp.uniform_cond: the predicate is a plain Python {type(pred).__name__} "
            f"({pred!r}), known while tracing; choose the branch with a Python `if`, or pass "
            "a boolean scalar MPLang value held by every party")
        locate_error(error)
        raise error
    traced = [trace_function(tracer.child(local=False), f, args) for f in (then_fn, else_fn)]
    if traced[0].out_tree != traced[1].out_tree:
        raise MPTypeError("simp.uniform_cond: branches return different structures: "
                          f"{traced[0].out_tree} vs {traced[1].out_tree}")
    arg_leaves = mp_leaves(args)
    graphs, captured = unify_regions(tracer, traced, len(arg_leaves))
    outs = uniform_cond_p.bind([pred, *arg_leaves, *captured],
                               {"verify_uniform": bool(verify_uniform)}, graphs)
    return tree_unflatten(traced[0].out_tree, outs)


@while_loop_p.def_type_rule
def _while_loop_rule(sig: Signature) -> list[ValueType]:
    op = "simp.while_loop"
    cond_g, body_g = sig.regions
    _check_region_inputs(op, sig.state, cond_g, "cond")
    _check_region_inputs(op, sig.state, body_g, "body")
    if len(cond_g.outputs) != 1:
        raise MPTypeError(f"{op}: cond_fn must return one predicate, got {len(cond_g.outputs)}")
    _check_predicate(op, cond_g.outputs[0].type, sig.world_size)
    num_state = len(body_g.outputs)
    state = sig.state[:num_state]
    for i, (before, v) in enumerate(zip(state, body_g.outputs, strict=True)):
        if before != v.type:
            raise MPTypeError(f"{op}: the loop state changes type: state {i} is {before} before "
                              f"the body and {v.type} after it; make body_fn return every "
                              "state value with its initial type (e.g. cast with .astype, or "
                              "start from an initial value of the loop's type)")
    return list(state)


@_feop(while_loop_p, "simp.while_loop(cond, body, init)")
@function
def while_loop(cond_fn: Callable[[Any], Any], body_fn: Callable[[Any], Any], init: Any) -> Any:
    """Repeat ``state = body_fn(state)`` while ``cond_fn(state)``, in lockstep on all parties."""
    tracer = current_tracer("simp.while_loop")
    leaves, _ = tree_flatten(init)
    for i, leaf in enumerate(leaves):
        if not isinstance(leaf, MPObject):
            raise MPTypeError(f"simp.while_loop: loop state leaf {i} is a plain "
                              f"{type(leaf).__name__}; the state must consist of MPLang values")
    cond_t = trace_function(tracer.child(local=False), cond_fn, (init,))
    body_t = trace_function(tracer.child(local=False), body_fn, (init,))
    init_tree = tree_flatten(init)[1]
    if body_t.out_tree != init_tree:
        raise MPTypeError("simp.while_loop: body_fn must return the same structure as the "
                          f"initial state; got {body_t.out_tree}, expected {init_tree}")
    graphs, captured = unify_regions(tracer, [cond_t, body_t], len(leaves))
    outs = while_loop_p.bind([*leaves, *captured], {}, graphs)
    return tree_unflatten(body_t.out_tree, outs)


# ---------------------------------------------------------------- flow rules


@constant_p.def_flow
@prank_p.def_flow
def _no_data(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Driver constants and ranks carry no party's data."""
    return [{} for _ in op.outputs]


@load_p.def_flow
def _load_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """An uploaded object is a source of its owner's data."""
    owner: int = op.attrs["party"]
    if owner != a.party:
        return [{owner: FOREIGN}]
    name = str(op.attrs["name"])
    a.source(op, name)
    return [{a.party: source(name, leading_rows(op.outputs[0].type))}]


@pcall_p.def_flow
def _pcall_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Each party runs the body on its own copies; only p's run reads p's sources.
    Parties decided at run time: every party that may hold the outputs."""
    parties = op.attrs["parties"]
    runners = list(parties) if parties is not None else \
        sorted({q for v in op.outputs for q in a.holders(v)} or range(a.world_size))
    outs: list[PartyLabels] = [{} for _ in op.outputs]
    for q in runners:
        mine = [lab.get(q) for lab in ins]
        a.runner = q
        for out, lab in zip(outs, a.local(op.regions[0], mine, q == a.party), strict=True):
            if lab is not None:
                out[q] = lab
    return outs


@shuffle_static_p.def_flow
def _shuffle_static_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    routes: dict[int, int] = op.attrs["routes"]
    outs = []
    for value in ins:
        out: PartyLabels = {}
        for dst, src in routes.items():
            label = value.get(src)
            if label is not None:
                out[dst] = label
                if dst != src:
                    a.send(op, dst, label, f"the value party {src} sends")
        outs.append(out)
    return outs


@shuffle_p.def_flow
def _shuffle_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Any source may answer any index holder; each index goes to every source."""
    value, index = ins
    label = everywhere(value)
    out: PartyLabels = {}
    for q in a.holders(op.outputs[0]):
        if label is not None:
            out[q] = label
            a.send(op, q, label, "the value (its source is chosen at run time)")
    for q, idx in index.items():
        for src in a.holders(op.inputs[0]):
            if src != q:
                a.send(op, src, idx, "the index party " + str(q) + " asks with")
    return [out]


@converge_p.def_flow
def _converge_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    out: PartyLabels = {}
    for value in ins:
        out = merge(out, value)
    return [out]


def _revealed_predicate(a: Analysis, op: Operation, pred: PartyLabels) -> Label:
    """A predicate every party must agree on is revealed to every party."""
    label = everywhere(pred)
    for q in range(a.world_size):
        a.send(op, q, label, "the predicate every party sees")
    return label


def _with(values: list[PartyLabels], label: Label) -> list[PartyLabels]:
    """Each copy also depends on ``label`` (control dependence)."""
    if label is None:
        return values
    return [{q: join(lab, label) or label for q, lab in v.items()} for v in values]


@uniform_cond_p.def_flow
def _uniform_cond_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    pred = _revealed_predicate(a, op, ins[0])
    then_out = a.graph(op.regions[0], ins[1:])
    else_out = a.graph(op.regions[1], ins[1:])
    return _with([merge(x, y) for x, y in zip(then_out, else_out, strict=True)], pred)


@while_loop_p.def_flow
def _while_loop_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    cond, body = op.regions
    n = len(body.outputs)
    captured = ins[n:]
    preds: list[Label] = []

    def step(state: list[PartyLabels]) -> list[PartyLabels]:
        preds.append(_revealed_predicate(a, op, a.graph(cond, state + captured)[0]))
        return a.graph(body, state + captured)

    state = a.loop(ins[:n], step)
    pred = _revealed_predicate(a, op, a.graph(cond, state + captured)[0])
    for p in preds:
        pred = join(pred, p)
    return _with(state, pred)


_SYMBOLS = {"add": "+", "subtract": "-", "multiply": "*", "divide": "/", "floor_divide": "//",
            "remainder": "%", "power": "**", "matmul": "@", "less": "<", "less_equal": "<=",
            "greater": ">", "greater_equal": ">=", "equal": "==", "not_equal": "!=",
            "negative": "-", "getitem": "[]"}


def _refuse_hidden(name: str, operands: tuple[Any, ...]) -> None:
    """Refuse a Python operator on a device's value that hides its plaintext (a secret
    share, a ciphertext) with no meaning registered for it, saying where to compute."""
    for x in operands:
        if not isinstance(x, MPObject) or x.device is None:
            continue
        base = x.base_type
        if isinstance(base, TensorType) or base.plaintext() is None:
            continue
        sym, dev = _SYMBOLS.get(name, name), x.device
        example = (f"jnp.where(a {sym} b, a, b)" if name in ("less", "less_equal", "greater",
                   "greater_equal", "equal", "not_equal") else f"a {sym} b")
        error = MPTypeError(
            f"operator `{sym}` on {dev}'s value {base}, which no party can read: Python code "
            f"outside a device function cannot compute or branch on it; compute inside "
            f"{dev}'s device function, e.g. mp.device({dev!r})(lambda a, b: {example})(x, y), "
            "or reveal the result to the parties first (mp.put('P0', z)) and branch there "
            "with simp.uniform_cond")
        locate_error(error)
        raise error


def _lift_operator(name: str, local_op: Callable[..., Any]) -> Callable[..., Any]:
    def apply(*operands: Any) -> Any:
        ctx = current_context()
        if isinstance(ctx, Tracer) and ctx.local:
            return local_op(*operands)
        if type_operator(name, operands) is None:
            _refuse_hidden(name, operands)
        return pcall(None, local_op, *operands)

    apply.__name__ = name
    return apply


OPERATORS.update({name: _lift_operator(name, op) for name, op in tensor.LOCAL_OPERATORS.items()})
"""At the simp level an operator runs on every party holding all its operands."""

__all__ = [
    "constant",
    "converge",
    "load",
    "pcall",
    "prank",
    "shuffle",
    "shuffle_static",
    "uniform_cond",
    "while_loop",
]
