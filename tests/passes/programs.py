"""Programs the pass tests share, and the helpers to compare their runs.

Each `Case` compiles one program for a 3-party world (`WORLD`) whose devices are
those of ``mp.ClusterSpec.simple(3)`` (PPUs P0..P2, ABY3 SPU SP0). ``expect``
maps a pass name (or ``"optimize"``) to op counts (`op_counts`, regions
included) the transformed graph must have, so each test shows the structural
change it is about; results of the original and transformed programs are
compared with `plain`, which keeps dtypes and tells ``-0.0`` from ``0.0``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import simp, tensor
from mplang.edsl.graph import Graph
from mplang.edsl.typing import TensorType

WORLD = 3
F32 = TensorType("float32", ())


@dataclass(frozen=True)
class Case:
    name: str
    build: Callable[[mp.Simulator], tuple[mp.Program, list[Any]]]
    """Compile the program; return it with the runtime inputs it takes."""
    expect: dict[str, dict[str, int]] = field(default_factory=dict)


def op_counts(graph: Graph) -> Counter[str]:
    """How often each opcode occurs in ``graph``, its regions included."""
    return Counter(op.opcode for op in graph.walk())


def plain(value: Any) -> Any:
    """Fetched values as comparable plain data (dtype kept, floats by ``repr``)."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return ("float", repr(value))
    if isinstance(value, list | tuple):
        return type(value)(plain(v) for v in value)
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, np.ndarray | np.generic | jax.Array):
        arr = np.asarray(value)
        items = [repr(x) for x in arr.reshape(-1).tolist()] if arr.dtype.kind in "fc" \
            else arr.reshape(-1).tolist()
        return (arr.dtype.name, arr.shape, items)
    raise TypeError(f"unexpected fetched value {value!r}")


def run(sim: mp.Simulator, program: mp.Program, inputs: list[Any], mode: str) -> Any:
    """``program``'s fetched outputs in plain form."""
    return plain(mp.fetch(sim, mp.evaluate(sim, program, *inputs, mode=mode)))


def _compiled(fn: Callable[..., Any]) -> Callable[[mp.Simulator], tuple[mp.Program, list[Any]]]:
    def build(sim: mp.Simulator) -> tuple[mp.Program, list[Any]]:
        return mp.compile(fn, world_size=WORLD), []

    build.__name__ = getattr(fn, "__name__", "build")
    return build


# ---------------------------------------------------------------- bodies shared by the programs


def double(v: Any) -> Any:
    return v * 2


def add(a: Any, b: Any) -> Any:
    return a + b


def square_plus_one(v: Any) -> Any:
    return v * v + 1


# ---------------------------------------------------------------- programs


def pcall_chains() -> Any:
    """A chain of four pcalls on party 0 and one of two on party 1."""
    x = simp.constant((0,), np.float32(1.5))
    y = simp.pcall((0,), double, x)
    z = simp.pcall((0,), add, y, x)
    w = simp.pcall((0,), lambda a, b: (a * b, a - b), z, y)
    v = simp.pcall((0,), lambda t: jnp.sin(t[0]) + t[1], w)
    p = simp.constant((1,), np.arange(4, dtype=np.int32))
    q = simp.pcall((1,), lambda t: jnp.cumsum(t), p)
    r = simp.pcall((1,), lambda t, s: t * s, q, p)
    return simp.shuffle_static(v, {1: 0, 2: 0}), w, r


def duplicated() -> Any:
    """The same computations written twice: constants, pcalls, operators, shuffles."""
    x = simp.constant((0, 1), np.float32(2.0))
    x2 = simp.constant((0, 1), np.float32(2.0))
    a = simp.pcall((0, 1), square_plus_one, x)
    b = simp.pcall((0, 1), square_plus_one, x2)
    c = a * 3 + b * 3
    d = simp.shuffle_static(c, {2: 0})
    e = simp.shuffle_static(c, {2: 0})
    f = simp.pcall((2,), add, d, e)
    return f, a, b, x2


def dead_code() -> Any:
    """Unused ops at the top level and inside a pcall body, and used ones around them."""
    x = simp.constant((0,), np.float32(3.0))
    unused = simp.pcall((0,), lambda v: jnp.exp(v), x)
    simp.shuffle_static(unused, {1: 0})
    simp.constant((1, 2), np.int32(7))

    def body(v: Any) -> Any:
        tensor.run_jax(jnp.log, v)                   # a local op whose result is unused
        return v + 1.0

    y = simp.pcall((0,), body, x)
    z = simp.pcall((0,), lambda v: (v - 1.0, v + 1.0), y)
    return simp.shuffle_static(z[0], {2: 0})


def shuffles() -> Any:
    """Independent shuffles with the same routes in one round, with ops between them
    that read earlier ones; a second round on the way back; other routes; a chain."""
    a = simp.constant((0,), np.float32(1.25))
    b = simp.constant((0,), np.arange(3, dtype=np.int32))
    c = simp.pcall((0,), double, a)
    sa = simp.shuffle_static(a, {1: 0, 2: 0})
    use_sa = simp.pcall((1,), double, sa)            # reads sa before sb, sc exist
    sb = simp.shuffle_static(b, {1: 0, 2: 0})
    sc = simp.shuffle_static(c, {1: 0, 2: 0})
    other = simp.shuffle_static(b, {2: 0})           # other routes: stays alone
    back1 = simp.shuffle_static(use_sa, {0: 1})      # round 1
    fresh = simp.constant((1,), np.float32(-0.5))
    back0 = simp.shuffle_static(fresh, {0: 1})       # round 0: not batched with round 1
    back2 = simp.shuffle_static(simp.pcall((1,), lambda t: t * t, sb), {0: 1})  # round 1
    chained = simp.shuffle_static(simp.shuffle_static(a, {1: 0}), {2: 1})
    return sa, sb, sc, other, back1, back0, back2, chained


def cond_and_while() -> Any:
    """Duplicates, dead code, pcall chains and batchable shuffles inside the regions
    of uniform_cond, while_loop and func.call."""
    everyone = (0, 1, 2)
    x = simp.constant(everyone, np.int32(3))
    pred = simp.pcall(None, lambda v: v > 2, x)

    def then_fn(v: Any) -> Any:
        a = simp.pcall((0,), double, v)
        b = simp.pcall((0,), double, v)              # duplicate of a
        simp.pcall((1,), square_plus_one, v)         # dead
        c = simp.pcall((0,), add, a, b)
        return simp.shuffle_static(c, {1: 0})

    def else_fn(v: Any) -> Any:
        return simp.shuffle_static(simp.pcall((0,), square_plus_one, v), {1: 0})

    branch = simp.uniform_cond(pred, then_fn, else_fn, x)

    i0 = simp.constant(everyone, np.int32(0))
    acc0 = simp.constant((0,), np.float32(1.0))
    side0 = simp.constant((1,), np.float32(0.0))

    def cond(state: Any) -> Any:
        return simp.pcall(None, lambda i: i < 3, state[0])

    def body(state: Any) -> Any:
        i, acc, side = state
        acc1 = simp.pcall((0,), lambda t: t * 1.5, acc)
        acc2 = simp.pcall((0,), lambda t, n: t + n.astype(jnp.float32), acc1, i)
        simp.pcall((0,), jnp.exp, acc2)              # dead
        s1 = simp.shuffle_static(acc2, {1: 0})
        s2 = simp.shuffle_static(simp.pcall((0,), lambda n: n * 10, i), {1: 0})
        side1 = simp.pcall((1,), lambda a, n, s: a + n.astype(jnp.float32) + s, s1, s2, side)
        return simp.pcall(None, lambda n: n + 1, i), acc2, side1

    loop = simp.while_loop(cond, body, (i0, acc0, side0))

    @mp.func.func
    def helper(v: Any) -> Any:
        first = simp.pcall((2,), double, v)
        return simp.pcall((2,), square_plus_one, first)

    h1 = helper(x)
    h2 = helper(x)                                   # the same call again
    return branch, loop, h1, h2


def device_level() -> Any:
    """PPU moves with the same route, duplicated and dead SPU work, a reveal."""
    a = mp.put("P0", np.int32(10))
    b = mp.put("P0", np.int32(20))
    c = mp.put("P1", np.int32(15))
    a1, b1 = mp.put("P1", a), mp.put("P1", b)        # two P0 -> P1 moves in one round
    total = mp.device("P1")(lambda x, y, z: x + y + z)(a1, b1, c)
    lt = mp.device("SP0")(lambda x, y: x < y)(a, c)
    lt_again = mp.device("SP0")(lambda x, y: x < y)(a, c)  # a second seal, run, reveal
    mp.device("SP0")(lambda x: x * 2)(b)             # dead SPU work
    prod = mp.device("SP0")(lambda x, y: x * y)(b, c)
    return total, mp.put("P0", lt), mp.put("P0", lt_again), mp.put("P1", prod)


def _millionaire(sim: mp.Simulator) -> tuple[mp.Program, list[Any]]:
    @mp.function
    def millionaire(alice: Any, bob: Any) -> Any:
        richer = mp.device("SP0")(lambda x, y: x < y)(alice, bob)
        again = mp.device("SP0")(lambda x, y: x < y)(alice, bob)
        return mp.put("P0", richer), mp.put("P1", again)

    with sim:
        x = mp.put("P0", np.int32(1_000_000))
        y = mp.put("P1", np.int32(2_000_000))
    return mp.compile(millionaire, x, y, world_size=WORLD), [x, y]


def numeric_edges() -> Any:
    """Constants that look alike but are not (CSE must keep them apart)."""
    pos = simp.constant((0,), np.float32(0.0))
    neg = simp.constant((0,), np.float32(-0.0))
    i32 = simp.constant((0,), np.int32(1))
    flag = simp.constant((0,), np.bool_(True))
    nan1 = simp.constant((0,), np.float32(np.nan))
    nan2 = simp.constant((0,), np.float32(np.nan))
    inv = simp.pcall((0,), lambda p, n: (1.0 / p, 1.0 / n), pos, neg)
    to1 = simp.shuffle_static(i32, {1: 0})
    to2 = simp.shuffle_static(i32, {2: 0})
    return inv, to1, to2, flag, nan1, nan2


CALLS: list[str] = []
"""What the host function `record` saw, in call order (one entry per party call)."""


def record(v: np.ndarray) -> np.ndarray:
    CALLS.append(f"record({float(v)})")
    return np.asarray(v, dtype=np.float32)


def effects() -> Any:
    """Host callbacks (side effects): unused and repeated calls must all stay."""
    x = simp.constant((0, 1), np.float32(4.0))
    simp.pcall((0, 1), lambda v: tensor.pyfunc(record, v, out=F32), x)
    first = simp.pcall((0,), lambda v: tensor.pyfunc(record, v, out=F32), x)
    second = simp.pcall((0,), lambda v: tensor.pyfunc(record, v, out=F32), x)
    return simp.pcall((0,), add, first, second)


CASES = [
    Case("pcall_chains", _compiled(pcall_chains), {
        "fuse_pcalls": {"simp.pcall": 2},
        "optimize": {"simp.pcall": 2}}),
    Case("duplicated", _compiled(duplicated), {
        "eliminate_common_subexpressions": {"simp.constant": 1, "simp.pcall": 4,
                                            "tensor.run_jax": 5, "simp.shuffle_static": 1},
        "optimize": {"simp.constant": 1, "simp.pcall": 4, "simp.shuffle_static": 1}}),
    Case("dead_code", _compiled(dead_code), {
        "eliminate_dead_code": {"simp.constant": 1, "simp.pcall": 2, "simp.shuffle_static": 1,
                                "tensor.run_jax": 3},
        "optimize": {"simp.constant": 1, "simp.pcall": 1, "simp.shuffle_static": 1,
                     "tensor.run_jax": 3}}),
    Case("shuffles", _compiled(shuffles), {
        "batch_shuffles": {"simp.shuffle_static": 6},
        "optimize": {"simp.shuffle_static": 6}}),
    Case("cond_and_while", _compiled(cond_and_while), {
        "eliminate_common_subexpressions": {"simp.pcall": 14, "func.call": 1},
        "eliminate_dead_code": {"simp.pcall": 15},
        "fuse_pcalls": {"simp.pcall": 12},
        "batch_shuffles": {"simp.shuffle_static": 3},
        "optimize": {"simp.pcall": 8, "simp.shuffle_static": 3, "func.call": 1}}),
    Case("device_level", _compiled(device_level), {
        "eliminate_common_subexpressions": {"spu.seal": 3, "spu.run": 3, "spu.reveal": 2},
        "eliminate_dead_code": {"spu.run": 3},
        "batch_shuffles": {"simp.shuffle_static": 1},
        "optimize": {"spu.seal": 3, "spu.run": 2, "spu.reveal": 2, "simp.shuffle_static": 1}}),
    Case("millionaire", _millionaire, {
        "eliminate_common_subexpressions": {"spu.seal": 2, "spu.run": 1, "spu.reveal": 2},
        "optimize": {"spu.seal": 2, "spu.run": 1, "spu.reveal": 2}}),
    Case("numeric_edges", _compiled(numeric_edges), {
        "eliminate_common_subexpressions": {"simp.constant": 5, "simp.shuffle_static": 2}}),
    Case("effects", _compiled(effects), {
        "eliminate_dead_code": {"tensor.pyfunc": 3, "simp.pcall": 4},
        "eliminate_common_subexpressions": {"tensor.pyfunc": 3, "simp.pcall": 4},
        "fuse_pcalls": {"tensor.pyfunc": 3, "simp.pcall": 2},
        "optimize": {"tensor.pyfunc": 3, "simp.pcall": 2}}),
]
