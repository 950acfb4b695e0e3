"""The PHE device kind: encrypt on put, evaluate at the evaluator, decrypt at the owner."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import phe
from tests.kernels.phe.conftest import KEY_BITS
from tests.simulators import simulated


def spec(members: list[str], **config: Any) -> mp.ClusterSpec:
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{9100 + i}"} for i in range(3)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]} for i in range(3)},
                    "HE0": {"kind": "PHE", "members": members,
                            "config": {"key_bits": KEY_BITS, **config}}}})


sim = simulated(spec(["node_0", "node_1"]))


VALS = [np.arange(5, dtype=np.float32) * (i + 1) - 2 for i in range(3)]


def test_secure_aggregation_under_the_owners_key(sim: mp.Simulator) -> None:
    @mp.function
    def agg() -> Any:
        xs = [mp.device(f"P{i}")(lambda v=v: v)() for i, v in enumerate(VALS)]
        total = mp.device("HE0")(lambda a, b, c: a + b + c)(*[mp.put("HE0", x) for x in xs])
        return mp.put("P0", total)

    np.testing.assert_allclose(mp.fetch(sim, mp.evaluate(sim, agg)), sum(VALS), atol=1e-5)


def test_device_functions_with_plaintext_constants_and_phe_ops(sim: mp.Simulator) -> None:
    weights = np.array([[1.0, 0.5], [2.0, -1.0], [0.0, 1.0], [1.0, 1.0], [3.0, 0.0]])

    @mp.function
    def prog() -> Any:
        x = mp.device("P2")(lambda: VALS[2])()
        c = mp.put("HE0", x)
        dot, scaled, total = mp.device("HE0")(lambda c, w: (phe.dot(c, w), c * 2.0 - 1.0,
                                                            phe.sum(c)))(c, weights)
        return mp.put("P0", dot), mp.put("P0", scaled), mp.put("P0", total)

    dot, scaled, total = mp.fetch(sim, mp.evaluate(sim, prog))
    np.testing.assert_allclose(dot, VALS[2] @ weights, atol=1e-4)
    np.testing.assert_allclose(scaled, VALS[2] * 2 - 1, atol=1e-5)
    assert total == pytest.approx(VALS[2].sum(), abs=1e-4)


def test_values_are_held_where_the_model_says() -> None:
    """Encrypted at the holder, evaluated at the evaluator, decrypted at the owner."""
    seen = {}

    @mp.function
    def prog() -> Any:
        x = mp.device("P2")(lambda: VALS[0])()
        c = mp.put("HE0", x)
        d = mp.device("HE0")(lambda c: c + c)(c)
        seen["c"], seen["d"] = c.mptype, d.mptype
        return mp.put("P0", d)

    program = mp.compile(prog, cluster=spec(["node_0", "node_1"]))
    assert str(seen["c"]) == "phe.ct<float32[5],k0,scale=2^24>@{2}"
    assert str(seen["d"]) == "phe.ct<float32[5],k0,scale=2^24>@{1}"
    text = str(program)
    assert text.count("phe.keygen") == 1 and "phe.decrypt" in text


def test_only_the_key_owner_can_receive_a_decryption() -> None:
    def prog() -> Any:
        c = mp.put("HE0", mp.device("P1")(lambda: VALS[0])())
        return mp.put("P1", c)

    with pytest.raises(mp.MPTypeError, match=r"put\('P1'\): only HE0's key owner node_0 can "
                       "decrypt; P1 is on node_1"):
        mp.compile(prog, cluster=spec(["node_0", "node_1"]))


def test_fetching_an_encrypted_value_is_refused(sim: mp.Simulator) -> None:
    c = mp.evaluate(sim, lambda: mp.put("HE0", mp.device("P1")(lambda: VALS[0])()))
    with pytest.raises(mp.MPRuntimeError, match="HE0 holds a ciphertext; decrypt it in the "
                       "program first"):
        mp.fetch(sim, c)


def test_a_function_returning_plaintext_is_refused() -> None:
    def prog() -> Any:
        c = mp.put("HE0", mp.device("P1")(lambda: VALS[0])())
        return mp.device("HE0")(lambda c: phe.decrypt(c, c))(c)

    with pytest.raises(mp.MPTypeError, match=r"phe\.decrypt: operand sk must be a PHE private "
                       r"key, got phe\.ct<float32\[5\]"):
        mp.compile(prog, cluster=spec(["node_0", "node_1"]))


def test_config_is_validated() -> None:
    with pytest.raises(mp.ClusterSpecError, match="scheme"):
        spec(["node_0", "node_1"], scheme="rsa")
    with pytest.raises(mp.ClusterSpecError, match="key_bits"):
        spec(["node_0", "node_1"], key_bits=512)
    with pytest.raises(mp.ClusterSpecError, match="a member is listed twice"):
        spec(["node_0", "node_0"])


def test_an_owner_that_evaluates_is_warned_about() -> None:
    def prog() -> Any:
        return mp.put("HE0", mp.device("P1")(lambda: VALS[0])())

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mp.compile(prog, cluster=spec(["node_0"]))
    messages = [str(w.message) for w in caught if w.category is mp.InsecureDeviceWarning]
    assert any("node_0 holds the key and evaluates too" in m for m in messages), messages


def test_the_security_model_is_stated() -> None:
    from mplang.device.kinds import get_kind

    model = get_kind("PHE").security_model
    assert "semi-honest parties, and the key owner must not collude with an evaluator" in model
