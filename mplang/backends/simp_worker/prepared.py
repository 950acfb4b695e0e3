"""Runs accepted by ``/prepare``, held until their driver's ``/run`` starts them, its
``/abort`` drops them, or they expire unstarted (`PreparedRuns.sweep`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from mplang.backends.simp_worker.executions import Executions, Run
from mplang.backends.simp_worker.mailbox import Mailbox
from mplang.edsl.errors import MPRefusedError
from mplang.edsl.graph import Graph
from mplang.runtime.options import RunOptions
from mplang.runtime.timeline import OpEvent


@dataclass
class Prepared:
    """A run accepted by ``/prepare``, waiting for its ``/run``."""

    run: Run
    graph: Graph
    inputs: list[str | None]
    options: RunOptions
    expires: float
    inline: int = 0
    """Up to how many bytes of outputs the driver wants in the ``/run`` answer."""
    events: list[OpEvent] | None = None
    """The ops this run recorded, when the driver asked for a trace."""


class PreparedRuns:
    """The prepared, unstarted runs of one worker, by (execution, scope). A run that
    leaves here without starting ends its registration, drops its messages and gets its
    privacy budget back (``refund(graph)``)."""

    def __init__(self, executions: Executions, mailbox: Mailbox,
                 refund: Callable[[Graph], None] = lambda graph: None):
        self.executions = executions
        self.mailbox = mailbox
        self.refund = refund
        self.runs: dict[tuple[str, str], Prepared] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.runs)

    def hold(self, prepared: Prepared) -> None:
        """Keep a prepared run until its ``/run`` (or until it expires unstarted)."""
        with self._lock:
            self._sweep(time.monotonic())
            self.runs[(prepared.run.exec_id, prepared.run.scope)] = prepared
        if self.executions.aborted(prepared.run.exec_id):  # an abort that came while it
            self.drop(prepared.run.exec_id)                 # was being prepared

    def take(self, exec_id: str, scope: str, driver: str) -> Prepared:
        """The run that driver (certificate fingerprint) ``driver`` prepared, to start it;
        refused (409) when there is none."""
        with self._lock:
            prepared = self.runs.get((exec_id, scope))
            if prepared is not None and prepared.run.driver == driver:
                del self.runs[(exec_id, scope)]
            else:
                prepared = None
        if prepared is None:
            raise MPRefusedError(f"execution {exec_id} (scope {scope!r}) was not prepared "
                                 "here by this driver", 409)
        return prepared

    def drop(self, exec_id: str) -> None:
        """Forget the prepared runs of an aborted execution."""
        with self._lock:
            dropped = [self.runs.pop(k) for k in list(self.runs) if k[0] == exec_id]
        for prepared in dropped:
            self.refund(prepared.graph)
            self.executions.end(prepared.run)

    def sweep(self) -> None:
        """Forget the runs whose ``/run`` did not come before they expired."""
        with self._lock:
            self._sweep(time.monotonic())

    def _sweep(self, now: float) -> None:
        for key in [k for k, p in self.runs.items() if p.expires < now]:
            stale = self.runs.pop(key)
            self.refund(stale.graph)
            self.executions.end(stale.run)
            self.mailbox.drop(stale.run.exec_id, stale.run.scope)
