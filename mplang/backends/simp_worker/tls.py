"""A uvicorn server that speaks mutual TLS only and tells the application who connected.

uvicorn does not pass the client's certificate to the application. This
protocol reads it from the TLS session once per connection and puts its
SHA-256 fingerprint into every request's ASGI scope, under the TLS extension
(``scope["extensions"]["tls"]["peer_fingerprint"]``). The identity comes from
the handshake alone, never from a header or the body.

A client that negotiated ``mplang/1`` by ALPN is handed to that protocol's
server (`mplang.backends.simp_worker.mux_server`) on the same connection.

The server accepts TCP itself (`GatedServer`): a connection is admitted by the
worker's `ConnectionGate` before its handshake, which must end within the gate's
``handshake_seconds``.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mplang.backends.mux import ALPN
from mplang.backends.simp_worker.connections import ConnectionGate, Ticket
from mplang.cluster.identity import peer_certificate

log = logging.getLogger("mplang.worker")

MuxFactory = Callable[[str | None, Ticket | None], asyncio.BaseProtocol]
"""Makes the ``mplang/1`` protocol of a connection from a peer's fingerprint and the
connection's ticket (released when it closes)."""


class PeerIdentityProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol plus the peer certificate's fingerprint in the scope;
    ``mplang/1`` connections go to ``mux``."""

    _peer: str | None = None
    _closed_at_once = False
    ticket: Ticket | None = None
    mux: ClassVar[list[MuxFactory]] = []  # the factory, if this server speaks mplang/1

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        tls = transport.get_extra_info("ssl_object")
        peer = peer_certificate(tls)
        if self.ticket is not None and not self.ticket.bind(peer):
            self._closed_at_once = True
            transport.abort()
            return
        if self.mux and tls is not None and tls.selected_alpn_protocol() == ALPN:
            protocol = self.mux[0](peer, self.ticket)
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
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
               mux: MuxFactory | None = None, **options: Any) -> GatedServer:
    """A server of ``app`` on ``host:port`` with ``context`` (mutual TLS) within
    ``gate``'s caps, and of ``mplang/1`` connections with ``mux``."""
    protocol = type("PeerProtocol", (PeerIdentityProtocol,), {"mux": [mux] if mux else []})
    config = uvicorn.Config(app, host=host, port=port, http=protocol, log_level="warning",
                            **options)
    return GatedServer(config, context, gate)
