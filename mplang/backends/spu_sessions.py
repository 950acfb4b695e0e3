"""Secure sessions: an SPU device's libspu links and runtimes, kept across evaluations.

Setting up a libspu runtime costs more than most ops: CHEETAH makes its
oblivious-transfer and homomorphic-encryption material on first use (about 90 ms and
1 MB per party even to compare two scalars). So each member keeps, per driver and
device, a `SessionPool` of up to `SLOTS` sessions (a link and a runtime each) and runs
every ``spu.run`` of that driver on one of them.

Agreement, per run (one round trip, no extra one for the leader's choice):

1. the device's first member (the leader) picks a slot that is free on its side and
   sends each member ``(slot, generation, uses)``: the slot's session and how many runs
   it has served (``uses`` -1: none, or discarded);
2. each other member waits until its own copy of that slot has served the runs before
   this one (they run in the leader's order), then sends its ``(generation, uses)`` to
   every other member;
3. everyone now holds the same states: if all are equal, the session is reused;
   otherwise every member replaces it with a new one of generation ``max + 1``.

A run that fails anywhere discards that party's session (its link may be out of step),
so the next run's states differ and the session is rebuilt everywhere: a failed run
cannot poison the next. When every slot is busy the leader says so and the run gets a
link of its own, as a traced run does (its messages are counted per run).

A session serves one run at a time; the run's messages are tagged with its execution
id and op key as any other; its variables are deleted when it ends. Pools are dropped
after `IDLE_SECONDS` unused, beyond `MAX_POOLS` (least recently used first), when their
driver closes, and on a change of the cluster spec; idle sessions beyond `MAX_SESSIONS`
per worker are dropped, least recently used first.
"""

from __future__ import annotations

import hashlib
import struct
import threading
import time
import weakref
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from mplang.dialects.spu import SpuConfig
from mplang.edsl.errors import MPTimeoutError

if TYPE_CHECKING:
    from mplang.backends.simp_worker.state import SimpWorker
    from mplang.runtime.interpreter import Interpreter

SLOTS = 2
"""Sessions per driver and device: how many of its SPU ops may run at once on kept
sessions (more run on links of their own)."""
IDLE_SECONDS = 600.0
"""A pool unused this long is dropped (its sessions with it)."""
MAX_POOLS = 16
"""Pools kept per worker (one per driver and device)."""
MAX_SESSIONS = 6
"""Sessions kept per process (a worker's, or those of all the parties a simulator runs
in it), over all pools: a session holds its protocol's material (a CHEETAH session that
compared 10^4 values holds about 640 MB per party), so the least recently used idle
ones beyond this are dropped (their next run builds new ones, everywhere, as after a
failure)."""

_ANNOUNCE = struct.Struct("<iqq")  # slot (-1: a link of its own), generation, uses
_STATE = struct.Struct("<qq")  # generation, uses


@dataclass
class Session:
    """A libspu runtime of one member; ``bind(exec_id, key, timeout)`` points its link's
    messages at a run."""

    runtime: Any
    bind: Callable[[str, str, float], None]


SessionMaker = Callable[[SpuConfig, str, int, str, str, float], Session]
"""Makes this member's session of ``config`` (link name, member index), bound to a run
(execution id, op key, timeout)."""


class _Slot:
    def __init__(self) -> None:
        self.session: Session | None = None
        self.generation = 0
        self.uses = -1  # runs served by the session (-1: no session)
        self.busy = False

    def state(self) -> tuple[int, int]:
        return self.generation, self.uses


class SessionPool:
    """One driver's sessions of one SPU device, on one member."""

    def __init__(self, name: str):
        self.name = name
        self.slots = [_Slot() for _ in range(SLOTS)]
        self.used = time.monotonic()
        self._cond = threading.Condition()

    @property
    def busy(self) -> bool:
        return any(s.busy for s in self.slots)

    def claim(self) -> int | None:
        """The leader's pick: a free slot (one with a session first), now busy; None if
        all are busy."""
        with self._cond:
            free = [i for i, s in enumerate(self.slots) if not s.busy]
            if not free:
                return None
            index = min(free, key=lambda i: self.slots[i].session is None)
            self.slots[index].busy = True
            self.used = time.monotonic()
            return index

    def wait_turn(self, index: int, generation: int, uses: int, deadline: float) -> None:
        """A member's wait until its slot ``index`` is free and has served the runs the
        leader's slot served before this one (the same generation, fewer uses: those
        runs are still to come here); then the slot is busy."""
        slot = self.slots[index]
        with self._cond:
            while slot.busy or (slot.generation == generation and 0 <= slot.uses < uses):
                left = deadline - time.monotonic()
                if left <= 0:
                    raise MPTimeoutError(f"the secure session {self.name}/{index} was not "
                                         f"free in time for this run")
                self._cond.wait(left)
            slot.busy = True
            self.used = time.monotonic()

    def state(self, index: int) -> tuple[int, int]:
        with self._cond:
            return self.slots[index].state()

    def session(self, index: int, states: list[tuple[int, int]],
                make: Callable[[int], Session]) -> Session:
        """The session all members agree on: slot ``index``'s, if every member's state
        is the same; otherwise a new one (``make(generation)``) of the next generation."""
        slot = self.slots[index]
        if slot.session is not None and all(s == states[0] for s in states):
            return slot.session
        slot.session = None  # whatever this party had is out of step with the others
        generation = max(g for g, _ in states) + 1
        slot.session, slot.generation, slot.uses = make(generation), generation, 0
        return slot.session

    def drop_idle_sessions(self) -> int:
        """Drop the sessions no run is using; how many."""
        with self._cond:
            idle = [s for s in self.slots if s.session is not None and not s.busy]
            for slot in idle:
                slot.session, slot.uses = None, -1
            return len(idle)

    def release(self, index: int, ok: bool) -> None:
        """Slot ``index``'s run ended; a failed one discards the session."""
        slot = self.slots[index]
        with self._cond:
            if ok:
                slot.uses += 1
            else:
                slot.session, slot.uses = None, -1
            slot.busy = False
            self.used = time.monotonic()
            self._cond.notify_all()


class SessionPools:
    """A worker's session pools, by driver and device."""

    def __init__(self, make: SessionMaker):
        self.make = make
        self._pools: OrderedDict[tuple[str, SpuConfig], SessionPool] = OrderedDict()
        self._lock = threading.Lock()
        _REGISTRIES.add(self)

    def pool(self, owner: str, config: SpuConfig) -> SessionPool:
        key = (owner, config)
        now = time.monotonic()
        _drop_sessions_beyond(MAX_SESSIONS)
        with self._lock:
            for old_key, old in list(self._pools.items()):
                if not old.busy and (now - old.used > IDLE_SECONDS
                                     or len(self._pools) > MAX_POOLS):
                    del self._pools[old_key]
            pool = self._pools.get(key)
            if pool is None:
                name = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
                pool = self._pools[key] = SessionPool(f"{config.device}:{name}")
            self._pools.move_to_end(key)
            return pool

    def pools(self) -> list[SessionPool]:
        with self._lock:
            return list(self._pools.values())

    def clear(self, owner: str | None = None) -> None:
        """Forget the pools of driver ``owner`` (default: every pool); runs going on keep
        their sessions."""
        with self._lock:
            for key in [k for k in self._pools if owner is None or k[0] == owner]:
                del self._pools[key]

    def __len__(self) -> int:
        return len(self._pools)


_REGISTRIES: weakref.WeakSet[SessionPools] = weakref.WeakSet()
"""Every `SessionPools` of this process (the cap on sessions is per process)."""


def _drop_sessions_beyond(limit: int) -> None:
    """Drop idle sessions of this process, least recently used pools first, until at
    most ``limit`` are kept (sessions in use count, and stay)."""
    pools = sorted((p for registry in list(_REGISTRIES) for p in registry.pools()),
                   key=lambda p: p.used)
    kept = sum(s.session is not None for p in pools for s in p.slots)
    for pool in pools:
        if kept <= limit:
            return
        kept -= pool.drop_idle_sessions()


def run_in_session(pools: SessionPools, interp: Interpreter, worker: SimpWorker,
                   config: SpuConfig, key: str, timeout: float,
                   body: Callable[[Any], list[Any]]) -> list[Any] | None:
    """``body(runtime)`` on the session the device's members agree on for this run of
    op ``key``; None if the leader found no free session (the run needs its own link)."""
    members = config.members
    me, leader = worker.rank, members[0]
    pool = pools.pool(interp.owner, config)
    deadline = time.monotonic() + timeout
    announce, state = f"{key}/session", f"{key}/session-state"
    if me == leader:
        index = pool.claim()
    else:
        index, generation, uses = _unpack(_ANNOUNCE, worker, interp, leader, announce)
        if not -1 <= index < SLOTS:
            raise RuntimeError(f"party {leader} announced session slot {index} of {SLOTS}")
        if index >= 0:
            pool.wait_turn(index, generation, uses, deadline)
    ok = False
    try:
        if me == leader:
            announced = (-1, 0, 0) if index is None else (index, *pool.state(index))
            for member in members[1:]:
                worker.communicator.send(member, (interp.exec_id, announce),
                                         _ANNOUNCE.pack(*announced))
            states = [announced[1:]]
        else:
            states = [(generation, uses)]
        if index is None or index < 0:
            return None
        mine = pool.state(index)
        if me != leader:
            for member in members:
                if member != me:
                    worker.communicator.send(member, (interp.exec_id, state),
                                             _STATE.pack(*mine))
        states += [mine if member == me else _unpack(_STATE, worker, interp, member, state)
                   for member in members[1:]]
        session = pool.session(index, states, lambda g: pools.make(
            config, f"{pool.name}/{index}/{g}", members.index(me), interp.exec_id, key,
            timeout))
        session.bind(interp.exec_id, key, timeout)
        outputs = body(session.runtime)
        ok = True
        return outputs
    finally:
        if index is not None and index >= 0:
            pool.release(index, ok)


def _unpack(layout: struct.Struct, worker: SimpWorker, interp: Interpreter, src: int,
            tag: str) -> Any:
    data = worker.recv(interp, src, tag)
    if not isinstance(data, bytes) or len(data) != layout.size:
        raise RuntimeError(f"party {src} sent a malformed secure session state")
    return layout.unpack(data)
