"""Driver kernels of the ``simp`` dialect (seed 000 HOST_HANDLERS).

Standard mode dispatches each simp op to the parties that take part in it,
merges values for ``converge`` on the driver, and decides control flow on the
driver after checking that all parties saw the same predicate. Launch mode
differs only in ``func.call``: the whole body goes to every worker at once.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.backends.control_flow import run_while
from mplang.backends.func_impl import call_region
from mplang.backends.simp_driver.values import HostVar
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.typing import Mask, MPType
from mplang.frontend.errors import MPRuntimeError
from mplang.frontend.registry import get_op, is_registered
from mplang.runtime.interpreter import Interpreter, Kernel, KernelTable

if TYPE_CHECKING:
    from mplang.backends.simp_driver.base import SimpDriver

def _dispatch_multi_party(name: str) -> Kernel | None:
    """Every multi-party op without a driver kernel of its own is dispatched to the parties."""
    return _dispatch if is_registered(name) and get_op(name).execution_model == "multi_party" \
        else None


STANDARD = KernelTable(fallback=_dispatch_multi_party)
LAUNCH_OVERRIDES = KernelTable()


def _driver(interp: Interpreter) -> SimpDriver:
    driver: SimpDriver = interp.states["simp"]
    return driver


def _participants(op: Operation, args: list[HostVar], world_size: int) -> list[int] | None:
    """The parties an op needs (None: all of them)."""
    if op.opcode == "simp.constant":
        return list(op.attrs["parties"])
    if op.opcode == "simp.pcall":
        parties: Mask | None = op.attrs["parties"]
        if parties is not None:
            return list(parties)
        return [r for r in range(world_size) if all(a.uris[r] is not None for a in args)]
    if op.opcode == "simp.shuffle_static":
        routes: dict[int, int] = op.attrs["routes"]
        return sorted(set(routes) | set(routes.values()))
    return None


def _dispatch(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    driver = _driver(interp)
    # an op may read one value twice (x * x); the one-op graph lists each input once
    unique = dict(zip(op.inputs, args, strict=True))
    graph = Graph(list(unique), [op], list(op.outputs))
    parties = _participants(op, args, driver.world_size)
    return driver.run_on_parties(graph, list(unique.values()), interp.exec_id, key, parties)



@STANDARD.register("simp.converge")
def _converge(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    merged: list[str | None] = []
    for rank in range(_driver(interp).world_size):
        held = [a.uris[rank] for a in args if a.uris[rank] is not None]
        if len(held) > 1:
            raise MPRuntimeError(f"op simp.converge: party {rank} holds more than one input",
                                 party=rank, op=op.opcode)
        merged.append(held[0] if held else None)
    return [HostVar(tuple(merged))]


def _uniform_predicate(interp: Interpreter, op: Operation, pred: HostVar, verify: bool) -> bool:
    values = _driver(interp).fetch_var(pred)
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


@STANDARD.register("simp.uniform_cond")
def _uniform_cond(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    pred, *operands = args
    branch = 0 if _uniform_predicate(interp, op, pred, op.attrs["verify_uniform"]) else 1
    return interp.run(op.regions[branch], operands, f"{key}/b{branch}")


@STANDARD.register("simp.while_loop")
def _while_loop(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    return run_while(interp, op, args, key,
                     lambda pred, scope: _uniform_predicate(interp, op, pred, True))


STANDARD.register("func.call")(call_region)


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
    values = [*graph.inputs, *(v for op in graph.walk() for v in (*op.inputs, *op.outputs))]
    for v in values:
        if not isinstance(v.type, MPType):
            continue
        if v.type.pmask is None:
            return None
        mask = mask | v.type.pmask
    return mask


@LAUNCH_OVERRIDES.register("func.call")
def _launch(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    driver = _driver(interp)
    body = op.regions[0]
    parties = graph_parties(body, driver.world_size)
    return driver.run_on_parties(body, args, interp.exec_id, key, parties)


DRIVER_KERNELS = {"standard": STANDARD, "launch": STANDARD.with_overrides(LAUNCH_OVERRIDES)}
"""Kernel table of each execution mode."""
