"""The same programs give the same results in the simulator and on HTTP workers.

Every shared program (``programs.py``: each simp primitive and the device
level) runs in both contexts and both execution modes and is checked against
its numpy reference; the HTTP results are also compared with the simulator's
directly. Drivers built with `simp.make_driver` and from a YAML path work, and
a 16 MiB array crosses between workers and back to the driver bit-exact.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.cluster.local import LocalCluster
from mplang.edsl.pytree import tree_flatten
from mplang.transport.wire import encode_value
from tests.worker import programs

Case = Any


def run_case(ctx: Any, case: Case, mode: str) -> tuple[Any, list[list[int]]]:
    """The case's fetched result (plain form) and the pmask of each output."""
    out = mp.evaluate(ctx, case.program, mode=mode)
    leaves, _ = tree_flatten(out)
    assert leaves and all(isinstance(x, mp.MPObject) for x in leaves)
    masks = [sorted(x.pmask) if x.pmask is not None else None for x in leaves]
    return programs.plain(mp.fetch(ctx, out)), masks


def expected_masks(case: Case) -> list[list[int]] | None:
    if case.holders is None:
        return None
    if all(isinstance(h, int) for h in case.holders):
        return [list(case.holders)]
    return [list(h) for h in case.holders]


@pytest.mark.parametrize("case", programs.CASES, ids=programs.CASE_IDS)
def test_program_matches_numpy_reference(ctx: Any, mode: str, case: Case) -> None:
    result, masks = run_case(ctx, case, mode)
    programs.assert_same(result, case.expected, case.tol, case.name)
    want = expected_masks(case)
    if want is not None:
        assert masks == want


@pytest.mark.parametrize("case", programs.CASES, ids=programs.CASE_IDS)
def test_http_results_equal_simulator_results(sim_ctx: mp.Simulator, http_driver: mp.Driver,
                                              mode: str, case: Case) -> None:
    sim_result, sim_masks = run_case(sim_ctx, case, mode)
    http_result, http_masks = run_case(http_driver, case, mode)
    assert http_masks == sim_masks
    # plaintext work is bit-identical; SPU fixed-point floats depend on the protocol's
    # randomness (probabilistic truncation), so those get the SPU tolerance
    programs.assert_same(http_result, sim_result, 0.0 if case.tol < 1e-3 else case.tol,
                         case.name)


def test_compiled_program_with_runtime_inputs(ctx: Any, mode: str) -> None:
    """An object from an earlier evaluate is a runtime input of a compiled program."""
    first = mp.evaluate(ctx, lambda: simp.prank() * 5 + 1, mode=mode)

    def step(x: Any) -> Any:
        return simp.shuffle_static(x, programs.RING) + x

    program = mp.compile(step, first, cluster=ctx.cluster)
    out = mp.evaluate(ctx, program, first, mode=mode)
    again = mp.evaluate(ctx, program, out, mode=mode)
    base = [r * 5 + 1 for r in range(3)]
    once = [base[programs.RING[r]] + base[r] for r in range(3)]
    twice = [once[programs.RING[r]] + once[r] for r in range(3)]
    assert [int(v) for v in mp.fetch(ctx, out)] == once
    assert [int(v) for v in mp.fetch(ctx, again)] == twice


def test_saved_and_loaded_program_runs_over_http(http_driver: mp.Driver, tmp_path: Path) -> None:
    case = next(c for c in programs.CASES if c.name == "spu_int_arith")
    program = mp.compile(case.program, cluster=http_driver.cluster)
    program.save(tmp_path / "prog.mpl")
    loaded = mp.load(tmp_path / "prog.mpl")
    for mode in ("launch", "standard"):
        got = programs.plain(mp.fetch(http_driver, mp.evaluate(http_driver, loaded, mode=mode)))
        assert got == case.expected


# ---------------------------------------------------------------- other ways to get a driver


def test_make_driver_takes_a_spec_path_and_key(local_cluster: LocalCluster) -> None:
    """``simp.make_driver(spec, key=K)`` is ``mp.Driver(spec, key=K)``; the workers are
    reached over https only."""
    assert all(e.startswith("https://127.0.0.1:") for e in local_cluster.cluster.base_urls())
    drv = simp.make_driver(local_cluster.spec_path, key=local_cluster.driver_key)
    try:
        assert drv.world_size == 3
        for case_name in ("shuffle", "millionaire_poorer", "reveal_to_ppu"):
            case = next(c for c in programs.CASES if c.name == case_name)
            for mode in ("launch", "standard"):
                result, _ = run_case(drv, case, mode)
                programs.assert_same(result, case.expected, case.tol, case.name)
    finally:
        drv.close()


def test_make_driver_refuses_a_list_of_endpoints() -> None:
    with pytest.raises(mp.MPLangError, match="does not say which certificate"):
        simp.make_driver(["127.0.0.1:1", "127.0.0.1:2"])


def test_driver_from_yaml_path_finds_its_key_next_to_the_spec(local_cluster: LocalCluster
                                                              ) -> None:
    drv = mp.Driver(local_cluster.spec_path)  # keys/driver.key beside the spec
    try:
        out = mp.evaluate(drv, lambda: simp.shuffle(simp.prank() + 10, 2 - simp.prank()))
        assert [int(v) for v in mp.fetch(drv, out)] == [12, 11, 10]
    finally:
        drv.close()


def test_a_node_key_cannot_act_as_a_driver(local_cluster: LocalCluster) -> None:
    """Only a key the spec lists under ``drivers`` may drive."""
    with pytest.raises(mp.ClusterSpecError, match="not listed under 'drivers'"):
        mp.Driver(local_cluster.spec_path, key=local_cluster.keys_dir / "node_1.key")


# ---------------------------------------------------------------- large tensors


@pytest.mark.parametrize("route", ["shuffle_static", "shuffle"])
def test_16_mib_array_travels_bit_exact(http_driver: mp.Driver, route: str) -> None:
    """16 MiB of float32 (random bit patterns, NaN payloads included) goes party 0 ->
    party 1 -> party 2 and back to the driver unchanged."""
    rng = np.random.default_rng(7)
    big = rng.integers(0, 2**32, size=(1024, 4096), dtype=np.uint32).view(np.float32)
    assert big.nbytes == 16 << 20 and np.isnan(big).any()

    # the wire form is the raw buffer plus a short header, not a text encoding
    wire = encode_value(big)
    assert sum(len(memoryview(p)) for p in wire) < big.nbytes + 256

    def prog() -> Any:
        x = simp.constant((0,), big)
        if route == "shuffle_static":
            y = simp.shuffle_static(x, {1: 0})
            return simp.shuffle_static(y, {2: 1})
        y = simp.shuffle(x, simp.constant((1,), 0))
        return simp.shuffle(y, simp.constant((2,), 1))

    out = mp.evaluate(http_driver, prog)
    assert sorted(out.pmask) == [2]
    got = mp.fetch(http_driver, out)
    assert got[0] is None and got[1] is None
    arr = got[2]
    assert isinstance(arr, np.ndarray)
    assert arr.dtype == np.float32 and arr.shape == big.shape
    assert arr.tobytes() == big.tobytes()
