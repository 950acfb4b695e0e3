"""``mplang status`` against real workers: every node up; one node down; a spec whose
certificate for a node is not the one its worker presents."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

import mplang as mp
from mplang.cli.main import main
from mplang.cluster.identity import keygen, load_certificate
from mplang.cluster.local import LocalCluster, write_dev_cluster
from mplang.cluster.status import package_version
from tests.worker.support import free_ports, running_cluster


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, LocalCluster]]:
    base = tmp_path_factory.mktemp("status")
    spec = mp.ClusterSpec.simple(3)
    spec = mp.ClusterSpec.from_dict({**spec.to_dict(), "nodes": [
        {"name": n.name, "endpoint": f"127.0.0.1:{p}"}
        for n, p in zip(spec.nodes, free_ports(3), strict=True)]})
    path = write_dev_cluster(spec, base / "dev")
    with running_cluster(path) as local:
        yield path, local


def status(path: Path, capsys: pytest.CaptureFixture[str], *extra: str) -> tuple[int, str]:
    code = main(["status", "--cluster", str(path), *extra])
    return code, capsys.readouterr().out


def fingerprint(path: Path) -> str:
    return load_certificate(str(path)).fingerprint[:16]


def test_every_node_up(cluster: tuple[Path, LocalCluster],
                       capsys: pytest.CaptureFixture[str]) -> None:
    path, _ = cluster
    spec = mp.ClusterSpec.from_yaml(path)
    code, out = status(path, capsys)
    lines = out.splitlines()
    assert code == 0
    assert lines[0].split() == ["NODE", "ENDPOINT", "STATE", "PINNED", "PRESENTED", "SPEC",
                                "VERSION", "DEVICES"]
    devices = {"node_0": "P0, SP0", "node_1": "P1, SP0", "node_2": "P2, SP0"}
    for line, node in zip(lines[1:4], spec.nodes, strict=True):
        assert line.split(None, 7) == [
            node.name, node.endpoint, "up", fingerprint(path.parent / "keys" /
                                                        f"{node.name}.crt"),
            "pinned", "same", package_version(), devices[node.name]]
    assert lines[4:] == ["3 of 3 nodes up, with the pinned certificates and this spec"]


def test_a_node_with_another_certificate(cluster: tuple[Path, LocalCluster], tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """A copy of the spec whose node_1 certificate is new: node_1 presents another one,
    and the others run with another spec than this copy."""
    path, _ = cluster
    shutil.copytree(path.parent, tmp_path / "dev")
    for old in (tmp_path / "dev" / "keys").glob("node_1.*"):
        old.unlink()
    keygen("node_1", tmp_path / "dev" / "keys")
    copy = tmp_path / "dev" / "cluster.yaml"
    running, ours = mp.ClusterSpec.from_yaml(path).digest(), mp.ClusterSpec.from_yaml(copy)
    code, out = status(copy, capsys)
    lines = out.splitlines()
    assert code == 1
    assert lines[2].split(None, 4)[:4] == [
        "node_1", ours.nodes[1].endpoint, "other", "certificate"]
    assert lines[2].split()[4:6] == [fingerprint(copy.parent / "keys" / "node_1.crt"),
                                     fingerprint(path.parent / "keys" / "node_1.crt")]
    assert [line.split()[2] for line in lines[1:4]] == ["other", "other", "other"]
    assert lines[4:] == [
        "0 of 3 nodes up",
        f"- node_0 runs with another spec (sha256 {running[:16]}..., this one is "
        f"{ours.digest()[:16]}...): give every party the same cluster spec (its workers "
        "reload an edited file)",
        "- node_1 runs with another certificate than the spec pins: give the spec the "
        "certificate its worker uses, or restart the worker with the key of the pinned one",
        f"- node_2 runs with another spec (sha256 {running[:16]}..., this one is "
        f"{ours.digest()[:16]}...): give every party the same cluster spec (its workers "
        "reload an edited file)"]


def test_a_driver_the_workers_do_not_know(cluster: tuple[Path, LocalCluster], tmp_path: Path,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    """A copy of the spec and keys with a new driver key: every worker closes the
    connection, and each row says so with the certificate the worker presents."""
    path, _ = cluster
    shutil.copytree(path.parent, tmp_path / "dev")
    for old in (tmp_path / "dev" / "keys").glob("driver.*"):
        old.unlink()
    keygen("driver", tmp_path / "dev" / "keys")
    mine = fingerprint(tmp_path / "dev" / "keys" / "driver.crt")
    code, out = status(tmp_path / "dev" / "cluster.yaml", capsys)
    lines = out.splitlines()
    assert code == 1
    assert [line.split()[2:6] for line in lines[1:4]] == [
        ["refuses", "us", fingerprint(path.parent / "keys" / f"node_{i}.crt"), "pinned"]
        for i in range(3)]
    assert lines[4:] == ["0 of 3 nodes up"] + [
        f"- node_{i} does not accept this party's certificate (sha256 {mine}...): the spec "
        "its worker runs with must list it" for i in range(3)]


def test_a_node_down_exits_non_zero(cluster: tuple[Path, LocalCluster],
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """Last in this module: it stops node_2's worker."""
    path, local = cluster
    local.kill("node_2")
    spec = mp.ClusterSpec.from_yaml(path)
    code, out = status(path, capsys)
    lines = out.splitlines()
    assert code == 1
    assert [line.split()[2] for line in lines[1:4]] == ["up", "up", "down"]
    assert lines[3].split() == ["node_2", spec.nodes[2].endpoint, "down",
                                fingerprint(path.parent / "keys" / "node_2.crt"), "-", "-",
                                "-", "-"]
    assert lines[4:] == [
        "2 of 3 nodes up",
        "- node_2 is down (ConnectionRefusedError: [Errno 111] Connection refused); is its "
        "worker running? Start the cluster's workers with `mplang up --cluster cluster.yaml`, "
        "or this node's with `mplang worker --cluster cluster.yaml --node node_2 --key "
        "keys/node_2.key`"]


def test_a_missing_key_is_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = write_dev_cluster(mp.ClusterSpec.from_endpoints(["127.0.0.1:1"]), tmp_path / "d")
    (tmp_path / "d" / "keys" / "driver.key").unlink()
    assert main(["status", "--cluster", str(spec)]) == 2
    assert capsys.readouterr().err == (
        f"mplang status: no key file at {tmp_path}/d/keys/driver.key (make one with: mplang "
        "keygen --name NAME --out DIR)\n")
