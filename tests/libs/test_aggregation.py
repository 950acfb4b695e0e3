"""`secure_sum` and `secure_mean` against numpy: results, who receives them, eager
use, a two-party device, and the trace-time errors."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang.libs.aggregation import secure_mean, secure_sum

RNG = np.random.default_rng(7)
FLOATS = [RNG.normal(size=(2, 3)).astype(np.float32) * 10 for _ in range(3)]
INTS = [RNG.integers(-1000, 1000, size=5).astype(np.int32) for _ in range(3)]


def on_parties(values: list[Any]) -> list[Any]:
    """Party i's value on device Pi."""
    return [mp.put(f"P{i}", v) for i, v in enumerate(values)]


def test_sum_and_mean_of_three_parties_match_numpy(sim: mp.Simulator) -> None:
    def prog(a: Any, b: Any, c: Any) -> Any:
        values = on_parties([a, b, c])
        return secure_sum(values), secure_mean(values, to="P2")

    total, mean = mp.evaluate(sim, prog, *FLOATS)
    assert mp.get_dev_attr(total) == "P0" and mp.get_dev_attr(mean) == "P2"
    np.testing.assert_allclose(mp.fetch(sim, total), np.sum(FLOATS, axis=0), atol=1e-3)
    np.testing.assert_allclose(mp.fetch(sim, mean), np.mean(FLOATS, axis=0), atol=1e-3)
    held = sim.held(mean)  # revealed to P2's party only
    assert held[0] is None and held[1] is None and held[2] is not None


def test_integer_sum_is_exact_and_mean_is_float(sim: mp.Simulator) -> None:
    def prog(a: Any, b: Any, c: Any) -> Any:
        values = on_parties([a, b, c])
        return secure_sum(values, to="P1"), secure_mean(values, to="P1")

    total, mean = mp.fetch(sim, mp.evaluate(sim, prog, *INTS))
    assert total.dtype == np.int32
    np.testing.assert_array_equal(total, np.sum(INTS, axis=0))
    assert mean.dtype == np.float32
    np.testing.assert_allclose(mean, np.mean(INTS, axis=0), atol=1e-2)


def test_result_kept_secret_composes(sim: mp.Simulator) -> None:
    """to=None keeps the sum on the secure device; a later step reveals a function of it."""
    def prog(a: Any, b: Any, c: Any) -> Any:
        total = secure_sum(on_parties([a, b, c]), to=None)
        assert mp.get_dev_attr(total) == "SP0"
        return mp.put("P1", mp.device("SP0")(lambda t: t.max())(total))

    out = mp.fetch(sim, mp.evaluate(sim, prog, *FLOATS))
    np.testing.assert_allclose(out, np.sum(FLOATS, axis=0).max(), atol=1e-3)


def test_runs_eagerly_and_in_standard_mode(sim: mp.Simulator) -> None:
    with sim:
        total = secure_sum(on_parties(FLOATS[:2]))
    np.testing.assert_allclose(mp.fetch(sim, total), FLOATS[0] + FLOATS[1], atol=1e-3)
    out = mp.evaluate(sim, lambda a, b: secure_mean(on_parties([a, b])), *INTS[:2],
                      mode="standard")
    np.testing.assert_allclose(mp.fetch(sim, out), (INTS[0] + INTS[1]) / 2, atol=1e-2)


def test_two_party_device(sim2: mp.Simulator) -> None:
    out = mp.evaluate(sim2, lambda a, b: secure_sum(on_parties([a, b]), to="P1"), *INTS[:2])
    np.testing.assert_array_equal(mp.fetch(sim2, out), INTS[0] + INTS[1])


def test_values_already_secret_are_accepted(sim: mp.Simulator) -> None:
    def prog(a: Any, b: Any) -> Any:
        secret = mp.device("SP0")(lambda x: x * 2)(mp.put("P0", a))
        return secure_sum([secret, mp.put("P1", b)])

    out = mp.fetch(sim, mp.evaluate(sim, prog, *INTS[:2]))
    np.testing.assert_array_equal(out, INTS[0] * 2 + INTS[1])


@pytest.mark.parametrize("build, match", [
    (lambda a: secure_sum([]), r"secure_sum: values must be a non-empty list of device "
                               r"values, one per party, got list"),
    (lambda a: secure_sum(mp.put("P0", a)), r"secure_sum: values must be a non-empty list"),
    (lambda a: secure_sum([mp.put("P0", a), mp.put("P1", a[:1])]),
     r"secure_sum: every party's value must have the same shape, got values\[0\] \(2, 3\) "
     r"on P0, values\[1\] \(1, 3\) on P1"),
    (lambda a: secure_mean([mp.put("P0", a), a]),
     r"secure_mean: values\[1\] must be a value on a device .*got ndarray"),
    (lambda a: secure_sum([mp.put("P0", a)], device="P1"),
     r"secure_sum: device 'P1' is a PPU of one party, which would see every input in "
     r"plaintext; name a secure device such as 'SP0'"),
    (lambda a: secure_sum([mp.put("P0", a)], device="SP9"),
     r"secure_sum: device: unknown device 'SP9'; this cluster has: P0, P1, P2, SP0"),
    (lambda a: secure_sum([mp.put("P0", a)], to="SP0"),
     r"secure_sum: to='SP0' is a SPU device; a result is revealed to one party's device "
     r"such as 'P0' \(or pass to=None"),
])
def test_errors_name_the_op_and_the_fix(sim: mp.Simulator, build: Any, match: str) -> None:
    with pytest.raises(mp.MPTypeError, match=match):
        mp.compile(build, FLOATS[0], cluster=sim.cluster)


def tee_and_phe_cluster() -> mp.ClusterSpec:
    nodes = [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{7400 + i}"} for i in range(3)]
    return mp.ClusterSpec.from_dict({"nodes": nodes, "devices": {
        "P0": {"kind": "PPU", "members": ["node_0"]},
        "P1": {"kind": "PPU", "members": ["node_1"]},
        "T0": {"kind": "TEE", "members": ["node_2"], "config": {"attestation": "mock"}},
        "HE0": {"kind": "PHE", "members": ["node_0", "node_2"]}}})


def test_runs_on_a_tee_and_refuses_a_phe_device() -> None:
    """A TEE runs the same functions (in plaintext, in its enclave); a PHE device cannot."""
    sim = mp.Simulator(tee_and_phe_cluster())
    try:
        with warnings.catch_warnings():  # the mock TEE warns about itself
            warnings.simplefilter("ignore", mp.InsecureDeviceWarning)
            out = mp.evaluate(sim, lambda a, b: secure_mean(on_parties([a, b]), device="T0",
                                                            to="P1"), *FLOATS[:2])
        np.testing.assert_allclose(mp.fetch(sim, out), (FLOATS[0] + FLOATS[1]) / 2, rtol=1e-6)
        with pytest.raises(mp.MPTypeError, match=r"secure_sum: device 'HE0' is a PHE device, "
                                                 r"which evaluates only its own ops; name a "
                                                 r"secret-sharing device such as 'SP0'"):
            mp.compile(lambda a: secure_sum([mp.put("P0", a)], device="HE0"), FLOATS[0],
                       cluster=sim.cluster)
    finally:
        sim.close()
