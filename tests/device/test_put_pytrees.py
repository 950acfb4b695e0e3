"""``mp.put`` of pytrees: every leaf moves; an error names the leaf's path."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.edsl.pytree import leaf_paths, tree_flatten
from tests.simulators import simulated


@dataclass
class Model:
    w: Any
    b: Any


sim = simulated(3)


def test_put_of_a_tuple_of_spu_results_reveals_each_leaf(sim: mp.Simulator) -> None:
    """The case the tutorials hit: a device function returning a tuple, revealed at once."""
    def prog() -> Any:
        x = mp.device("P0")(lambda: jnp.arange(3.0))()
        y = mp.device("P1")(lambda: jnp.ones(3))()
        w, b = mp.device("SP0")(lambda a, c: (a * c + 1, jnp.sum(a)))(x, y)
        return mp.put("P0", (w, b))

    w, b = mp.fetch(sim, mp.evaluate(sim, prog))
    np.testing.assert_allclose(w, np.arange(3.0) + 1, atol=1e-3)
    assert float(b) == pytest.approx(3.0, abs=1e-3)


def test_put_of_nested_dicts_lists_and_dataclasses(sim: mp.Simulator) -> None:
    def prog() -> Any:
        a = mp.device("P1")(lambda: jnp.int32(7))()
        tree = {"w": [a, np.int32(2)], "m": Model(w=a, b=np.float32(0.5)), "none": None}
        return mp.put("P2", tree)

    out = mp.evaluate(sim, prog)
    assert out["none"] is None and isinstance(out["m"], Model)
    assert {x.device for x in [*out["w"], out["m"].w, out["m"].b]} == {"P2"}
    got = mp.fetch(sim, out)
    assert got["w"] == [7, 2] and got["m"].w == 7 and got["m"].b == pytest.approx(0.5)


def test_a_bad_leaf_is_named_by_its_path(sim: mp.Simulator) -> None:
    def prog() -> Any:
        return mp.put("P0", (np.int32(1), {"w": "text"}))

    with pytest.raises(mp.MPTypeError, match=r"put\('P0'\): leaf \[1\]\['w'\]: values of "
                       r"dtype <U4 are not supported; use numbers"):
        mp.evaluate(sim, prog)


def test_leaf_paths() -> None:
    _, tree = tree_flatten({"b": (1, [2, Model(3, 4)]), "a": 5})
    assert leaf_paths(tree) == ["['a']", "['b'][0]", "['b'][1][0]", "['b'][1][1].w",
                                "['b'][1][1].b"]
    assert leaf_paths(tree_flatten(1)[1]) == [""]
