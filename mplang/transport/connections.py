"""How many connections a worker holds, and from whom.

Every TCP connection is admitted by `ConnectionGate` before its TLS handshake:
within the cap on connections from its source address and on connections over
all sources (which the descriptor limit bounds). Its handshake must end within
``handshake_seconds``. Once the handshake names the peer's certificate, the
connection counts against that peer's cap too. A connection over a cap is
closed at once and the worker logs which cap (at most once a second per cap
and source, so a flood does not flood the log).
"""

from __future__ import annotations

import logging
import resource
import time
from collections import Counter

from mplang.transport.limits import WorkerLimits

log = logging.getLogger("mplang.worker")

DESCRIPTOR_RESERVE = 256
"""Descriptors kept for files, the spec watcher, outgoing connections and helpers."""
_DESCRIPTOR_CEILING = 1 << 20


def raise_descriptor_limit() -> int:
    """Raise this process's soft limit on open descriptors to its hard limit (at most
    2^20); the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = _DESCRIPTOR_CEILING if hard == resource.RLIM_INFINITY \
        else min(hard, _DESCRIPTOR_CEILING)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("could not raise the descriptor limit from %d to %d: %s", soft, target,
                        e)
    return soft


class Ticket:
    """One admitted connection; `release` (idempotent) when it closes."""

    __slots__ = ("address", "gate", "peer")

    def __init__(self, gate: ConnectionGate, address: str):
        self.gate: ConnectionGate | None = gate
        self.address = address
        self.peer: str | None = None

    def bind(self, fingerprint: str | None) -> bool:
        """The handshake named ``fingerprint``: whether its peer is within its cap."""
        return self.gate is None or self.gate.bind(self, fingerprint)

    def release(self) -> None:
        if self.gate is not None:
            self.gate.release(self)
            self.gate = None


class ConnectionGate:
    """The connection caps of one worker (all calls on its event loop's thread)."""

    def __init__(self, limits: WorkerLimits):
        self.per_address = limits.max_connections_per_address
        self.per_peer = limits.max_connections_per_peer
        self.handshake_seconds = limits.handshake_seconds
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        self.total = limits.max_connections if limits.max_connections is not None \
            else max(64, min(soft, _DESCRIPTOR_CEILING) - DESCRIPTOR_RESERVE)
        self.open = 0
        self.addresses: Counter[str] = Counter()
        self.peers: Counter[str] = Counter()
        self._logged: dict[tuple[str, str], float] = {}

    def admit(self, address: str) -> Ticket | None:
        """A new TCP connection from ``address``: its ticket, or None if over a cap."""
        if self.open >= self.total:
            self._refuse("connections", address, self.total)
            return None
        if self.addresses[address] >= self.per_address:
            self._refuse("connections per address", address, self.per_address)
            return None
        self.open += 1
        self.addresses[address] += 1
        return Ticket(self, address)

    def bind(self, ticket: Ticket, fingerprint: str | None) -> bool:
        if fingerprint is None:
            return True  # no certificate: the handshake already failed, or the app refuses it
        if self.peers[fingerprint] >= self.per_peer:
            self._refuse("connections per peer", f"certificate {fingerprint[:16]}...",
                         self.per_peer)
            return False
        ticket.peer = fingerprint
        self.peers[fingerprint] += 1
        return True

    def release(self, ticket: Ticket) -> None:
        self.open -= 1
        for counter, key in ((self.addresses, ticket.address), (self.peers, ticket.peer)):
            if key is not None:
                counter[key] -= 1
                if counter[key] <= 0:
                    del counter[key]

    def _refuse(self, cap: str, source: str, limit: int) -> None:
        now = time.monotonic()
        if now - self._logged.get((cap, source), -1.0) >= 1.0:
            if len(self._logged) > 4096:
                self._logged.clear()
            self._logged[(cap, source)] = now
            log.warning("connection cap hit: %s at its limit of %d; closing new connections "
                        "from %s", cap, limit, source)
