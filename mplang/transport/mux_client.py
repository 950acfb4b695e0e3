"""Requests to workers over persistent ``mplang/1`` connections, for the driver, the
workers' messages to each other and ``mplang put``.

There is one mutual-TLS connection per worker, opened on first use and reopened
if it breaks. Its TLS context accepts exactly the certificate the spec gives for
that worker and presents this party's own. Requests from many threads share it,
each on its own stream (`mplang.transport.mux`); the connections run on one event
loop thread per process. Only the client side lives here, so the driver never
imports the worker server.
"""

from __future__ import annotations

import asyncio
import itertools
import ssl
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from typing import Any

import uvloop

from mplang.cluster.identity import LocalIdentity, presented_fingerprint
from mplang.device.cluster import ClusterSpec
from mplang.edsl.errors import MPLangError
from mplang.transport.errors import (
    CertificateMismatch,
    NoAnswerError,
    Reply,
    StatusError,
    TransportError,
    UnreachableError,
)
from mplang.transport.mux import ALPN, MuxProtocol, body_buffer

SPEC_HEADER = "x-mplang-spec"
"""The sender's spec digest: a worker refuses requests from a party whose spec differs."""
CONNECT_TIMEOUT = 5.0
UNSOLICITED_LIMIT = 64 << 10
"""The largest answer to a message sent without waiting (a refusal) that is read."""


class _IoLoop:
    """The event loop thread that runs this process's outgoing connections."""

    _lock = threading.Lock()
    _loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def get(cls) -> asyncio.AbstractEventLoop:
        with cls._lock:
            if cls._loop is None:
                loop = uvloop.new_event_loop()
                threading.Thread(target=loop.run_forever, name="mplang-io",
                                 daemon=True).start()
                cls._loop = loop
            return cls._loop


Unsolicited = Callable[[int, dict[str, Any], memoryview], None]
"""Called with (rank, head, body) for an answer to a message sent without waiting:
the worker refused it."""


@dataclass
class _Connection:
    """The connection to one worker; all its state is touched on the loop thread."""

    rank: int
    node: str
    pinned: str
    """The fingerprint of the certificate the spec gives for the worker."""
    own: str
    """The fingerprint of this party's certificate."""
    host: str
    port: int
    context: ssl.SSLContext
    unsolicited: Unsolicited | None
    protocol: MuxProtocol | None = None
    connecting: list[tuple[int, dict[str, Any], Sequence[Any]]] | None = None
    answered: bool = False
    """Whether the worker answered on the current connection."""
    pending: dict[int, Future[Reply]] = field(default_factory=dict)

    # MuxHandler
    def on_head(self, stream: int, head: dict[str, Any], size: int) -> memoryview | None:
        if stream not in self.pending and size > UNSOLICITED_LIMIT:
            return None  # a refusal is small: this is not one
        return body_buffer(size)

    def on_body(self, stream: int, head: dict[str, Any], body: memoryview) -> None:
        self.answered = True
        status = head.get("status")
        future = self.pending.pop(stream, None)
        if future is None:
            if self.unsolicited is not None:
                self.unsolicited(self.rank, head, body)
        elif type(status) is not int:
            future.set_exception(TransportError("a malformed answer (no status)"))
        else:
            future.set_result(Reply(status, body))

    def on_lost(self, error: BaseException | None) -> None:
        self.protocol = None
        pending, self.pending = self.pending, {}
        reason = (f"the connection closed ({type(error).__name__}: {error})" if error
                  else "the connection closed")
        if not self.answered:
            reason = (f"{self.node} closed the connection before any answer: it does not "
                      f"accept this party's certificate (sha256 {self.own[:16]}...), or it "
                      "stopped; the cluster spec its worker runs with must list that "
                      "certificate (`mplang status` compares the specs)")
        for future in pending.values():
            if not future.done():
                future.set_exception(TransportError(reason))

    # sending (loop thread)
    def send(self, stream: int, head: dict[str, Any], parts: Sequence[Any]) -> None:
        if self.protocol is not None and not self.protocol.closed:
            self.protocol.send(stream, head, parts)
            return
        if self.connecting is None:
            self.connecting = []
            asyncio.get_running_loop().create_task(self._connect())
        self.connecting.append((stream, head, parts))

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        waiting = self.connecting or []
        try:
            _, protocol = await asyncio.wait_for(loop.create_connection(
                lambda: MuxProtocol(self), self.host, self.port, ssl=self.context,
                server_hostname=self.host),
                CONNECT_TIMEOUT)
        except (TimeoutError, OSError) as e:
            error: BaseException = e
            if isinstance(e, ssl.SSLCertVerificationError):
                presented = await loop.run_in_executor(None, presented_fingerprint,
                                                       self.host, self.port, CONNECT_TIMEOUT)
                error = CertificateMismatch(self.node, self.pinned, presented)
            self.connecting = None
            for stream, head, _ in waiting:
                self._fail(stream, head, error, unreachable=True)
            return
        self.protocol, self.answered = protocol, False
        self.connecting = None
        for stream, head, parts in waiting:
            self.send(stream, head, parts)

    def _fail(self, stream: int, head: dict[str, Any], error: BaseException, *,
              unreachable: bool = False) -> None:
        future = self.pending.pop(stream, None)
        reason = f"{type(error).__name__}: {error}"
        if future is not None:
            if not future.done():
                future.set_exception(error if isinstance(error, CertificateMismatch) else
                                     UnreachableError(reason) if unreachable
                                     else TransportError(reason))
        elif self.unsolicited is not None:
            self.unsolicited(self.rank, {**head, "status": 503, "error": reason}, memoryview(b""))

    def request(self, stream: int, head: dict[str, Any], parts: Sequence[Any],
                future: Future[Reply]) -> None:
        self.pending[stream] = future
        self.send(stream, head, parts)

    def cancel(self, stream: int) -> None:
        self.pending.pop(stream, None)

    def close(self) -> None:
        if self.protocol is not None:
            self.protocol.close()


class MuxClients:
    """One persistent ``mplang/1`` connection per worker of ``spec``, pinned to its
    certificate. ``unsolicited`` receives the refusals of messages sent with `send`."""

    def __init__(self, spec: ClusterSpec, identity: LocalIdentity, timeout: float,
                 unsolicited: Unsolicited | None = None):
        spec.require_certificates()
        self.digest = spec.digest()
        self.timeout = timeout
        self.nodes = tuple(node.name for node in spec.nodes)
        """Each rank's node name."""
        self._loop = _IoLoop.get()
        self._streams = itertools.count(1)
        self._connections = []
        for rank, node in enumerate(spec.nodes):
            assert node.certificate is not None
            context = identity.client_context(node.certificate)
            context.set_alpn_protocols([ALPN])
            host, port = host_port(node.endpoint)
            self._connections.append(_Connection(
                rank, node.name, node.certificate.fingerprint, identity.fingerprint, host, port,
                context, unsolicited))

    def _head(self, path: str, headers: dict[str, str] | None) -> dict[str, Any]:
        return {"path": path, "headers": {**(headers or {}), SPEC_HEADER: self.digest}}

    def post(self, rank: int, path: str, parts: Sequence[Any], timeout: float | None = None,
             headers: dict[str, str] | None = None) -> Reply:
        """Send ``parts`` (back to back, not copied) to ``path`` of worker ``rank`` and
        wait for the answer; raises `StatusError` on a 4xx answer and `TransportError`
        if the worker cannot be reached or does not answer within ``timeout``."""
        connection = self._connections[rank]
        stream = next(self._streams)
        future: Future[Reply] = Future()
        self._loop.call_soon_threadsafe(connection.request, stream,
                                        self._head(path, headers), parts, future)
        wait = self.timeout if timeout is None else timeout
        try:
            reply = future.result(wait)
        except FutureTimeout:
            self._loop.call_soon_threadsafe(connection.cancel, stream)
            raise NoAnswerError(f"{path}: no answer within {wait:g} s") from None
        if 400 <= reply.status_code < 500:
            raise StatusError(f"{path}: {reply.status_code} {reply.text[:500]}", reply)
        return reply

    def send(self, rank: int, path: str, parts: Sequence[Any],
             headers: dict[str, str] | None = None) -> None:
        """Send without waiting for an answer: a worker answers such a message only to
        refuse it, and the refusal goes to ``unsolicited``."""
        self._loop.call_soon_threadsafe(self._connections[rank].send, next(self._streams),
                                        self._head(path, headers), parts)

    def close(self) -> None:
        for connection in self._connections:
            self._loop.call_soon_threadsafe(connection.close)


def host_port(endpoint: str) -> tuple[str, int]:
    """The host and port of a worker's endpoint (``[scheme://]host:port``)."""
    address = endpoint.split("://", 1)[-1].rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise MPLangError(f"endpoint {endpoint!r} must be host:port")
    return host.strip("[]"), int(port)
