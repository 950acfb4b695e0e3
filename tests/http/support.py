"""Helpers for the HTTP runtime tests: ports, cluster specs, request signing,
request bodies and in-process workers.

Valid requests are signed with mplang's own `Signer`; forged ones change one
thing (the secret, the signing time, a header, the body) so each check tests
exactly one refusal.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import uvicorn

import mplang as mp
from mplang import simp
from mplang.backends.simp_worker.http import WorkerServer, create_app
from mplang.backends.wire import encode_value_bytes, pack_message
from mplang.edsl.graph import Graph
from mplang.edsl.serde import encode_graph_bundle
from mplang.runtime import auth
from mplang.runtime.auth import Signer
from mplang.runtime.local_cluster import LocalCluster

SECRET = b"mplang-http-tests-" + b"5f3c9a1e7b2d4c68"
"""The cluster secret of every test cluster (at least 16 bytes)."""
WRONG_SECRET = b"not-the-cluster-secret-0123456789"


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


# ---------------------------------------------------------------- signed requests


def signed(secret: bytes, sender: str, path: str, body: bytes, *,
           timestamp: float | None = None) -> tuple[dict[str, str], bytes]:
    """Headers and wire content of a POST of ``body`` signed by ``sender`` with ``secret``
    (mplang's own `Signer`; ``timestamp`` forges the signing time)."""
    signer = Signer(secret, sender)
    if timestamp is None:
        headers = signer.headers("POST", path)
    else:
        real = auth.time
        auth.time = SimpleNamespace(time=lambda: timestamp,  # type: ignore[assignment]
                                    monotonic=real.monotonic)
        try:
            headers = signer.headers("POST", path)
        finally:
            auth.time = real
    content = b"".join(bytes(c) for c in signer.body(headers, [body]))
    headers["content-type"] = "application/octet-stream"
    return headers, content


def frame(header: dict[str, Any], *payload: bytes) -> bytes:
    """A request body: MPV1 frame with a JSON header and raw payload bytes."""
    return b"".join(bytes(p) for p in pack_message(header, list(payload)))


def run_body(graph: Graph, inputs: list[str | None] | None = None,
             exec_id: str | None = None) -> bytes:
    """A ``/run`` body for ``graph``."""
    return frame({"exec": exec_id or uuid.uuid4().hex, "scope": "", "inputs": inputs or [],
                  "progress": False}, encode_graph_bundle(graph, {}))


def local_graph(value: int = 5) -> Graph:
    """A program party 0 runs alone (no messages): a constant on party 0, plus one."""
    def prog() -> Any:
        return simp.pcall((0,), lambda v: v + 1, simp.constant((0,), value))

    return mp.compile(prog, world_size=3).graph


def tiny_graph(value: int = 5) -> Graph:
    """The smallest useful program: a constant on party 0 (a few hundred bytes)."""
    return mp.compile(lambda: simp.constant((0,), value), world_size=3).graph


ENDPOINTS = ("/run", "/fetch", "/delete", "/abort", "/msg")
"""Every endpoint that needs a signed request."""


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
        return frame({"src": 1, "exec": uuid.uuid4().hex, "key": "/0"}, encode_value_bytes(7))
    raise ValueError(path)


# ---------------------------------------------------------------- in-process workers


class ThreadWorker:
    """One node's worker served by uvicorn on a thread of the test process, so its
    state (mailbox, object store) can be inspected."""

    def __init__(self, spec: mp.ClusterSpec, node: str, secret: bytes, timeout: float = 30.0):
        self.server = WorkerServer(spec, node, secret, timeout=timeout)
        host, port = spec.nodes[spec.rank_of(node)].endpoint.split(":")
        config = uvicorn.Config(create_app(self.server), host=host, port=int(port),
                                log_level="warning", lifespan="on")
        self._uvicorn = uvicorn.Server(config)
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


# ---------------------------------------------------------------- the mplang command


def mplang_command() -> list[str]:
    """The installed ``mplang`` script next to this interpreter (``-m mplang.cli`` if absent)."""
    script = Path(sys.executable).with_name("mplang")
    return [str(script)] if script.exists() else [sys.executable, "-m", "mplang.cli"]


def worker_env(secret: bytes = SECRET) -> dict[str, str]:
    """This process's environment with the cluster secret set."""
    return {**os.environ, "MPLANG_CLUSTER_SECRET": secret.decode()}


@contextlib.contextmanager
def running_cluster(spec: mp.ClusterSpec, *, plugins: list[str] | None = None,
                    timeout: float = 60.0) -> Iterator[LocalCluster]:
    """Worker processes for ``spec`` (signed with `SECRET`), stopped on exit."""
    cluster = LocalCluster(spec, SECRET, plugins=plugins)
    try:
        cluster.start(timeout=timeout)
        yield cluster
    finally:
        cluster.close()


@contextlib.contextmanager
def connected_driver(cluster: LocalCluster) -> Iterator[mp.Driver]:
    """A driver for ``cluster`` with bounded waits (a hung worker fails a test instead
    of stalling the session), closed on exit."""
    driver = mp.Driver(cluster.cluster, secret=SECRET, timeout=30.0, run_timeout=120.0)
    try:
        yield driver
    finally:
        driver.close()
