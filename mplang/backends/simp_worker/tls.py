"""A uvicorn server that speaks mutual TLS only and tells the application who connected.

uvicorn does not pass the client's certificate to the application. This
protocol reads it from the TLS session once per connection and puts its
SHA-256 fingerprint into every request's ASGI scope, under the TLS extension
(``scope["extensions"]["tls"]["peer_fingerprint"]``). The identity comes from
the handshake alone, never from a header or the body.
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from mplang.runtime.identity import peer_certificate


class PeerIdentityProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol plus the peer certificate's fingerprint in the scope."""

    _peer: str | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._peer = peer_certificate(transport.get_extra_info("ssl_object"))

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self.scope["extensions"] = {"tls": {"peer_fingerprint": self._peer}}


def peer_of(scope: Any) -> str | None:
    """The fingerprint `PeerIdentityProtocol` put into a request's scope."""
    return (scope.get("extensions") or {}).get("tls", {}).get("peer_fingerprint")


def tls_config(app: Any, host: str, port: int, context: ssl.SSLContext, **options: Any
               ) -> uvicorn.Config:
    """A uvicorn config serving ``app`` on ``host:port`` with ``context`` (mutual TLS)."""
    return uvicorn.Config(app, host=host, port=port, http=PeerIdentityProtocol,
                          ssl_context_factory=lambda config, default: context,
                          log_level="warning", **options)
