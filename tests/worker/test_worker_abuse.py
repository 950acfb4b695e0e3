"""A worker shrugs off abuse from listed peers and outsiders (issue 26, items 4 and 5).

Two worker processes on loopback with small caps (`ARGS`). Each memory attack
adds at most 64 MiB to node_0's RSS and leaves it serving: a program across both
workers runs within 1 s of the attack's end. Each cap has a test that tries to
beat it the way an attacker would. Outsiders connect from other loopback source
addresses (127.0.0.2 ...), so the listed parties on 127.0.0.1 have their own
per-address allowance; every connection targets 127.0.0.1.

``pytest tests/worker/test_worker_abuse.py -s`` prints the RSS figures recorded in
benchmarks/RESULTS.md.
"""

from __future__ import annotations

import contextlib
import os
import select
import socket
import ssl
import time
import uuid
from collections.abc import Iterator

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.cluster.local import LocalCluster
from mplang.transport.mux_client import SPEC_HEADER
from tests.worker import memory_workload, mux_wire, support

MiB, GiB = 1 << 20, 1 << 30
BUDGET = 48 * MiB
PER_ADDRESS, PER_PEER, TOTAL = 32, 8, 96
STALL, HANDSHAKE = 3.0, 1.0
ARGS = ["--max-inflight-bytes", str(BUDGET), "--stall-seconds", str(STALL),
        "--handshake-seconds", str(HANDSHAKE), "--max-connections-per-address", str(PER_ADDRESS),
        "--max-connections-per-peer", str(PER_PEER), "--max-connections", str(TOTAL),
        "--timeout", "20"]
BOUND_KIB = 64 * 1024
"""The most an attack may add to a worker's RSS."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    spec = support.spec_dict(support.free_ports(2))
    spec["devices"]["SP0"]["config"]["protocol"] = "SEMI2K"
    dev = support.dev_cluster(tmp_path_factory.mktemp("abuse"), mp.ClusterSpec.from_dict(spec))
    # keys of driver2 and mallory too
    with support.running_cluster(dev.spec_path, timeout=120, worker_args=ARGS) as local:
        yield local


@pytest.fixture(scope="module")
def driver(cluster: LocalCluster) -> Iterator[mp.Driver]:
    with support.connected_driver(cluster) as connected:
        _program(connected)  # warm: connections between the workers are open
        yield connected


def _program(driver: mp.Driver) -> None:
    """A program across both workers (a message from node_0 to node_1)."""
    out = mp.evaluate(driver, lambda: simp.shuffle_static(simp.constant((0,), np.int32(7)),
                                                          {1: 0}))
    assert mp.fetch(driver, out)[1] == 7


def _serves_within_a_second(driver: mp.Driver) -> None:
    start = time.monotonic()
    _program(driver)
    assert time.monotonic() - start < 1.0


def _pid(cluster: LocalCluster) -> int:
    return cluster.processes["node_0"].pid


@contextlib.contextmanager
def _bounded(cluster: LocalCluster, attack: str) -> Iterator[None]:
    """The attack in the block adds at most 64 MiB to node_0's RSS and leaves it
    serving; prints the figures."""
    before = memory_workload.rss_kib(_pid(cluster))
    yield
    during = memory_workload.rss_kib(_pid(cluster))
    print(f"\n{attack}: node_0 RSS {before / 1024:.0f} -> {during / 1024:.0f} MiB "
          f"(+{(during - before) / 1024:.1f} MiB)")
    assert during - before <= BOUND_KIB, (attack, before, during)


def _spec(cluster: LocalCluster) -> str:
    return cluster.cluster.digest()


def _closed_by_worker(sock: socket.socket, timeout: float) -> bool:
    """Whether the worker closes ``sock`` within ``timeout`` (anything it sends is read)."""
    deadline = time.monotonic() + timeout
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(1 << 16):
                return True
        except TimeoutError:
            return False
        except (ConnectionError, ssl.SSLError):
            return True
    return False


def _log_has(cluster: LocalCluster, text: str, timeout: float = 3.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if text in cluster.log_tail("node_0", 1 << 20):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------- streams (item 4)


def test_driver_path_heads_from_a_node_are_refused_before_allocating(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    sock = mux_wire.connect(cluster, "node_1")
    with _bounded(cluster, "3 HEADs of 1 GiB on /run from a node"):
        for stream in (1, 3, 5):
            sock.sendall(mux_wire.head(stream, GiB, {"path": "/run",
                                                     "headers": {SPEC_HEADER: _spec(cluster)}}))
        answers = dict(mux_wire.read_answer(sock) for _ in range(3))
        assert sorted(answers) == [1, 3, 5]
        assert all(a["status"] == 403 for a in answers.values()), answers
    sock.close()
    _serves_within_a_second(driver)


def test_a_driver_s_huge_heads_are_refused_by_the_budget(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    sock = mux_wire.connect(cluster, "driver")
    with _bounded(cluster, "3 HEADs of 1 GiB on /run from the driver"):
        for stream in (1, 3, 5):
            sock.sendall(mux_wire.head(stream, GiB, {"path": "/run",
                                                     "headers": {SPEC_HEADER: _spec(cluster)}}))
        answers = dict(mux_wire.read_answer(sock) for _ in range(3))
        assert all(a["status"] == 429 and "budget" in a["error"] for a in answers.values())
    sock.close()
    _serves_within_a_second(driver)


def test_admitted_heads_take_no_memory_until_their_bytes_arrive(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    sock = mux_wire.connect(cluster, "driver")
    before = memory_workload.rss_kib(_pid(cluster))
    for stream in (1, 3, 5):  # 45 MiB announced, within the budget: admitted
        sock.sendall(mux_wire.head(stream, 15 * MiB, {"path": "/run",
                                                      "headers": {SPEC_HEADER: _spec(cluster)}}))
    assert not _closed_by_worker(sock, 0.3)  # no refusal, no close
    grown = memory_workload.rss_kib(_pid(cluster)) - before
    print(f"\n3 admitted HEADs of 15 MiB, no body: node_0 RSS +{grown / 1024:.1f} MiB")
    assert grown < 8 * 1024
    sock.close()
    _serves_within_a_second(driver)


def _fill(sock: ssl.SSLSocket, stream: int, size: int, sent: int, spec: str) -> None:
    sock.sendall(mux_wire.head(stream, size, {"path": "/run", "headers": {SPEC_HEADER: spec}}))
    chunk = bytes(256 << 10)
    for offset in range(0, sent, len(chunk)):
        sock.sendall(mux_wire.data(stream, chunk[:min(len(chunk), sent - offset)]))


def test_the_budget_holds_when_the_bytes_are_sent(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    """Two drivers announce 48 MiB (the budget) over two connections and send 44 MiB of
    it; one more byte announced is refused, and the stalled bodies are dropped."""
    spec = _spec(cluster)
    socks = [mux_wire.connect(cluster, name) for name in ("driver", "driver2")]
    with _bounded(cluster, "48 MiB announced and 44 MiB sent over two connections"):
        for sock in socks:
            for stream in (1, 3):
                _fill(sock, stream, 12 * MiB, 11 * MiB, spec)
        time.sleep(0.2)  # the worker has read what was sent
        socks[0].sendall(mux_wire.head(5, MiB, {"path": "/run", "headers": {SPEC_HEADER: spec}}))
        stream, answer = mux_wire.read_answer(socks[0])
        assert (stream, answer["status"]) == (5, 429), answer
    assert all(_closed_by_worker(s, STALL + 3) for s in socks)  # stalled: dropped
    for sock in socks:
        sock.close()
    _serves_within_a_second(driver)
    again = mux_wire.connect(cluster, "driver")  # the budget is whole again
    again.sendall(mux_wire.head(1, 40 * MiB, {"path": "/run", "headers": {SPEC_HEADER: spec}}))
    assert not _closed_by_worker(again, 0.3)
    again.close()


def _http_post(sock: ssl.SSLSocket, spec: str, size: int) -> None:
    """The head of an HTTP/1.1 ``POST /run`` announcing a ``size``-byte body."""
    sock.sendall(f"POST /run HTTP/1.1\r\nhost: worker\r\n{SPEC_HEADER}: {spec}\r\n"
                 f"content-length: {size}\r\n\r\n".encode())


def _http_answer(sock: ssl.SSLSocket, wait: float = 5) -> tuple[int, bytes]:
    """The status and body of the HTTP/1.1 answer the worker sends on ``sock`` (within
    ``wait`` seconds)."""
    sock.settimeout(wait)
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(1 << 16)
        assert chunk, data
        data += chunk
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                      if line.lower().startswith(b"content-length:")))
    while len(body) < length:
        body += sock.recv(1 << 16)
    return int(head.split()[1]), body


def test_http_bodies_count_in_the_same_budget(cluster: LocalCluster, driver: mp.Driver) -> None:
    """An HTTP/1.1 body takes its content-length from the worker's in-flight budget until
    it has been read: while 40 MiB are being sent over HTTP/1.1, a 10 MiB body is refused
    (429, before a byte of it is sent) over HTTP/1.1 and over mplang/1; once that
    connection closes, its bytes are given back (and the request it left unfinished is
    logged as refused: it was a traceback)."""
    dev = support.DevCluster(cluster.spec_path, cluster.keys_dir)
    spec = _spec(cluster)
    hog = support.tls_socket(dev, "driver", 0)
    _http_post(hog, spec, 40 * MiB)
    hog.sendall(bytes(MiB))
    time.sleep(0.2)
    with support.tls_socket(dev, "driver2", 0) as second:
        _http_post(second, spec, 10 * MiB)
        status, body = _http_answer(second)
    assert status == 429, body
    assert b"would exceed the worker's budget of 50331648" in body, body
    mux = mux_wire.connect(cluster, "driver2")
    mux.sendall(mux_wire.head(1, 10 * MiB, {"path": "/run", "headers": {SPEC_HEADER: spec}}))
    assert mux_wire.read_answer(mux)[1]["status"] == 429
    hog.close()  # its request ends as a refusal in the log, not a traceback
    assert _log_has(cluster, f"the client left after {MiB} of {40 * MiB} body bytes")
    assert "ClientDisconnect" not in cluster.log_tail("node_0", 1 << 20)
    mux.sendall(mux_wire.head(3, 40 * MiB, {"path": "/run", "headers": {SPEC_HEADER: spec}}))
    assert not _closed_by_worker(mux, 0.3)  # admitted: the budget is whole again
    mux.close()
    with support.tls_socket(dev, "driver2", 0) as third:
        _http_post(third, spec, 40 * MiB)
        assert not support.closed_by_peer(third, 0.3)  # admitted, waiting for the body
    _serves_within_a_second(driver)


def test_a_stalled_http_body_is_dropped_and_its_budget_given_back(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    """An HTTP/1.1 body announcing the whole budget stops after 1 MiB: after the stall
    limit the worker answers 408 and closes the connection, and a body of the whole
    budget sent next is admitted and read to its end."""
    dev = support.DevCluster(cluster.spec_path, cluster.keys_dir)
    spec = _spec(cluster)
    with support.tls_socket(dev, "driver", 0) as sock:
        _http_post(sock, spec, BUDGET)
        sock.sendall(bytes(MiB))
        start = time.monotonic()
        status, body = _http_answer(sock, STALL + 3)
        assert time.monotonic() - start >= STALL - 0.5
        assert status == 408, body
        stalled = f"the body received nothing for {STALL:g} s (after {MiB} of {BUDGET} bytes)"
        assert stalled.encode() in body
        assert _closed_by_worker(sock, 1)
    assert _log_has(cluster, f"refused POST /run: {stalled}")
    with support.tls_socket(dev, "driver2", 0) as sock:
        _http_post(sock, spec, BUDGET)
        sock.sendall(bytes(BUDGET))
        status, body = _http_answer(sock)
    assert status == 400, body  # admitted (not 429) and read whole: only malformed
    _serves_within_a_second(driver)


def test_a_stalled_body_is_dropped_after_the_timeout(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    sock = mux_wire.connect(cluster, "driver")
    start = time.monotonic()
    _fill(sock, 1, MiB, MiB // 2, _spec(cluster))
    assert _closed_by_worker(sock, STALL + 3)
    assert time.monotonic() - start >= STALL - 0.5
    assert _log_has(cluster, f"a body received nothing for {STALL:g} s")
    sock.close()
    _serves_within_a_second(driver)


def test_refused_message_heads_keep_a_counter_not_their_head(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    """300 /msg HEADs of about 60 KiB of JSON (15,000 lists each once parsed, about
    1 MB) announcing 1 GiB bodies: refused at once, and kept as counters only. The
    attacker trickles a byte into every open stream after each 10 HEADs, so that no
    stream stalls, and reads the refusals (a worker stops reading from a peer that
    does not read its answers)."""
    heads = 300
    padding = [[]] * 15_000  # type: ignore[var-annotated]
    frames = [mux_wire.head(2 * i + 1, GiB, {
        "path": "/msg", "pad": padding,
        "headers": {**support.msg_headers(uuid.uuid4().hex), SPEC_HEADER: _spec(cluster)}})
        for i in range(heads)]
    sock = mux_wire.connect(cluster, "node_1", timeout=30)
    answers: list[int] = []
    with _bounded(cluster, f"{heads} refused /msg HEADs of 60 KiB, held open"):
        for i, frame in enumerate(frames):
            sock.sendall(frame)
            if i % 10 == 9:
                sock.sendall(b"".join(mux_wire.data(2 * k + 1, b"x") for k in range(i + 1)))
                answers += [mux_wire.read_answer(sock)[1]["status"] for _ in range(10)]
        assert len(answers) == heads
        assert all(400 <= status < 500 for status in answers), set(answers)
    assert _closed_by_worker(sock, STALL + 3)  # the trickle stopped: the streams stall
    sock.close()
    _serves_within_a_second(driver)


def test_streams_over_the_cap_close_the_connection(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    sock = mux_wire.connect(cluster, "node_1")
    headers = {**support.msg_headers(), SPEC_HEADER: _spec(cluster)}
    sock.sendall(b"".join(mux_wire.head(2 * i + 1, GiB, {"path": "/msg", "headers": headers})
                          for i in range(1025)))  # one over the default cap
    assert _closed_by_worker(sock, 5)
    assert _log_has(cluster, "more than 1024 streams open at once")
    sock.close()
    _serves_within_a_second(driver)


# ---------------------------------------------------------------- connections (item 5)


def _outsiders(source: str, count: int, port: int) -> list[socket.socket]:
    """``count`` TCP connections from ``source`` to 127.0.0.1:``port`` that never start TLS."""
    socks = []
    for _ in range(count):
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind((source, 0))
        sock.settimeout(5)
        sock.connect(("127.0.0.1", port))
        socks.append(sock)
    return socks


def _closed(socks: list[socket.socket]) -> int:
    """How many of ``socks`` the worker has closed by now."""
    readable, _, _ = select.select(socks, [], [], 0)
    closed = 0
    for sock in readable:
        try:
            closed += sock.recv(1, socket.MSG_PEEK) == b""
        except ConnectionError:
            closed += 1
    return closed


def _port(cluster: LocalCluster) -> int:
    return int(cluster.cluster.nodes[0].endpoint.rsplit(":", 1)[1])


def _descriptors(cluster: LocalCluster) -> int:
    return len(os.listdir(f"/proc/{_pid(cluster)}/fd"))


def test_outsiders_that_never_finish_tls_are_capped_and_timed_out(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    base = _descriptors(cluster)
    socks = _outsiders("127.0.0.2", PER_ADDRESS + 16, _port(cluster))
    try:
        time.sleep(0.3)
        closed, held = _closed(socks), _descriptors(cluster)
        print(f"\n{len(socks)} outsiders from one address: {closed} closed at once, node_0 "
              f"descriptors {base} -> {held}")
        assert closed >= 16  # over the per-address cap: closed at once
        assert held <= base + PER_ADDRESS + 4
        assert _log_has(cluster, "connections per address at its limit of 32")
        dev = support.DevCluster(cluster.spec_path, cluster.keys_dir)
        with dev.client("driver", 0) as client:  # a listed party still connects
            assert client.get("/health").status_code == 200
        _serves_within_a_second(driver)
        deadline = time.monotonic() + HANDSHAKE + 3  # the stalled handshakes end
        while _closed(socks) < len(socks) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _closed(socks) == len(socks)
    finally:
        for sock in socks:
            sock.close()


def test_many_source_addresses_meet_the_cap_on_all_connections(
        cluster: LocalCluster, driver: mp.Driver) -> None:
    """Beating the per-address cap with four addresses: the cap over all connections
    holds (descriptors stay bounded), connections already open keep serving, and new
    ones connect again once the handshake timeout has closed the flood."""
    socks: list[socket.socket] = []
    try:
        for source in ("127.0.0.3", "127.0.0.4", "127.0.0.5", "127.0.0.6"):
            socks += _outsiders(source, PER_ADDRESS, _port(cluster))
        time.sleep(0.3)
        held = _descriptors(cluster)
        print(f"\n{len(socks)} outsiders from four addresses: node_0 descriptors {held}")
        assert held <= TOTAL + 64
        assert _log_has(cluster, f"connections at its limit of {TOTAL}")
        _serves_within_a_second(driver)  # over connections opened before the flood
    finally:
        for sock in socks:
            sock.close()
    time.sleep(HANDSHAKE + 0.5)
    dev = support.DevCluster(cluster.spec_path, cluster.keys_dir)
    with dev.client("driver", 0) as client:
        assert client.get("/health").status_code == 200


def test_a_peer_over_its_connection_cap_is_closed(cluster: LocalCluster) -> None:
    socks = [mux_wire.connect(cluster, "driver2") for _ in range(PER_PEER)]
    try:
        extra = mux_wire.connect(cluster, "driver2")
        assert _closed_by_worker(extra, 3)
        extra.close()
        assert _log_has(cluster, f"connections per peer at its limit of {PER_PEER}")
        assert not _closed_by_worker(socks[-1], 0.2)  # those within the cap stay
    finally:
        for sock in socks:
            sock.close()
    time.sleep(0.3)
    again = mux_wire.connect(cluster, "driver2")  # closed connections free their places
    again.sendall(mux_wire.head(1, 0, {"path": "/nothing-here", "headers": {}}))
    assert mux_wire.read_answer(again)[1]["status"] == 404
    again.close()
