"""The rules behind a worker's abuse limits, on their own: what a stream's HEAD must
satisfy (`authorize_head`), the in-flight budget, lazily backed buffers and the
connection caps (`ConnectionGate`). The same limits against real worker processes are
``test_worker_abuse.py``."""

from __future__ import annotations

import logging
import os
import resource

import pytest

from mplang.cluster.peers import PeerDirectory
from mplang.edsl.errors import MPRefusedError
from mplang.transport.admission import InflightBudget, authorize_head
from mplang.transport.connections import ConnectionGate, raise_descriptor_limit
from mplang.transport.limits import WorkerLimits
from mplang.transport.mux import body_buffer
from mplang.transport.mux_client import SPEC_HEADER
from tests.worker import memory_workload, support


@pytest.fixture(scope="module")
def peers(tmp_path_factory: pytest.TempPathFactory) -> tuple[PeerDirectory, support.DevCluster]:
    dev = support.dev_cluster(tmp_path_factory.mktemp("admission"),
                              support.make_spec(support.free_ports(3)))
    return PeerDirectory(dev.spec), dev


def _status(peers: tuple[PeerDirectory, support.DevCluster], who: str, path: str,
            size: int) -> int:
    directory, dev = peers
    try:
        authorize_head(directory, WorkerLimits(), "node_0", 0, dev.identity(who).fingerprint,
                       path, {SPEC_HEADER: directory.digest}, size)
    except MPRefusedError as e:
        return e.status
    return 200


@pytest.mark.parametrize("who, path, size, status", [
    ("driver", "/run", 1 << 30, 200),  # within the path's limit: the budget decides
    ("node_1", "/run", 1 << 30, 403),  # a node may not act as a driver
    ("driver", "/msg", 10, 403),  # a driver may not send peer messages
    ("node_1", "/upload", 10, 403),  # only the node's own key uploads
    ("node_0", "/upload", 10, 200),
    ("driver", "/fetch", 1 << 20, 413),  # a fetch is a small JSON header
    ("driver", "/nothing", 0, 404),
    ("mallory", "/health", 0, 403),  # not listed
    ("node_2", "/health", 0, 200),
])
def test_a_head_is_authorized_before_its_body(peers: tuple[PeerDirectory, support.DevCluster],
                                              who: str, path: str, size: int,
                                              status: int) -> None:
    assert _status(peers, who, path, size) == status


def test_the_budget_refuses_what_would_exceed_it() -> None:
    budget = InflightBudget(100)
    budget.take(60)
    with pytest.raises(MPRefusedError) as refused:
        budget.take(41)
    assert refused.value.status == 429
    budget.give(60)
    budget.take(100)  # given back: the whole budget again


def test_a_large_buffer_takes_memory_only_as_it_is_written() -> None:
    before = memory_workload.rss_kib(os.getpid())
    buffers = [body_buffer(256 << 20) for _ in range(4)]  # 1 GiB announced
    assert memory_workload.rss_kib(os.getpid()) - before < 16 << 10
    buffers[0][:4] = b"abcd"
    assert bytes(buffers[0][:5]) == b"abcd\0"


def test_connection_caps(caplog: pytest.LogCaptureFixture) -> None:
    gate = ConnectionGate(WorkerLimits(max_connections_per_address=2, max_connections_per_peer=1,
                                       max_connections=3))
    a1, a2 = gate.admit("10.0.0.1"), gate.admit("10.0.0.1")
    assert a1 is not None and a2 is not None
    with caplog.at_level(logging.WARNING, "mplang.worker"):
        assert gate.admit("10.0.0.1") is None  # per address
        assert gate.admit("10.0.0.1") is None  # logged once a second, not per attempt
    assert [r.getMessage() for r in caplog.records] == [
        "connection cap hit: connections per address at its limit of 2; closing new "
        "connections from 10.0.0.1"]
    b = gate.admit("10.0.0.2")
    assert b is not None
    assert gate.admit("10.0.0.3") is None  # over all sources
    assert a1.bind("fp") and not a2.bind("fp")  # per peer
    a1.release()
    a1.release()  # idempotent
    assert a2.bind("fp") and gate.admit("10.0.0.1") is not None


def test_the_descriptor_limit_is_raised_within_the_hard_limit() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(256, hard), hard))
        raised = raise_descriptor_limit()
        assert raised == resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        assert raised == min(1 << 20, hard if hard != resource.RLIM_INFINITY else 1 << 20)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
