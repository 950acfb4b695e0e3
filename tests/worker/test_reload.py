"""A changed spec file takes effect on reload, or is refused with what the driver must do.

Three workers run in this process over real mutual TLS on loopback
(`support.ThreadWorker`); each test edits the shared spec file, reloads every worker
(`WorkerServer.reload_if_changed`, what the worker's watcher calls every second) and
restores it. The dev policies name the drivers ``driver`` and ``driver2``.
"""

from __future__ import annotations

import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from mplang.cluster.identity import keygen
from tests.worker import support


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> support.DevCluster:
    return support.dev_cluster(tmp_path_factory.mktemp("reload"),
                               support.make_spec(support.free_ports(3)))


@pytest.fixture(scope="module")
def workers(dev: support.DevCluster) -> Iterator[list[support.ThreadWorker]]:
    with support.thread_workers(dev, 3) as started:
        yield started


@pytest.fixture
def edit(dev: support.DevCluster, workers: list[support.ThreadWorker]) -> Iterator[Any]:
    """Edits the spec file and reloads every worker (whether each reloaded); the
    original spec is back after the test."""
    original = dev.spec_path.read_text()

    def apply(change: Any) -> list[bool]:
        support.rewrite_spec(dev, change)
        return [w.server.reload_if_changed() for w in workers]

    yield apply
    dev.spec_path.write_text(original)
    for w in workers:
        w.server.reload_if_changed()
    with dev.client("driver", 0) as client:
        assert client.get("/health").status_code == 200


def add_party(dev: support.DevCluster, tmp: Path, name: str) -> Path:
    """A new key pair ``name`` in the cluster's key folder; its certificate's path."""
    keygen(name, tmp)
    for suffix in (".key", ".crt"):
        shutil.copy(tmp / f"{name}{suffix}", dev.keys / f"{name}{suffix}")
    return dev.keys / f"{name}.crt"


def test_a_removed_driver_can_no_longer_handshake_and_its_connections_close(
        dev: support.DevCluster, workers: Any, edit: Any) -> None:
    open_ = [support.tls_socket(dev, "driver2", r) for r in range(3)]
    assert all(support.health_over(s, dev).endswith(b"200 OK") for s in open_)
    assert not any(support.closed_by_peer(s, 0.2) for s in open_)
    assert all(edit(lambda d: d["drivers"].pop()))  # drop driver2
    assert all(support.closed_by_peer(s, 5.0) for s in open_)
    for rank in range(3):
        assert support.handshake_refused(dev, "driver2", rank)
        with dev.client("driver2", rank) as client, pytest.raises(httpx.TransportError):
            client.get("/health")
        with dev.client("driver", rank) as client:  # the others are unaffected
            assert client.get("/health").status_code == 200


def test_a_rotated_node_certificate_can_no_longer_handshake_and_its_links_close(
        dev: support.DevCluster, workers: Any, edit: Any, tmp_path: Path) -> None:
    """node_2's old certificate, on an ``mplang/1`` link as a peer uses it, is dropped
    by node_0 and node_1; its new one is trusted (node_2 itself needs a restart)."""
    links = [support.tls_socket(dev, "node_2", r, alpn="mplang/1") for r in (0, 1)]
    assert not any(support.closed_by_peer(s, 0.2) for s in links)
    keygen("node_2", tmp_path)
    edit(lambda d: d["nodes"][2].update(certificate=str(tmp_path / "node_2.crt")))
    assert all(support.closed_by_peer(s, 5.0) for s in links)
    rotated = support.DevCluster(dev.spec_path, tmp_path)
    for rank in (0, 1):
        assert support.handshake_refused(dev, "node_2", rank)  # the old key
        with rotated.client("node_2", rank) as client:
            assert client.get("/health").status_code == 200  # the new key
        # the worker's own links to the peers are made anew for the new spec
        assert workers[rank].server._clients.digest == rotated.spec.digest()


def test_a_new_driver_no_policy_names_is_refused_by_every_node(
        dev: support.DevCluster, workers: Any, edit: Any, tmp_path: Path) -> None:
    cert = add_party(dev, tmp_path, "driver3")
    assert all(edit(lambda d: d["drivers"].append({"name": "driver3",
                                                   "certificate": str(cert)})))
    policies = dev.spec_path.parent / "policies"
    for rank in range(3):
        with dev.client("driver3", rank) as client:
            response = client.post("/run", content=support.run_body(
                support.local_graph(), parties=[rank]))
        assert response.status_code == 403
        assert response.json()["error"] == (
            f"node_{rank} refuses the program: driver 'driver3' is not in drivers "
            f"[driver, driver2] of {policies / f'node_{rank}.yaml'}")
    refused = support.driver_refusal(dev.spec_path, dev.keys / "driver3.key")
    assert "driver 'driver3' is not in drivers [driver, driver2] of " in str(refused)


def test_a_device_change_is_refused_and_the_driver_told_to_restart_the_workers(
        dev: support.DevCluster, workers: Any, edit: Any) -> None:
    assert not any(edit(lambda d: d["devices"]["SP0"]["config"].update(field="FM128")))
    changed = ("device 'SP0' changes to kind SPU, members node_0, node_1, node_2, config "
               "{'protocol': 'ABY3', 'field': 'FM128'} (was kind SPU, members node_0, "
               "node_1, node_2, config {'protocol': 'ABY3', 'field': 'FM64'})")
    refused = support.driver_refusal(dev.spec_path, dev.keys / "driver.key")
    assert (refused.party, refused.status) == (0, 409)
    assert f"node_0 did not reload {dev.spec_path}: {changed}: nodes, endpoints and " \
           "devices change only when every worker restarts with the new spec" in str(refused)


def test_an_added_device_is_named(dev: support.DevCluster, workers: Any, edit: Any) -> None:
    assert not any(edit(lambda d: d["devices"].update(
        P9={"kind": "PPU", "members": ["node_1"]})))
    with dev.client("driver", 1) as client:
        response = client.post("/run", content=support.run_body(support.local_graph()))
        health = client.get("/health").json()
    assert response.status_code == 409
    assert "device 'P9' is added (kind PPU, members node_1): nodes, endpoints and " \
           "devices change only when every worker restarts" in response.json()["error"]
    assert health["spec"] != dev.spec.digest()  # the spec in force is still the old one
    assert health["refused_reload"] == (
        f"node_1 did not reload {dev.spec_path}: device 'P9' is added (kind PPU, members "
        "node_1): nodes, endpoints and devices change only when every worker restarts with "
        "the new spec")


def wait_for(condition: Any, timeout: float = 10.0) -> None:
    """Until ``condition()`` holds (a worker process's watcher reloads once a second)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "the workers did not reload the spec in time"
        time.sleep(0.1)


def test_worker_processes_reload_a_driver_added_then_removed(tmp_path: Path) -> None:
    """What an operator does, on worker processes: a driver added to the spec reaches
    every node and is refused by its policy; removed, it can no longer connect."""
    with support.running_cluster(support.make_spec(support.free_ports(3))) as cluster:
        dev = support.DevCluster(cluster.spec_path, cluster.keys_dir)
        cert = add_party(dev, tmp_path, "driver3")
        support.rewrite_spec(dev, lambda d: d["drivers"].append(
            {"name": "driver3", "certificate": str(cert)}))
        wait_for(lambda: not any(support.handshake_refused(dev, "driver3", r)
                                 for r in range(3)))
        refused = support.driver_refusal(dev.spec_path, dev.keys / "driver3.key")
        assert "refuses the program: driver 'driver3' is not in drivers [driver] of " \
            in str(refused)
        open_ = support.tls_socket(dev, "driver3", 0)
        assert support.health_over(open_, dev).endswith(b"200 OK")
        support.rewrite_spec(dev, lambda d: d["drivers"].pop())
        assert support.closed_by_peer(open_, 10.0)
        wait_for(lambda: all(support.handshake_refused(dev, "driver3", r) for r in range(3)))
