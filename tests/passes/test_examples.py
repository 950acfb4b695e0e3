"""The device-level examples, optimized, give the results they give unoptimized
(PSI on 2 parties exactly; SPU fixed-point statistics within the noise of the
protocol's probabilistic truncation, which differs between any two runs)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

import mplang as mp

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def _example(name: str, folder: Path = EXAMPLES) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"_mplang_pass_example_{name}",
                                                  folder / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_psi(mode: str, tmp_path: Path) -> None:
    psi = _example("psi_all_pairs", BENCHMARKS)  # the all-pairs program, a big SPU graph
    ids0, ids1 = psi.make_ids(0)
    psi.save_ids(tmp_path / "node_0", ids0)
    psi.save_ids(tmp_path / "node_1", ids1)
    # SEMI2K (node_0 makes the Beaver triples), not the 2-party default CHEETAH: the
    # subject is the passes, and CHEETAH's setup costs seconds per run here
    spec = mp.ClusterSpec.simple(2).to_dict()
    spec["devices"]["SP0"]["config"] = {"protocol": "SEMI2K"}
    sim = mp.Simulator(mp.ClusterSpec.from_dict(spec),  # the passes: no policy judges
                       data_roots={n: tmp_path / n for n in ("node_0", "node_1")},
                       policies="open")
    try:
        with sim:
            program = mp.compile(psi.psi, cluster=sim.cluster)
        optimized = mp.optimize(program)
        optimized.graph.verify()
        want = mp.fetch(sim, mp.evaluate(sim, program, mode=mode))
        got = mp.fetch(sim, mp.evaluate(sim, optimized, mode=mode))
        assert sorted(got) == sorted(want)
        for key in want:
            np.testing.assert_array_equal(np.asarray(got[key]), np.asarray(want[key]))
    finally:
        sim.close()


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_secure_mean_variance(mode: str, tmp_path: Path) -> None:
    smv = _example("secure_mean_variance")
    roots = {f"node_{i}": tmp_path / f"node_{i}" for i in range(3)}
    for root, values in zip(roots.values(), smv.make_data(0), strict=True):
        smv.save_values(root, values)
    sim = mp.Simulator(smv.make_cluster(), data_roots=roots)
    try:
        with sim:
            program = mp.compile(smv.joint_stats, cluster=sim.cluster)
        optimized = mp.optimize(program)
        optimized.graph.verify()
        want = [float(mp.fetch(sim, o)) for o in mp.evaluate(sim, program, mode=mode)]
        got = [float(mp.fetch(sim, o)) for o in mp.evaluate(sim, optimized, mode=mode)]
        np.testing.assert_allclose(got, want, rtol=1e-4)
    finally:
        sim.close()
