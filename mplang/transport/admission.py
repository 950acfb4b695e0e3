"""Admitting an ``mplang/1`` stream from its HEAD, before anything is allocated.

A HEAD names a path and announces a body size. Its peer (the connection's
certificate) must hold the path's role, the size must fit the path's limit, and
the worker-wide budget of bytes being received (`InflightBudget`) must have room
for it; otherwise the stream is refused at once. An admitted body gets a buffer
whose pages the kernel provides only as its bytes arrive
(`mplang.transport.mux.body_buffer`), so a HEAD alone costs no memory.

Bodies of HTTP/1.1 requests count in the same budget (`BudgetedBodies`), from their
start (their content-length) until they have been received; one that receives nothing
for ``stall_seconds`` is dropped, as an ``mplang/1`` body is.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from mplang.cluster.peers import Peer, PeerDirectory, Role
from mplang.edsl.errors import MPRefusedError
from mplang.transport.limits import WorkerLimits
from mplang.transport.mux_client import SPEC_HEADER
from mplang.transport.request import SMALL_BODY, URIS_BODY, upload_limit

log = logging.getLogger("mplang.worker")

VOTE_LIMIT = 512
"""The largest vote body (a base64 signature is about 100 bytes)."""

@dataclass(frozen=True)
class Route:
    """Who may send to a path (None: any listed party) and its largest body."""

    role: Role | None
    limit: Callable[[WorkerLimits], int]


def _largest(limits: WorkerLimits) -> int:
    return limits.max_body_bytes


ROUTES: Mapping[str, Route] = {
    "/run": Route("driver", _largest),
    "/fetch": Route("driver", lambda _: SMALL_BODY),
    "/delete": Route("driver", lambda _: URIS_BODY),
    "/abort": Route("driver", lambda _: SMALL_BODY),
    "/close": Route("driver", lambda _: SMALL_BODY),
    "/describe": Route("driver", lambda _: SMALL_BODY),
    "/msg": Route("node", _largest),
    "/vote": Route("node", lambda _: VOTE_LIMIT),
    "/upload": Route("node", upload_limit),
    "/budget": Route("node", lambda _: SMALL_BODY),
    "/health": Route(None, lambda _: SMALL_BODY),
}
"""The paths a worker serves over ``mplang/1``."""


def authorize_head(peers: PeerDirectory, limits: WorkerLimits, here: str, rank: int,
                   fingerprint: str | None, path: str, headers: Mapping[str, str],
                   size: int) -> Peer:
    """The peer sending a ``size``-byte body to ``path``, if it may (`MPRefusedError`:
    404 no such path, 403/409 not this peer, 413 too large)."""
    route = ROUTES.get(path)
    if route is None:
        raise MPRefusedError(f"{here} serves no path {path[:64]}", 404)
    if route.role is None:
        peer = peers.lookup(fingerprint)
        if peer is None:
            raise MPRefusedError(f"certificate not in {here}'s cluster spec", 403)
    else:
        peer = peers.authorize(fingerprint, headers.get(SPEC_HEADER), route.role, path, here)
    if path in ("/upload", "/budget") and peer.rank != rank:
        raise MPRefusedError(f"{peer} may not use {path} of {here}: only the node's own key "
                             "may", 403)
    limit = route.limit(limits)
    if size > limit:
        raise MPRefusedError(f"body of {size} bytes exceeds the limit of {limit} for {path}",
                             413)
    return peer


class InflightBudget:
    """Bytes of bodies being received, over all connections (touched on the event loop's
    thread only)."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0

    def take(self, size: int) -> None:
        """Reserve ``size`` bytes, or refuse (429) if the budget has no room."""
        if self.used + size > self.limit:
            raise MPRefusedError(f"{size} more bytes in flight would exceed the worker's "
                                 f"budget of {self.limit} ({self.used} in flight)", 429)
        self.used += size

    def give(self, size: int) -> None:
        self.used -= size


class BudgetedBodies:
    """The worker's ASGI app as HTTP/1.1 connections see it: a request body counts in
    ``budget`` from the request's start (its content-length) until the app has received
    it all (or answered), as an ``mplang/1`` stream's body does; one the budget has no
    room for is refused (429) before a byte of it is read, one that receives nothing for
    ``stall_seconds`` 408 (the connection closed). A body over its path's limit
    (`ROUTES`) is left to the app, which refuses it (413) without reading it."""

    def __init__(self, app: Callable[..., Any], budget: InflightBudget, limits: WorkerLimits):
        self.app, self.budget, self.limits = app, budget, limits

    async def __call__(self, scope: dict[str, Any], receive: Callable[..., Any],
                       send: Callable[..., Any]) -> None:
        declared = dict(scope.get("headers") or ()).get(b"content-length", b"")
        size = int(declared) if scope["type"] == "http" and declared.isdigit() else 0
        route = ROUTES.get(scope.get("path", ""))
        if not 0 < size <= (route.limit(self.limits) if route else self.limits.max_body_bytes):
            await self.app(scope, receive, send)
            return
        try:
            self.budget.take(size)
        except MPRefusedError as e:
            log.warning("refused %s %s: %s", scope["method"], scope["path"][:64], e)
            body = json.dumps({"error": str(e), "kind": type(e).__name__}).encode()
            await send({"type": "http.response.start", "status": e.status,
                        "headers": [(b"content-type", b"application/json"),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})
            return
        held, got, stall = size, 0, self.limits.stall_seconds

        async def counted() -> Any:
            nonlocal held, got
            if not held:
                return await receive()
            try:
                async with asyncio.timeout(stall):
                    message = await receive()
            except TimeoutError:
                raise MPRefusedError(f"the body received nothing for {stall:g} s (after "
                                     f"{got} of {size} bytes)", 408) from None
            got += len(message.get("body", b""))
            if not (message["type"] == "http.request" and message.get("more_body")):
                self.budget.give(held)
                held = 0
            return message

        try:
            await self.app(scope, counted, send)
        finally:
            if held:
                self.budget.give(held)
