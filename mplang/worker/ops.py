"""The ``simp`` dialect's backend and its worker kernels: local execution and direct
messages. Driver kernels register on the same backend in `mplang.driver.ops`."""

from __future__ import annotations

from typing import Any

import numpy as np

from mplang.dialects import simp as _simp
from mplang.edsl.errors import MPPublicError, MPRuntimeError
from mplang.edsl.graph import Operation
from mplang.edsl.typing import Mask
from mplang.kernels.control_flow import run_while
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Interpreter
from mplang.worker.state import SimpWorker

BACKEND = register_backend("simp")


def _worker(interp: Interpreter) -> SimpWorker:
    worker: SimpWorker = interp.states["simp"]
    return worker


def _fail(worker: SimpWorker, op: Operation, message: str) -> MPPublicError:
    return MPPublicError(f"party {worker.rank}: op {op.opcode}"
                          f"{f' (traced at {op.loc})' if op.loc else ''}: {message}",
                          party=worker.rank, op=op.opcode, loc=op.loc)


@BACKEND.kernel(_simp.constant_p)
def _constant(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    return [op.attrs["value"] if _worker(interp).rank in op.attrs["parties"] else None]


@BACKEND.kernel(_simp.prank_p)
def _prank(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    return [np.asarray(_worker(interp).rank, dtype=np.int32)]


@BACKEND.kernel(_simp.pcall_p)
def _pcall(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    worker = _worker(interp)
    parties: Mask | None = op.attrs["parties"]
    if parties is None:
        runs = all(a is not None for a in args)
    else:
        runs = worker.rank in parties
        missing = [i for i, a in enumerate(args) if a is None]
        if runs and missing:
            raise _fail(worker, op, f"runs on parties {parties} but this party does not hold "
                                    f"input {missing[0]}")
    if not runs:
        return [None] * len(op.outputs)
    return interp.run(op.regions[0], args, key)


@BACKEND.kernel(_simp.shuffle_static_p)
def _shuffle_static(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    """Each route carries one message: the value itself, or the list of all N values."""
    worker = _worker(interp)
    tag = (interp.exec_id, key)
    routes: dict[int, int] = op.attrs["routes"]
    count = len(args)
    missing = next((i for i, x in enumerate(args) if x is None), None)
    what = "a value" if count == 1 else f"value {missing}, which"  # used if missing is set
    for dst, src in routes.items():
        if src == worker.rank and dst != src:
            if missing is not None:
                raise _fail(worker, op, f"must send to party {dst} {what} it does not hold")
            worker.communicator.send(dst, tag, args[0] if count == 1 else list(args))
    source = routes.get(worker.rank)
    if source is None:
        return [None] * count
    if source == worker.rank:
        if missing is not None:
            raise _fail(worker, op, f"must keep {what} it does not hold")
        return list(args)
    message = worker.recv(interp, source, key)
    if count == 1:
        return [message]
    if not isinstance(message, list) or len(message) != count:
        raise _fail(worker, op, f"expected {count} values from party {source}, got "
                                f"{len(message) if isinstance(message, list) else 'one'}")
    return list(message)


@BACKEND.kernel(_simp.shuffle_p)
def _shuffle(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    worker = _worker(interp)
    x, index = args
    me, world = worker.rank, worker.world_size
    request = -1 if index is None else int(np.asarray(index))
    if index is not None and not 0 <= request < world:
        request = -2
    ask = (interp.exec_id, key + "/ask")
    give = (interp.exec_id, key + "/give")
    for peer in range(world):
        if peer != me:
            worker.communicator.send(peer, ask, request)
    requests = {peer: worker.recv(interp, peer, ask[1]) for peer in range(world) if peer != me}
    for peer, wanted in requests.items():
        if wanted == me:
            worker.communicator.send(peer, give, x)
    if index is None:
        return [None]
    # the index is data: these failures leave this party only as a generic error
    if request == -2:
        raise MPRuntimeError(f"party {me}: op {op.opcode}: index {int(np.asarray(index))} is "
                             f"not a party of a {world}-party world", party=me, op=op.opcode)
    value = x if request == me else worker.recv(interp, request, give[1])
    if value is None:
        raise MPRuntimeError(f"party {me}: op {op.opcode}: party {request} does not hold the "
                             "value requested from it", party=me, op=op.opcode)
    return [value]


@BACKEND.kernel(_simp.converge_p)
def _converge(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    held = [i for i, a in enumerate(args) if a is not None]
    if len(held) > 1:
        raise _fail(_worker(interp), op, f"inputs {held} are all held by this party; "
                                          "converge needs disjoint holders")
    return [args[held[0]] if held else None]


def _uniform_predicate(interp: Interpreter, op: Operation, pred: Any, tag_key: str,
                       verify: bool) -> bool:
    worker = _worker(interp)
    if pred is None:
        raise _fail(worker, op, "this party does not hold the predicate")
    value = bool(np.asarray(pred))
    if verify and worker.world_size > 1:
        tag = (interp.exec_id, tag_key)
        for peer in range(worker.world_size):
            if peer != worker.rank:
                worker.communicator.send(peer, tag, value)
        seen = {peer: worker.recv(interp, peer, tag_key)
                for peer in range(worker.world_size) if peer != worker.rank}
        seen[worker.rank] = value
        if len(set(seen.values())) > 1:
            raise _fail(worker, op, "the predicate is not uniform: the parties computed "
                                    "different values")
    return value


@BACKEND.kernel(_simp.uniform_cond_p)
def _uniform_cond(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    pred, *operands = args
    take_then = _uniform_predicate(interp, op, pred, key + "/pred", op.attrs["verify_uniform"])
    branch = 0 if take_then else 1
    return interp.run(op.regions[branch], operands, f"{key}/b{branch}")


@BACKEND.kernel(_simp.while_loop_p)
def _while_loop(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    return run_while(interp, op, args, key, lambda pred, scope: _uniform_predicate(
        interp, op, pred, scope + "/pred", True))
