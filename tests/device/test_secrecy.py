"""Secrecy in practice: what each party's object store actually holds.

A value on an SPU exists only as `SpuShare`s on its members; a PPU value only on
its party; a value revealed to one party reaches no other."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.kernels.spu.run import SpuShare

Stored = Callable[[mp.Simulator, int], list[Any]]

# distinctive values that cannot appear by accident
SECRET_A = np.array([123456789, -987654, 31337, 271828], dtype=np.int32)
SECRET_B = np.array([1000003, 99991, -424242, 17], dtype=np.int32)


def is_plain(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic, jax.Array, int, float))


def holds_array_equal_to(values: list[Any], target: np.ndarray) -> bool:
    for v in values:
        if is_plain(v):
            arr = np.asarray(v)
            if arr.shape == target.shape and np.array_equal(arr, target):
                return True
    return False


def share_bytes(share: SpuShare) -> bytes:
    s = share.to_libspu()
    return bytes(s.meta) + b"".join(bytes(c) for c in s.share_chunks)


def ring_encodings(values: np.ndarray) -> list[bytes]:
    """Each element as a little-endian 64- and 128-bit ring element (how an integer
    would sit in an FM64/FM128 share if it were not masked)."""
    out = []
    for v in values.astype(np.int64).tolist():
        out.append(int(v).to_bytes(8, "little", signed=True))
        out.append(int(v).to_bytes(16, "little", signed=True))
    return out


@pytest.fixture(params=[3, 2], ids=["aby3-3pc", "cheetah-2pc"])
def fresh(request: pytest.FixtureRequest) -> Any:
    sim = mp.Simulator(request.param)
    try:
        yield sim
    finally:
        sim.close()


def reveal(sim: mp.Simulator, obj: Any, to: str = "P0") -> Any:
    """The plaintext of secure value ``obj``, revealed to ``to`` by a program."""
    return mp.fetch(sim, mp.evaluate(sim, lambda v: mp.put(to, v), obj))


def test_spu_value_is_held_only_as_shares(fresh: mp.Simulator, stored: Stored) -> None:
    sim = fresh
    n = sim.world_size
    a = mp.evaluate(sim, lambda: mp.put("P0", SECRET_A))
    b = mp.evaluate(sim, lambda: mp.put("P1", SECRET_B))
    total = mp.evaluate(sim, lambda x, y: mp.device("SP0")(lambda u, v: u + v)(x, y), a, b)
    secret = SECRET_A + SECRET_B
    assert mp.get_dev_attr(total) == "SP0"

    per_party = sim.held(total)
    assert len(per_party) == n
    assert all(isinstance(s, SpuShare) for s in per_party)
    for rank in range(n):
        values = stored(sim, rank)
        # the result is in every member's store, as a share and never as plaintext
        assert any(isinstance(v, SpuShare) for v in values)
        assert not holds_array_equal_to(values, secret), f"party {rank} holds the result"
        for v in values:
            if isinstance(v, SpuShare):
                blob = share_bytes(v)
                for enc in ring_encodings(secret):
                    assert enc not in blob, f"party {rank}'s share contains the plaintext"
    # the inputs stay with their owners
    assert holds_array_equal_to(stored(sim, 0), SECRET_A)
    assert holds_array_equal_to(stored(sim, 1), SECRET_B)
    for rank in range(1, n):
        assert not holds_array_equal_to(stored(sim, rank), SECRET_A)
    for rank in [r for r in range(n) if r != 1]:
        assert not holds_array_equal_to(stored(sim, rank), SECRET_B)
    # and the shares do encode the secret: a program that reveals it gets it back
    np.testing.assert_array_equal(reveal(sim, total), secret)


def test_shares_differ_between_members(fresh: mp.Simulator) -> None:
    out = mp.evaluate(fresh, lambda: mp.put("SP0", SECRET_A))
    shares = [share_bytes(s) for s in fresh.held(out)]
    assert len(set(shares)) == len(shares)


def test_sealing_twice_gives_fresh_shares(fresh: mp.Simulator) -> None:
    first = mp.evaluate(fresh, lambda: mp.put("SP0", SECRET_B))
    second = mp.evaluate(fresh, lambda: mp.put("SP0", SECRET_B))
    assert share_bytes(fresh.held(first)[0]) != share_bytes(fresh.held(second)[0])
    np.testing.assert_array_equal(reveal(fresh, first), reveal(fresh, second))


def test_eager_spu_work_leaves_no_plaintext_with_outsiders(sim: mp.Simulator,
                                                            stored: Stored) -> None:
    with sim:
        x = mp.put("P0", SECRET_A)
        y = mp.put("P1", SECRET_B)
        z = mp.device("SP0")(lambda u, v: u * 2 + v)(x, y)
        w = mp.device("SP0")(lambda u: u - 1)(z)
    expected_z = SECRET_A * 2 + SECRET_B
    # party 2 owns no input: it holds shares and nothing in the clear
    assert all(isinstance(v, SpuShare) for v in stored(sim, 2))
    assert len(stored(sim, 2)) >= 2
    for rank in range(3):
        values = stored(sim, rank)
        assert not holds_array_equal_to(values, expected_z)
        assert not holds_array_equal_to(values, expected_z - 1)
    np.testing.assert_array_equal(reveal(sim, w), expected_z - 1)


def test_ppu_value_lives_only_on_its_party(sim: mp.Simulator, stored: Stored) -> None:
    out = mp.evaluate(sim, lambda: mp.device("P1")(lambda: jnp.asarray(SECRET_A) * 3)())
    expected = SECRET_A * 3
    np.testing.assert_array_equal(mp.fetch(sim, out), expected)
    per_party = sim.held(out)
    assert per_party[0] is None and per_party[2] is None
    assert holds_array_equal_to(stored(sim, 1), expected)
    for rank in (0, 2):
        values = stored(sim, rank)
        assert not holds_array_equal_to(values, expected)
        assert not any(isinstance(v, SpuShare) for v in values)


def test_reveal_to_p0_gives_others_nothing(sim: mp.Simulator, stored: Stored,
                                           mode: str) -> None:
    def prog() -> Any:
        x = mp.put("P1", SECRET_A)
        y = mp.put("P2", SECRET_B)
        z = mp.device("SP0")(lambda u, v: u - v)(x, y)
        return mp.put("P0", z)

    out = mp.evaluate(sim, prog, mode=mode)
    secret = SECRET_A - SECRET_B
    per_party = sim.held(out)
    np.testing.assert_array_equal(per_party[0], secret)
    assert per_party[1] is None and per_party[2] is None
    assert holds_array_equal_to(stored(sim, 0), secret)
    for rank in (1, 2):
        assert not holds_array_equal_to(stored(sim, rank), secret)
    np.testing.assert_array_equal(mp.fetch(sim, out), secret)


def test_reveal_goes_only_to_the_target_in_the_program(sim: mp.Simulator) -> None:
    def prog() -> Any:
        return mp.put("P2", mp.put("SP0", SECRET_A))

    program = mp.compile(prog, cluster=sim.cluster)
    text = str(program)
    assert text.count("spu.reveal") == 1 and "to=2" in text
    # the output type says only party 2 holds the result
    out_type = program.graph.outputs[0].type
    assert isinstance(out_type, mp.MPType)
    assert out_type.pmask == mp.Mask.of([2])


def test_spu_over_a_subset_leaves_the_outsider_nothing(stored: Stored, mode: str) -> None:
    spec = mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"n{i}", "endpoint": f"h:{i}"} for i in range(3)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [f"n{i}"]} for i in range(3)},
                    "S21": {"kind": "SPU", "members": ["n2", "n1"]}}})
    sim = mp.Simulator(spec)
    try:
        def prog() -> Any:
            a = mp.put("P0", SECRET_A)   # party 0 owns an input but is not a member
            b = mp.put("P1", SECRET_B)
            return mp.device("S21")(lambda u, v: u - v)(a, b)

        out = mp.evaluate(sim, prog, mode=mode)
        per_party = sim.held(out)
        assert per_party[0] is None
        assert isinstance(per_party[1], SpuShare) and isinstance(per_party[2], SpuShare)
        assert stored(sim, 0) == []  # nothing of the result, not even a share
        for rank in (1, 2):
            assert not holds_array_equal_to(stored(sim, rank), SECRET_A - SECRET_B)
            assert not holds_array_equal_to(stored(sim, rank), SECRET_A)
        np.testing.assert_array_equal(reveal(sim, out, "P1"), SECRET_A - SECRET_B)
    finally:
        sim.close()


def test_outsider_of_the_four_party_default_spu_sends_only_shares(stored: Stored) -> None:
    """``ClusterSpec.simple(4)``: ABY3 over parties 0..2; party 3's input reaches the
    members as shares only, and party 3 keeps no share of it or of the result."""
    sim = mp.Simulator(4)
    try:
        out = mp.evaluate(sim, lambda: mp.device("SP0")(lambda u, v: u * v)(
            mp.put("P3", SECRET_A), mp.put("P0", SECRET_B)))
        per_party = sim.held(out)
        assert all(isinstance(s, SpuShare) for s in per_party[:3]) and per_party[3] is None
        assert not any(isinstance(v, SpuShare) for v in stored(sim, 3))
        for rank in range(3):
            values = stored(sim, rank)
            assert not holds_array_equal_to(values, SECRET_A), f"party {rank} holds P3's input"
            for v in values:
                if isinstance(v, SpuShare):
                    blob = share_bytes(v)
                    assert not any(enc in blob for enc in ring_encodings(SECRET_A))
        np.testing.assert_array_equal(reveal(sim, out), SECRET_A * SECRET_B)
    finally:
        sim.close()
