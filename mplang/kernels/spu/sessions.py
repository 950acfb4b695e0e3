"""Secure sessions: an SPU device's libspu links and runtimes, kept across evaluations.

Setting up a libspu runtime costs more than most ops: CHEETAH makes its
oblivious-transfer and homomorphic-encryption material on first use (about 90 ms and
1 MB per party even to compare two scalars). So each member keeps, per driver and
device, a `SessionPool` of up to `SLOTS` sessions (a link and a runtime each) and runs
every ``spu.run`` of that driver on one of them.

Agreement, per run:

1. the device's first member (the leader) picks a slot that is free on its side and
   sends each member ``(slot, generation, uses)``: the slot's session and how many runs
   it has served (``uses`` -1: none, or discarded);
2. each other member waits until its own copy of that slot has served the runs before
   this one (they run in the leader's order), then sends its ``(generation, uses)`` to
   every other member;
3. everyone then holds the same states: if all are equal, the session is reused;
   otherwise every member replaces it with a new one of generation ``max + 1``.

A member whose state is the leader's does not wait for step 3: it starts at once on
its session (the leader as soon as it has announced), tagging the run's messages with
that state, and checks the others' states as they come. One that differs abandons the
attempt (its receives stop; outputs are kept only once every state is known to match),
and the run is made again on the new session.

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
    from mplang.runtime.interpreter import Call, Interpreter
    from mplang.worker.state import SimpWorker

SLOTS = 4
"""Sessions per driver and device: how many of its SPU ops may run at once on kept
sessions (more run on links of their own)."""
IDLE_SECONDS = 600.0
"""A pool unused this long is dropped (its sessions with it)."""
MAX_POOLS = 16
"""Pools kept per worker (one per driver and device)."""
MAX_SESSIONS = 8
"""Sessions kept per process (a worker's, or those of all the parties a simulator runs
in it), over all pools: a session holds its protocol's material (a CHEETAH session that
compared 10^4 values holds about 640 MB per party), so the least recently used idle
ones beyond this are dropped (their next run builds new ones, everywhere, as after a
failure)."""

_ANNOUNCE = struct.Struct("<iqq")  # slot (-1: a link of its own), generation, uses
_STATE = struct.Struct("<qq")  # generation, uses


@dataclass
class Session:
    """A libspu runtime of one member; ``bind(exec_id, key, timeout, attempt, settled)``
    points its link's messages at a run (`_CommChannel.bind`)."""

    runtime: Any
    bind: Callable[[str, str, float, str, Callable[[], bool] | None], None]


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


def run_in_session(pools: SessionPools, call: Call, worker: SimpWorker, config: SpuConfig,
                   timeout: float, body: Callable[[Any], list[Any]]) -> list[Any] | None:
    """``body(runtime)`` on the session the device's members agree on for this run of
    ``call``'s op; None if the leader found no free session (the run needs its own link)."""
    interp, key = call.interp, call.key
    members = config.members
    me, leader = worker.rank, members[0]
    pool = pools.pool(interp.owner, config)
    deadline = time.monotonic() + timeout
    announce = f"{key}/session"
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
            generation, uses = announced[1:]
        if index is None or index < 0:
            return None
        states = _States(worker, interp, members, f"{key}/session-state",
                         (generation, uses), pool.state(index))
        outputs = _agreed_run(pool, index, states, body, lambda g: pools.make(
            config, f"{pool.name}/{index}/{g}", members.index(me), interp.exec_id, key,
            timeout), lambda session, attempt, settled: session.bind(
            interp.exec_id, key, timeout, attempt, settled))
        ok = True
        return outputs
    finally:
        if index is not None and index >= 0:
            pool.release(index, ok)


class _OutOfStep(Exception):
    """A member's session state differs from the leader's: the optimistic attempt is
    abandoned."""


class _States:
    """The members' (generation, uses) of one run's slot: the leader's (announced), this
    member's, and the others' as they arrive (each non-leader sends its own to all)."""

    def __init__(self, worker: SimpWorker, interp: Interpreter, members: tuple[int, ...],
                 tag: str, leader_state: tuple[int, int], mine: tuple[int, int]):
        self._worker, self._interp, self._tag = worker, interp, tag
        self.mine, self.leader_state = mine, leader_state
        me = worker.rank
        if me != members[0]:
            for member in members:
                if member != me:
                    worker.communicator.send(member, (interp.exec_id, tag), _STATE.pack(*mine))
        self.known = {members[0]: leader_state, me: mine}
        self._members = members
        self._pending = [m for m in members if m not in self.known]
        self._lock = threading.Lock()

    def optimistic(self) -> bool:
        """Whether this member may start before hearing the others: the leader has a
        session and this member's is in the same state."""
        return self.leader_state[1] >= 0 and self.mine == self.leader_state

    def settled(self) -> bool:
        """Whether every state is in, looking without waiting; raises `_OutOfStep` (now
        and on every later call) once one differs from the leader's."""
        with self._lock:
            for member in list(self._pending):
                try:
                    data = self._worker.communicator.recv(
                        member, (self._interp.exec_id, self._tag), 0.0)
                except MPTimeoutError:
                    continue
                self.known[member] = _parse(_STATE, member, data)
                self._pending.remove(member)
            if any(state != self.leader_state for state in self.known.values()):
                raise _OutOfStep(f"the members' secure sessions are out of step: {self.known}")
            return not self._pending

    def out_of_step(self) -> bool:
        """Whether a state that differs from the leader's is in (a failed optimistic
        attempt came of that: it is run again)."""
        try:
            self.settled()
        except _OutOfStep:
            return True
        except Exception:  # the attempt's own failure is the one to report
            return False
        return False

    def all(self) -> list[tuple[int, int]]:
        """Every member's state, waiting for those still to come."""
        with self._lock:
            for member in list(self._pending):
                self.known[member] = _unpack(_STATE, self._worker, self._interp, member,
                                             self._tag)
                self._pending.remove(member)
        return [self.known[m] for m in self._members]


def _agreed_run(pool: SessionPool, index: int, states: _States,
                body: Callable[[Any], list[Any]], make: Callable[[int], Session],
                bind: Callable[[Session, str, Callable[[], bool] | None], None]) -> list[Any]:
    """``body`` on the session of slot ``index`` the members agree on. A member whose
    state is the leader's starts at once on its session (the optimistic attempt), while
    the others' states arrive; if one differs, the attempt is abandoned (its receives
    stop, its outputs are dropped) and every member runs on a new session."""
    kept = pool.slots[index].session
    if kept is not None and states.optimistic():
        generation, uses = states.mine
        bind(kept, f"{generation}.{uses}/", states.settled)
        try:
            outputs = body(kept.runtime)
        except Exception:
            if not states.out_of_step():
                raise
        else:
            if len(set(states.all())) == 1:
                return outputs
    session = pool.session(index, states.all(), make)
    bind(session, f"{pool.slots[index].generation}.0/", None)
    return body(session.runtime)


def _unpack(layout: struct.Struct, worker: SimpWorker, interp: Interpreter, src: int,
            tag: str) -> Any:
    return _parse(layout, src, worker.recv(interp, src, tag))


def _parse(layout: struct.Struct, src: int, data: Any) -> Any:
    if not isinstance(data, bytes) or len(data) != layout.size:
        raise RuntimeError(f"party {src} sent a malformed secure session state")
    return layout.unpack(data)
