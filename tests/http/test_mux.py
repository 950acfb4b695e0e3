"""``mplang/1`` against real worker processes: refusals are 4xx answers on their stream,
broken framing closes only that connection, and a large transfer does not hold up
small requests."""

from __future__ import annotations

import json
import socket
import ssl
import struct
import threading
import time
import uuid
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.backends.mux import ALPN
from mplang.backends.mux_client import MuxClients, StatusError, host_port
from mplang.backends.wire import encode_value_bytes, pack_message
from mplang.cluster.identity import load_identity
from mplang.cluster.local import LocalCluster
from tests.http import support


def _raw(cluster: LocalCluster, name: str, rank: int = 0) -> ssl.SSLSocket:
    """A TLS connection speaking mplang/1 to worker ``rank``, as party ``name``."""
    cert = cluster.cluster.nodes[rank].certificate
    assert cert is not None
    context = load_identity(cluster.keys_dir / f"{name}.key").client_context(cert)
    context.set_alpn_protocols([ALPN])
    host, port = host_port(cluster.cluster.nodes[rank].endpoint)
    sock = context.wrap_socket(socket.create_connection((host, port), timeout=10),
                               server_hostname=host)
    assert sock.selected_alpn_protocol() == ALPN
    return sock


def _head(stream: int, size: int, head: dict[str, Any]) -> bytes:
    text = json.dumps(head).encode()
    return struct.pack("!BII", 1, stream, 8 + len(text)) + struct.pack("!Q", size) + text


def _read_answer(sock: ssl.SSLSocket) -> tuple[int, dict[str, Any]]:
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
            return stream, json.loads(data[8:])


def test_broken_framing_closes_that_connection_only(local_cluster: LocalCluster,
                                                    http_driver: mp.Driver) -> None:
    sock = _raw(local_cluster, "driver")
    sock.sendall(struct.pack("!BII", 7, 1, 3) + b"abc")
    assert sock.recv(10) == b""  # closed by the worker
    sock.close()
    x = mp.evaluate(http_driver, lambda: simp.constant((0,), np.int32(41)))
    assert mp.fetch(http_driver, x)[0] == 41


def test_a_body_over_the_limit_is_refused_from_its_head(local_cluster: LocalCluster) -> None:
    sock = _raw(local_cluster, "driver")
    spec = local_cluster.cluster.digest()
    sock.sendall(_head(5, 1 << 40, {"path": "/run", "headers": {"x-mplang-spec": spec}}))
    stream, answer = _read_answer(sock)  # answered before any body byte was sent
    assert stream == 5 and answer["status"] == 413
    assert answer["error"].startswith(f"body of {1 << 40} bytes exceeds the limit of")
    sock.sendall(_head(7, 0, {"path": "/run", "headers": "not a dict"}))
    stream, answer = _read_answer(sock)
    assert (stream, answer["status"]) == (7, 400)
    assert answer["error"] == "a request's HEAD needs a path and string headers"
    sock.close()


def test_requests_are_checked_as_over_http(local_cluster: LocalCluster) -> None:
    spec = local_cluster.cluster
    driver = MuxClients(spec, load_identity(local_cluster.driver_key), 10.0)
    try:
        with pytest.raises(StatusError) as nowhere:
            driver.post(0, "/nowhere", [])
        assert nowhere.value.response.status_code == 404
        with pytest.raises(StatusError) as msg:  # a driver may not send peer messages
            driver.post(1, "/msg", [encode_value_bytes(7)], headers=support.msg_headers())
        assert msg.value.response.status_code == 403
        assert "may not use /msg (only a node may)" in msg.value.response.text
        answer = driver.post(0, "/delete", pack_message({"uris": []}, []))
        assert answer.json() == {"deleted": 0}
    finally:
        driver.close()


def test_a_refused_message_comes_back_with_its_execution(local_cluster: LocalCluster) -> None:
    refusals: list[tuple[int, dict[str, Any]]] = []
    got = threading.Event()

    def refused(rank: int, head: dict[str, Any], body: memoryview) -> None:
        refusals.append((rank, head))
        got.set()

    node_0 = MuxClients(local_cluster.cluster, load_identity(local_cluster.keys_dir / "node_0.key"),
                        10.0, refused)
    exec_id = uuid.uuid4().hex
    try:
        node_0.send(1, "/msg", [encode_value_bytes(7)], support.msg_headers(exec_id, "/3"))
        assert got.wait(10)
    finally:
        node_0.close()
    ((rank, head),) = refusals
    assert rank == 1 and head["exec"] == exec_id and head["key"] == "/3"
    assert head["status"] == 409
    assert f"execution {exec_id}" in head["error"]


def test_small_requests_are_not_held_up_by_a_large_fetch(http_driver: mp.Driver) -> None:
    n = 64 << 20  # 256 MiB of float32: a few hundred ms on the wire
    big = mp.evaluate(http_driver, lambda: simp.pcall((0,), lambda: jnp.ones(n, jnp.float32)))
    small = mp.evaluate(http_driver, lambda: simp.constant((0,), np.int32(3)))
    finished: dict[str, float] = {}

    def fetch_big() -> None:
        value = mp.fetch(http_driver, big)[0]
        finished["big"] = time.monotonic()
        assert value.shape == (n,) and float(value[-1]) == 1.0

    thread = threading.Thread(target=fetch_big)
    thread.start()
    time.sleep(0.05)  # the large answer is on its way
    for _ in range(3):
        http_driver._inline.clear()  # fetch over the wire, not from the run's answer
        assert mp.fetch(http_driver, small)[0] == 3
    finished["small"] = time.monotonic()
    thread.join(60)
    assert finished["small"] < finished["big"]


def test_small_results_come_back_with_the_run(http_driver: mp.Driver) -> None:
    out = mp.evaluate(http_driver, lambda: simp.pcall((0, 1), lambda: np.int32(5) * 2))
    uris = [u for u in out.var.uris if u is not None]  # type: ignore[attr-defined]
    assert len(uris) == 2 and all(u in http_driver._inline for u in uris)
    assert [int(v) for v in mp.fetch(http_driver, out) if v is not None] == [10, 10]
    del out  # the handle's collection forgets the inlined values
    deadline = time.monotonic() + 5
    while any(u in http_driver._inline for u in uris) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not any(u in http_driver._inline for u in uris)
