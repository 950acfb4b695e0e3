"""Fixtures of the HTTP runtime tests.

``local_cluster`` starts one 3-node `LocalCluster` (worker processes on free
loopback ports; PPUs P0..P2, ABY3 SPU SP0) for the whole session;
``http_driver`` is an `mp.Driver` for it and ``sim_ctx`` a simulator of the same
spec. ``ctx`` is each of the two (``"sim"`` / ``"http"``). Tests that kill a
worker restart it before they return, so the cluster stays whole.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import mplang as mp
from mplang.cluster.local import LocalCluster
from tests.worker import support


@pytest.fixture(scope="session")
def cluster_spec() -> mp.ClusterSpec:
    return support.make_spec(support.free_ports(3))


@pytest.fixture(scope="session")
def local_cluster(cluster_spec: mp.ClusterSpec) -> Iterator[LocalCluster]:
    """The shared worker processes; all of them are stopped at the end of the session."""
    with support.running_cluster(cluster_spec) as cluster:
        yield cluster


@pytest.fixture(scope="session")
def http_driver(local_cluster: LocalCluster) -> Iterator[mp.Driver]:
    with support.connected_driver(local_cluster) as driver:
        yield driver


@pytest.fixture(scope="session")
def sim_ctx(cluster_spec: mp.ClusterSpec) -> Iterator[mp.Simulator]:
    simulator = mp.Simulator(cluster_spec)
    try:
        yield simulator
    finally:
        simulator.close()


@pytest.fixture(params=["sim", "http"])
def ctx(request: pytest.FixtureRequest) -> mp.Simulator | mp.Driver:
    """The in-memory simulator and the HTTP driver, over the same cluster spec."""
    return request.getfixturevalue("sim_ctx" if request.param == "sim" else "http_driver")


@pytest.fixture
def urls(local_cluster: LocalCluster) -> list[str]:
    """Base URLs of the shared workers, in rank order."""
    return local_cluster.cluster.base_urls()
