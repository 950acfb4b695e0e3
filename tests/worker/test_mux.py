"""``mplang/1`` against real worker processes: refusals are 4xx answers on their stream,
broken framing closes only that connection, and a large transfer does not hold up
small requests."""

from __future__ import annotations

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
from mplang.cluster.identity import load_identity
from mplang.cluster.local import LocalCluster
from mplang.transport.mux_client import MuxClients, StatusError
from mplang.transport.wire import encode_value_bytes, pack_message
from tests.worker import mux_wire, support


def test_broken_framing_closes_that_connection_only(local_cluster: LocalCluster,
                                                    http_driver: mp.Driver) -> None:
    sock = mux_wire.connect(local_cluster, "driver")
    sock.sendall(struct.pack("!BII", 7, 1, 3) + b"abc")
    assert sock.recv(10) == b""  # closed by the worker
    sock.close()
    x = mp.evaluate(http_driver, lambda: simp.constant((0,), np.int32(41)))
    assert mp.fetch(http_driver, x)[0] == 41


def test_a_body_over_the_limit_is_refused_from_its_head(local_cluster: LocalCluster) -> None:
    sock = mux_wire.connect(local_cluster, "driver")
    spec = local_cluster.cluster.digest()
    sock.sendall(mux_wire.head(5, 1 << 40, {"path": "/run", "headers": {"x-mplang-spec": spec}}))
    stream, answer = mux_wire.read_answer(sock)  # answered before any body byte was sent
    assert stream == 5 and answer["status"] == 413
    assert answer["error"].startswith(f"body of {1 << 40} bytes exceeds the limit of")
    sock.sendall(mux_wire.head(7, 0, {"path": "/run", "headers": "not a dict"}))
    stream, answer = mux_wire.read_answer(sock)
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
        with pytest.raises(StatusError) as bad:  # served without the app: the same answers
            driver.post(0, "/delete", pack_message({"uris": "mem://x"}, []))
        assert bad.value.response.status_code == 400
        assert bad.value.response.json() == {"error": "uris must be a list of strings or nulls"}
        with pytest.raises(StatusError) as missing:
            driver.post(0, "/fetch", pack_message({"uri": "mem://nothing"}, []))
        assert missing.value.response.status_code == 404
        assert missing.value.response.json() == {
            "error": "object mem://nothing is not in the store of node_0"}
        health = driver.post(2, "/health", [])  # the one GET route (it was a 405)
        assert health.json()["node"] == "node_2" and health.json()["status"] == "ok"
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


def test_closed_connections_free_their_tls_state_without_a_garbage_collection(
        tmp_path: Any) -> None:
    """A closed mplang/1 connection leaves no cycle behind that holds its TLS objects
    (or its buffers) until the next full collection: with the collector off, 200
    connections leave no more TLS objects alive than one does."""
    import gc
    import socket
    import ssl

    dev = support.dev_cluster(tmp_path, support.make_spec(support.free_ports(3)))
    cert = dev.spec.nodes[0].certificate
    assert cert is not None
    host, port = dev.spec.base_urls()[0].removeprefix("https://").split(":")
    context = dev.identity("driver").client_context(cert)
    context.set_alpn_protocols([mux_wire.ALPN])

    def churn(n: int) -> None:
        for _ in range(n):
            with context.wrap_socket(socket.create_connection((host, int(port))),
                                     server_hostname=host) as sock:
                assert sock.selected_alpn_protocol() == mux_wire.ALPN
        time.sleep(0.5)  # the worker sees each close

    def alive() -> int:
        return sum(isinstance(o, ssl.SSLObject) for o in gc.get_objects())

    with support.thread_workers(dev, 1):
        churn(5)
        gc.collect()
        gc.disable()
        try:
            before = alive()
            churn(200)
            after = alive()
        finally:
            gc.enable()
    assert after - before <= 2, (before, after)
