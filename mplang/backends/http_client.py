"""Requests to workers over mutual TLS, shared by the driver and the workers' peer messages.

Each worker gets its own connection pool whose TLS context accepts exactly the
certificate the spec gives for that worker, and presents this party's own
certificate. Only the client side lives here, so the driver never imports the
worker server.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import httpx

from mplang.device.cluster import ClusterSpec
from mplang.runtime.identity import LocalIdentity

SPEC_HEADER = "x-mplang-spec"
"""The sender's spec digest: a worker refuses requests from a party whose spec differs."""
CHUNK = 1 << 20


def error_message(response: httpx.Response, limit: int = 2000) -> str | None:
    """The ``error`` a worker's JSON answer gives (at most ``limit`` characters), or None
    if the answer is not such a JSON object."""
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error[:limit] if isinstance(error, str) else None


class PinnedClients:
    """One HTTP/1.1 connection pool per worker of ``spec``, pinned to its certificate."""

    def __init__(self, spec: ClusterSpec, identity: LocalIdentity, timeout: float,
                 max_connections: int = 64):
        spec.require_certificates()
        self.spec = spec
        self.digest = spec.digest()
        self.urls = spec.base_urls()
        self._clients: list[httpx.Client] = []
        for node in spec.nodes:
            assert node.certificate is not None
            self._clients.append(httpx.Client(
                verify=identity.client_context(node.certificate),
                timeout=httpx.Timeout(timeout, connect=5.0),
                limits=httpx.Limits(max_connections=max_connections,
                                    max_keepalive_connections=max_connections)))

    def post(self, rank: int, path: str, parts: list[bytes | memoryview],
             timeout: float | None = None, headers: dict[str, str] | None = None
             ) -> httpx.Response:
        """POST ``parts`` (streamed back to back) to worker ``rank``; raises
        `httpx.HTTPStatusError` on a 4xx answer and `httpx.HTTPError` on transport errors."""
        size = sum(memoryview(p).nbytes for p in parts)
        headers = {**(headers or {}), "content-type": "application/octet-stream",
                   "content-length": str(size), SPEC_HEADER: self.digest}
        kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
        body = cast(Iterable[bytes], _chunks(parts))  # httpx sends memoryviews as they are
        response = self._clients[rank].post(self.urls[rank] + path, content=body,
                                            headers=headers, **kwargs)
        if 400 <= response.status_code < 500:
            raise httpx.HTTPStatusError(f"{path}: {response.status_code} {response.text[:500]}",
                                        request=response.request, response=response)
        return response

    def get(self, rank: int, path: str) -> httpx.Response:
        return self._clients[rank].get(self.urls[rank] + path, headers={SPEC_HEADER: self.digest})

    def close(self) -> None:
        for client in self._clients:
            client.close()


def _chunks(parts: Iterable[bytes | memoryview]) -> Iterable[bytes | memoryview]:
    for part in parts:
        view = memoryview(part).cast("B")
        for start in range(0, len(view), CHUNK):
            yield view[start:start + CHUNK]
