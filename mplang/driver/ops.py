"""Driver kernels of the ``simp`` dialect.

Standard mode dispatches each simp op to the parties that take part in it,
merges values for ``converge`` on the driver, and decides control flow on the
driver after checking that all parties saw the same predicate. Launch mode
differs only in ``func.call``: the whole body goes to every worker at once.
Multi-party ops of any dialect without a driver kernel of their own go to
`dispatch`, which runs them on every party.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.dialects import func as _func
from mplang.dialects import simp as _simp
from mplang.driver.values import HostVar
from mplang.edsl.errors import MPRefusedError, MPRuntimeError
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.typing import Mask, MPType
from mplang.kernels.control_flow import run_while
from mplang.kernels.func import BACKEND as FUNC_BACKEND
from mplang.runtime.interpreter import Call, Interpreter
from mplang.worker.ops import BACKEND

if TYPE_CHECKING:
    from mplang.driver.base import SimpDriver

Participants = Callable[[Operation, Sequence[HostVar], int], list[int] | None]


def _driver(call: Call) -> SimpDriver:
    driver: SimpDriver = call.state("simp")
    return driver


def _run_on(call: Call, args: Sequence[Any], parties: list[int] | None) -> list[Any]:
    op = call.op
    # an op may read one value twice (x * x); the one-op graph lists each input once
    unique = dict(zip(op.inputs, args, strict=True))
    graph = Graph(list(unique), [op], list(op.outputs))
    return _driver(call).run_on_parties(graph, list(unique.values()), *call.tag, parties,
                                        call.interp.options)


def dispatch(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    """Run ``op`` on every party (the driver kernel of multi-party ops without their own)."""
    return _run_on(Call(interp, op, key), args, None)


def _dispatch_to(participants: Participants) -> Callable[..., list[Any]]:
    """A driver kernel running the op on the parties ``participants`` names."""
    def kernel(call: Call, *args: Any) -> list[Any]:
        return _run_on(call, args, participants(call.op, args, _driver(call).world_size))

    return kernel


BACKEND.kernel(_simp.constant_p, runtime="driver")(
    _dispatch_to(lambda op, args, world: list(op.attrs["parties"])))
BACKEND.kernel(_simp.shuffle_static_p, runtime="driver")(
    _dispatch_to(lambda op, args, world: sorted(set(op.attrs["routes"])
                                                | set(op.attrs["routes"].values()))))


def _pcall_parties(op: Operation, args: Sequence[HostVar], world_size: int) -> list[int]:
    parties: Mask | None = op.attrs["parties"]
    if parties is not None:
        return list(parties)
    return [r for r in range(world_size) if all(a.uris[r] is not None for a in args)]


BACKEND.kernel(_simp.pcall_p, runtime="driver")(_dispatch_to(_pcall_parties))


@BACKEND.kernel(_simp.converge_p, runtime="driver")
def _converge(call: Call, *xs: HostVar) -> list[Any]:
    merged: list[str | None] = []
    for rank in range(_driver(call).world_size):
        held = [a.uris[rank] for a in xs if a.uris[rank] is not None]
        if len(held) > 1:
            raise MPRuntimeError(f"op simp.converge: party {rank} holds more than one input",
                                 party=rank, op=call.op.opcode)
        merged.append(held[0] if held else None)
    return [HostVar(tuple(merged))]


def _uniform_predicate(call: Call, pred: HostVar, verify: bool) -> bool:
    op = call.op
    try:
        values = _driver(call).fetch_var(pred)
    except MPRefusedError as e:  # name the op whose predicate the driver asked for
        at = f" at {op.loc}" if op.loc else ""
        raise MPRefusedError(f"op {op.opcode}{at} (standard mode: the driver fetches its "
                             f"predicate): {e}", e.status) from None
    missing = [r for r, v in enumerate(values) if v is None]
    if missing:
        raise MPRuntimeError(f"op {op.opcode}: parties {missing} do not hold the predicate",
                             party=missing[0], op=op.opcode)
    seen = [bool(np.asarray(v)) for v in values]
    if verify and len(set(seen)) > 1:
        detail = ", ".join(f"party {r}: {v}" for r, v in enumerate(seen))
        raise MPRuntimeError(f"op {op.opcode}: the predicate is not uniform ({detail})",
                             op=op.opcode)
    return seen[0]


@BACKEND.kernel(_simp.uniform_cond_p, runtime="driver")
def _uniform_cond(call: Call, pred: HostVar, *args: Any, verify_uniform: bool) -> list[Any]:
    branch = 0 if _uniform_predicate(call, pred, verify_uniform) else 1
    return call.interp.run(call.op.regions[branch], args, f"{call.key}/b{branch}")


@BACKEND.kernel(_simp.while_loop_p, runtime="driver")
def _while_loop(call: Call, *state: Any) -> list[Any]:
    return run_while(call, state, lambda pred, scope: _uniform_predicate(call, pred, True))


_PARTIES: weakref.WeakKeyDictionary[Graph, Mask | None] = weakref.WeakKeyDictionary()


def graph_parties(graph: Graph, world_size: int) -> list[int] | None:
    """The parties that hold any value of ``graph`` (None: all, or not known statically).

    A party outside every value's pmask has nothing to compute, send or receive.
    """
    if graph not in _PARTIES:
        _PARTIES[graph] = _holders(graph)
    mask = _PARTIES[graph]
    return None if mask is None or len(mask) == world_size else list(mask)


def _holders(graph: Graph) -> Mask | None:
    mask = Mask(0)
    for op in graph.walk():  # a pcall with effects but no inputs or outputs (a write)
        parties = op.attrs.get("parties")
        if isinstance(parties, Mask):
            mask = mask | parties
    values = [*graph.inputs, *(v for op in graph.walk() for v in (*op.inputs, *op.outputs))]
    for v in values:
        if not isinstance(v.type, MPType):
            continue
        if v.type.pmask is None:
            return None
        mask = mask | v.type.pmask
    return mask


def _launch(call: Call, *args: Any) -> list[Any]:
    """Launch mode's ``func.call``: the whole body goes to every party that takes part."""
    driver = _driver(call)
    body = call.op.regions[0]
    parties = graph_parties(body, driver.world_size)
    return driver.run_on_parties(body, args, *call.tag, parties,
                                 replace(call.interp.options, whole=True))


FUNC_BACKEND.kernel(_func.call_p, runtime="launch")(_launch)
