"""The ``simp`` dialect's backend and its worker kernels: local execution and direct
messages. Driver kernels register on the same backend in `mplang.driver.ops`."""

from __future__ import annotations

from typing import Any

import numpy as np

from mplang.dialects import simp as _simp
from mplang.edsl.errors import MPPublicError
from mplang.edsl.typing import Mask
from mplang.kernels.control_flow import run_while
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Call
from mplang.worker.state import SimpWorker

BACKEND = register_backend("simp")


def _worker(call: Call) -> SimpWorker:
    worker: SimpWorker = call.state("simp")
    return worker


def _fail(call: Call, message: str) -> MPPublicError:
    op, rank = call.op, _worker(call).rank
    return MPPublicError(f"party {rank}: op {op.opcode}"
                          f"{f' (traced at {op.loc})' if op.loc else ''}: {message}",
                          party=rank, op=op.opcode, loc=op.loc)


@BACKEND.kernel(_simp.constant_p)
def _constant(call: Call, *, parties: Mask, value: Any) -> list[Any]:
    return [value if _worker(call).rank in parties else None]


@BACKEND.kernel(_simp.prank_p)
def _prank(call: Call) -> list[Any]:
    return [np.asarray(_worker(call).rank, dtype=np.int32)]


@BACKEND.kernel(_simp.pcall_p)
def _pcall(call: Call, *args: Any, parties: Mask | None) -> list[Any]:
    if parties is None:
        runs = all(a is not None for a in args)
    else:
        runs = _worker(call).rank in parties
        missing = [i for i, a in enumerate(args) if a is None]
        if runs and missing:
            raise _fail(call, f"runs on parties {parties} but this party does not hold "
                              f"input {missing[0]}")
    if not runs:
        return [None] * len(call.op.outputs)
    return call.interp.run(call.op.regions[0], args, call.key)


@BACKEND.kernel(_simp.shuffle_static_p)
def _shuffle_static(call: Call, *values: Any, routes: dict[int, int]) -> list[Any]:
    """Each route carries one message: the value itself, or the list of all N values."""
    worker = _worker(call)
    count = len(values)
    missing = next((i for i, x in enumerate(values) if x is None), None)
    what = "a value" if count == 1 else f"value {missing}, which"  # used if missing is set
    for dst, src in routes.items():
        if src == worker.rank and dst != src:
            if missing is not None:
                raise _fail(call, f"must send to party {dst} {what} it does not hold")
            worker.communicator.send(dst, call.tag, values[0] if count == 1 else list(values))
    source = routes.get(worker.rank)
    if source is None:
        return [None] * count
    if source == worker.rank:
        if missing is not None:
            raise _fail(call, f"must keep {what} it does not hold")
        return list(values)
    message = worker.recv(call.interp, source, call.key)
    if count == 1:
        return [message]
    if not isinstance(message, list) or len(message) != count:
        raise _fail(call, f"expected {count} values from party {source}, got "
                          f"{len(message) if isinstance(message, list) else 'one'}")
    return list(message)


@BACKEND.kernel(_simp.shuffle_p)
def _shuffle(call: Call, x: Any, index: Any) -> list[Any]:
    worker = _worker(call)
    me, world = worker.rank, worker.world_size
    request = -1 if index is None else int(np.asarray(index))
    if index is not None and not 0 <= request < world:
        request = -2
    exec_id, key = call.tag
    ask, give = (exec_id, key + "/ask"), (exec_id, key + "/give")
    for peer in range(world):
        if peer != me:
            worker.communicator.send(peer, ask, request)
    requests = {peer: worker.recv(call.interp, peer, ask[1]) for peer in range(world)
                if peer != me}
    for peer, wanted in requests.items():
        if wanted == me:
            worker.communicator.send(peer, give, x)
    if index is None:
        return [None]
    # the index is data: these failures leave this party only as a generic error
    if request == -2:
        raise call.error(f"index {int(np.asarray(index))} is not a party of a {world}-party "
                         "world")
    value = x if request == me else worker.recv(call.interp, request, give[1])
    if value is None:
        raise call.error(f"party {request} does not hold the value requested from it")
    return [value]


@BACKEND.kernel(_simp.converge_p)
def _converge(call: Call, *xs: Any) -> list[Any]:
    held = [i for i, a in enumerate(xs) if a is not None]
    if len(held) > 1:
        raise _fail(call, f"inputs {held} are all held by this party; "
                          "converge needs disjoint holders")
    return [xs[held[0]] if held else None]


def _uniform_predicate(call: Call, pred: Any, tag_key: str, verify: bool) -> bool:
    worker = _worker(call)
    if pred is None:
        raise _fail(call, "this party does not hold the predicate")
    value = bool(np.asarray(pred))
    if verify and worker.world_size > 1:
        tag = (call.interp.exec_id, tag_key)
        for peer in range(worker.world_size):
            if peer != worker.rank:
                worker.communicator.send(peer, tag, value)
        seen = {peer: worker.recv(call.interp, peer, tag_key)
                for peer in range(worker.world_size) if peer != worker.rank}
        seen[worker.rank] = value
        if len(set(seen.values())) > 1:
            raise _fail(call, "the predicate is not uniform: the parties computed "
                              "different values")
    return value


@BACKEND.kernel(_simp.uniform_cond_p)
def _uniform_cond(call: Call, pred: Any, *args: Any, verify_uniform: bool) -> list[Any]:
    take_then = _uniform_predicate(call, pred, call.key + "/pred", verify_uniform)
    branch = 0 if take_then else 1
    return call.interp.run(call.op.regions[branch], args, f"{call.key}/b{branch}")


@BACKEND.kernel(_simp.while_loop_p)
def _while_loop(call: Call, *state: Any) -> list[Any]:
    return run_while(call, state, lambda pred, scope: _uniform_predicate(
        call, pred, scope + "/pred", True))
