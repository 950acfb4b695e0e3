"""SPU protocols and settings from the device config: CHEETAH (2 parties), ABY3 (3,
and 3 of 4 with an outsider's input), SEMI2K (2 and 4, asked for explicitly); the
defaults of `ClusterSpec.simple`; fields FM64 and FM128; fixed-point fraction bits."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.kernels.spu.run import SpuShare

X = np.array([1.5, -2.0, 3.25, 0.0], dtype=np.float32)
Y = np.array([0.5, 4.0, -1.0, 2.0], dtype=np.float32)
K = np.array([3, -7, 11, 0], dtype=np.int32)


def kernel(x: Any, y: Any, k: Any) -> Any:
    return {
        "add": x + y,
        "mul": x * y,
        "lt": x < y,
        "where": jnp.where(x > y, x, y),
        "sum": jnp.sum(x * y),
        "imul": k * k - k,
    }


def reference(x: np.ndarray, y: np.ndarray, k: np.ndarray) -> dict[str, Any]:
    return {
        "add": x + y,
        "mul": x * y,
        "lt": x < y,
        "where": np.where(x > y, x, y),
        "sum": np.float32(np.sum(x * y)),
        "imul": k * k - k,
    }


def joint_program(n: int) -> Any:
    """x from P0, y from P1, k from the last party; everything revealed to P0."""

    def prog() -> Any:
        x = mp.put("P0", X)
        y = mp.put("P1", Y)
        k = mp.put(f"P{n - 1}", K)
        out = mp.device("S")(kernel)(x, y, k)
        return {name: mp.put("P0", v) for name, v in out.items()}, out["mul"]

    return prog


CASES = [
    ("SEMI2K", 2, "FM64"),
    ("SEMI2K", 2, "FM128"),
    ("SEMI2K", 4, "FM64"),
    ("ABY3", 3, "FM64"),
    ("ABY3", 3, "FM128"),
    ("CHEETAH", 2, "FM64"),
]


@pytest.fixture
def spu_world(request: pytest.FixtureRequest, make_spec: Any) -> Iterator[mp.Simulator]:
    protocol, n, field = request.param
    sim = mp.Simulator(make_spec(n, protocol=protocol, field=field))
    try:
        yield sim
    finally:
        sim.close()


def reveal(sim: mp.Simulator, obj: Any, to: str = "P0") -> Any:
    """The plaintext of secure value ``obj``, revealed to ``to`` by a program."""
    return mp.fetch(sim, mp.evaluate(sim, lambda v: mp.put(to, v), obj))


@pytest.mark.parametrize("spu_world", CASES, ids=[f"{p}-{n}pc-{f}" for p, n, f in CASES],
                         indirect=True)
def test_protocol_matches_numpy(spu_world: mp.Simulator) -> None:
    world = spu_world
    n = world.world_size
    spu = world.cluster.device("S")
    protocol, field = spu.config["protocol"], spu.config["field"]
    program = mp.compile(joint_program(n), cluster=world.cluster)
    text = str(program)
    assert f"protocol='{protocol}'" in text and f"field='{field}'" in text
    revealed, shared = mp.evaluate(world, program)
    values = mp.fetch(world, revealed)
    expected = reference(X, Y, K)
    for name, want in expected.items():
        got = np.asarray(values[name])
        assert got.shape == np.shape(want), name
        if np.asarray(want).dtype.kind in "biu":
            assert got.dtype == np.asarray(want).dtype, name
            np.testing.assert_array_equal(got, want, err_msg=name)
        else:
            np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3, err_msg=name)
    # revealed to P0 only
    for name in expected:
        assert all(v is None for v in world.held(revealed[name])[1:]), name
    # the secret output is shared among all members, under the configured protocol and field
    shares = world.held(shared)
    assert len(shares) == n and all(isinstance(s, SpuShare) for s in shares)
    meta = bytes(shares[0].to_libspu().meta).decode("latin-1")
    assert f"{protocol.lower()}." in meta
    assert f"<{field}>" in meta
    np.testing.assert_allclose(reveal(world, shared), X * Y, rtol=1e-3, atol=1e-3)


def test_four_party_semi2k_spans_all_parties(make_spec: Any) -> None:
    sim = mp.Simulator(make_spec(4, protocol="SEMI2K"))
    try:
        def prog() -> Any:
            parts = [mp.put(f"P{i}", np.float32(i + 1) * X) for i in range(4)]
            return mp.device("S")(lambda *xs: sum(xs[1:], xs[0]) / 10)(*parts)

        out = mp.evaluate(sim, prog)
        assert all(isinstance(s, SpuShare) for s in sim.held(out))
        np.testing.assert_allclose(reveal(sim, out), X, rtol=1e-3, atol=1e-3)
    finally:
        sim.close()


@pytest.mark.parametrize(("n", "protocol"), [(2, "cheetah"), (3, "aby3")])
def test_simple_cluster_protocols_reach_libspu(n: int, protocol: str) -> None:
    sim = mp.Simulator(n)
    try:
        out = mp.evaluate(sim, lambda: mp.put("SP0", K))
        meta = bytes(sim.held(out)[0].to_libspu().meta).decode("latin-1")
        assert f"{protocol}." in meta
        np.testing.assert_array_equal(reveal(sim, out), K)
    finally:
        sim.close()


@pytest.mark.parametrize("mode", ["launch", "standard"])
def test_four_party_simple_cluster_takes_an_outsiders_input(mode: str) -> None:
    """``ClusterSpec.simple(4)``: ABY3 on node_0..2; party 3 secret-shares its input into
    the SPU (sending one share to each member, keeping none) and receives the result."""
    sim = mp.Simulator(4)
    try:
        spu = sim.cluster.device("SP0")
        assert (spu.members, spu.config["protocol"]) == (("node_0", "node_1", "node_2"), "ABY3")

        def prog() -> Any:
            outsider = mp.put("P3", K)
            inside = mp.put("P1", K + 1)
            shared = mp.put("SP0", outsider)             # the outsider's value alone
            product = mp.device("SP0")(lambda a, b: a * b - a)(outsider, inside)
            return shared, product, mp.put("P3", product)

        program = mp.compile(prog, cluster=sim.cluster)
        shared, product, back = mp.evaluate(sim, program, mode=mode)
        for obj in (shared, product):
            held = sim.held(obj)
            assert all(isinstance(s, SpuShare) for s in held[:3]) and held[3] is None
            meta = bytes(held[0].to_libspu().meta).decode("latin-1")
            assert "aby3." in meta
        np.testing.assert_array_equal(reveal(sim, shared, "P3"), K)
        np.testing.assert_array_equal(reveal(sim, product, "P3"), K * (K + 1) - K)
        assert sim.held(back)[:3] == [None, None, None]  # revealed to party 3 only
        np.testing.assert_array_equal(mp.fetch(sim, back), K * (K + 1) - K)
    finally:
        sim.close()


# ---------------------------------------------------------------- fields


def square_big(make_spec: Any, field: str) -> np.ndarray:
    sim = mp.Simulator(make_spec(2, protocol="SEMI2K", field=field))
    try:
        big = np.array([1.0e7, 3.0], dtype=np.float32)
        out = mp.evaluate(sim, lambda: mp.device("S")(lambda v: v * v)(mp.put("P0", big)))
        return np.asarray(reveal(sim, out))
    finally:
        sim.close()


def test_fm128_has_room_that_fm64_lacks(make_spec: Any) -> None:
    # 1e7 * 1e7 = 1e14 needs ~47 integer bits plus the fraction bits: it fits the
    # 128-bit ring and overflows the 64-bit one; the field really reaches libspu.
    wide = square_big(make_spec, "FM128")
    np.testing.assert_allclose(wide, [1.0e14, 9.0], rtol=1e-3)
    narrow = square_big(make_spec, "FM64")
    assert narrow[1] == pytest.approx(9.0, abs=1e-3)
    assert not np.isclose(narrow[0], 1.0e14, rtol=1e-2)


# ---------------------------------------------------------------- fixed point


def third(make_spec: Any, bits: int | None, protocol: str | None = None, n: int = 2) -> float:
    sim = mp.Simulator(make_spec(n, protocol=protocol, fxp_fraction_bits=bits))
    try:
        def prog() -> Any:
            return mp.put("P1", mp.device("S")(lambda v: v / 3)(mp.put("P0", np.float32(1.0))))

        text = str(mp.compile(prog, cluster=sim.cluster))
        assert f"fxp_fraction_bits={bits or 18}" in text
        return float(mp.fetch(sim, mp.evaluate(sim, prog)))
    finally:
        sim.close()


def test_fraction_bits_change_precision(make_spec: Any) -> None:
    coarse = third(make_spec, 4)
    fine = third(make_spec, 24)
    default = third(make_spec, None)
    assert abs(coarse - 1 / 3) > 1e-2     # 4 fraction bits: steps of 1/16
    assert abs(coarse * 16 - round(coarse * 16)) < 1e-6  # a multiple of 1/16
    assert abs(fine - 1 / 3) < 1e-5
    assert abs(default - 1 / 3) < 1e-4
    assert abs(fine - 1 / 3) < abs(coarse - 1 / 3)


def test_fraction_bits_apply_to_aby3(make_spec: Any) -> None:
    coarse = third(make_spec, 5, protocol="ABY3", n=3)
    assert abs(coarse - 1 / 3) > 5e-3
    assert abs(coarse * 32 - round(coarse * 32)) < 1e-6


def test_fraction_bits_reach_the_shares(make_spec: Any) -> None:
    """An SPU input is encoded with the configured scale: with 2 fraction bits 0.3
    can only be stored as 0.25."""
    sim = mp.Simulator(make_spec(2, fxp_fraction_bits=2))
    try:
        out = mp.evaluate(sim, lambda: mp.put("S", np.array([0.3, 1.75], np.float32)))
        np.testing.assert_allclose(reveal(sim, out), [0.25, 1.75], atol=1e-6)
    finally:
        sim.close()


@pytest.mark.parametrize(("field", "bits"), [("FM64", 18), ("FM128", 26)])
def test_the_ir_shows_the_fraction_bits_libspu_uses(make_spec: Any, field: str,
                                                   bits: int) -> None:
    """A config without fxp_fraction_bits computes with libspu's default for its field,
    and the program says which: an input is encoded in steps of 2**-bits."""
    sim = mp.Simulator(make_spec(2, field=field))
    try:
        def prog() -> Any:
            return mp.put("S", np.array([1 / 3], np.float64 if field == "FM128" else np.float32))

        assert f"field={field!r}, fxp_fraction_bits={bits}" in str(
            mp.compile(prog, cluster=sim.cluster)).replace('"', "'")
        got = float(reveal(sim, mp.evaluate(sim, prog))[0])
        assert got * 2**bits == round(got * 2**bits) and abs(got - 1 / 3) <= 2.0**-bits
    finally:
        sim.close()
