"""Request authentication between driver and workers, keyed by a cluster secret:
an HMAC-SHA256 signature over method, path, sender, timestamp and nonce in the
headers, and an HMAC tag over the body at its end. A verifier refuses bad
signatures, stale timestamps, replayed nonces and bodies that do not match.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import threading
import time
from collections.abc import Iterable, Iterator, Mapping

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


TAG_SIZE = 32
CHUNK = 1 << 20


def _sign(secret: bytes, method: str, path: str, sender: str, timestamp: str,
          nonce: str) -> str:
    message = "\n".join([method.upper(), path, sender, timestamp, nonce]).encode()
    return hmac.new(secret, message, hashlib.sha256).hexdigest()


def _body_mac(secret: bytes, signature: str) -> hmac.HMAC:
    return hmac.new(secret, b"mplang-body\n" + signature.encode(), hashlib.sha256)


class Signer:
    """Signs outgoing requests as ``sender``.

    The headers carry an HMAC over method, path, sender, timestamp and nonce;
    the body ends with a 32-byte HMAC tag over its content, bound to that
    signature. The tag is computed while the body streams out, so hashing a
    large body overlaps with sending it.
    """

    def __init__(self, secret: bytes, sender: str):
        self._secret = secret
        self.sender = sender

    def headers(self, method: str, path: str) -> dict[str, str]:
        timestamp = f"{time.time():.6f}"
        nonce = secrets.token_hex(16)
        return {H_SENDER: self.sender, H_TIMESTAMP: timestamp, H_NONCE: nonce,
                H_SIGNATURE: _sign(self._secret, method, path, self.sender, timestamp, nonce)}

    def body(self, headers: Mapping[str, str], parts: Iterable[bytes | memoryview]
             ) -> Iterator[bytes | memoryview]:
        """The body stream: ``parts`` in chunks of at most 1 MiB, then the tag."""
        mac = _body_mac(self._secret, headers[H_SIGNATURE])
        for part in parts:
            view = memoryview(part).cast("B")
            for start in range(0, len(view), CHUNK):
                chunk = view[start:start + CHUNK]
                mac.update(chunk)
                yield chunk
        yield mac.digest()


class BodyChecker:
    """Checks a streamed body's trailing tag; ``feed`` chunks, then ``finish``."""

    def __init__(self, mac: hmac.HMAC):
        self._mac = mac
        self._chunks: list[bytes | memoryview] = []
        self._tail = b""

    def feed(self, chunk: bytes) -> None:
        if len(chunk) >= TAG_SIZE:
            if self._tail:
                self._mac.update(self._tail)
                self._chunks.append(self._tail)
            content = memoryview(chunk)[:-TAG_SIZE]
            self._mac.update(content)
            self._chunks.append(content)
            self._tail = chunk[-TAG_SIZE:]
            return
        data = self._tail + chunk
        cut = len(data) - TAG_SIZE
        if cut > 0:
            self._mac.update(data[:cut])
            self._chunks.append(data[:cut])
            data = data[cut:]
        self._tail = data

    def finish(self) -> bytes:
        """The body without its tag; raises `AuthError` if the tag does not match."""
        if len(self._tail) != TAG_SIZE or not hmac.compare_digest(self._mac.digest(), self._tail):
            raise AuthError("the request body does not match its signature", 401)
        return b"".join(self._chunks)


class Verifier:
    """Checks signatures; remembers nonces for the accepted clock window."""

    def __init__(self, secret: bytes, window_s: float = 120.0, not_before: float | None = None):
        self._secret = secret
        self.window_s = window_s
        self.not_before = not_before
        """Requests signed before this time are refused: nonces seen by an earlier
        process serving the same endpoint are not known here."""
        self._seen: dict[str, float] = {}
        self._lock = threading.Lock()

    def verify(self, method: str, path: str, headers: Mapping[str, str]) -> tuple[str, BodyChecker]:
        """The authenticated sender and the checker of its body; raises `AuthError` otherwise."""
        try:
            sender, timestamp = headers[H_SENDER], headers[H_TIMESTAMP]
            nonce, signature = headers[H_NONCE], headers[H_SIGNATURE]
        except KeyError as e:
            raise AuthError(f"missing authentication header {e.args[0]}", 401) from None
        expected = _sign(self._secret, method, path, sender, timestamp, nonce)
        if not hmac.compare_digest(expected, signature):
            raise AuthError("invalid request signature", 401)
        try:
            age = abs(time.time() - float(timestamp))
        except ValueError:
            raise AuthError("invalid timestamp", 401) from None
        if age > self.window_s:
            raise AuthError("request timestamp outside the accepted window", 401)
        if self.not_before is not None and float(timestamp) < self.not_before:
            raise AuthError("request signed before this worker started (a replay)", 403)
        now = time.monotonic()
        with self._lock:
            if nonce in self._seen:
                raise AuthError("replayed request", 403)
            self._seen[nonce] = now + 2 * self.window_s
            if len(self._seen) > 100_000:
                self._seen = {n: t for n, t in self._seen.items() if t > now}
        return sender, BodyChecker(_body_mac(self._secret, signature))
