"""A uvicorn server that speaks mutual TLS only and tells the application who connected.

uvicorn does not pass the client's certificate to the application. This
protocol reads it from the TLS session once per connection and puts its
SHA-256 fingerprint into every request's ASGI scope, under the TLS extension
(``scope["extensions"]["tls"]["peer_fingerprint"]``). The identity comes from
the handshake alone, never from a header or the body.

A client that negotiated ``mplang/1`` by ALPN is handed to that protocol's
server (`mplang.backends.simp_worker.mux_server`) on the same connection.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import Callable
from typing import Any, ClassVar

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mplang.backends.mux import ALPN
from mplang.cluster.identity import peer_certificate

MuxFactory = Callable[[str | None], asyncio.BaseProtocol]
"""Makes the ``mplang/1`` protocol of a connection from a peer's fingerprint."""


class PeerIdentityProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol plus the peer certificate's fingerprint in the scope;
    ``mplang/1`` connections go to ``mux``."""

    _peer: str | None = None
    mux: ClassVar[list[MuxFactory]] = []  # the factory, if this server speaks mplang/1

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        tls = transport.get_extra_info("ssl_object")
        peer = peer_certificate(tls)
        if self.mux and tls is not None and tls.selected_alpn_protocol() == ALPN:
            protocol = self.mux[0](peer)
            transport.set_protocol(protocol)
            protocol.connection_made(transport)
            return
        super().connection_made(transport)
        self._peer = peer

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {"tls": {"peer_fingerprint": self._peer}}


def peer_of(scope: Any) -> str | None:
    """The fingerprint `PeerIdentityProtocol` put into a request's scope."""
    return (scope.get("extensions") or {}).get("tls", {}).get("peer_fingerprint")


def tls_config(app: Any, host: str, port: int, context: ssl.SSLContext,
               mux: MuxFactory | None = None, **options: Any) -> uvicorn.Config:
    """A uvicorn config serving ``app`` on ``host:port`` with ``context`` (mutual TLS),
    and ``mplang/1`` connections with ``mux``."""
    protocol = type("PeerProtocol", (PeerIdentityProtocol,), {"mux": [mux]}) \
        if mux is not None else PeerIdentityProtocol
    return uvicorn.Config(app, host=host, port=port, http=protocol,
                          ssl_context_factory=lambda config, default: context,
                          log_level="warning", **options)
