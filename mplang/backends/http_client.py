"""Signed HTTP requests to workers, shared by the driver and the workers' peer messages.

Only the client side lives here, so the driver never imports the worker server.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, cast

import httpx

from mplang.runtime.auth import TAG_SIZE, Signer


def post(client: httpx.Client, signer: Signer, base_url: str, path: str,
         parts: list[bytes | memoryview], timeout: float | None = None) -> httpx.Response:
    """A signed POST of ``parts`` (streamed back to back); raises on transport errors and 4xx."""
    headers = signer.headers("POST", path)
    body = cast(Iterable[bytes], signer.body(headers, parts))  # httpx sends memoryviews as is
    headers["content-type"] = "application/octet-stream"
    headers["content-length"] = str(sum(memoryview(p).nbytes for p in parts) + TAG_SIZE)
    kwargs: dict[str, Any] = {} if timeout is None else {"timeout": timeout}
    response = client.post(base_url + path, content=body, headers=headers, **kwargs)
    if 400 <= response.status_code < 500:
        raise httpx.HTTPStatusError(f"{path}: {response.status_code} {response.text[:500]}",
                                    request=response.request, response=response)
    return response
