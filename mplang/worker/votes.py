"""The votes the parties of a run send each other before any op of it runs.

A worker given a run of several parties checks the program, then sends its vote
(`mplang.worker.consent.sign_vote`) to every other party of the run
over its ``mplang/1`` connection to that party (path ``/vote``), and waits for
theirs. A vote may arrive before the run it is for reaches this worker, so
`VoteBox` keeps votes by (execution, scope) whether or not the run is known;
each peer holds at most `PER_PEER` unclaimed votes here, its oldest dropped first.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable

from mplang.edsl.errors import MPCommunicationError, MPTimeoutError

PER_PEER = 1024
"""Votes one peer may have waiting here for runs that have not claimed them."""


class VoteBox:
    """Votes received from peers, by (execution, scope), until their run takes them."""

    def __init__(self, rank: int):
        self.rank = rank
        self._cond = threading.Condition()
        self._held: dict[int, OrderedDict[tuple[str, str], str]] = {}
        """sender -> (execution, scope) -> its vote, oldest first."""
        self._aborted: dict[str, str] = {}

    def put(self, sender: int, exec_id: str, scope: str, vote: str) -> None:
        """Keep ``sender``'s vote for run (``exec_id``, ``scope``); a second vote of the
        same sender for the same run is ignored."""
        with self._cond:
            held = self._held.setdefault(sender, OrderedDict())
            held.setdefault((exec_id, scope), vote)
            while len(held) > PER_PEER:
                held.popitem(last=False)
            self._cond.notify_all()

    def take(self, exec_id: str, scope: str, parties: Iterable[int], deadline: float,
             why_late: Callable[[int], str]) -> dict[str, str]:
        """The vote of every party in ``parties`` for the run, by rank (as text), waiting
        until ``deadline`` (`time.monotonic`). Raises `MPTimeoutError` naming the first
        party whose vote did not come (``why_late(party)`` says why it may not have), and
        `MPCommunicationError` if the execution is aborted meanwhile."""
        votes: dict[str, str] = {}
        missing = sorted(parties)
        with self._cond:
            while True:
                for party in [p for p in missing if (exec_id, scope) in self._held.get(p, ())]:
                    votes[str(party)] = self._held[party].pop((exec_id, scope))
                    missing.remove(party)
                if not missing:
                    return votes
                reason = self._aborted.get(exec_id)
                if reason is not None:
                    raise MPCommunicationError(
                        f"party {self.rank}: execution {exec_id} was abandoned ({reason}) "
                        f"while waiting for the vote of party {missing[0]}",
                        party=self.rank, peer=missing[0])
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise MPTimeoutError(
                        f"party {self.rank}: no vote of party {missing[0]} for execution "
                        f"{exec_id} came in time: {why_late(missing[0])}",
                        party=self.rank, peer=missing[0])
                self._cond.wait(remaining)

    def held(self, sender: int) -> int:
        """How many of ``sender``'s votes wait here for their runs."""
        with self._cond:
            return len(self._held.get(sender, ()))

    def abort(self, exec_id: str, reason: str) -> None:
        """End every wait for votes of ``exec_id`` (remembered for the waits to come, up
        to `PER_PEER` executions)."""
        with self._cond:
            self._aborted.setdefault(exec_id, reason)
            while len(self._aborted) > PER_PEER:
                del self._aborted[next(iter(self._aborted))]
            self._cond.notify_all()
