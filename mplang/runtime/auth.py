"""Request authentication between driver and workers: HMAC-SHA256 signatures
over method, path, sender, timestamp, nonce and the body's digest, keyed by a
cluster secret. A verifier refuses stale timestamps and replayed nonces.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Iterable, Mapping

from mplang.frontend.errors import MPLangError

SECRET_ENV = "MPLANG_CLUSTER_SECRET"
H_SENDER = "x-mplang-sender"
H_TIMESTAMP = "x-mplang-timestamp"
H_NONCE = "x-mplang-nonce"
H_SIGNATURE = "x-mplang-signature"
MIN_SECRET_BYTES = 16


class AuthError(MPLangError):
    """A request failed authentication; ``status`` is 401 (bad or missing) or 403 (replay)."""

    def __init__(self, message: str, status: int):
        super().__init__(message)
        self.status = status


def load_secret(secret_file: str | os.PathLike[str] | None = None) -> bytes:
    """The cluster secret from ``secret_file`` or ``$MPLANG_CLUSTER_SECRET``."""
    if secret_file is not None:
        with open(secret_file, "rb") as f:
            secret = f.read().strip()
    else:
        secret = os.environ.get(SECRET_ENV, "").encode()
    if len(secret) < MIN_SECRET_BYTES:
        raise MPLangError(f"a cluster secret of at least {MIN_SECRET_BYTES} bytes is required: "
                          f"set ${SECRET_ENV} or pass --secret-file")
    return secret


def body_digest(chunks: Iterable[bytes | memoryview]) -> str:
    h = hashlib.sha256()
    for chunk in chunks:
        h.update(chunk)
    return h.hexdigest()


def _signature(secret: bytes, method: str, path: str, sender: str, timestamp: str, nonce: str,
               digest: str) -> str:
    message = "\n".join([method.upper(), path, sender, timestamp, nonce, digest]).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


class Signer:
    """Signs outgoing requests as ``sender``."""

    def __init__(self, secret: bytes, sender: str):
        self._secret = secret
        self.sender = sender

    def headers(self, method: str, path: str, digest: str) -> dict[str, str]:
        timestamp = f"{time.time():.6f}"
        nonce = secrets.token_hex(16)
        return {H_SENDER: self.sender, H_TIMESTAMP: timestamp, H_NONCE: nonce,
                H_SIGNATURE: _signature(self._secret, method, path, self.sender, timestamp,
                                        nonce, digest)}


class Verifier:
    """Checks signatures; remembers nonces for the accepted clock window."""

    def __init__(self, secret: bytes, window_s: float = 120.0):
        self._secret = secret
        self.window_s = window_s
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def verify(self, method: str, path: str, headers: Mapping[str, str], digest: str) -> str:
        """The authenticated sender; raises `AuthError` otherwise."""
        try:
            sender, timestamp = headers[H_SENDER], headers[H_TIMESTAMP]
            nonce, signature = headers[H_NONCE], headers[H_SIGNATURE]
        except KeyError as e:
            raise AuthError(f"missing authentication header {e.args[0]}", 401) from None
        expected = _signature(self._secret, method, path, sender, timestamp, nonce, digest)
        if not hmac.compare_digest(expected, signature):
            raise AuthError("invalid request signature", 401)
        try:
            age = abs(time.time() - float(timestamp))
        except ValueError:
            raise AuthError("invalid timestamp", 401) from None
        if age > self.window_s:
            raise AuthError("request timestamp outside the accepted window", 401)
        now = time.monotonic()
        with self._lock:
            if nonce in self._seen:
                raise AuthError("replayed request", 403)
            self._seen[nonce] = now + 2 * self.window_s
            if len(self._seen) > 100_000:
                self._seen = {n: t for n, t in self._seen.items() if t > now}
        return sender
