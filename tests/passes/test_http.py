"""Optimized programs on HTTP workers: batched shuffles cross the wire as one
``list`` message per route, and every shared program gives the results it gives
unoptimized, in both modes.

One 3-node `LocalCluster` (worker processes on free loopback ports, the devices
of ``ClusterSpec.simple(3)``) serves the whole module.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.cluster.local import LocalCluster
from tests.passes import programs


def _spec(n: int) -> mp.ClusterSpec:
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind(("127.0.0.1", 0))
            ports.append(s.getsockname()[1])
    base = mp.ClusterSpec.simple(n).to_dict()
    for node, port in zip(base["nodes"], ports, strict=True):
        node["endpoint"] = f"127.0.0.1:{port}"
    return mp.ClusterSpec.from_dict(base)


@pytest.fixture(scope="module")
def driver() -> Iterator[mp.Driver]:
    spec = _spec(programs.WORLD)
    with LocalCluster(spec) as cluster:
        drv = cluster.driver(timeout=30.0, run_timeout=120.0)
        try:
            yield drv
        finally:
            drv.close()


def batched() -> Any:
    """Three values of different kinds moved along the same routes in one round."""
    a = simp.constant((0,), np.arange(6, dtype=np.float32).reshape(2, 3))
    b = simp.constant((0,), np.int32(-7))
    c = simp.constant((0,), np.array([True, False]))
    return (simp.shuffle_static(a, {1: 0, 2: 0}), simp.shuffle_static(b, {1: 0, 2: 0}),
            simp.shuffle_static(c, {1: 0, 2: 0}))


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_batched_shuffle_over_http(driver: mp.Driver, mode: str) -> None:
    program = mp.compile(batched, world_size=programs.WORLD)
    optimized = mp.optimize(program)
    assert programs.op_counts(optimized.graph)["simp.shuffle_static"] == 1
    got = programs.run(driver, optimized, [], mode)
    assert got == programs.run(driver, program, [], mode)
    a, b, c = mp.fetch(driver, mp.evaluate(driver, optimized, mode=mode))
    assert a[0] is None and b[0] is None and c[0] is None
    np.testing.assert_array_equal(a[2], np.arange(6, dtype=np.float32).reshape(2, 3))
    assert int(b[1]) == -7 and c[1].tolist() == [True, False]


CASES = [c for c in programs.CASES if c.name in
         ("shuffles", "cond_and_while", "device_level", "pcall_chains", "dead_code",
          "duplicated", "millionaire")]

def _params() -> list[Any]:
    params = []
    for case in CASES:
        for mode in ("launch", "standard"):
            params.append(pytest.param(case, mode, id=f"{case.name}-{mode}"))
    return params


@pytest.mark.parametrize(("case", "mode"), _params())
def test_optimized_programs_over_http(driver: mp.Driver, case: Any, mode: str) -> None:
    program, inputs = case.build(driver)
    optimized = mp.optimize(program)
    assert programs.run(driver, optimized, inputs, mode) == \
        programs.run(driver, program, inputs, mode)


def test_repeated_operand_in_standard_mode_without_any_pass(driver: mp.Driver) -> None:
    """An op reading one value twice is dispatched correctly in standard mode over HTTP."""
    def square() -> Any:
        x = simp.constant((0,), np.float32(3.0))
        return x * x

    assert float(mp.fetch(driver, mp.evaluate(driver, square, mode="standard"))[0]) == 9.0

