"""Candidate transports for the wire issue (13), measured between two processes on loopback.

Every candidate runs mutual TLS 1.3 with MPLang's own identities: the parent makes a
``client`` and a ``server`` key with `mplang.cluster.identity.keygen`; each side loads
its own with `load_identity` and pins the other's certificate (`server_context`,
`client_context`). The server is a child process; the client is this process.

Candidates:

- ``http1``: HTTP/1.1 keep-alive, httpx client, uvicorn (httptools, uvloop) server with
  ``mplang.transport.tls.tls_server``, as the worker runs today (a bare ASGI
  app instead of FastAPI, so the transport is what is measured);
- ``http2``: HTTP/2, httpx[http2] ``AsyncClient`` on an event-loop thread (one connection,
  streams multiplexed), hypercorn server (uvloop) with the same ASGI app;
- ``tls-mux``: one blocking ``ssl.SSLSocket`` per peer pair with our own framing (stream id,
  op, total, offset, length); a writer thread interleaves 256 KiB frames of large messages
  with small ones (small first), a reader thread receives with ``recv_into`` straight into
  the destination (a registered, reused buffer for large messages);
- ``websocket``: websockets (sync client, asyncio server), one connection, messages tagged
  with a stream id; large messages sent as 1 MiB messages so small ones interleave.

The baseline ``tcp`` is a plain loopback TCP copy into a reused buffer, same harness.

Per candidate: round trip of a 1 KiB request with a 1 KiB answer (median, p99 over
``--pings`` after 200 warm-up), a 64 MiB message one way into the server's reused
buffer (median of ``--repeats``, MiB/s and ratio to ``tcp``), the round trip of small
messages on another logical stream while a 256 MiB message is in flight (median; the
count says how many completed during the transfer), and CPU seconds (user + system,
``resource.getrusage``) per 64 MiB on each side.

Packages beyond the project's: the ``bench`` extra (``pip install -e '.[bench]'``) pins
h2 4.3.0 (with hpack 4.2.0, hyperframe 6.1.0), hypercorn 0.17.3 (with priority 2.0.0,
wsproto 1.3.2) and websockets 15.0.1. Already there: httpx 0.28.1, uvicorn 0.54.0,
httptools 0.9.0, uvloop 0.23.0.

    .venv/bin/python benchmarks/bench_transports.py [--only tls-mux,http2] [--max-load 1.5]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import resource
import socket
import ssl
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, cast

from mplang.cluster.identity import (
    Certificate,
    LocalIdentity,
    keygen,
    load_certificate,
    load_identity,
    peer_certificate,
)

SMALL = 1 << 10
BIG = 64 << 20
HUGE = 256 << 20
FRAME = 256 << 10  # tls-mux: largest frame, so small messages wait at most one frame
WS_PART = 1 << 20  # websocket: large messages go as messages of this size
HTTP_CHUNK = 1 << 20  # as mplang.backends.http_client.CHUNK
WARMUP = 200
KINDS = ["tcp", "http1", "http2", "tls-mux", "websocket"]

ECHO, SINK, STATS, REPLY, SINK_PART = 1, 2, 3, 4, 5


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def stats_json() -> bytes:
    return json.dumps({"cpu": cpu_seconds()}).encode()


def identities(keys: Path, me: str, peer: str) -> tuple[LocalIdentity, Certificate]:
    return load_identity(keys / f"{me}.key"), load_certificate(str(keys / f"{peer}.crt"))


def recv_exact(sock: socket.socket, view: memoryview) -> bool:
    got, n = 0, len(view)
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            return False
        got += k
    return True


# ---------------------------------------------------------------- tls-mux: framing


HEADER = struct.Struct("!IBQQI")  # stream, op, message length, offset, frame length


class Mux:
    """Logical streams over one connected socket: a writer thread sends small messages
    before the next frame of a large one; a reader thread receives each frame into its
    message's buffer (``sinks[op]`` if registered and large enough) and calls
    ``on_message(stream, op, buffer)`` when a message is complete."""

    def __init__(self, sock: socket.socket,
                 on_message: Callable[[int, int, memoryview], None]):
        self.sock = sock
        self.on_message = on_message
        self.sinks: dict[int, memoryview] = {}
        self._cond = threading.Condition()
        self._small: deque[tuple[int, int, memoryview]] = deque()
        self._bulk: deque[list[Any]] = deque()
        self._closed = False
        threading.Thread(target=self._write_loop, daemon=True).start()
        threading.Thread(target=self._read_loop, daemon=True).start()

    def send(self, stream: int, op: int, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        with self._cond:
            if len(view) <= FRAME:
                self._small.append((stream, op, view))
            else:
                self._bulk.append([stream, op, view, 0])
            self._cond.notify()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify()
        self.sock.close()

    def _write_loop(self) -> None:
        while True:
            with self._cond:
                while not (self._small or self._bulk or self._closed):
                    self._cond.wait()
                if self._closed:
                    return
                if self._small:
                    stream, op, view = self._small.popleft()
                    offset, n = 0, len(view)
                else:
                    item = self._bulk[0]
                    stream, op, view, offset = item
                    n = min(FRAME, len(view) - offset)
                    item[3] = offset + n
                    if item[3] == len(view):
                        self._bulk.popleft()
                    else:
                        self._bulk.rotate(-1)  # round robin between large messages
            header = HEADER.pack(stream, op, len(view), offset, n)
            try:
                if n <= 4 * SMALL:
                    self.sock.sendall(header + view[offset:offset + n])
                else:
                    self.sock.sendall(header)
                    self.sock.sendall(view[offset:offset + n])
            except OSError:
                return

    def _read_loop(self) -> None:
        header = memoryview(bytearray(HEADER.size))
        partial: dict[int, memoryview] = {}
        try:
            while recv_exact(self.sock, header):
                stream, op, total, offset, n = HEADER.unpack(header)
                if offset == 0:
                    sink = self.sinks.get(op)
                    partial[stream] = (sink[:total] if sink is not None and total <= len(sink)
                                       else memoryview(bytearray(total)))
                buf = partial[stream]
                if not recv_exact(self.sock, buf[offset:offset + n]):
                    return
                if offset + n == total:
                    del partial[stream]
                    self.on_message(stream, op, buf)
        except OSError:
            return


# ---------------------------------------------------------------- servers (child process)


def serve_tcp(port: int, keys: Path) -> None:
    del keys
    listener = socket.create_server(("127.0.0.1", port))
    sink = memoryview(bytearray(HUGE))
    header = memoryview(bytearray(9))
    while True:
        conn, _ = listener.accept()
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        while recv_exact(conn, header):
            op, n = struct.unpack("!BQ", header)
            if op == STATS:
                body = stats_json()
                conn.sendall(struct.pack("!I", len(body)) + body)
                continue
            recv_exact(conn, sink[:n])
            conn.sendall(bytes(SMALL) if op == ECHO else b"k")
        conn.close()


def serve_mux(port: int, keys: Path) -> None:
    me, client = identities(keys, "server", "client")
    ctx = me.server_context([client])
    listener = socket.create_server(("127.0.0.1", port))
    sink = memoryview(bytearray(HUGE))
    answer = bytes(SMALL)
    while True:
        raw, _ = listener.accept()
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            conn = ctx.wrap_socket(raw, server_side=True)
        except OSError:  # the parent's probe for a listening port
            raw.close()
            continue
        assert peer_certificate(conn) == client.fingerprint
        serve_mux_connection(conn, sink, answer)


def serve_mux_connection(conn: socket.socket, sink: memoryview, answer: bytes) -> Mux:
    def on_message(stream: int, op: int, buf: memoryview) -> None:
        if op == ECHO:
            mux.send(stream, REPLY, answer)
        elif op == SINK:
            mux.send(stream, REPLY, struct.pack("!Q", len(buf)))
        elif op == STATS:
            mux.send(stream, REPLY, stats_json())

    mux = Mux(conn, on_message)
    mux.sinks[SINK] = sink
    return mux


def asgi_app() -> Callable[..., Any]:
    sink = memoryview(bytearray(HUGE))
    answer = bytes(SMALL)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        path, got = scope["path"], 0
        body = b""
        while True:
            message = await receive()
            chunk = message.get("body", b"")
            if path == "/sink":
                sink[got:got + len(chunk)] = chunk
            got += len(chunk)
            if not message.get("more_body"):
                break
        body = answer if path == "/echo" else stats_json() if path == "/stats" else b"%d" % got
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(body))]})
        await send({"type": "http.response.body", "body": body})

    return app


def serve_http1(port: int, keys: Path) -> None:
    from mplang.transport.connections import ConnectionGate
    from mplang.transport.limits import WorkerLimits
    from mplang.transport.tls import tls_server

    me, client = identities(keys, "server", "client")
    tls_server(asgi_app(), "127.0.0.1", port, me.server_context([client]),
               ConnectionGate(WorkerLimits()), lifespan="off", access_log=False).run()


def serve_http2(port: int, keys: Path) -> None:
    import asyncio

    import uvloop
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    me, client = identities(keys, "server", "client")

    class PinnedConfig(Config):
        @property
        def ssl_enabled(self) -> bool:
            return True

        def create_ssl_context(self) -> ssl.SSLContext:
            ctx = me.server_context([client])
            ctx.set_alpn_protocols(["h2"])
            return ctx

    config = PinnedConfig()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_max_requests = 1 << 40  # default 1000, then it closes the connection
    uvloop.install()
    asyncio.run(serve(asgi_app(), config, mode="asgi"))


def serve_websocket(port: int, keys: Path) -> None:
    import asyncio

    import uvloop
    from websockets.asyncio.server import ServerConnection, serve

    me, client = identities(keys, "server", "client")
    ctx = me.server_context([client])
    sink = memoryview(bytearray(HUGE))
    answer = bytes(SMALL)

    async def handler(ws: ServerConnection) -> None:
        offsets: dict[int, int] = {}
        async for message in ws:
            assert isinstance(message, bytes)
            stream, op = struct.unpack_from("!IB", message)
            data = memoryview(message)[5:]
            if op == ECHO:
                await ws.send(struct.pack("!IB", stream, REPLY) + answer)
            elif op in (SINK_PART, SINK):
                got = offsets.pop(stream, 0)
                sink[got:got + len(data)] = data
                if op == SINK_PART:
                    offsets[stream] = got + len(data)
                else:
                    await ws.send(struct.pack("!IBQ", stream, REPLY, got + len(data)))
            elif op == STATS:
                await ws.send(struct.pack("!IB", stream, REPLY) + stats_json())

    async def main() -> None:
        async with serve(handler, "127.0.0.1", port, ssl=ctx, max_size=None,
                         compression=None) as server:
            await server.serve_forever()

    uvloop.install()
    asyncio.run(main())


SERVERS: dict[str, Callable[[int, Path], None]] = {
    "tcp": serve_tcp, "http1": serve_http1, "http2": serve_http2, "tls-mux": serve_mux,
    "websocket": serve_websocket}


# ---------------------------------------------------------------- clients (this process)


class TcpClient:
    def __init__(self, port: int, keys: Path):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.payload = bytes(SMALL)
        self.answer = memoryview(bytearray(SMALL))

    def rtt(self) -> None:
        self.sock.sendall(struct.pack("!BQ", ECHO, SMALL) + self.payload)
        assert recv_exact(self.sock, self.answer)

    def send_big(self, view: memoryview) -> None:
        self.sock.sendall(struct.pack("!BQ", SINK, len(view)))
        self.sock.sendall(view)
        assert self.sock.recv(1) == b"k"

    def server_cpu(self) -> float:
        self.sock.sendall(struct.pack("!BQ", STATS, 0))
        size = memoryview(bytearray(4))
        recv_exact(self.sock, size)
        body = memoryview(bytearray(struct.unpack("!I", size)[0]))
        recv_exact(self.sock, body)
        return float(json.loads(bytes(body))["cpu"])

    def close(self) -> None:
        self.sock.close()


class StreamClient:
    """Requests over logical streams: one waiting slot per stream id, answered by a
    reader (`Mux` or a websocket reader thread)."""

    def __init__(self) -> None:
        self.ids = itertools.count(1)
        self.pending: dict[int, list[Any]] = {}
        self.payload = bytes(SMALL)

    def answered(self, stream: int, data: memoryview) -> None:
        slot = self.pending.pop(stream)
        slot[1] = data
        slot[0].set()

    def request(self, op: int, data: bytes | memoryview) -> memoryview:
        stream = next(self.ids)
        slot: list[Any] = [threading.Event(), None]
        self.pending[stream] = slot
        self.send(stream, op, data)
        slot[0].wait()
        return slot[1]

    def send(self, stream: int, op: int, data: bytes | memoryview) -> None:
        raise NotImplementedError

    def rtt(self) -> None:
        assert len(self.request(ECHO, self.payload)) == SMALL

    def send_big(self, view: memoryview) -> None:
        answer = self.request(SINK, view)
        assert struct.unpack("!Q", answer[-8:])[0] == len(view)

    def server_cpu(self) -> float:
        return float(json.loads(bytes(self.request(STATS, b"")))["cpu"])


class MuxClient(StreamClient):
    def __init__(self, port: int, keys: Path):
        super().__init__()
        me, server = identities(keys, "client", "server")
        raw = socket.create_connection(("127.0.0.1", port))
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = me.client_context(server).wrap_socket(raw)
        assert peer_certificate(conn) == server.fingerprint
        self.mux = Mux(conn, lambda stream, op, buf: self.answered(stream, buf))

    def send(self, stream: int, op: int, data: bytes | memoryview) -> None:
        self.mux.send(stream, op, data)

    def close(self) -> None:
        self.mux.close()


class WebSocketClient(StreamClient):
    def __init__(self, port: int, keys: Path):
        from websockets.sync.client import connect

        super().__init__()
        me, server = identities(keys, "client", "server")
        self.ws = connect(f"wss://127.0.0.1:{port}", ssl=me.client_context(server),
                          max_size=None, compression=None)
        threading.Thread(target=self._read_loop, daemon=True).start()

    def _read_loop(self) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            for message in self.ws:
                assert isinstance(message, bytes)
                stream, _ = struct.unpack_from("!IB", message)
                self.answered(stream, memoryview(message)[5:])
        except ConnectionClosed:
            return

    def send(self, stream: int, op: int, data: bytes | memoryview) -> None:
        view = memoryview(data).cast("B")
        if op == SINK:
            for start in range(0, len(view) - WS_PART, WS_PART):
                self.ws.send(struct.pack("!IB", stream, SINK_PART) + view[start:start + WS_PART])
            last = (len(view) - 1) // WS_PART * WS_PART
            self.ws.send(struct.pack("!IB", stream, SINK) + view[last:])
        else:
            self.ws.send(struct.pack("!IB", stream, op) + view)

    def close(self) -> None:
        self.ws.close()


class HttpClient:
    """httpx, as `PinnedClients` uses it (sync, a keep-alive pool: a concurrent request
    takes a second connection)."""

    def __init__(self, port: int, keys: Path):
        import httpx

        me, server = identities(keys, "client", "server")
        self.url = f"https://127.0.0.1:{port}"
        self.client = httpx.Client(verify=me.client_context(server),
                                   timeout=httpx.Timeout(300.0, connect=5.0),
                                   limits=httpx.Limits(max_connections=64,
                                                       max_keepalive_connections=64))
        self.payload = bytes(SMALL)

    def rtt(self) -> None:
        response = self.client.post(self.url + "/echo", content=self.payload)
        assert len(response.content) == SMALL and response.http_version == "HTTP/1.1"

    def send_big(self, view: memoryview) -> None:
        body = cast(Iterator[bytes], http_chunks(view))  # httpx sends memoryviews as they are
        response = self.client.post(self.url + "/sink", content=body, headers=http_headers(view))
        assert int(response.content) == len(view)

    def server_cpu(self) -> float:
        return float(self.client.get(self.url + "/stats").json()["cpu"])

    def close(self) -> None:
        self.client.close()


def http_chunks(view: memoryview) -> Iterator[memoryview]:
    for start in range(0, len(view), HTTP_CHUNK):
        yield view[start:start + HTTP_CHUNK]


async def http_chunks_async(view: memoryview) -> AsyncIterator[memoryview]:
    for chunk in http_chunks(view):
        yield chunk


def http_headers(view: memoryview) -> dict[str, str]:
    return {"content-type": "application/octet-stream", "content-length": str(len(view))}


class Http2Client:
    """httpx.AsyncClient with HTTP/2 (one connection, streams multiplexed) on an event loop
    thread: its sync HTTP/2 client loses the connection when two threads share it."""

    def __init__(self, port: int, keys: Path):
        import asyncio

        import httpx

        me, server = identities(keys, "client", "server")
        self.url = f"https://127.0.0.1:{port}"
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, daemon=True).start()
        self.client = httpx.AsyncClient(verify=me.client_context(server), http2=True,
                                        timeout=httpx.Timeout(300.0, connect=5.0))
        self.payload = bytes(SMALL)

    def _run(self, coro: Any) -> Any:
        import asyncio

        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()

    def rtt(self) -> None:
        response = self._run(self.client.post(self.url + "/echo", content=self.payload))
        assert len(response.content) == SMALL and response.http_version == "HTTP/2"

    def send_big(self, view: memoryview) -> None:
        response = self._run(self.client.post(self.url + "/sink",
                                              content=cast(AsyncIterator[bytes],
                                                           http_chunks_async(view)),
                                              headers=http_headers(view)))
        assert int(response.content) == len(view)

    def server_cpu(self) -> float:
        return float(self._run(self.client.get(self.url + "/stats")).json()["cpu"])

    def close(self) -> None:
        self._run(self.client.aclose())
        self.loop.call_soon_threadsafe(self.loop.stop)


def make_client(kind: str, port: int, keys: Path) -> Any:
    if kind == "tcp":
        return TcpClient(port, keys)
    if kind == "tls-mux":
        return MuxClient(port, keys)
    if kind == "websocket":
        return WebSocketClient(port, keys)
    if kind == "http2":
        return Http2Client(port, keys)
    return HttpClient(port, keys)


# ---------------------------------------------------------------- measuring


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_listening(port: int, server: subprocess.Popen[bytes], seconds: float = 30.0) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            sys.exit(f"server exited with {server.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1.0).close()
            return
        except OSError:
            time.sleep(0.05)
    sys.exit(f"no server on port {port} after {seconds} s")


def wait_for_load(limit: float, seconds: float = 600.0) -> float:
    deadline = time.monotonic() + seconds
    while os.getloadavg()[0] >= limit and time.monotonic() < deadline:
        time.sleep(10)
    return os.getloadavg()[0]


def measure(kind: str, keys: Path, pings: int, repeats: int) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", kind, "--port", str(port),
                               "--keys", str(keys)])
    try:
        wait_listening(port, server)
        client = make_client(kind, port, keys)
        try:
            return _measure(kind, client, pings, repeats)
        finally:
            client.close()
    finally:
        server.terminate()
        server.wait(timeout=30)


def _pings(client: Any, n: int) -> list[float]:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        client.rtt()
        times.append(time.perf_counter() - start)
    return times


def _measure(kind: str, client: Any, pings: int, repeats: int) -> dict[str, Any]:
    _pings(client, WARMUP)
    times = sorted(_pings(client, pings))
    data = memoryview(bytearray(os.urandom(1 << 20)) * (HUGE >> 20))
    client.send_big(data[:BIG])  # warm-up: connections, the server's buffer pages
    server0, client0 = client.server_cpu(), cpu_seconds()
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        client.send_big(data[:BIG])
        seconds.append(time.perf_counter() - start)
    server1, client1 = client.server_cpu(), cpu_seconds()
    row: dict[str, Any] = {
        "kind": kind, "rtt_median_us": statistics.median(times) * 1e6,
        "rtt_p99_us": times[int(0.99 * (len(times) - 1))] * 1e6,
        "big_s": statistics.median(seconds),
        "cpu_client_s": (client1 - client0) / repeats,
        "cpu_server_s": (server1 - server0) / repeats - 0.0}
    if kind == "tcp":
        return row
    done = threading.Event()
    elapsed: list[float] = []

    def transfer() -> None:
        start = time.perf_counter()
        client.send_big(data)
        elapsed.append(time.perf_counter() - start)
        done.set()

    thread = threading.Thread(target=transfer)
    thread.start()
    during = []
    while not done.is_set():
        start = time.perf_counter()
        client.rtt()
        if not done.is_set():
            during.append(time.perf_counter() - start)
    thread.join()
    row.update(hol_median_us=statistics.median(during) * 1e6 if during else float("nan"),
               hol_pings=len(during), huge_s=elapsed[0])
    return row


def table(rows: list[dict[str, Any]]) -> str:
    tcp = next(r for r in rows if r["kind"] == "tcp")
    mib = BIG / (1 << 20)
    lines = ["| transport | RTT 1 KiB median | p99 | 64 MiB one way | vs TCP copy "
             "| RTT while 256 MiB in flight (pings) | 256 MiB | CPU s / 64 MiB client, server |",
             "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        hol = ("n/a (one stream)" if r["kind"] == "tcp" else
               f"{r['hol_median_us'] / 1e3:.2f} ms ({r['hol_pings']})")
        huge = "" if r["kind"] == "tcp" else f"{HUGE / (1 << 20) / r['huge_s']:.0f} MiB/s"
        lines.append(f"| {r['kind']} | {r['rtt_median_us']:.0f} µs | {r['rtt_p99_us']:.0f} µs "
                     f"| {mib / r['big_s']:.0f} MiB/s | {tcp['big_s'] / r['big_s']:.2f}x "
                     f"| {hol} | {huge} | {r['cpu_client_s']:.3f}, {r['cpu_server_s']:.3f} |")
    return "\n".join(lines)


def main() -> int:
    global FRAME
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated subset of " + ",".join(KINDS[1:]))
    parser.add_argument("--pings", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-load", type=float, default=1.5,
                        help="wait (up to 10 min) for a 1-minute load average below this")
    parser.add_argument("--frame-kib", type=int, default=FRAME >> 10,
                        help="tls-mux: largest frame the sender writes")
    parser.add_argument("--json", help="write the rows here too")
    parser.add_argument("--serve", choices=KINDS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--keys", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        SERVERS[args.serve](args.port, Path(args.keys))
        return 0

    FRAME = args.frame_kib << 10
    kinds = ["tcp", *(args.only.split(",") if args.only else KINDS[1:])]
    rows = []
    with tempfile.TemporaryDirectory(prefix="mplang-bench-transports-") as tmp:
        keys = Path(tmp)
        keygen("server", keys)
        keygen("client", keys)
        for kind in kinds:
            load = wait_for_load(args.max_load)
            row = measure(kind, keys, args.pings, args.repeats)
            row["load_before"] = load
            rows.append(row)
            print(f"{kind}: {json.dumps(row)}", file=sys.stderr, flush=True)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
