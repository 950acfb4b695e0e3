"""Private inputs over HTTP: a node's owner uploads to its own worker (``/upload``,
``mplang put``), a driver learns only types (``/describe``), and programs read the
data on its owner (``tensor.load``, ``simp.load``) over real mutual TLS."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.cluster.local import LocalCluster
from mplang.driver.upload_client import put
from mplang.transport.limits import WorkerLimits
from mplang.transport.wire import encode_value_bytes
from tests.test_private_inputs import assert_missing_name_refused
from tests.worker import support

X0 = np.arange(6, dtype=np.float32).reshape(2, 3)
X1 = np.full((2, 3), 10, dtype=np.float32)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> support.DevCluster:
    return support.dev_cluster(tmp_path_factory.mktemp("uploads"),
                               support.make_spec(support.free_ports(3)))


@pytest.fixture(scope="module")
def roots(dev: support.DevCluster) -> list[Path]:
    dirs = [dev.spec_path.parent / "data" / f"node_{r}" for r in range(3)]
    for d in dirs:
        d.mkdir(parents=True)
    np.save(dirs[0] / "x.npy", X0)
    np.save(dirs[1] / "x.npy", X1)
    np.savez(dirs[1] / "t.npz", w=np.array([1.5, 2.5]))
    (dev.spec_path.parent / "secret.npy").write_bytes((dirs[0] / "x.npy").read_bytes())
    (dirs[0] / "link.npy").symlink_to(dev.spec_path.parent / "secret.npy")
    return dirs


@pytest.fixture(scope="module")
def workers(dev: support.DevCluster, roots: list[Path]
            ) -> Iterator[list[support.ThreadWorker]]:
    """node_0..node_2 in this process, each with its data root and a policy letting its
    plaintext go to the driver (these tests fetch what was loaded); node_1 accepts only
    the driver ``driver``; node_2 takes uploads of at most 1 KiB."""
    policies = dev.spec_path.parent / "policies"
    policies.mkdir(exist_ok=True)  # write_dev_cluster wrote development policies
    for r in range(3):
        only = "drivers: [driver]\n" if r == 1 else ""
        (policies / f"node_{r}.yaml").write_text(f"plaintext_to: [driver]\n{only}")
    small = WorkerLimits(max_value_bytes=1024)
    started = [support.ThreadWorker(dev, f"node_{r}", timeout=10.0,
                                    limits=small if r == 2 else None) for r in range(3)]
    for w, root in zip(started, roots, strict=True):
        w.server.worker.data_root = root
        w.start()
    yield started
    for w in started:
        w.stop()


@pytest.fixture(scope="module")
def driver(dev: support.DevCluster, workers: Any) -> Iterator[mp.Driver]:
    drv = mp.Driver(dev.spec_path, key=dev.keys / "driver.key", timeout=10.0, run_timeout=60.0)
    yield drv
    drv.close()


def upload(dev: support.DevCluster, who: str, rank: int, name: Any, value: Any) -> httpx.Response:
    with dev.client(who, rank) as client:
        return client.post("/upload", content=support.frame({"name": name},
                                                            encode_value_bytes(value)))


def describe(dev: support.DevCluster, who: str, rank: int, **fields: Any) -> httpx.Response:
    with dev.client(who, rank) as client:
        return client.post("/describe", content=support.frame(fields))


def test_tensor_load_over_http_with_types_from_describe(driver: mp.Driver) -> None:
    def prog() -> Any:
        x = simp.pcall((0, 1), lambda: tensor.load("x.npy"))
        w = simp.pcall((1,), lambda: tensor.load("t.npz", "w"))
        return simp.pcall(None, lambda a: a + 1, x), w

    y, w = mp.fetch(driver, mp.evaluate(driver, prog))
    np.testing.assert_array_equal(y[0], X0 + 1)
    np.testing.assert_array_equal(y[1], X1 + 1)
    np.testing.assert_array_equal(w[1], [1.5, 2.5])


def test_a_path_out_of_the_data_root_is_refused(driver: mp.Driver) -> None:
    for path in ("../../secret.npy", "link.npy"):
        with pytest.raises(mp.MPRuntimeError) as info:
            mp.evaluate(driver, lambda p=path: simp.pcall((0,), lambda: tensor.load(p)))
        assert str(info.value).startswith(
            f"tensor.load: path {path!r} escapes the data root of node_0")

    def declared() -> Any:
        return simp.pcall((0,), lambda: tensor.load("link.npy", dtype="float32", shape=(2, 3)))

    with pytest.raises(mp.MPRuntimeError) as info:
        mp.evaluate(driver, declared)
    assert "tensor.load: path 'link.npy' escapes the data root of node_0" in str(info.value)


def test_upload_by_the_node_s_own_key_then_simp_load(dev: support.DevCluster, driver: mp.Driver,
                                                   workers: list[support.ThreadWorker]) -> None:
    vec = np.array([3, 1, 2], dtype=np.int32)
    answer = put(dev.spec_path, "node_2", "myvec", vec)
    assert answer == {"name": "myvec", "node": "node_2", "dtype": "int32", "shape": [3]}
    out = mp.fetch(driver, mp.evaluate(
        driver, lambda: simp.pcall(None, lambda v: v * 10, simp.load(2, "myvec"))))
    assert out[:2] == [None, None]
    np.testing.assert_array_equal(out[2], vec * 10)
    assert workers[2].server.worker.named.uses("myvec") == 1


def test_upload_by_anyone_else_is_refused(dev: support.DevCluster,
                                          workers: list[support.ThreadWorker]) -> None:
    value = np.zeros(2)
    for who in ("node_1", "node_0"):
        response = upload(dev, who, 2, "v", value)
        assert response.status_code == 403
        assert f"{who}" in response.json()["error"]
        assert "only the node's own key may" in response.json()["error"]
    for who in ("driver", "driver2"):
        response = upload(dev, who, 2, "v", value)
        assert response.status_code == 403, response.text
        assert "only a node may" in response.json()["error"]
    with pytest.raises(httpx.HTTPError):
        upload(dev, support.STRANGER, 2, "v", value)
    assert "v" not in workers[2].server.worker.named


def test_malformed_and_oversized_uploads(dev: support.DevCluster,
                                         workers: list[support.ThreadWorker]) -> None:
    for bad_value in (7, b"raw bytes", [np.zeros(2), np.zeros(2)]):
        response = upload(dev, "node_2", 2, "v", bad_value)
        assert response.status_code == 400
        assert response.json()["error"].startswith("upload: 'v' must be a tensor")
    for bad_name in ("../x", "", 5, "x" * 129):
        response = upload(dev, "node_2", 2, bad_name, np.zeros(2))
        assert response.status_code == 400
        assert "is not 1 to 128 letters, digits or '_.-'" in response.json()["error"]
    response = upload(dev, "node_2", 2, "big", np.zeros(1000))
    assert response.status_code == 413
    with dev.client("node_2", 2) as client:
        garbage = client.post("/upload", content=b"MPV1\xff\xff\xff\xff")
    assert garbage.status_code == 400
    assert workers[2].server.worker.named.names() in ([], ["myvec"])


def test_describe_answers_drivers_with_types_only(dev: support.DevCluster, workers: Any) -> None:
    ok = describe(dev, "driver", 1, what="file", path="t.npz", key="w")
    assert ok.status_code == 200 and ok.json() == {"dtype": "float64", "shape": [2]}
    missing = describe(dev, "driver", 0, what="file", path="nope.npy")
    assert missing.status_code == 404
    assert missing.json()["error"] == (
        "tensor.load: node_0 has no file 'nope.npy' in its data root; put it there (by "
        "default ./data/node_0; mp.Simulator(..., data_roots=...), `mplang run --sim N "
        "--data-root DIR` or `mplang worker --data-root DIR` choose another) or fix the path")
    escape = describe(dev, "driver", 0, what="file", path="../x.npy")
    assert escape.status_code == 400
    assert escape.json()["error"] == "tensor.load: path '../x.npy' escapes the data root of " \
                                     "node_0"
    no_object = describe(dev, "driver", 2, what="object", name="nothing")
    assert no_object.status_code == 404
    assert no_object.json()["error"] == "simp.load: node_2 has no uploaded object 'nothing'"
    assert describe(dev, "driver", 0, what="secrets").status_code == 400
    assert describe(dev, "driver", 0, what="file", path=["x"]).status_code == 400
    assert describe(dev, "node_1", 0, what="file", path="x.npy").status_code == 403
    assert describe(dev, "driver2", 0, what="file", path="x.npy").status_code == 200
    refused = describe(dev, "driver2", 1, what="file", path="x.npy")
    assert refused.status_code == 403
    assert refused.json() == {
        "error": f"node_1's policy does not accept driver 'driver2' (drivers: [driver] in "
                 f"{dev.spec_path.parent / 'policies' / 'node_1.yaml'})",
        "kind": "PolicyRefusedError"}


def test_simp_load_of_a_missing_name(driver: mp.Driver) -> None:
    assert_missing_name_refused(driver, 1, "absent")


def test_mplang_put_cli_end_to_end(dev: support.DevCluster, workers: list[support.ThreadWorker],
                                   tmp_path: Path) -> None:
    path = tmp_path / "weights.npy"
    np.save(path, np.arange(4, dtype=np.int64).reshape(2, 2))
    done = subprocess.run([*support.mplang_command(), "put", "--cluster", str(dev.spec_path),
                           "--node", "node_1", "weights", str(path)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "uploaded 'weights' (int64, shape 2x2) to node_1"
    np.testing.assert_array_equal(workers[1].server.worker.named.get("weights"),
                                  [[0, 1], [2, 3]])
    refused = subprocess.run([*support.mplang_command(), "put", "--cluster", str(dev.spec_path),
                              "--node", "node_0", "--key", str(dev.keys / "node_1.key"),
                              "weights", str(path)],
                             capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.startswith("mplang put: node_0 refused the upload: 403")
    assert "weights" not in workers[0].server.worker.named


def test_worker_processes_read_their_data_root_dir_slash_node(tmp_path: Path) -> None:
    """``mplang worker --data-root`` as ``LocalCluster(data_root=D)`` (and ``mplang up
    --data-root D``) passes it: each node reads ``D/<node>``."""
    for r in range(3):
        (tmp_path / f"node_{r}").mkdir()
        np.save(tmp_path / f"node_{r}" / "v.npy", np.full(3, r + 1, dtype=np.int32))
    local = LocalCluster(support.make_spec(support.free_ports(3)), data_root=tmp_path)
    try:
        policies = local.spec_path.parent / "policies"
        policies.mkdir(exist_ok=True)  # write_dev_cluster wrote development policies
        for r in range(3):
            (policies / f"node_{r}.yaml").write_text("plaintext_to: [driver]\n")
        local.start(timeout=60.0)
        with support.connected_driver(local) as drv:
            out = mp.fetch(drv, mp.evaluate(
                drv, lambda: simp.pcall((0, 1), lambda: tensor.load("v.npy"))))
    finally:
        local.close()
    np.testing.assert_array_equal(out[0], [1, 1, 1])
    np.testing.assert_array_equal(out[1], [2, 2, 2])
