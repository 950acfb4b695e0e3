"""`secure_mean_variance`: the pooled mean and variance of parties' values within 1e-6
relative of numpy for values up to 10^6 on the default rings and with more fraction bits
(where `jnp.mean` on the device is off by about ``n * 2**-19``), revealed to one party
only; and its trace-time errors."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.libs.aggregation import _scale, secure_mean_variance

RNG = np.random.default_rng(5)
INCOMES = [RNG.normal(44_893, 15_000, n).astype(np.float32) for n in (700, 500, 300)]
LARGE = [RNG.uniform(5e5, 1e6, (20, 10)).astype(np.float32) for _ in range(3)]


def spec(field: str, bits: int | None = None) -> mp.ClusterSpec:
    data = mp.ClusterSpec.simple(3).to_dict()
    config: dict[str, Any] = {"protocol": "ABY3", "field": field}
    if bits is not None:
        config["fxp_fraction_bits"] = bits
    data["devices"]["SP0"]["config"] = config
    return mp.ClusterSpec.from_dict(data)


def stats(cluster: mp.ClusterSpec, data: list[np.ndarray]) -> tuple[Any, Any, Any, Any]:
    def prog() -> Any:
        parts = [mp.put(f"P{i}", v) for i, v in enumerate(data)]
        habit = mp.device("SP0")(lambda *p: jnp.mean(jnp.concatenate(
            [q.reshape(-1) for q in p])))(*parts)
        return (*secure_mean_variance(parts, to="P1"), mp.put("P1", habit))

    sim = mp.Simulator(cluster)
    try:
        mean, variance, habit = mp.evaluate(sim, prog)
        held = sim.held(mean)
        return mp.fetch(sim, mean), mp.fetch(sim, variance), mp.fetch(sim, habit), held
    finally:
        sim.close()


@pytest.mark.parametrize(("field", "bits"), [("FM64", None), ("FM64", 24), ("FM128", None)])
@pytest.mark.parametrize("data", [INCOMES, LARGE], ids=["incomes", "up_to_1e6"])
def test_within_1e_6_of_numpy(field: str, bits: int | None, data: list[np.ndarray]) -> None:
    mean, variance, habit, held = stats(spec(field, bits), data)
    exact = np.concatenate([d.reshape(-1) for d in data]).astype(np.float64)
    assert abs(mean / exact.mean() - 1) < 1e-6
    assert abs(variance / exact.var() - 1) < 1e-6
    assert held[0] is None and held[2] is None and held[1] is not None
    if (field, bits, data is INCOMES) == ("FM64", None, True):  # what the library avoids
        assert abs(habit / exact.mean() - 1) > 1e-3


def test_the_scale_keeps_squares_inside_the_ring() -> None:
    assert _scale(None, 1e6, 1000) == 1.0           # floats are floats (a TEE)
    assert _scale((64, 18), 1e6, 1000) == 2.0**9    # deviations within 2**12
    assert _scale((64, 18), 100.0, 1000) == 1.0
    assert _scale((64, 24), 1e6, 1000) == 2.0**15
    assert _scale((128, 26), 1e6, 10**6) == 1.0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"values": []}, "secure_mean_variance: values must be a non-empty list of device values, "
                     "one per party, got list"),
    ({"to": None}, "secure_mean_variance: to must name a party's device such as 'P0', which "
                   "divides the sums the secure device reveals to it"),
    ({"bound": 0}, "secure_mean_variance: bound must be a positive number, got 0"),
    ({"to": "SP0"}, "secure_mean_variance: to='SP0' is a SPU device; a result is revealed to "
                    "one party's device such as 'P0' (or pass to=None to keep it secret on "
                    "the secure device)"),
])
def test_refusals(kwargs: dict[str, Any], message: str) -> None:
    def prog() -> Any:
        args = {"values": [mp.put("P0", np.ones(3, np.float32))], **kwargs}
        return secure_mean_variance(**args)

    with pytest.raises(mp.MPTypeError) as info:
        mp.compile(prog, cluster=mp.ClusterSpec.simple(3))
    assert str(info.value).split(" (at ")[0] == message
