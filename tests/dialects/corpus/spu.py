"""The spu corpus: spu.seal, spu.shares, spu.run and spu.reveal (`tests.dialects.corpus`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang.dialects.spu import SpuConfig, reconstruct
from tests.dialects.corpus import CLUSTER


def spu_corpus() -> Any:
    """spu.seal, spu.shares (a driver constant), spu.run and spu.reveal, through the
    device API."""
    x = mp.device("P0")(lambda: jnp.arange(4, dtype=jnp.int32))()
    y = mp.device("P1")(lambda: jnp.full((4,), 10, dtype=jnp.int32))()
    one = mp.put("SP0", np.ones(4, dtype=np.int32))
    z = mp.device("SP0")(lambda a, b, c: a * b + a * c)(x, y, one)
    return mp.put("P2", z)


SPU_EXPECTED = [0, 11, 22, 33]


def check(result: Any) -> None:
    assert np.asarray(result).tolist() == SPU_EXPECTED


def spu_value(sim: mp.Simulator) -> tuple[list[Any], Callable[[list[Any]], None]]:
    """Real SPU shares: each member's share of a value computed on SP0."""
    def prog() -> Any:
        x = mp.device("P0")(lambda: jnp.arange(6, dtype=jnp.int32).reshape(2, 3))()
        return mp.device("SP0")(lambda a: a * 3 - 1)(x)

    z = mp.evaluate(sim, prog)
    shares = sim.held(z)
    config = SpuConfig.of(CLUSTER, CLUSTER.device("SP0"))
    plaintext = z.base_type.plaintext_type
    expected = np.arange(6, dtype=np.int32).reshape(2, 3) * 3 - 1

    def check(decoded: list[Any]) -> None:
        value = reconstruct(config, [s.to_libspu() for s in decoded], plaintext)
        np.testing.assert_array_equal(value, expected)

    return shares, check


VALUES = {"share": spu_value}
"""Codec kind -> a run giving values of that kind, and a check of decoded values."""
