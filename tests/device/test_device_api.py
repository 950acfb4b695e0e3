"""The device API: `mp.device(name)(fn)`, `mp.put`, device inference,
`mp.get_dev_attr`, automatic moves, both execution modes, eager mode, saved
programs and the SPU compile cache. Results are checked against numpy."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.dialects import spu as spu_dialect
from mplang.dialects.spu import SecretShareType
from mplang.kernels.spu.run import SpuShare
from mplang.policy import PolicyRefusedError

A = np.array([[1.5, -2.25, 3.0], [0.5, 4.0, -1.0]], dtype=np.float32)
B = np.array([[0.75, 1.0, -3.5], [2.0, -0.5, -1.0]], dtype=np.float32)
IA = np.array([7, -3, 12, 0, 5], dtype=np.int32)
IB = np.array([2, -3, 15, -8, 5], dtype=np.int32)


def assert_close(actual: Any, expected: Any, tol: float = 2e-3) -> None:
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape
    if expected.dtype == np.bool_ or np.issubdtype(expected.dtype, np.integer):
        assert actual.dtype == expected.dtype
        np.testing.assert_array_equal(actual, expected)
    else:
        np.testing.assert_allclose(actual, expected, rtol=tol, atol=tol)


# ---------------------------------------------------------------- PPU


def test_ppu_runs_local_jax_on_its_party(sim: mp.Simulator, mode: str) -> None:
    def prog(a: Any) -> Any:
        x = mp.put("P1", a)
        return mp.device("P1")(lambda v: jnp.tanh(v) @ v.T + 1)(x)

    out = mp.evaluate(sim, prog, A, mode=mode)
    assert mp.get_dev_attr(out) == "P1"
    expected = np.tanh(A) @ A.T + 1
    assert_close(mp.fetch(sim, out), expected, 1e-5)
    per_party = sim.held(out)
    assert per_party[0] is None and per_party[2] is None
    assert_close(per_party[1], expected, 1e-5)


def test_ppu_function_without_arguments(sim: mp.Simulator) -> None:
    out = mp.evaluate(sim, lambda: mp.device("P2")(lambda: jnp.arange(5, dtype=jnp.int32) * 3)())
    assert mp.get_dev_attr(out) == "P2"
    np.testing.assert_array_equal(mp.fetch(sim, out), np.arange(5) * 3)
    assert sim.held(out)[:2] == [None, None]


# ---------------------------------------------------------------- SPU arithmetic vs numpy

FLOAT_OPS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "sub": (lambda a, b: a - b, lambda a, b: a - b),
    "mul": (lambda a, b: a * b, lambda a, b: a * b),
    "affine": (lambda a, b: -a * 2.5 + b / 4 + 1, lambda a, b: -a * 2.5 + b / 4 + 1),
    "matmul": (lambda a, b: a @ b.T, lambda a, b: a @ b.T),
    "matmul_t": (lambda a, b: jnp.matmul(a.T, b), lambda a, b: a.T @ b),
    "sum": (lambda a, b: jnp.sum(a * b), lambda a, b: np.sum(a * b)),
    "sum_axis0": (lambda a, b: jnp.sum(a, axis=0), lambda a, b: np.sum(a, axis=0)),
    "mean_axis1": (lambda a, b: jnp.mean(b, axis=1), lambda a, b: np.mean(b, axis=1)),
    "max": (lambda a, b: jnp.max(a), lambda a, b: np.max(a)),
    "min_axis1": (lambda a, b: jnp.min(b, axis=1), lambda a, b: np.min(b, axis=1)),
    "maximum": (lambda a, b: jnp.maximum(a, b), lambda a, b: np.maximum(a, b)),
    "less": (lambda a, b: a < b, lambda a, b: a < b),
    "greater_equal": (lambda a, b: a >= b, lambda a, b: a >= b),
    "where": (lambda a, b: jnp.where(a > b, a, b * 2), lambda a, b: np.where(a > b, a, b * 2)),
    "relu": (lambda a, b: jnp.where(a > 0, a, 0.0), lambda a, b: np.where(a > 0, a, 0.0)),
}


@pytest.mark.parametrize("op", list(FLOAT_OPS))
def test_spu_float_ops_match_numpy(sim: mp.Simulator, op: str) -> None:
    spu_fn, ref = FLOAT_OPS[op]

    def prog(a: Any, b: Any) -> Any:
        x = mp.put("P0", a)
        y = mp.put("P1", b)
        z = mp.device("SP0")(spu_fn)(x, y)
        assert mp.get_dev_attr(z) == "SP0"
        return mp.put("P0", z)

    out = mp.evaluate(sim, prog, A, B)
    expected = np.asarray(ref(A, B))
    if expected.dtype == np.float64:
        expected = expected.astype(np.float32)
    assert_close(mp.fetch(sim, out), expected)


INT_OPS: dict[str, tuple[Callable[..., Any], Callable[..., Any]]] = {
    "add": (lambda a, b: a + b, lambda a, b: a + b),
    "mul": (lambda a, b: a * b - 3, lambda a, b: a * b - 3),
    "equal": (lambda a, b: a == b, lambda a, b: a == b),
    "less": (lambda a, b: a < b, lambda a, b: a < b),
    "sum": (lambda a, b: jnp.sum(a * b), lambda a, b: np.sum(a * b, dtype=np.int32)),
    "where": (lambda a, b: jnp.where(a < b, b, a), lambda a, b: np.where(a < b, b, a)),
    "dot": (lambda a, b: jnp.dot(a, b), lambda a, b: np.dot(a, b).astype(np.int32)),
}


@pytest.mark.parametrize("op", list(INT_OPS))
def test_spu_int_ops_are_exact(sim: mp.Simulator, op: str) -> None:
    spu_fn, ref = INT_OPS[op]

    def prog(a: Any, b: Any) -> Any:
        return mp.put("P1", mp.device("SP0")(spu_fn)(mp.put("P2", a), mp.put("P0", b)))

    out = mp.evaluate(sim, prog, IA, IB)
    assert_close(mp.fetch(sim, out), np.asarray(ref(IA, IB)))


def test_spu_pytrees_in_and_out(sim: mp.Simulator, mode: str) -> None:
    def kernel(inputs: dict[str, Any], scale: Any) -> Any:
        a, (b, c) = inputs["a"], inputs["pair"]
        return {"sum": a + b * scale, "stats": (jnp.sum(c), a < b), "same": c}

    def prog() -> Any:
        a = mp.put("P0", A)
        b = mp.put("P1", B)
        c = mp.put("P2", IA)
        res = mp.device("SP0")(kernel)({"a": a, "pair": (b, c)}, 3.0)
        assert [mp.get_dev_attr(x) for x in res["stats"]] == ["SP0", "SP0"]
        return {"sum": mp.put("P0", res["sum"]),
                "stats": tuple(mp.put("P1", v) for v in res["stats"]),
                "same": mp.put("P2", res["same"])}

    out = mp.evaluate(sim, prog, mode=mode)
    assert mp.get_dev_attr(out["sum"]) == "P0"
    assert mp.get_dev_attr(out["same"]) == "P2"
    assert [mp.get_dev_attr(x) for x in out["stats"]] == ["P1", "P1"]
    values = mp.fetch(sim, out)
    assert set(values) == {"sum", "stats", "same"}
    assert isinstance(values["stats"], tuple) and len(values["stats"]) == 2
    assert_close(values["sum"], A + B * 3.0)
    assert_close(values["stats"][0], np.int32(IA.sum()))
    assert_close(values["stats"][1], A < B)
    assert_close(values["same"], IA)


def test_ppu_pytrees_in_and_out(sim: mp.Simulator) -> None:
    def prog() -> Any:
        x = mp.put("P1", A)
        y = mp.put("P1", IA)
        return mp.device("P1")(lambda d: [d["x"].T, {"n": -d["y"], "k": jnp.sum(d["y"])}])(
            {"x": x, "y": y})

    out = mp.evaluate(sim, prog)
    assert isinstance(out, list) and len(out) == 2
    assert mp.get_dev_attr(out[1]["n"]) == "P1"
    values = mp.fetch(sim, out)
    assert_close(values[0], A.T, 0)
    assert_close(values[1]["n"], -IA)
    assert int(values[1]["k"]) == int(IA.sum())


def test_keyword_arguments(sim: mp.Simulator) -> None:
    def prog() -> Any:
        x = mp.put("P0", IA)
        y = mp.put("P1", IB)
        on_ppu = mp.device("P0")(lambda u, scale=1, v=None: u * scale + v)(x, scale=3, v=y)
        on_spu = mp.device("SP0")(lambda u, v=None, k=0: (u - v) * k)(x, v=y, k=5)
        return on_ppu, mp.put("P1", on_spu)

    on_ppu, on_spu = mp.fetch(sim, mp.evaluate(sim, prog))
    np.testing.assert_array_equal(on_ppu, IA * 3 + IB)
    np.testing.assert_array_equal(on_spu, (IA - IB) * 5)


def test_spu_constant_arguments_are_compiled_in(sim: mp.Simulator) -> None:
    def prog(k: float) -> Any:
        x = mp.put("P0", A)
        return mp.put("P0", mp.device("SP0")(lambda v, c: v * c)(x, k))

    assert_close(mp.fetch(sim, mp.evaluate(sim, prog, 0.5)), A * 0.5)
    assert_close(mp.fetch(sim, mp.evaluate(sim, prog, -4.0)), A * -4.0)


# ---------------------------------------------------------------- moves


def test_ppu_to_spu_seals_and_spu_to_ppu_reveals_to_that_party_only(sim: mp.Simulator,
                                                                     mode: str) -> None:
    def prog(a: Any, b: Any) -> Any:
        x = mp.put("P0", a)
        y = mp.put("P2", b)
        z = mp.device("SP0")(lambda u, v: u * v + u)(x, y)
        return mp.put("P1", z)

    text = str(mp.compile(prog, A, B, cluster=sim.cluster))
    assert text.count("spu.seal") == 2
    assert text.count("spu.run") == 1
    assert text.count("spu.reveal") == 1 and "to=1" in text
    out = mp.evaluate(sim, prog, A, B, mode=mode)
    assert mp.get_dev_attr(out) == "P1"
    per_party = sim.held(out)
    assert per_party[0] is None and per_party[2] is None
    assert_close(per_party[1], A * B + A)
    assert_close(mp.fetch(sim, out), A * B + A)


def test_ppu_function_reveals_an_spu_argument(sim: mp.Simulator) -> None:
    def prog() -> Any:
        s = mp.put("SP0", IA)
        return mp.device("P2")(lambda v: v * 10)(s)

    out = mp.evaluate(sim, prog)
    assert mp.get_dev_attr(out) == "P2"
    per_party = sim.held(out)
    assert per_party[:2] == [None, None]
    np.testing.assert_array_equal(per_party[2], IA * 10)


def test_ppu_to_ppu_moves_over_the_party_link(sim: mp.Simulator, mode: str) -> None:
    def prog() -> Any:
        x = mp.device("P0")(lambda: jnp.arange(4, dtype=jnp.float32) + 0.5)()
        return mp.device("P2")(lambda v: v * 2)(x), mp.put("P1", x)

    text = str(mp.compile(prog, cluster=sim.cluster))
    assert "simp.shuffle_static" in text
    assert "spu." not in text  # a PPU-to-PPU move involves no secret sharing
    on_p2, on_p1 = mp.evaluate(sim, prog, mode=mode)
    assert (mp.get_dev_attr(on_p2), mp.get_dev_attr(on_p1)) == ("P2", "P1")
    expected = np.arange(4, dtype=np.float32) + 0.5
    p2 = sim.held(on_p2)
    assert p2[0] is None and p2[1] is None
    np.testing.assert_array_equal(p2[2], expected * 2)
    p1 = sim.held(on_p1)
    assert p1[0] is None and p1[2] is None
    np.testing.assert_array_equal(p1[1], expected)


def test_spu_argument_that_is_a_plain_party_value_is_sealed(sim: mp.Simulator) -> None:
    def prog() -> Any:
        x = simp.constant((1,), IA)  # simp-level, held by party 1 only
        z = mp.device("SP0")(lambda v: v + 1)(x)
        assert mp.get_dev_attr(z) == "SP0"
        return mp.put("P2", z)

    text = str(mp.compile(prog, cluster=sim.cluster))
    assert "spu.seal" in text
    out = mp.evaluate(sim, prog)
    np.testing.assert_array_equal(mp.fetch(sim, out), IA + 1)


def test_ppu_accepts_a_plain_value_of_its_own_party(sim: mp.Simulator) -> None:
    def prog() -> Any:
        return mp.device("P1")(lambda v: v * 2)(simp.constant((1,), IA))

    out = mp.evaluate(sim, prog)
    assert mp.get_dev_attr(out) == "P1"
    np.testing.assert_array_equal(mp.fetch(sim, out), IA * 2)


# ---------------------------------------------------------------- put


def test_put_constants(sim: mp.Simulator, mode: str) -> None:
    def prog() -> Any:
        return mp.put("P1", A), mp.put("SP0", IA), mp.put("SP0", 2.5), mp.put("P0", 7)

    def revealed() -> Any:
        return mp.put("P2", mp.put("SP0", IA)), mp.put("P2", mp.put("SP0", 2.5))

    on_p1, on_spu, scalar_spu, scalar_p0 = mp.evaluate(sim, prog, mode=mode)
    assert [mp.get_dev_attr(x) for x in (on_p1, on_spu, scalar_spu, scalar_p0)] == \
        ["P1", "SP0", "SP0", "P0"]
    assert sim.held(on_p1)[0] is None and sim.held(on_p1)[2] is None
    np.testing.assert_array_equal(mp.fetch(sim, on_p1), A)
    assert isinstance(on_spu.mptype.base, SecretShareType)
    with pytest.raises(PolicyRefusedError, match=r"party \d: object mem://\S+ is a secret "
                       "share, which leaves this party only inside its protocol"):
        sim.fetch_object(on_spu)  # no party hands a share to the driver
    assert all(isinstance(s, SpuShare) for s in sim.held(on_spu))
    array, scalar = mp.fetch(sim, mp.evaluate(sim, revealed, mode=mode))
    np.testing.assert_array_equal(array, IA)
    assert float(scalar) == pytest.approx(2.5, abs=1e-4)
    assert int(mp.fetch(sim, scalar_p0)) == 7


def test_put_moves_objects(sim: mp.Simulator) -> None:
    def prog() -> Any:
        x = mp.put("P0", IA)
        s = mp.put("SP0", x)          # seal
        back = mp.put("P2", s)        # reveal to P2
        hop = mp.put("P1", back)      # PPU -> PPU
        same = mp.put("P1", hop)      # already there: no-op
        return s, back, hop, same

    s, back, hop, same = mp.evaluate(sim, prog)
    assert [mp.get_dev_attr(x) for x in (s, back, hop, same)] == ["SP0", "P2", "P1", "P1"]
    for obj in (back, hop, same):
        np.testing.assert_array_equal(mp.fetch(sim, obj), IA)
    assert sim.held(back)[:2] == [None, None]


def test_put_on_the_same_device_adds_no_op(sim: mp.Simulator) -> None:
    def once() -> Any:
        return mp.put("P0", IA)

    def twice() -> Any:
        return mp.put("P0", mp.put("P0", IA))

    cluster = sim.cluster
    assert str(mp.compile(twice, cluster=cluster)).count("simp.") == \
        str(mp.compile(once, cluster=cluster)).count("simp.")


# ---------------------------------------------------------------- inference


def test_infer_single_device(sim: mp.Simulator) -> None:
    def prog() -> Any:
        x = mp.put("P2", A)
        y = mp.put("P2", B)
        on_ppu = mp.device()(lambda u, v: u - v)(x, y)
        s = mp.put("SP0", IA)
        on_spu = mp.device()(lambda u: u * u)(s)
        assert mp.get_dev_attr(on_spu) == "SP0"
        return on_ppu, mp.put("P0", on_spu)

    on_ppu, on_spu = mp.evaluate(sim, prog)
    assert mp.get_dev_attr(on_ppu) == "P2"
    assert sim.held(on_ppu)[:2] == [None, None]
    assert_close(mp.fetch(sim, on_ppu), A - B, 1e-6)
    np.testing.assert_array_equal(mp.fetch(sim, on_spu), IA * IA)


def test_infer_ppu_and_spu_mixed_gives_the_spu(sim: mp.Simulator) -> None:
    def prog() -> Any:
        s = mp.put("SP0", A)
        x = mp.put("P1", B)
        return mp.device()(lambda u, v: u * v)(x, s)

    text = str(mp.compile(prog, cluster=sim.cluster))
    assert "spu.run" in text
    out = mp.evaluate(sim, prog)
    assert mp.get_dev_attr(out) == "SP0"
    assert all(isinstance(v, SpuShare) for v in sim.held(out))
    assert_close(mp.fetch(sim, mp.evaluate(sim, lambda: mp.put("P1", prog()))), A * B)


def test_infer_several_ppus_gives_the_spu_spanning_them(sim: mp.Simulator) -> None:
    def prog() -> Any:
        x = mp.put("P0", IA)
        y = mp.put("P2", IB)
        return mp.device()(lambda u, v: u > v)(x, y)

    out = mp.evaluate(sim, prog)
    assert mp.get_dev_attr(out) == "SP0"
    revealed = mp.evaluate(sim, lambda: mp.put("P0", prog()))
    np.testing.assert_array_equal(mp.fetch(sim, revealed), IA > IB)


def test_infer_picks_the_only_spu_that_spans_the_ppus() -> None:
    nodes = [{"name": f"n{i}", "endpoint": f"h:{i}"} for i in range(3)]
    spec = mp.ClusterSpec.from_dict({
        "nodes": nodes,
        "devices": {
            **{f"P{i}": {"kind": "PPU", "members": [f"n{i}"]} for i in range(3)},
            "S01": {"kind": "SPU", "members": ["n0", "n1"]},
            "S12": {"kind": "SPU", "members": ["n1", "n2"]},
        }})
    sim = mp.Simulator(spec)
    try:
        def prog() -> Any:
            a = mp.device()(lambda u, v: u + v)(mp.put("P0", IA), mp.put("P1", IB))
            b = mp.device()(lambda u, v: u - v)(mp.put("P2", IA), mp.put("P1", IB))
            return a, b

        a, b = mp.evaluate(sim, prog)
        assert (mp.get_dev_attr(a), mp.get_dev_attr(b)) == ("S01", "S12")
        ra, rb = mp.fetch(sim, mp.evaluate(sim, lambda: tuple(mp.put("P1", v) for v in prog())))
        np.testing.assert_array_equal(ra, IA + IB)
        np.testing.assert_array_equal(rb, IA - IB)
        # S01's result is held by parties 0 and 1 only
        assert sim.held(a)[2] is None
        assert sim.held(b)[0] is None
    finally:
        sim.close()


def test_infer_without_device_arguments_fails(sim: mp.Simulator) -> None:
    with pytest.raises(mp.MPTypeError, match="device"):
        mp.compile(lambda: mp.device()(lambda: jnp.int32(1))(), cluster=sim.cluster)


# ---------------------------------------------------------------- get_dev_attr


def test_get_dev_attr(sim: mp.Simulator) -> None:
    seen: dict[str, Any] = {}

    def prog() -> Any:
        x = mp.put("P1", IA)
        s = mp.put("SP0", x)
        plain = simp.constant((0,), 1)
        seen.update(x=mp.get_dev_attr(x), s=mp.get_dev_attr(s), plain=mp.get_dev_attr(plain))
        return x, s, plain

    x, s, plain = mp.evaluate(sim, prog)
    assert seen == {"x": "P1", "s": "SP0", "plain": None}
    assert (mp.get_dev_attr(x), mp.get_dev_attr(s), mp.get_dev_attr(plain)) == ("P1", "SP0", None)
    with pytest.raises(TypeError):
        mp.get_dev_attr(np.int32(1))  # type: ignore[arg-type]


# ---------------------------------------------------------------- modes, eager, save/load


def secure_mean() -> Any:
    a = mp.device("P0")(lambda: jnp.array([1.0, 2.0, 4.0], jnp.float32))()
    b = mp.device("P1")(lambda: jnp.array([3.0, -1.0, 0.5], jnp.float32))()
    c = mp.device("P2")(lambda: jnp.array([2.0, 2.0, 2.0], jnp.float32))()
    mean = mp.device("SP0")(lambda x, y, z: (x + y + z) / 3)(a, b, c)
    best = mp.device("SP0")(lambda m: jnp.argmax(m))(mean)
    return mp.put("P0", mean), mp.put("P2", best)


SECURE_MEAN = np.array([2.0, 1.0, 6.5 / 3], dtype=np.float32)


def test_both_modes_agree(sim: mp.Simulator, mode: str) -> None:
    mean, best = mp.evaluate(sim, secure_mean, mode=mode)
    assert_close(mp.fetch(sim, mean), SECURE_MEAN)
    assert int(mp.fetch(sim, best)) == int(np.argmax(SECURE_MEAN))
    assert sim.held(mean)[1:] == [None, None]
    assert sim.held(best)[:2] == [None, None]


@pytest.fixture
def sim_default_mode(mode: str) -> Any:
    """A 3-party simulator whose default (and so eager) mode is ``mode``."""
    simulator = mp.Simulator(3, default_mode=mode)  # type: ignore[arg-type]
    try:
        yield simulator
    finally:
        simulator.close()


def test_eager_mode_under_with_sim(sim_default_mode: mp.Simulator) -> None:
    sim = sim_default_mode
    with sim:
        x = mp.put("P0", A)
        y = mp.device("P1")(lambda: jnp.asarray(B))()
        assert (mp.get_dev_attr(x), mp.get_dev_attr(y)) == ("P0", "P1")
        z = mp.device()(lambda u, v: u @ v.T)(x, y)
        assert mp.get_dev_attr(z) == "SP0"
        w = mp.put("P2", z)
        moved = mp.put("P1", x)
    assert_close(mp.fetch(sim, w), A @ B.T)
    assert mp.get_dev_attr(w) == "P2"
    per_party = sim.held(w)
    assert per_party[0] is None and per_party[1] is None
    assert_close(per_party[2], A @ B.T)
    np.testing.assert_array_equal(sim.held(moved)[1], A)


def test_saved_programs_still_run(sim: mp.Simulator, mode: str, tmp_path: Any) -> None:
    program = mp.compile(secure_mean, cluster=sim.cluster)
    path = tmp_path / "secure_mean.mpl"
    program.save(path)
    loaded = mp.load(path)
    assert str(loaded) == str(program)
    mean, best = mp.evaluate(sim, loaded, mode=mode)
    assert mp.get_dev_attr(mean) == "P0" and mp.get_dev_attr(best) == "P2"
    assert_close(mp.fetch(sim, mean), SECURE_MEAN)
    assert int(mp.fetch(sim, best)) == int(np.argmax(SECURE_MEAN))


def test_saved_program_runs_in_a_fresh_simulator(tmp_path: Any) -> None:
    spec = mp.ClusterSpec.simple(3)
    path = tmp_path / "p.mpl"
    mp.compile(secure_mean, cluster=spec).save(path)
    sim = mp.Simulator(spec)
    try:
        mean, _ = mp.evaluate(sim, mp.load(path))
        assert_close(mp.fetch(sim, mean), SECURE_MEAN)
    finally:
        sim.close()


def test_compiled_program_takes_new_device_inputs(sim: mp.Simulator, mode: str) -> None:
    x = mp.evaluate(sim, lambda: mp.put("P0", A))
    s = mp.evaluate(sim, lambda: mp.put("SP0", B))

    def prog(a: Any, b: Any) -> Any:
        return mp.put("P1", mp.device()(lambda u, v: u * v + 1)(a, b))

    program = mp.compile(prog, x, s, cluster=sim.cluster)
    out = mp.evaluate(sim, program, x, s, mode=mode)
    assert_close(mp.fetch(sim, out), A * B + 1)
    x2 = mp.evaluate(sim, lambda: mp.put("P0", A * 2))
    out2 = mp.evaluate(sim, program, x2, s, mode=mode)
    assert mp.get_dev_attr(out2) == "P1"
    assert_close(mp.fetch(sim, out2), A * 2 * B + 1)


# ---------------------------------------------------------------- SPU compile cache


def test_reused_spu_function_compiles_once(sim: mp.Simulator,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[Any] = []
    real_compile = spu_dialect.executable_of

    def counting_compile(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real_compile(*args, **kwargs)

    monkeypatch.setattr(spu_dialect, "executable_of", counting_compile)

    def scaled_sum(u: Any, v: Any) -> Any:  # fresh per test, reused by both compiles
        return jnp.sum(u * v, axis=0)

    def prog(a: Any, b: Any) -> Any:
        return mp.put("P0", mp.device("SP0")(scaled_sum)(mp.put("P0", a), mp.put("P1", b)))

    first = mp.compile(prog, A, B, cluster=sim.cluster)
    size = len(spu_dialect._COMPILED)
    assert len(calls) == 1
    second = mp.compile(prog, A + 1, B, cluster=sim.cluster)  # new constants, same types
    assert len(spu_dialect._COMPILED) == size
    assert len(calls) == 1
    assert str(first).count("spu.run") == str(second).count("spu.run") == 1
    assert_close(mp.fetch(sim, mp.evaluate(sim, second)), np.sum((A + 1) * B, axis=0))
    # other input types need another executable
    mp.compile(prog, IA, IB, cluster=sim.cluster)
    assert len(calls) == 2
    assert len(spu_dialect._COMPILED) == size + 1


def test_a_frontend_op_runs_only_on_devices_its_metadata_allows() -> None:
    from mplang import tensor
    from mplang.frontend import FeCapabilityError

    def spu_pyfunc(a: Any) -> Any:
        x = mp.put("P0", a)
        return mp.device("SP0")(tensor.pyfunc)(np.negative, x,
                                                out=jax.ShapeDtypeStruct((3,), np.float32))

    with pytest.raises(FeCapabilityError,
                       match=r"tensor.pyfunc cannot run on SPU SP0: its targets are PPU"):
        mp.compile(spu_pyfunc, np.ones(3, np.float32), cluster=mp.ClusterSpec.simple(3))

    def ppu_pyfunc(a: Any) -> Any:
        return mp.device("P1")(tensor.pyfunc)(np.negative, mp.put("P1", a),
                                               out=jax.ShapeDtypeStruct((3,), np.float32))

    sim = mp.Simulator(3)
    out = mp.evaluate(sim, ppu_pyfunc, np.arange(3, dtype=np.float32))
    np.testing.assert_array_equal(mp.fetch(sim, out), [0.0, -1.0, -2.0])
    sim.close()
