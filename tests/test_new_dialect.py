"""A new dialect and device kind from one module (`tests.toy_dialect`), editing no other
file: its op runs on the simulator and on worker processes that load it as a plugin,
and its flow rule decides what the policies `mplang init` writes let out."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import tensor
from mplang.cluster.local import LocalCluster
from mplang.edsl.primitive import get_primitive
from tests import toy_dialect

X = np.linspace(-3, 3, 20, dtype=np.float32)
SPEC = {"nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61950 + i}"} for i in (0, 1)],
        "devices": {"P0": {"kind": "PPU", "members": ["node_0"]},
                    "P1": {"kind": "PPU", "members": ["node_1"]},
                    "T1": {"kind": "TOY", "members": ["node_1"]}}}


def clipped() -> Any:
    """node_1's rows, clipped on its TOY device."""
    x = mp.device("P1")(lambda: tensor.load("x.npy"))()
    return mp.device("T1")(lambda v: toy_dialect.clip(v, bound=1.0))(mp.put("T1", x))


def clipped_sum() -> Any:
    return mp.device("P1")(jnp.sum)(mp.put("P1", clipped()))


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    for node in ("node_0", "node_1"):
        (root / node).mkdir()
    np.save(root / "node_1" / "x.npy", X)
    return root


def test_the_op_is_declared_once_with_every_rule() -> None:
    prim = get_primitive("toy.clip")
    assert prim is not None and prim.kernels.get("worker") is not None
    assert prim.rule("local_flow") is not None and prim.rule("cost") is not None


def test_it_runs_on_the_simulator_and_its_flow_rule_judges(roots: Path) -> None:
    spec = mp.ClusterSpec.from_dict(SPEC)
    with mp.Simulator(spec, data_roots={n: roots / n for n in ("node_0", "node_1")}) as sim:
        total = mp.fetch(sim, mp.evaluate(sim, clipped_sum))
        with pytest.raises(mp.MPRefusedError, match=r"row-wise \(raw\) values of x\.npy"):
            mp.evaluate(sim, lambda: mp.put("P0", clipped()))
    assert float(total) == pytest.approx(float(np.clip(X, -1, 1).sum()), abs=1e-5)


@pytest.fixture(scope="module")
def driver(roots: Path) -> Iterator[mp.Driver]:
    with LocalCluster(mp.ClusterSpec.from_dict(SPEC), plugins=["tests.toy_dialect"],
                      data_root=roots) as cluster, cluster.driver() as driver:
        yield driver


def test_it_runs_on_worker_processes_that_load_it(driver: mp.Driver) -> None:
    total = mp.fetch(driver, mp.evaluate(driver, clipped_sum))
    assert float(total) == pytest.approx(float(np.clip(X, -1, 1).sum()), abs=1e-5)
    with pytest.raises(mp.MPRefusedError, match=r"row-wise \(raw\) values of x\.npy"):
        mp.evaluate(driver, lambda: mp.put("P0", clipped()))
