"""A loopback TCP proxy for fault tests and WAN benchmarks: it forwards every connection
made to its port to a target port, byte for byte (mutual TLS passes through it end to
end), and can add latency each way, limit the bandwidth each way (shared by its
connections, as one link), stall (hold every byte until resumed) or cut (reset every
open connection). Its event loop runs on a thread of its own."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections.abc import Coroutine, Iterator
from typing import Any

import mplang as mp
from mplang.cluster.local import LocalCluster
from tests.worker import support

CHUNK = 1 << 16


class _Connection:
    """One proxied connection: the client's and the target's streams."""

    def __init__(self, client: asyncio.StreamWriter, target: asyncio.StreamWriter):
        self.writers = (client, target)

    def reset(self) -> None:
        for writer in self.writers:
            transport = writer.transport
            if isinstance(transport, asyncio.Transport):
                transport.abort()  # closed at once, unsent bytes dropped


class TcpProxy:
    """Listens on ``127.0.0.1:port`` (a free one by default) and forwards to
    ``127.0.0.1:target``."""

    def __init__(self, target: int, port: int = 0, latency_s: float = 0.0,
                 bandwidth_bps: float | None = None):
        self.target = target
        self.latency_s = latency_s
        """Added to every chunk in each direction."""
        self.bandwidth_bps = bandwidth_bps
        """Bits per second each way (None: unlimited): a chunk leaves after the chunks
        before it in its direction, its size over this rate later."""
        self._free = {True: 0.0, False: 0.0}  # when each direction's link is next idle
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._connections: set[_Connection] = set()
        self.accepted = 0
        """Connections accepted so far."""
        listener = socket.create_server(("127.0.0.1", port))
        self.port: int = listener.getsockname()[1]
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, sock=listener))
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True,
                                        name="tcp-proxy")
        self._thread.start()

    def _call(self, coroutine: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
                      ) -> None:
        self.accepted += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
        except OSError:
            writer.transport.abort()
            return
        connection = _Connection(writer, up_writer)
        self._connections.add(connection)
        try:
            with contextlib.suppress(OSError):  # a cut, or a side that went away
                await asyncio.gather(self._pump(reader, up_writer, True),
                                     self._pump(up_reader, writer, False))
        finally:
            self._connections.discard(connection)
            connection.reset()

    async def _pump(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter,
                    up: bool) -> None:
        """Read ``source`` as it comes; write each chunk to ``sink`` once it has crossed
        the link (direction ``up``: towards the target) and the proxy is not stalled."""
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

        async def deliver() -> None:
            while True:
                due, data = await queue.get()
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                await self._flowing.wait()
                if not data:
                    with contextlib.suppress(OSError):
                        sink.write_eof()
                    return
                sink.write(data)
                await sink.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                try:
                    data = await source.read(CHUNK)
                except OSError:
                    data = b""
                queue.put_nowait((self._arrival(len(data), up), data))
                if not data:
                    break
            await sender
        except (OSError, asyncio.CancelledError):
            sender.cancel()
            raise

    def _arrival(self, size: int, up: bool) -> float:
        """When ``size`` bytes sent now in direction ``up`` reach the other side."""
        now = time.monotonic()
        if self.bandwidth_bps is None:
            return now + self.latency_s
        done = max(now, self._free[up]) + size * 8 / self.bandwidth_bps
        self._free[up] = done
        return done + self.latency_s

    # -- modes, from any thread
    def stall(self) -> None:
        """Hold every byte (of open and new connections) until `resume`."""
        self._loop.call_soon_threadsafe(self._flowing.clear)

    def resume(self) -> None:
        """Forward again, the held bytes first."""
        self._loop.call_soon_threadsafe(self._flowing.set)

    def cut(self) -> None:
        """Reset every open connection (new ones are forwarded)."""
        async def reset() -> None:
            for connection in list(self._connections):
                connection.reset()

        self._call(reset())

    def close(self) -> None:
        """Reset every connection, stop listening and end the loop's thread."""
        async def shut() -> None:
            self._server.close()
            for connection in list(self._connections):
                connection.reset()
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        self._call(shut())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def __enter__(self) -> TcpProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@contextlib.contextmanager
def proxied_cluster(rank: int = 1) -> Iterator[tuple[LocalCluster, TcpProxy]]:
    """Three worker processes (ABY3 SPU over all three) where every connection to
    ``node_{rank}`` (from the driver and from its peers) passes through a `TcpProxy`:
    the spec gives the proxy's port as its endpoint and the worker listens on another."""
    ports = support.free_ports(4)
    with TcpProxy(ports[3]) as proxy:
        spec = support.spec_dict(ports[:3])
        spec["nodes"][rank]["endpoint"] = f"127.0.0.1:{proxy.port}"
        listen = {f"node_{rank}": f"127.0.0.1:{ports[3]}"}
        with support.running_cluster(mp.ClusterSpec.from_dict(spec), listen=listen) as cluster:
            yield cluster, proxy
