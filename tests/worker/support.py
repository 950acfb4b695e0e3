"""Helpers for the HTTP runtime tests: ports, cluster specs with identities, request
bodies and in-process workers.

Every test cluster is a development cluster: a key pair per node and for the
drivers ``driver`` and ``driver2``, plus ``mallory``, a key pair with a valid
certificate that no spec lists. Requests go over real mutual TLS; a forged
request changes one thing (the certificate, the role, the spec digest, the body)
so each check tests exactly one refusal.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import socket
import ssl
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import yaml

import mplang as mp
from mplang import simp
from mplang.cluster.identity import LocalIdentity, keygen, load_identity
from mplang.cluster.local import LocalCluster, write_dev_cluster
from mplang.edsl.graph import Graph
from mplang.edsl.serde import encode_graph_bundle
from mplang.transport.limits import WorkerLimits
from mplang.transport.mux_client import SPEC_HEADER, MuxClients
from mplang.transport.wire import encode_value_bytes, pack_message
from mplang.worker.http import uvicorn_server
from mplang.worker.messages import H_EXEC, H_KEY
from mplang.worker.server import WorkerServer

DRIVERS = ("driver", "driver2")
"""The drivers every test spec lists."""
STRANGER = "mallory"
"""A key pair with a valid certificate that no spec lists."""


@dataclass
class DevCluster:
    """A spec file with certificates and the folder holding every party's key."""

    spec_path: Path
    keys: Path

    @property
    def spec(self) -> mp.ClusterSpec:
        return mp.ClusterSpec.from_yaml(self.spec_path)

    def identity(self, name: str) -> LocalIdentity:
        return load_identity(self.keys / f"{name}.key")

    def client(self, name: str, rank: int, *, pin: int | None = None) -> httpx.Client:
        """An HTTPS client presenting ``name``'s certificate to worker ``rank`` (pinned to
        the certificate of worker ``pin``, by default ``rank``)."""
        spec = self.spec
        cert = spec.nodes[rank if pin is None else pin].certificate
        assert cert is not None
        return httpx.Client(verify=self.identity(name).client_context(cert), timeout=30.0,
                            base_url=spec.base_urls()[rank],
                            headers={SPEC_HEADER: spec.digest()})


def driver_refusal(spec_path: Path, key: Path) -> mp.MPRefusedError:
    """The refusal a driver of spec file ``spec_path`` (with ``key``) gets when it runs a
    one-op program on party 0 (the test fails if it runs)."""
    driver = mp.Driver(spec_path, key=key, timeout=10.0)
    try:
        mp.evaluate(driver, lambda: simp.constant((0,), 1))
    except mp.MPRefusedError as e:
        return e
    finally:
        driver.close()
    raise AssertionError(f"a driver of {spec_path} was not refused")

def tls_socket(cluster: DevCluster, name: str, rank: int, alpn: str = "http/1.1"
               ) -> ssl.SSLSocket:
    """A mutual-TLS connection presenting ``name``'s certificate to worker ``rank``,
    offering ``alpn`` (``mplang/1`` is the peers' protocol)."""
    node = cluster.spec.nodes[rank]
    assert node.certificate is not None
    ctx = cluster.identity(name).client_context(node.certificate)
    ctx.set_alpn_protocols([alpn])
    host, port = node.endpoint.rsplit(":", 1)
    return ctx.wrap_socket(socket.create_connection((host, int(port)), timeout=10))


def health_over(sock: ssl.SSLSocket, cluster: DevCluster) -> bytes:
    """The status line of ``GET /health`` over an HTTP/1.1 connection (kept open)."""
    sock.sendall(f"GET /health HTTP/1.1\r\nhost: worker\r\n{SPEC_HEADER}: "
                 f"{cluster.spec.digest()}\r\n\r\n".encode())
    return sock.recv(65536).split(b"\r\n", 1)[0]


def closed_by_peer(sock: ssl.SSLSocket, wait: float) -> bool:
    """Whether the worker closes (or refuses) ``sock`` within ``wait`` seconds."""
    sock.settimeout(wait)
    try:
        while sock.recv(65536):
            pass
    except TimeoutError:
        return False
    except OSError:  # a TLS alert or a reset
        return True
    return True


def handshake_refused(cluster: DevCluster, name: str, rank: int) -> bool:
    """Whether worker ``rank`` refuses a connection presenting ``name``'s certificate
    (in TLS 1.3 the client's side of the handshake ends first: the refusal arrives as
    the worker's alert and close)."""
    try:
        with tls_socket(cluster, name, rank) as sock:
            return not health_over(sock, cluster)
    except OSError:
        return True


def dev_cluster(tmp: Path, spec: mp.ClusterSpec) -> DevCluster:
    """Write ``spec`` with new keys for its nodes, `DRIVERS` and `STRANGER` under ``tmp``."""
    path = write_dev_cluster(spec, tmp, drivers=DRIVERS)
    keygen(STRANGER, tmp / "keys")
    return DevCluster(path, tmp / "keys")


def rewrite_spec(cluster: DevCluster, edit: Any) -> None:
    """Apply ``edit`` to the spec file's data (a dict) and write it back."""
    data = yaml.safe_load(cluster.spec_path.read_text())
    edit(data)
    cluster.spec_path.write_text(yaml.safe_dump(data, sort_keys=False))


# ---------------------------------------------------------------- ports and specs


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
        return ports


def spec_dict(ports: list[int]) -> dict[str, Any]:
    """Nodes ``node_i`` on ``ports``, PPUs ``P0..`` and an ABY3 SPU ``SP0`` over all nodes."""
    n = len(ports)
    devices: dict[str, Any] = {f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]}
                               for i in range(n)}
    devices["SP0"] = {"kind": "SPU", "members": [f"node_{i}" for i in range(n)],
                      "config": {"protocol": "ABY3", "field": "FM64"}}
    return {"nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{p}"}
                      for i, p in enumerate(ports)],
            "devices": devices}


def make_spec(ports: list[int]) -> mp.ClusterSpec:
    return mp.ClusterSpec.from_dict(spec_dict(ports))


def port_is_free(port: int, host: str = "127.0.0.1") -> bool:
    """Whether a new server could listen on ``host:port`` (what a restarted worker needs)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError:
            return False
        return True


def wait_ports_free(ports: list[int], timeout: float = 15.0) -> list[int]:
    """Wait until every port is free; return those still busy at the deadline."""
    deadline = time.monotonic() + timeout
    busy = [p for p in ports if not port_is_free(p)]
    while busy and time.monotonic() < deadline:
        time.sleep(0.1)
        busy = [p for p in busy if not port_is_free(p)]
    return busy


# ---------------------------------------------------------------- request bodies


def frame(header: dict[str, Any], *payload: bytes) -> bytes:
    """A request body: MPV1 frame with a JSON header and raw payload bytes."""
    return b"".join(bytes(p) for p in pack_message(header, list(payload)))


def run_body(graph: Graph, inputs: list[str | None] | None = None,
             exec_id: str | None = None, parties: list[int] | None = None) -> bytes:
    """A ``/run`` body for ``graph``."""
    header: dict[str, Any] = {"exec": exec_id or uuid.uuid4().hex, "scope": "",
                              "inputs": inputs or [], "progress": False}
    if parties is not None:
        header["parties"] = parties
    return frame(header, encode_graph_bundle(graph, {}))


def local_graph(value: int = 5) -> Graph:
    """A program party 0 runs alone (no messages): a constant on party 0, plus one."""
    def prog() -> Any:
        return simp.pcall((0,), lambda v: v + 1, simp.constant((0,), value))

    return mp.compile(prog, world_size=3).graph


def tiny_graph(value: int = 5) -> Graph:
    """The smallest useful program: a constant on party 0 (a few hundred bytes)."""
    return mp.compile(lambda: simp.constant((0,), value), world_size=3).graph


DRIVER_ENDPOINTS = ("/run", "/fetch", "/delete", "/abort")
"""The endpoints only a listed driver may use."""
ENDPOINTS = (*DRIVER_ENDPOINTS, "/msg")


def valid_body(path: str) -> bytes:
    """A well-formed body for ``path`` (what a legitimate client would send)."""
    if path == "/run":
        return run_body(local_graph())
    if path == "/fetch":
        return frame({"uri": "no-such-object"})
    if path == "/delete":
        return frame({"uris": []})
    if path == "/abort":
        return frame({"exec": uuid.uuid4().hex, "reason": "test"})
    if path == "/msg":
        return encode_value_bytes(7)
    raise ValueError(path)


@dataclass
class WaitingRun:
    """A run started on one worker alone, waiting there for votes that never come."""

    exec_id: str
    digest: str
    """The digest of its program, which peer messages must name."""
    answer: concurrent.futures.Future[httpx.Response]
    """The worker's answer to its ``/run``: when it is aborted or its votes time out."""


def start_waiting_run(dev: DevCluster, worker: ThreadWorker, graph: Graph,
                      parties: list[int] | None = None) -> WaitingRun:
    """Start a run of ``graph`` (``parties``, default all three) on ``worker`` only, as a
    driver would: it registers for its messages, sends its vote, and waits for the other
    parties' votes until it is aborted or the worker's timeout ends it."""
    exec_id = uuid.uuid4().hex
    body = run_body(graph, exec_id=exec_id, parties=parties or [0, 1, 2])
    answer: concurrent.futures.Future[httpx.Response] = concurrent.futures.Future()
    rank = worker.server.rank

    def start() -> None:
        try:
            with dev.client("driver", rank) as client:
                answer.set_result(client.post("/run", content=body, timeout=120))
        except Exception as e:  # handed to whoever waits for the answer
            answer.set_exception(e)

    threading.Thread(target=start, daemon=True).start()
    deadline = time.monotonic() + 30
    while not worker.server.executions.program_of(exec_id, "/0"):
        assert not answer.done(), answer.result().text
        assert time.monotonic() < deadline, "the run did not register"
        time.sleep(0.01)
    return WaitingRun(exec_id, hashlib.sha256(encode_graph_bundle(graph, {})).hexdigest(),
                      answer)


def send_vote(dev: DevCluster, node: str, rank: int, exec_id: str, vote: bytes) -> None:
    """Send ``vote`` for run (``exec_id``, scope "") to worker ``rank`` as ``node``, over
    that node's own ``mplang/1`` connection, as a worker sends its vote."""
    clients = MuxClients(dev.spec, load_identity(dev.keys / f"{node}.key"), 10.0)
    try:
        clients.send(rank, "/vote", [vote], {H_EXEC: exec_id, H_KEY: ""})
        clients.post(rank, "/health", [])  # the vote went first on the same connection
    finally:
        clients.close()


def msg_headers(exec_id: str | None = None, key: str = "/0", program: str = "",
                link: bool = False) -> dict[str, str]:
    """The headers of a peer message."""
    return {"x-mplang-exec": exec_id or uuid.uuid4().hex, "x-mplang-key": key,
            "x-mplang-program": program, "x-mplang-link": "1" if link else "0"}


# ---------------------------------------------------------------- in-process workers


class ThreadWorker:
    """One node's worker served over mutual TLS on a thread of the test process, so its
    state (mailbox, object store, executions) can be inspected."""

    def __init__(self, cluster: DevCluster, node: str, timeout: float = 30.0,
                 limits: WorkerLimits | None = None):
        self.server = WorkerServer(cluster.spec, node, cluster.identity(node), timeout=timeout,
                                   limits=limits, spec_path=cluster.spec_path,
                                   audit_log=cluster.spec_path.parent / "audit" / f"{node}.jsonl")
        self._uvicorn = uvicorn_server(self.server)
        self._thread = threading.Thread(target=self._uvicorn.run, daemon=True,
                                        name=f"uvicorn-{node}")

    def start(self, timeout: float = 30.0) -> None:
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._uvicorn.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("in-process worker did not start")
            time.sleep(0.02)

    def stop(self) -> None:
        self._uvicorn.should_exit = True
        self._thread.join(timeout=15)


@contextlib.contextmanager
def thread_workers(cluster: DevCluster, n: int, timeout: float = 10.0,
                   limits: dict[int, WorkerLimits] | None = None) -> Iterator[list[ThreadWorker]]:
    """Workers ``node_0`` .. ``node_{n-1}`` in this process (``limits`` by rank), stopped
    on exit."""
    started = [ThreadWorker(cluster, f"node_{r}", timeout=timeout,
                            limits=(limits or {}).get(r)) for r in range(n)]
    for w in started:
        w.start()
    try:
        yield started
    finally:
        for w in started:
            w.stop()


# ---------------------------------------------------------------- the mplang command


def mplang_command() -> list[str]:
    """The installed ``mplang`` script next to this interpreter (``-m mplang.cli`` if absent)."""
    script = Path(sys.executable).with_name("mplang")
    return [str(script)] if script.exists() else [sys.executable, "-m", "mplang.cli"]


@contextlib.contextmanager
def running_cluster(spec: mp.ClusterSpec | Path, *, timeout: float = 60.0,
                    **options: Any) -> Iterator[LocalCluster]:
    """Worker processes for ``spec`` (new development keys, unless it is a spec file
    with its keys beside it), stopped on exit; ``options`` go to `LocalCluster`."""
    cluster = LocalCluster(spec, **options)
    try:
        cluster.start(timeout=timeout)
        yield cluster
    finally:
        cluster.close()


@contextlib.contextmanager
def audited_cluster(spec: mp.ClusterSpec, base: Path) -> Iterator[tuple[LocalCluster, Path]]:
    """Worker processes for ``spec`` (new development keys and the policies `mplang init`
    writes) reading ``base/data/NODE`` and logging to ``base/audit``, stopped on exit;
    yields the cluster and the audit folder."""
    cluster = LocalCluster(spec, audit_dir=base / "audit", data_root=base / "data")
    try:
        cluster.start(timeout=120)
        yield cluster, base / "audit"
    finally:
        cluster.close()


def edit_policies(cluster: LocalCluster, nodes: Sequence[str], change: Callable[[str], str]
                  ) -> None:
    """Rewrite each of ``nodes``' policy files with ``change`` and wait until its worker's
    log says it reloaded it (within 2 s)."""
    logged = "reloaded policy"
    logs = {n: cluster.log_dir / f"{n}.log" for n in nodes}
    before = {n: logs[n].stat().st_size if logs[n].exists() else 0 for n in nodes}
    for node in nodes:
        path = cluster.spec_path.parent / "policies" / f"{node}.yaml"
        path.write_text(change(path.read_text()))
    deadline = time.monotonic() + 2.0
    for node in nodes:  # in what the log gained since (a busy worker's log may be long)
        while logged not in logs[node].read_bytes()[before[node]:].decode(errors="replace"):
            assert time.monotonic() < deadline, f"{node} did not reload its policy in 2 s"
            time.sleep(0.05)


@contextlib.contextmanager
def connected_driver(cluster: LocalCluster) -> Iterator[mp.Driver]:
    """A driver for ``cluster`` with bounded waits (a hung worker fails a test instead
    of stalling the session), closed on exit."""
    driver = cluster.driver(timeout=30.0, run_timeout=120.0)
    try:
        yield driver
    finally:
        driver.close()
