"""A pcall body is traced once: MPLang bodies by MPLang, JAX functions by JAX."""

from __future__ import annotations

from typing import Any

import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import simp


def test_an_mplang_body_runs_once() -> None:
    calls: list[int] = []

    def body(v: Any) -> Any:
        calls.append(1)
        return v * 2 + 1

    def prog() -> Any:
        return simp.pcall((0,), body, simp.constant((0,), np.arange(3, dtype=np.int32)))

    program = mp.compile(prog, world_size=2)
    assert calls == [1]
    assert "tensor.run_jax" in str(program)


def test_a_jax_body_is_traced_by_jax_only_once_known() -> None:
    calls: list[str] = []

    def body(v: Any) -> Any:
        calls.append(type(v).__name__)
        return jnp.cumsum(v)

    def prog(n: int) -> Any:
        return simp.pcall((0,), body, simp.constant((0,), np.arange(n, dtype=np.int32)))

    mp.compile(prog, 3, world_size=2)
    assert calls[0] == "TraceObject"  # found to be a JAX function on the first call
    calls.clear()
    sim = mp.Simulator(2)
    out = mp.evaluate(sim, prog, 5)  # new input type: traced again, by JAX alone
    assert calls and all(name != "TraceObject" for name in calls)
    assert mp.fetch(sim, out)[0].tolist() == [0, 1, 3, 6, 10]
    sim.close()


def test_jax_library_functions_go_straight_to_jax() -> None:
    sim = mp.Simulator(2)
    out = mp.evaluate(sim, lambda: simp.pcall((1,), jnp.sum,
                                              simp.constant((1,), np.ones(4, np.float32))))
    assert mp.fetch(sim, out)[1] == 4.0
    sim.close()


def test_a_body_returning_concrete_arrays_gets_constants() -> None:
    sim = mp.Simulator(2)
    out = mp.evaluate(sim, lambda: simp.pcall((0,), lambda: jnp.arange(3)))
    assert mp.fetch(sim, out)[0].tolist() == [0, 1, 2]
    sim.close()
