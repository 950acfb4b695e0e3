"""``mplang/1``: many messages over one mutual-TLS connection, each on its own stream.

A message is a HEAD frame (a JSON object and the size of the body that follows)
and as many DATA frames as its body needs, at most `FRAME` bytes each. Frames of
different streams interleave: a small message waits for at most one frame of a
large one, so a slow or large transfer never holds up another execution. The
receiver reads each DATA frame straight into the buffer the handler gave for
that stream (no copy besides TLS's own), and the sender writes array buffers as
they are.

The protocol runs on an asyncio event loop (`MuxProtocol`); both ends use it, the
connecting side (`mplang.transport.mux_client`) and the worker
(`mplang.worker.mux_server`). TLS gives integrity and the peer's
identity (its certificate, pinned per party): frames carry no signature of their own.

Frame: ``kind`` (1 byte: HEAD or DATA), ``stream`` (4 bytes), ``length`` (4 bytes),
big-endian, then ``length`` bytes. A HEAD's bytes are the body size (8 bytes) and
the JSON object.

A receiver bounds what a peer can make it hold: a stream whose body it drops keeps
a byte counter only (not its HEAD), at most ``max_streams`` streams are open at
once, and a body that receives nothing for ``stall_seconds`` closes the connection.
"""

from __future__ import annotations

import asyncio
import json
import mmap
import struct
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

ALPN = "mplang/1"
"""The ALPN name a client offers to speak this protocol on a worker's port."""
FRAME = 256 << 10
"""The largest DATA frame: how long a small message may wait behind a large one."""
MAX_HEAD = 64 << 10
"""The largest HEAD (its JSON object); a larger one closes the connection."""

HEAD, DATA = 1, 2
_FRAME = struct.Struct("!BII")
_SIZE = struct.Struct("!Q")
_INLINE = 4096  # bodies up to this size go out in one write with their frame header
_EAGER = 1 << 20  # bodies up to this size get an ordinary buffer


def body_buffer(size: int) -> memoryview:
    """A writable buffer of ``size`` zero bytes for a body. Above 1 MiB, its memory is taken
    as it is written, in huge pages where the kernel allows (64 MiB: 32 faults, not 16,384)."""
    if size <= _EAGER:
        return memoryview(bytearray(size))
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        mapping.madvise(mmap.MADV_HUGEPAGE)
    return memoryview(mapping)


class MuxProtocolError(Exception):
    """The peer broke the framing; the connection is closed."""


class MuxHandler(Protocol):
    """What a connection does with the messages it receives."""

    def on_head(self, stream: int, head: dict[str, Any], size: int) -> memoryview | None:
        """A message begins: where its ``size``-byte body goes (None: read and drop it;
        then `on_body` is not called)."""

    def on_body(self, stream: int, head: dict[str, Any], body: memoryview) -> None:
        """A message's body is complete."""

    def on_lost(self, error: BaseException | None) -> None:
        """The connection closed (``error`` if it broke)."""


@dataclass(slots=True)
class _Incoming:
    head: dict[str, Any]  # empty for a dropped body: it keeps its counters only
    sink: memoryview | None
    size: int
    got: int = 0
    touched: float = 0.0  # when it last received bytes (time.monotonic)


_DROPPED: dict[str, Any] = {}


class _Outgoing:
    __slots__ = ("head", "head_sent", "offset", "part", "size", "stream", "taken", "views")

    def __init__(self, stream: int, head: dict[str, Any], parts: Sequence[Any]):
        self.stream = stream
        self.views = [v for v in (memoryview(p).cast("B") for p in parts) if len(v)]
        self.size = sum(len(v) for v in self.views)
        text = json.dumps(head, separators=(",", ":")).encode()
        self.head = _FRAME.pack(HEAD, stream, _SIZE.size + len(text)) + _SIZE.pack(self.size) \
            + text
        """The whole HEAD frame."""
        self.head_sent = False
        self.taken = 0
        self.part = 0
        self.offset = 0

    def take(self, n: int) -> list[memoryview]:
        """The next ``n`` body bytes, as slices of the parts (no copy)."""
        out = []
        self.taken += n
        while n:
            view = self.views[self.part]
            k = min(n, len(view) - self.offset)
            out.append(view[self.offset:self.offset + k])
            self.offset += k
            n -= k
            if self.offset == len(view):
                self.part, self.offset = self.part + 1, 0
        return out


class MuxProtocol(asyncio.BufferedProtocol):
    """One end of an ``mplang/1`` connection. `send` is called on the loop's thread."""

    def __init__(self, handler: MuxHandler, *, max_streams: int = 1 << 16,
                 stall_seconds: float | None = None):
        self.handler = handler
        self.max_streams = max_streams
        self.stall_seconds = stall_seconds
        self._stall_timer: asyncio.TimerHandle | None = None
        self.transport: Any = None  # an asyncio or uvloop TLS transport
        self._frame = memoryview(bytearray(_FRAME.size))
        self._filled = 0
        self._kind = 0
        self._stream = 0
        self._left = 0  # bytes of the current frame's payload still to come
        self._head = memoryview(bytearray(0))
        self._incoming: dict[int, _Incoming] = {}
        self._scratch = memoryview(bytearray(FRAME))
        self._small: deque[_Outgoing] = deque()
        self._bulk: deque[_Outgoing] = deque()
        self._paused = False
        self._pump_scheduled = False
        self.closed = False

    # -- connection
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        if self.stall_seconds is not None:
            self._schedule_stall_check()

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._stop_stall_checks()
        self._small.clear()
        self._bulk.clear()
        self.handler.on_lost(exc)
        # a closed connection holds no buffers, and no cycle through its transport keeps
        # the TLS state alive until the next full garbage collection
        self.transport = None
        self._incoming.clear()
        self._frame = self._head = self._scratch = memoryview(b"")

    def close(self, error: str | None = None) -> None:
        if self.transport is not None and not self.closed:
            self.closed = True
            self._stop_stall_checks()
            self.transport.close()
            self.handler.on_lost(MuxProtocolError(error) if error else None)

    # -- stalled bodies
    def _schedule_stall_check(self) -> None:
        assert self.stall_seconds is not None
        self._stall_timer = asyncio.get_running_loop().call_later(
            min(1.0, self.stall_seconds / 2), self._check_stalls)

    def _stop_stall_checks(self) -> None:
        if self._stall_timer is not None:
            self._stall_timer.cancel()
            self._stall_timer = None

    def _check_stalls(self) -> None:
        """Close the connection if a body has received nothing for ``stall_seconds``."""
        assert self.stall_seconds is not None
        if self.closed:
            return
        oldest = min((i.touched for i in self._incoming.values()), default=None)
        if oldest is not None and time.monotonic() - oldest > self.stall_seconds:
            self.close(f"a body received nothing for {self.stall_seconds:g} s "
                       f"({len(self._incoming)} streams open)")
            return
        self._schedule_stall_check()

    # -- sending
    def send(self, stream: int, head: dict[str, Any], parts: Sequence[Any] = ()) -> None:
        """Queue a message: small ones go before the next frame of a large one."""
        if self.closed:
            raise ConnectionError("the connection is closed")
        out = _Outgoing(stream, head, parts)
        (self._small if out.size <= FRAME else self._bulk).append(out)
        self._pump()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._pump()

    def _pump(self) -> None:
        """Write queued messages: all small ones, then one frame of a large one; the next
        frame waits for the loop's next turn, so requests arriving meanwhile are read and
        their (small) answers go out first."""
        self._pump_scheduled = False
        transport = self.transport
        while not self._paused and not self.closed and (self._small or self._bulk):
            if self._small:
                out = self._small.popleft()
                if 0 < out.size <= _INLINE:  # one write: HEAD, DATA and the body
                    transport.write(out.head + _FRAME.pack(DATA, out.stream, out.size)
                                    + b"".join(out.take(out.size)))
                else:
                    transport.write(out.head)
                    if out.size:
                        self._write_data(out, out.size)
                continue
            out = self._bulk[0]
            if not out.head_sent:
                transport.write(out.head)
                out.head_sent = True
            self._write_data(out, min(FRAME, out.size - out.taken))
            if out.taken == out.size:
                self._bulk.popleft()
            else:
                self._bulk.rotate(-1)  # large messages share the connection in turn
            if self._bulk and not self._pump_scheduled:
                self._pump_scheduled = True
                asyncio.get_running_loop().call_soon(self._pump)
            return

    def _write_data(self, out: _Outgoing, n: int) -> None:
        """One DATA frame of the next ``n`` bytes of ``out``'s body."""
        self.transport.write(_FRAME.pack(DATA, out.stream, n))
        for view in out.take(n):
            self.transport.write(view)

    # -- receiving
    def get_buffer(self, sizehint: int) -> memoryview:
        if self.closed:  # bytes that were in flight when the framing broke
            return self._scratch
        if self._filled < _FRAME.size:
            return self._frame[self._filled:]
        if self._kind == HEAD:
            return self._head[len(self._head) - self._left:]
        incoming = self._incoming[self._stream]
        if incoming.sink is None:
            return self._scratch[:self._left]
        return incoming.sink[incoming.got:incoming.got + self._left]

    def buffer_updated(self, nbytes: int) -> None:
        if self.closed:
            return
        try:
            self._advance(nbytes)
        except MuxProtocolError as e:
            self.close(str(e))

    def _advance(self, nbytes: int) -> None:
        if self._filled < _FRAME.size:
            self._filled += nbytes
            if self._filled < _FRAME.size:
                return
            self._kind, self._stream, self._left = _FRAME.unpack(self._frame)
            if self._kind == HEAD:
                if not _SIZE.size < self._left <= _SIZE.size + MAX_HEAD \
                        or self._stream in self._incoming:
                    raise MuxProtocolError("malformed HEAD frame")
                if len(self._incoming) >= self.max_streams:
                    raise MuxProtocolError(f"more than {self.max_streams} streams open at once")
                self._head = memoryview(bytearray(self._left))
                return
            incoming = self._incoming.get(self._stream)
            if self._kind != DATA or incoming is None or \
                    not 0 < self._left <= min(FRAME, incoming.size - incoming.got):
                raise MuxProtocolError("malformed DATA frame")
            return
        self._left -= nbytes
        if self._kind == DATA:
            incoming = self._incoming[self._stream]
            incoming.got += nbytes
            if self._left == 0:
                self._filled = 0
                if self.stall_seconds is not None:
                    incoming.touched = time.monotonic()
                if incoming.got == incoming.size:
                    del self._incoming[self._stream]
                    if incoming.sink is not None:
                        self.handler.on_body(self._stream, incoming.head, incoming.sink)
            return
        if self._left == 0:
            self._filled = 0
            self._begin(self._stream, self._head)

    def _begin(self, stream: int, data: memoryview) -> None:
        (size,) = _SIZE.unpack_from(data)
        try:
            head = json.loads(bytes(data[_SIZE.size:]))
        except (ValueError, RecursionError):
            raise MuxProtocolError("a HEAD is not JSON") from None
        if not isinstance(head, dict):
            raise MuxProtocolError("a HEAD is not a JSON object")
        try:
            sink = self.handler.on_head(stream, head, size)
        except (MemoryError, OverflowError):
            raise MuxProtocolError(f"no memory for a body of {size} bytes") from None
        if sink is not None and len(sink) != size:
            raise MuxProtocolError("the handler's buffer does not fit the body")
        if size == 0:
            if sink is not None:
                self.handler.on_body(stream, head, sink)
        else:
            self._incoming[stream] = _Incoming(head if sink is not None else _DROPPED, sink,
                                               size, touched=time.monotonic())
