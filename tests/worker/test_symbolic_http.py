"""Sizes known only at run time on worker processes: a PSI join's rows into tensors and
the SPU in one program, each member compiling the SPU function for the run's sizes."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import table
from mplang.libs import psi

IDS_A, IDS_B = np.arange(0, 400, 2), np.arange(0, 600, 3)
SHARED = np.intersect1d(IDS_A, IDS_B)


@mp.function
def joined_statistics() -> Any:
    a = mp.device("P0")(lambda: table.constant({"id": IDS_A, "x": IDS_A * 0.5}))()
    b = mp.device("P1")(lambda: table.constant({"id": IDS_B, "y": IDS_B * 1.0}))()
    ja, jb = psi.join(a, b, "id")
    xa = mp.device("P0")(lambda t: table.to_tensor(t, ["x"]))(ja)
    xb = mp.device("P1")(lambda t: table.to_tensor(t, ["y"]))(jb)
    local = mp.device("P0")(lambda x: jnp.sum(x * x))(xa)
    mean, dot = mp.device("SP0")(lambda x, y: (jnp.mean(x), jnp.sum(x * y)))(xa, xb)
    return local, mp.put("P0", mean), mp.put("P0", dot)


def test_a_join_flows_into_the_spu_in_one_program(ctx: mp.Simulator | mp.Driver) -> None:
    for _ in range(2):  # the second run reuses each member's compiled executable
        local, mean, dot = mp.fetch(ctx, mp.evaluate(ctx, joined_statistics))
        assert float(local) == float(((SHARED * 0.5) ** 2).sum())
        assert float(mean) == pytest.approx(float((SHARED * 0.5).mean()), rel=1e-3)
        assert float(dot) == pytest.approx(float((SHARED * 0.5 * SHARED).sum()), rel=1e-3)
