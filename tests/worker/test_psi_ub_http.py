"""Unbalanced PSI across real worker processes under the development policies (plus
``writes: [ub-psi/*, out/*]``, the protocol ``ecdh_oprf_ub`` and every partner in the
``intersection`` rule: the server's set shows each client which of its keys match): the
server prepares its set once into its data root, two clients join their own files with it
several times over the workers' communicator links and write the results into their data
roots (the joined rows depend on the server's set: they do not go to the driver), checked
against numpy."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

import mplang as mp
from mplang import simp
from mplang.cluster.local import LocalCluster
from mplang.dialects import table
from mplang.libs import psi
from tests.worker import support

RNG = np.random.default_rng(8)
SERVER = pa.table({"id": pa.array(RNG.choice(50_000, 20_000, replace=False), pa.int64())})


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, Path]]:
    base = tmp_path_factory.mktemp("ub")
    spec = support.make_spec(support.free_ports(3))
    local = LocalCluster(spec, data_root=base)
    for node in ("node_0", "node_1", "node_2"):
        (base / node).mkdir()
        policy = local.spec_path.parent / "policies" / f"{node}.yaml"
        policy.write_text(policy.read_text().replace("writes: []", 'writes: ["ub-psi/*", "out/*"]')
                          .replace("psi_protocols: [", "psi_protocols: [ecdh_oprf_ub, ")
                          .replace("{to: [], when: intersection}",
                                   '{to: ["*"], when: intersection}'))
    try:
        local.start(timeout=120)
        yield local, base
    finally:
        local.close()


def test_prepare_once_and_join_across_workers(cluster: tuple[LocalCluster, Path]) -> None:
    local, base = cluster
    with support.connected_driver(local) as driver:
        def prepare() -> Any:
            return psi.ub_prepare(simp.pcall((0,), lambda: table.constant(SERVER)), "id",
                                  name="big")

        assert int(mp.fetch(driver, mp.evaluate(driver, prepare))[0]) == 20_000
        assert (base / "node_0" / "ub-psi" / "big" / "server.json").is_file()
        for n, client in enumerate((1, 2, 1)):
            ids = np.random.default_rng(n).choice(50_000, 500)
            mine = pa.table({"id": pa.array(ids, pa.int64()), "n": pa.array(np.arange(500))})
            pcsv.write_csv(mine, base / f"node_{client}" / "ids.csv")

            def query(client: int = client) -> None:
                t = simp.pcall((client,), lambda: table.read_csv(
                    "ids.csv", {"id": "int64", "n": "int64"}))
                joined = psi.ub_join(t, "id", server=0, name="big")
                simp.pcall((client,), lambda j: table.write_csv(j, "out/joined.csv"), joined)

            mp.evaluate(driver, query)
            got = pcsv.read_csv(base / f"node_{client}" / "out" / "joined.csv")
            rows = np.flatnonzero(np.isin(ids, SERVER.column("id").to_numpy()))
            want = mine.take(pa.array(rows[np.lexsort((rows, ids[rows]))]))
            assert got.equals(want) and got.num_rows > 100
            assert (base / f"node_{client}" / "ub-psi" / "big" / "client.json").is_file()
