"""Raw ``mplang/1`` for tests that speak it as an attacker would: a TLS connection
as any party, HEAD frames announcing any size, and the worker's answers."""

from __future__ import annotations

import json
import socket
import ssl
import struct
from typing import Any

from mplang.cluster.identity import load_identity
from mplang.cluster.local import LocalCluster
from mplang.transport.mux import ALPN
from mplang.transport.mux_client import host_port


def connect(cluster: LocalCluster, name: str, rank: int = 0,
            timeout: float = 10.0) -> ssl.SSLSocket:
    """A TLS connection speaking mplang/1 to worker ``rank``, as party ``name``."""
    cert = cluster.cluster.nodes[rank].certificate
    assert cert is not None
    context = load_identity(cluster.keys_dir / f"{name}.key").client_context(cert)
    context.set_alpn_protocols([ALPN])
    host, port = host_port(cluster.cluster.nodes[rank].endpoint)
    sock = context.wrap_socket(socket.create_connection((host, port), timeout=timeout),
                               server_hostname=host)
    assert sock.selected_alpn_protocol() == ALPN
    return sock


def frame(kind: int, stream: int, payload: bytes) -> bytes:
    """A frame of any ``kind`` (1: HEAD, 2: DATA) and ``payload``."""
    return struct.pack("!BII", kind, stream, len(payload)) + payload


def head(stream: int, size: int, obj: Any) -> bytes:
    """A HEAD frame of ``stream`` announcing a ``size``-byte body (``obj`` as JSON;
    bytes as they are)."""
    text = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return frame(1, stream, struct.pack("!Q", size) + text)


def read_answer(sock: ssl.SSLSocket) -> tuple[int, dict[str, Any]]:
    """The stream and HEAD of the next frame the worker sends."""
    def exact(n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = sock.recv(n - len(data))
            assert chunk, "the worker closed the connection"
            data += chunk
        return data
    while True:
        kind, stream, length = struct.unpack("!BII", exact(9))
        data = exact(length)
        if kind == 1:  # a HEAD; skip the DATA of earlier answers
            answer: dict[str, Any] = json.loads(data[8:])
            return stream, answer


def data(stream: int, payload: bytes) -> bytes:
    """A DATA frame of ``stream``."""
    return frame(2, stream, payload)
