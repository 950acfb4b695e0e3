"""The ``mplang/1`` framing on its own: what one end writes, the other reassembles;
small messages overtake large ones; broken framing closes the connection."""

from __future__ import annotations

import asyncio
import json
import random
import struct
from typing import Any

import numpy as np
import pytest

from mplang.transport.mux import DATA, FRAME, HEAD, MAX_HEAD, MuxProtocol


class Transport:
    """Records what a protocol writes."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))

    def close(self) -> None:
        self.closed = True


class Recorder:
    def __init__(self, sinks: bool = True) -> None:
        self.messages: list[tuple[int, dict[str, Any], bytes | None]] = []
        self.lost: list[BaseException | None] = []
        self.sinks = sinks

    def on_head(self, stream: int, head: dict[str, Any], size: int) -> memoryview | None:
        return memoryview(bytearray(size)) if self.sinks else None

    def on_body(self, stream: int, head: dict[str, Any], body: memoryview | None) -> None:
        self.messages.append((stream, head, None if body is None else bytes(body)))

    def on_lost(self, error: BaseException | None) -> None:
        self.lost.append(error)


def pair() -> tuple[MuxProtocol, Transport, MuxProtocol, Recorder]:
    sender, transport = MuxProtocol(Recorder()), Transport()
    sender.connection_made(transport)  # type: ignore[arg-type]
    recorder = Recorder()
    receiver = MuxProtocol(recorder)
    receiver.connection_made(Transport())  # type: ignore[arg-type]
    return sender, transport, receiver, recorder


def drained(sender: MuxProtocol, transport: Transport, send: Any) -> bytes:
    """What ``sender`` writes for ``send(sender)`` once its loop has run every frame
    (a large message goes out one frame per turn of the loop)."""
    async def run() -> None:
        send(sender)
        while sender._pump_scheduled:
            await asyncio.sleep(0)
    asyncio.run(run())
    return b"".join(transport.writes)


def feed(protocol: MuxProtocol, data: bytes, rng: random.Random) -> None:
    """Deliver ``data`` as a TLS transport would: into the protocol's buffers, in pieces."""
    view = memoryview(data)
    while view:
        buf = protocol.get_buffer(-1)
        n = min(len(buf), len(view), rng.randint(1, 70_000))
        buf[:n] = view[:n]
        protocol.buffer_updated(n)
        view = view[n:]


def frames(data: bytes) -> list[tuple[int, int, int]]:
    """(kind, stream, length) of every frame in ``data``."""
    out, pos = [], 0
    while pos < len(data):
        kind, stream, length = struct.unpack_from("!BII", data, pos)
        out.append((kind, stream, length))
        pos += 9 + length
    return out


def test_messages_arrive_whole_and_in_their_own_buffers() -> None:
    sender, transport, receiver, recorder = pair()
    big = np.arange(700_000, dtype=np.int32)  # 2.8 MB: 11 frames

    def send(p: MuxProtocol) -> None:
        p.send(1, {"path": "/big"}, [b"head-", big.data])
        p.send(3, {"path": "/empty"})
        p.send(5, {"path": "/small"}, [b"x" * 5000, b"y"])

    feed(receiver, drained(sender, transport, send), random.Random(0))
    got = {stream: (head, body) for stream, head, body in recorder.messages}
    assert got[1] == ({"path": "/big"}, b"head-" + big.tobytes())
    assert got[3] == ({"path": "/empty"}, b"")
    assert got[5] == ({"path": "/small"}, b"x" * 5000 + b"y")
    assert not recorder.lost


def test_large_messages_share_the_connection_frame_by_frame() -> None:
    sender, transport, receiver, recorder = pair()

    def send(p: MuxProtocol) -> None:
        p.pause_writing()  # as when the socket is full: all three wait
        p.send(1, {"n": 1}, [b"a" * (3 * FRAME)])
        p.send(2, {"n": 2}, [b"b" * (3 * FRAME)])
        p.send(3, {"n": 3}, [b"ping"])
        p.resume_writing()

    data = drained(sender, transport, send)
    order = [(kind, stream) for kind, stream, _ in frames(data)]
    assert order[:2] == [(HEAD, 3), (DATA, 3)]  # the small one first
    assert order[2:] == [(HEAD, 1), (DATA, 1), (HEAD, 2), (DATA, 2), (DATA, 1), (DATA, 2),
                         (DATA, 1), (DATA, 2)]
    feed(receiver, data, random.Random(1))
    assert [stream for stream, _, _ in recorder.messages] == [3, 1, 2]
    assert recorder.messages[1][2] == b"a" * (3 * FRAME)


def test_a_dropped_body_is_read_and_discarded() -> None:
    sender, transport, _, _ = pair()
    receiver_handler = Recorder(sinks=False)
    receiver = MuxProtocol(receiver_handler)
    receiver.connection_made(Transport())  # type: ignore[arg-type]

    def send(p: MuxProtocol) -> None:
        p.send(1, {"drop": True}, [bytes(2 * FRAME + 5)])
        p.send(3, {"after": True}, [b"ok"])

    feed(receiver, drained(sender, transport, send), random.Random(2))
    assert receiver_handler.messages == []  # a dropped body is not delivered
    assert not receiver.closed and not receiver._incoming  # read to its end, nothing kept


def test_a_dropped_stream_keeps_a_counter_not_its_head() -> None:
    receiver = MuxProtocol(Recorder(sinks=False))
    receiver.connection_made(Transport())  # type: ignore[arg-type]
    big = {"padding": ["x" * 60] * 900}  # a HEAD near its 64 KiB limit
    feed(receiver, _head(1, 10, big), random.Random(5))
    assert receiver._incoming[1].head == {} and receiver._incoming[1].sink is None


def test_streams_over_the_cap_close_the_connection() -> None:
    recorder = Recorder(sinks=False)
    receiver = MuxProtocol(recorder, max_streams=4)
    transport = Transport()
    receiver.connection_made(transport)  # type: ignore[arg-type]
    feed(receiver, b"".join(_head(s, 10, {}) for s in range(1, 5)), random.Random(6))
    assert not transport.closed  # four open streams are within the cap
    feed(receiver, _head(5, 10, {}), random.Random(7))
    assert transport.closed
    assert [str(e) for e in recorder.lost] == ["more than 4 streams open at once"]


def test_a_stalled_body_closes_the_connection() -> None:
    async def run() -> tuple[Transport, Recorder]:
        recorder = Recorder()
        receiver = MuxProtocol(recorder, stall_seconds=0.2)
        transport = Transport()
        receiver.connection_made(transport)  # type: ignore[arg-type]
        feed(receiver, _head(1, 10, {}) + struct.pack("!BII", DATA, 1, 4) + b"abcd",
             random.Random(8))  # 4 of its 10 bytes, then nothing
        for _ in range(40):
            if transport.closed:
                break
            await asyncio.sleep(0.05)
        return transport, recorder

    transport, recorder = asyncio.run(run())
    assert transport.closed
    assert [str(e) for e in recorder.lost] == [
        "a body received nothing for 0.2 s (1 streams open)"]


def _head(stream: int, size: int, obj: Any) -> bytes:
    text = json.dumps(obj).encode() if not isinstance(obj, bytes) else obj
    return struct.pack("!BII", HEAD, stream, 8 + len(text)) + struct.pack("!Q", size) + text


BROKEN = [
    (struct.pack("!BII", 9, 1, 4) + b"abcd", "malformed DATA frame"),
    (struct.pack("!BII", DATA, 1, 4) + b"abcd", "malformed DATA frame"),  # no such stream
    (_head(1, 0, b"{not json"), "a HEAD is not JSON"),
    (_head(1, 0, [1, 2]), "a HEAD is not a JSON object"),
    (struct.pack("!BII", HEAD, 1, MAX_HEAD + 9), "malformed HEAD frame"),
    (struct.pack("!BII", HEAD, 1, 3) + b"abc", "malformed HEAD frame"),
    (_head(1, 10, {}) + struct.pack("!BII", DATA, 1, 11) + bytes(11), "malformed DATA frame"),
    (_head(1, 10, {}) + _head(1, 10, {}), "malformed HEAD frame"),  # stream already open
]


@pytest.mark.parametrize("garbage, why", BROKEN, ids=[
    "unknown kind", "data of no stream", "head not json", "head a list", "head too long",
    "head shorter than its size", "data beyond the body", "stream opened twice"])
def test_broken_framing_closes_the_connection(garbage: bytes, why: str) -> None:
    recorder = Recorder()
    receiver = MuxProtocol(recorder)
    transport = Transport()
    receiver.connection_made(transport)  # type: ignore[arg-type]
    feed(receiver, garbage, random.Random(3))
    assert transport.closed
    assert [str(e) for e in recorder.lost] == [why]
    assert recorder.messages == []


def test_a_body_too_large_to_hold_closes_the_connection() -> None:
    recorder = Recorder()  # allocates whatever the HEAD announces
    receiver = MuxProtocol(recorder)
    transport = Transport()
    receiver.connection_made(transport)  # type: ignore[arg-type]
    feed(receiver, _head(1, 1 << 62, {}), random.Random(4))
    assert transport.closed
    assert [str(e) for e in recorder.lost] == [f"no memory for a body of {1 << 62} bytes"]
