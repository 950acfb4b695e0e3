"""A uvicorn server that speaks mutual TLS only and tells the application who connected.

uvicorn does not pass the client's certificate to the application. This
protocol reads it from the TLS session once per connection and puts its
SHA-256 fingerprint into every request's ASGI scope, under the TLS extension
(``scope["extensions"]["tls"]["peer_fingerprint"]``). The identity comes from
the handshake alone, never from a header or the body.

A client that negotiated ``mplang/1`` by ALPN is handed to that protocol's
server (`mplang.worker.mux_server`) on the same connection.

The server accepts TCP itself (`GatedServer`): a connection is admitted by the
worker's `ConnectionGate` before its handshake, which must end within the gate's
``handshake_seconds``.

`ServerTrust` is the worker's side of the handshake: the certificates it trusts,
replaced when the spec is reloaded, and the open connections by peer, so that a
reload closes those of a certificate it removed.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
import threading
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mplang.cluster.identity import Certificate, peer_certificate
from mplang.transport.connections import ConnectionGate, Ticket
from mplang.transport.mux import ALPN

log = logging.getLogger("mplang.worker")

MuxFactory = Callable[[str | None, Ticket | None], asyncio.BaseProtocol]
"""Makes the ``mplang/1`` protocol of a connection from a peer's fingerprint and the
connection's ticket (released when it closes)."""
Opened = Callable[[asyncio.Transport, str | None], None]
"""Told of every connection: its transport and its peer certificate's fingerprint."""


class ServerTrust:
    """The server side of mutual TLS, whose trusted certificates a reload replaces.

    The server listens with `context` for good. Its SNI callback, which OpenSSL calls
    on every ClientHello (with a server name or not), moves the handshake to a context
    made for the certificates trusted now: a certificate `trust_only` dropped fails the
    handshake as one never listed does. No session tickets are issued (a resumed
    session would skip the client certificate). Open connections are tracked by their
    peer's fingerprint (`opened`) so that `trust_only` closes those of a dropped one.
    """

    def __init__(self, make: Callable[[Iterable[Certificate]], ssl.SSLContext],
                 certificates: Iterable[Certificate], alpn: list[str]):
        self._make, self._alpn = make, alpn
        certificates = list(certificates)
        self._current = self._context(certificates)
        self.context = self._context(certificates)
        """The context to listen with."""
        self.context.sni_callback = self._switch
        self._open: dict[asyncio.Transport, tuple[str | None, asyncio.AbstractEventLoop]] = {}
        self._lock = threading.Lock()

    def _context(self, certificates: Iterable[Certificate]) -> ssl.SSLContext:
        ctx = self._make(certificates)
        ctx.num_tickets = 0
        ctx.set_alpn_protocols(self._alpn)
        return ctx

    def _switch(self, tls: ssl.SSLObject, name: str | None, ctx: ssl.SSLContext) -> None:
        tls.context = self._current

    def opened(self, transport: asyncio.Transport, fingerprint: str | None) -> None:
        """Track a connection (on its event loop) until it closes."""
        loop = asyncio.get_running_loop()
        with self._lock:
            for gone in [t for t in self._open if t.is_closing()]:
                del self._open[gone]
            self._open[transport] = (fingerprint, loop)

    def trust_only(self, certificates: Iterable[Certificate]) -> int:
        """Trust exactly ``certificates`` from the next handshake on and close the open
        connections of any other (from any thread); how many it closes."""
        certificates = list(certificates)
        self._current = self._context(certificates)
        keep = {c.fingerprint for c in certificates}
        with self._lock:
            dropped = [(t, loop) for t, (fp, loop) in self._open.items()
                       if fp not in keep and not t.is_closing()]
        for transport, loop in dropped:
            loop.call_soon_threadsafe(transport.close)
        return len(dropped)


class PeerIdentityProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol plus the peer certificate's fingerprint in the scope;
    ``mplang/1`` connections go to ``mux``."""

    _peer: str | None = None
    _closed_at_once = False
    ticket: Ticket | None = None
    mux: ClassVar[list[MuxFactory]] = []  # the factory, if this server speaks mplang/1
    opened: ClassVar[list[Opened]] = []  # told of each connection, if given

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        tls = transport.get_extra_info("ssl_object")
        peer = peer_certificate(tls)
        if self.ticket is not None and not self.ticket.bind(peer):
            self._closed_at_once = True
            transport.abort()
            return
        if self.opened:
            self.opened[0](transport, peer)
        if self.mux and tls is not None and tls.selected_alpn_protocol() == ALPN:
            protocol = self.mux[0](peer, self.ticket)
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
            del self.parser  # the HTTP parser's cycle back to this unused protocol
            return
        super().connection_made(transport)
        self._peer = peer

    def connection_lost(self, exc: Exception | None) -> None:
        if self.ticket is not None:
            self.ticket.release()
        if not self._closed_at_once:
            super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {"tls": {"peer_fingerprint": self._peer}}


def peer_of(scope: Any) -> str | None:
    """The fingerprint `PeerIdentityProtocol` put into a request's scope."""
    return (scope.get("extensions") or {}).get("tls", {}).get("peer_fingerprint")


class GatedServer(uvicorn.Server):
    """uvicorn's server, accepting TCP itself: a connection is admitted by ``gate``
    before its TLS handshake, which must end within the gate's ``handshake_seconds``;
    then it speaks HTTP/1.1 or ``mplang/1`` (`PeerIdentityProtocol`)."""

    def __init__(self, config: uvicorn.Config, context: ssl.SSLContext, gate: ConnectionGate):
        super().__init__(config)
        self.context = context
        self.gate = gate
        self._listener: socket.socket | None = None
        self._accepting: asyncio.Task[None] | None = None
        self._handshakes: set[asyncio.Task[None]] = set()

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        config = self.config
        family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
        listener = socket.create_server((config.host, config.port), family=family,
                                        backlog=config.backlog)
        listener.setblocking(False)
        self._listener = listener
        await super().startup(sockets=[])  # the lifespan; uvicorn itself listens on nothing
        self._accepting = asyncio.get_running_loop().create_task(self._accept(listener))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        if self._listener is not None:
            self._listener.close()
        await super().shutdown(sockets=sockets)

    async def _accept(self, listener: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                sock, address = await loop.sock_accept(listener)
            except OSError as e:  # out of descriptors: wait for some to close
                log.warning("cannot accept a connection: %s", e)
                await asyncio.sleep(0.1)
                continue
            ticket = self.gate.admit(str(address[0]))
            if ticket is None:
                sock.close()
                continue
            task = loop.create_task(self._handshake(sock, ticket))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, sock: socket.socket, ticket: Ticket) -> None:
        config = self.config

        def protocol() -> PeerIdentityProtocol:
            made = config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state)
            assert isinstance(made, PeerIdentityProtocol)
            made.ticket = ticket
            return made

        try:
            await asyncio.get_running_loop().connect_accepted_socket(
                protocol, sock, ssl=self.context,
                ssl_handshake_timeout=self.gate.handshake_seconds)
        except (OSError, ssl.SSLError, TimeoutError, ConnectionError) as e:
            log.debug("a TLS handshake failed: %s: %s", type(e).__name__, e)
            ticket.release()


def tls_server(app: Any, host: str, port: int, context: ssl.SSLContext, gate: ConnectionGate,
               mux: MuxFactory | None = None, opened: Opened | None = None,
               **options: Any) -> GatedServer:
    """A server of ``app`` on ``host:port`` with ``context`` (mutual TLS) within
    ``gate``'s caps, and of ``mplang/1`` connections with ``mux``; ``opened`` is told of
    each connection."""
    protocol = type("PeerProtocol", (PeerIdentityProtocol,), {
        "mux": [mux] if mux else [], "opened": [opened] if opened is not None else []})
    config = uvicorn.Config(app, host=host, port=port, http=protocol, log_level="warning",
                            **options)
    return GatedServer(config, context, gate)
