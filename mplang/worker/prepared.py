"""A run a worker accepted (`WorkerServer.prepare`), from its ``/run`` until it ends."""

from __future__ import annotations

from dataclasses import dataclass

from mplang.edsl.graph import Graph
from mplang.runtime.options import RunOptions
from mplang.runtime.timeline import OpEvent
from mplang.worker.executions import Run


@dataclass
class Prepared:
    """A run this worker accepted: registered for its messages, not started yet."""

    run: Run
    graph: Graph
    inputs: list[str | None]
    options: RunOptions
    inline: int = 0
    """Up to how many bytes of outputs the driver wants in the ``/run`` answer."""
    events: list[OpEvent] | None = None
    """The ops this run recorded, when the driver asked for a trace."""
