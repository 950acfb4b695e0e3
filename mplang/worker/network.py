"""A network model for the in-memory simulator: every message between two parties
arrives after the link's latency plus its size over the link's bandwidth, and a
link carries one message at a time (later messages queue behind earlier ones)."""

from __future__ import annotations

import heapq
import itertools
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mplang.runtime.backend import Tag
from mplang.transport.wire import payload_bytes
from mplang.worker.mailbox import Mailbox


@dataclass(frozen=True)
class Link:
    """One directed link: latency in seconds, bandwidth in bytes per second (None: infinite)."""

    latency_s: float
    bandwidth_bytes_s: float | None

    def transmit_s(self, nbytes: int) -> float:
        return 0.0 if self.bandwidth_bytes_s is None else nbytes / self.bandwidth_bytes_s


@dataclass(frozen=True)
class NetworkModel:
    """Latency (ms) and bandwidth (Mbit/s) of every link, with per-link overrides
    ``{(src, dst): (latency_ms, bandwidth_mbps)}``."""

    latency_ms: float = 0.0
    bandwidth_mbps: float | None = None
    links: Mapping[tuple[int, int], tuple[float, float | None]] | None = None

    def __post_init__(self) -> None:
        pairs = [(self.latency_ms, self.bandwidth_mbps), *(self.links or {}).values()]
        for latency, bandwidth in pairs:
            if latency < 0 or (bandwidth is not None and bandwidth <= 0):
                raise ValueError("latency must be >= 0 and bandwidth > 0")

    def link(self, src: int, dst: int) -> Link:
        latency, bandwidth = (self.links or {}).get((src, dst),
                                                    (self.latency_ms, self.bandwidth_mbps))
        return Link(latency / 1e3, None if bandwidth is None else bandwidth * 1e6 / 8)


class DelayedNetwork:
    """Delivers messages into mailboxes at the time the model says they arrive."""

    def __init__(self, model: NetworkModel):
        self.model = model
        self._queue: list[tuple[float, int, Mailbox, int, Tag, Any]] = []
        self._link_free: dict[tuple[int, int], float] = {}
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._closed = False
        self._thread = threading.Thread(target=self._deliver, name="mplang-network",
                                        daemon=True)
        self._thread.start()

    def send(self, mailbox: Mailbox, src: int, dst: int, tag: Tag, value: Any) -> None:
        link = self.model.link(src, dst)
        with self._cond:
            depart = max(time.monotonic(), self._link_free.get((src, dst), 0.0))
            done = depart + link.transmit_s(payload_bytes(value))
            self._link_free[(src, dst)] = done
            heapq.heappush(self._queue, (done + link.latency_s, next(self._order), mailbox,
                                         src, tag, value))
            self._cond.notify()

    def _deliver(self) -> None:
        with self._cond:
            while not self._closed:
                if not self._queue:
                    self._cond.wait()
                    continue
                arrival = self._queue[0][0]
                delay = arrival - time.monotonic()
                if delay > 0:
                    self._cond.wait(delay)
                    continue
                _, _, mailbox, src, tag, value = heapq.heappop(self._queue)
                mailbox.put(src, tag, value)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
