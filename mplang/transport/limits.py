"""What one worker grants: the byte, run, stream, connection and time limits of
`WorkerLimits`, enforced by the transport and by the worker's executions."""

from __future__ import annotations

from dataclasses import dataclass

GiB = 1 << 30


@dataclass(frozen=True)
class WorkerLimits:
    """What one worker grants; the defaults are strict but fit real programs."""

    max_body_bytes: int = 2 * GiB
    """Largest request body (program, message or upload)."""
    max_value_bytes: int = 4 * GiB
    """Largest value a program may declare (a 10^12-element tensor is refused)."""
    max_execution_bytes: int = 16 * GiB
    """Bytes peers may send into one execution."""
    max_link_bytes: int = 8 * GiB
    """Link (secure-device protocol) bytes one peer may send into one execution."""
    max_link_messages: int = 4_000_000
    """Link messages one peer may send into one execution."""
    mailbox_bytes: int = 4 * GiB
    """Bytes of messages waiting to be taken, over all executions."""
    max_runs: int = 256
    """Runs going on at once."""
    max_seconds: float = 24 * 3600.0
    """Longest run; a driver asking for more is capped."""
    remembered_runs: int = 20_000
    """Executions remembered after they end (about 300 bytes each): their ids cannot be
    reused, and late messages for them are refused, while remembered."""
    max_inflight_bytes: int = 4 * GiB
    """Bytes of bodies being received at once, over all connections (as their HEADs
    announce them); a HEAD over the budget is refused (429) before anything is allocated."""
    max_streams: int = 1024
    """Streams open at once on one ``mplang/1`` connection; one more closes it."""
    stall_seconds: float = 30.0
    """A body that receives no byte for this long closes its connection."""
    handshake_seconds: float = 10.0
    """Longest TLS handshake; a connection that has not finished it is closed."""
    vote_seconds: float = 30.0
    """Longest wait for the other parties' votes on a run (their accept of its program)."""
    max_connections_per_peer: int = 64
    """Connections one certificate may hold open."""
    max_connections_per_address: int = 256
    """Connections (handshaking or open) from one source address."""
    max_connections: int | None = None
    """Connections at once over all sources; None: the descriptor limit less 256."""
