"""What a worker accepts: limits per execution, and the runs it expects messages for.

A peer may send only what a run on this worker expects: the run must be going
on (registered by the driver's ``/run``, not finished or aborted), the sender
must be a party of it and run the same program, a typed message carries at
most the bytes its program's types declare, and link traffic (secure-device
protocol bytes) stays within a byte and message budget per link. Everything
else is refused at once (`MPRefusedError`) and logged.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from mplang.edsl.errors import MPRefusedError
from mplang.edsl.graph import Graph, communicates
from mplang.edsl.typing import MAX_SYMBOLIC_ELEMENTS, MPType
from mplang.transport.limits import WorkerLimits

log = logging.getLogger("mplang.worker")

SHARE_EXPANSION = 8
"""Bytes of a secret share or ciphertext per plaintext byte, as an upper bound (two
128-bit shares of a 32-bit value take 8x)."""
FRAMING_BYTES = 64 << 10
"""Allowance for a message's header and codec framing."""
NOT_YET = "not running here yet"
"""Marks a refusal the sender may retry: the run was not registered yet."""


def declared_bytes(vtype: object) -> int:
    """The largest number of bytes a value of ``vtype`` may take (0 when it holds no tensor)."""
    base = vtype.base if isinstance(vtype, MPType) else vtype
    bound = getattr(base, "wire_bytes", lambda: None)()
    if bound is not None:
        return int(bound)
    plain = getattr(base, "plaintext", lambda: None)()
    if plain is None:
        return 0
    elements = plain.elements_bound(MAX_SYMBOLIC_ELEMENTS)
    size = elements * np.dtype(plain.dtype).itemsize
    expansion = getattr(base, "expansion", 1.0)
    return int(size * (SHARE_EXPANSION if expansion is None else max(expansion, 1.0)))


def largest_message(graph: Graph, limits: WorkerLimits) -> int:
    """The most bytes one typed message of ``graph`` may carry: the largest sum of one
    op's results or of its operands (an op may send what it was given, such as the
    shares of an earlier evaluation it reveals). Raises `MPRefusedError` (413) for a
    value over the worker's limit."""
    largest = 0
    for op in graph.walk():
        for values in (op.outputs, op.inputs):
            total = 0
            for value in values:
                size = declared_bytes(value.type)
                if size > limits.max_value_bytes:
                    where = f" at {op.loc}" if op.loc else ""
                    raise MPRefusedError(
                        f"op {op.opcode}{where} declares a value {value.type} of {size} "
                        f"bytes, over this worker's limit of {limits.max_value_bytes} bytes",
                        413)
                total += size
            largest = max(largest, total)
    return largest + FRAMING_BYTES


class RunRefusal(MPRefusedError):
    """A message from a party of a run that the run here refuses: the run cannot go on
    without it, so it stops here with this refusal as its cause."""


@dataclass
class Run:
    """One ``/run`` of an execution on this worker."""

    exec_id: str
    scope: str
    driver: str
    """Fingerprint of the driver that started it."""
    program: str
    """Digest of the program it runs (peers must run the same)."""
    parties: frozenset[int]
    talkers: frozenset[str]
    """Key segments (op indices) of the program's ops that exchange messages."""
    max_message: int
    deadline: float
    received: int = 0
    links: dict[int, list[int]] = field(default_factory=dict)
    """Per sending party: [link bytes, link messages]."""


class Executions:
    """The runs going on at one worker, and the memory of finished ones."""

    def __init__(self, rank: int, limits: WorkerLimits):
        self.rank = rank
        self.limits = limits
        self._lock = threading.Lock()
        self._running: dict[str, dict[str, Run]] = {}
        self._owners: OrderedDict[str, str] = OrderedDict()
        """exec id -> driver fingerprint, for running and remembered executions."""
        self._finished: OrderedDict[str, list[str]] = OrderedDict()
        """exec id -> the scopes of its runs that ended here."""
        self._aborted: OrderedDict[str, None] = OrderedDict()

    def begin(self, exec_id: str, scope: str, driver: str, program: str, graph: Graph,
              parties: frozenset[int], timeout: float | None) -> Run:
        """Register a run; refuses a reused id, another driver's execution, an aborted
        one, or one over the limits."""
        max_message = largest_message(graph, self.limits)
        seconds = min(timeout or self.limits.max_seconds, self.limits.max_seconds)
        with self._lock:
            owner = self._owners.get(exec_id)
            if owner is not None and owner != driver:
                raise MPRefusedError(f"execution {exec_id} belongs to another driver", 403)
            if exec_id in self._aborted:
                raise MPRefusedError(f"execution {exec_id} was aborted", 409)
            runs = self._running.setdefault(exec_id, {})
            if scope in runs or scope in self._finished.get(exec_id, ()):
                raise MPRefusedError(f"execution id {exec_id} (scope {scope!r}) was already "
                                     "used on this worker", 409)
            if sum(len(r) for r in self._running.values()) >= self.limits.max_runs:
                if not runs:
                    del self._running[exec_id]
                raise MPRefusedError(f"this worker already runs {self.limits.max_runs} "
                                     "programs", 429)
            talkers = frozenset(str(i) for i, op in enumerate(graph.operations)
                                if communicates(op))
            run = Run(exec_id, scope, driver, program, parties, talkers, max_message,
                      time.monotonic() + seconds)
            runs[scope] = run
            self._remember(self._owners, exec_id, driver)
            return run

    def end(self, run: Run) -> None:
        with self._lock:
            runs = self._running.get(run.exec_id, {})
            runs.pop(run.scope, None)
            if not runs:
                self._running.pop(run.exec_id, None)
            scopes = self._finished.get(run.exec_id, [])
            scopes.append(run.scope)
            self._remember(self._finished, run.exec_id, scopes)

    def abort(self, exec_id: str, driver: str) -> None:
        """Mark ``exec_id`` aborted (also before its run arrives); only its driver may."""
        with self._lock:
            owner = self._owners.get(exec_id)
            if owner is not None and owner != driver:
                raise MPRefusedError(f"execution {exec_id} belongs to another driver", 403)
            self._remember(self._owners, exec_id, driver)
            self._remember(self._aborted, exec_id, None)

    def aborted(self, exec_id: str) -> bool:
        with self._lock:
            return exec_id in self._aborted

    def admit(self, src: int, exec_id: str, key: str, program: str, nbytes: int,
              link: bool) -> None:
        """Check one peer message against the run that expects it; count its bytes."""
        with self._lock:
            if exec_id in self._aborted:
                raise MPRefusedError(f"execution {exec_id} was aborted", 410)
            run = self._run_for(exec_id, key)
            if run is None:
                if any(key.startswith(s + "/") for s in self._finished.get(exec_id, ())):
                    raise MPRefusedError(f"execution {exec_id} has ended here", 410)
                raise MPRefusedError(f"execution {exec_id} is {NOT_YET}", 409)
            if src not in run.parties:
                raise MPRefusedError(f"party {src} takes no part in execution {exec_id}", 403)
            op_index = key[len(run.scope) + 1:].split("/", 1)[0]
            if op_index not in run.talkers:
                raise RunRefusal(f"op {key[:200]} of execution {exec_id} sends no messages",
                                 403)
            if program != run.program:
                raise RunRefusal(f"party {src} runs another program under execution "
                                 f"{exec_id}", 409)
            if time.monotonic() > run.deadline:  # not a cause: the run's own waits end it,
                # naming the party they wait for (a message this late is a consequence)
                raise MPRefusedError(f"execution {exec_id} ran past its time limit", 410)
            if run.received + nbytes > self.limits.max_execution_bytes:
                raise RunRefusal(f"execution {exec_id} would receive more than "
                                 f"{self.limits.max_execution_bytes} bytes", 413)
            if link:
                counts = run.links.setdefault(src, [0, 0])
                if counts[0] + nbytes > self.limits.max_link_bytes or \
                        counts[1] + 1 > self.limits.max_link_messages:
                    raise RunRefusal(f"party {src}'s link traffic into execution {exec_id} "
                                     "is over its budget", 413)
                counts[0] += nbytes
                counts[1] += 1
            elif nbytes > run.max_message:
                raise RunRefusal(f"a message of {nbytes} bytes for {key[:200]} is larger "
                                 f"than the program's types allow ({run.max_message})", 413)
            run.received += nbytes

    def _run_for(self, exec_id: str, key: str) -> Run | None:
        runs = self._running.get(exec_id)
        if not runs:
            return None
        best: Run | None = None
        for scope, run in runs.items():
            if key.startswith(scope + "/") and (best is None or len(scope) > len(best.scope)):
                best = run
        return best

    def program_of(self, exec_id: str, key: str, dst: int | None = None) -> str:
        """The program digest of this worker's own run that ``key`` belongs to; refuses a
        message to a party ``dst`` outside the run (only its parties voted for it)."""
        with self._lock:
            run = self._run_for(exec_id, key)
            if run is not None and dst is not None and dst not in run.parties:
                raise MPRefusedError(f"execution {exec_id}: op {key[:200]} sends to party {dst}, "
                                     f"which is not one of the parties the driver named for "
                                     f"this run ({sorted(run.parties)}, who alone accepted its "
                                     "program); nothing was sent", 403)
            return run.program if run is not None else ""

    def time_left(self, exec_id: str, key: str) -> float | None:
        """Seconds until the time limit of this worker's run that ``key`` belongs to (None:
        no such run)."""
        with self._lock:
            run = self._run_for(exec_id, key)
            return None if run is None else run.deadline - time.monotonic()

    def running(self) -> int:
        with self._lock:
            return sum(len(r) for r in self._running.values())

    def _remember(self, table: OrderedDict, key: object, value: object) -> None:
        table[key] = value
        table.move_to_end(key)
        while len(table) > self.limits.remembered_runs:
            table.popitem(last=False)
