"""The TEE device with MOCK attestation: sealed inputs, attested computation, sealed outputs."""

from __future__ import annotations

import time
import warnings
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.dialects.tee import QUOTE_MAGIC
from mplang.kernels.crypto import ed25519_public
from mplang.kernels.tee import (
    MOCK_VENDOR_PUBLIC_KEY,
    check_quote,
    code_digest,
    make_quote,
)

A = np.arange(6, dtype=np.float32)
B = np.linspace(-1, 1, 6).astype(np.float32)


def spec(**config: Any) -> mp.ClusterSpec:
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{9200 + i}"} for i in range(3)],
        "devices": {"P0": {"kind": "PPU", "members": ["node_0"]},
                    "P1": {"kind": "PPU", "members": ["node_1"]},
                    "T0": {"kind": "TEE", "members": ["node_2"],
                           "config": {"attestation": "mock", **config}}}})


def two_party(a: np.ndarray = A, b: np.ndarray = B) -> Any:
    x = mp.device("P0")(lambda: a)()
    y = mp.device("P1")(lambda: b)()
    r = mp.device("T0")(lambda u, v: (jnp.dot(u, v), jnp.maximum(u, v)))(x, y)
    return mp.put("P0", r[0]), mp.put("P1", r[1])


@pytest.fixture(autouse=True)
def _quiet() -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)
        yield


def run(cluster: mp.ClusterSpec, fn: Any) -> Any:
    sim = mp.Simulator(cluster)
    try:
        return mp.fetch(sim, mp.evaluate(sim, fn))
    finally:
        sim.close()


def test_two_party_computation_inside_the_tee() -> None:
    dot, top = run(spec(), two_party)
    assert dot == pytest.approx(float(A @ B), abs=1e-5)
    np.testing.assert_allclose(top, np.maximum(A, B))


def test_only_the_tee_opens_inputs_and_only_receivers_open_results() -> None:
    program = mp.compile(two_party, cluster=spec())
    text = str(program)
    opens = [line for line in text.splitlines() if "crypto.aes_decrypt" in line]
    # two inputs opened at the TEE (party 2), one result opened at each receiver
    assert len(opens) == 4
    assert text.count("tee.verify_quote") == 2 and text.count("tee.mock_quote") == 1


def test_a_quote_for_another_measurement_refuses_before_data_leaves() -> None:
    start = time.monotonic()
    with pytest.raises(mp.MPRuntimeError, match=r"op tee\.verify_quote: attestation refused, "
                       r"nothing is sent to the TEE: the quote reports measurement .* the TEE "
                       "runs other code or another computation") as info:
        run(spec(code="00" * 32), two_party)
    assert info.value.op == "tee.verify_quote" and info.value.party in (0, 1)
    assert time.monotonic() - start < 30


def test_a_bad_signature_refuses_before_data_leaves() -> None:
    other_vendor = ed25519_public(b"\x01" * 32).hex()
    with pytest.raises(mp.MPRuntimeError, match="attestation refused, nothing is sent to the "
                       "TEE: the quote's signature does not verify under the expected vendor"):
        run(spec(vendor_key=other_vendor), two_party)


def test_quotes_bind_key_code_and_computation() -> None:
    tee_key = bytes(range(32))
    quote = make_quote(tee_key, code_digest(), "ab" * 32)
    assert quote.startswith(QUOTE_MAGIC) and b"MOCK" in quote[:len(QUOTE_MAGIC)]
    assert check_quote(quote, code_digest(), "ab" * 32, MOCK_VENDOR_PUBLIC_KEY) == tee_key
    with pytest.raises(ValueError, match="the quote reports measurement"):
        check_quote(quote, code_digest(), "cd" * 32, MOCK_VENDOR_PUBLIC_KEY)
    swapped = quote[:len(QUOTE_MAGIC) + 32] + bytes(32) + quote[len(QUOTE_MAGIC) + 64:]
    with pytest.raises(ValueError, match="signature does not verify"):
        check_quote(swapped, code_digest(), "ab" * 32, MOCK_VENDOR_PUBLIC_KEY)
    with pytest.raises(ValueError, match="not a mock quote"):
        check_quote(quote[:-1], code_digest(), "ab" * 32, MOCK_VENDOR_PUBLIC_KEY)


def test_another_function_has_another_measurement() -> None:
    def other() -> Any:
        x = mp.device("P0")(lambda: A)()
        y = mp.device("P1")(lambda: B)()
        return mp.put("P0", mp.device("T0")(lambda u, v: jnp.dot(u, v) + 1)(x, y))

    def digests(fn: Any) -> set[str]:
        text = str(mp.compile(fn, cluster=spec()))
        return {part.split("'")[1] for part in text.split("computation=")[1:]}

    assert len(digests(two_party)) == 1 and digests(two_party) != digests(other)


def test_the_mock_is_labelled(monkeypatch: pytest.MonkeyPatch) -> None:
    from mplang.device import kinds

    monkeypatch.setattr(kinds, "_WARNED", set())
    with pytest.raises(mp.ClusterSpecError, match="set 'attestation: mock'"):
        mp.ClusterSpec.from_dict({"nodes": [{"name": "n", "endpoint": "127.0.0.1:1"}],
                                  "devices": {"T0": {"kind": "TEE", "members": ["n"]}}})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        mp.compile(two_party, cluster=spec())
    assert any("attestation is a MOCK" in str(w.message) for w in caught
               if w.category is mp.InsecureDeviceWarning)
    from mplang.device.kinds import get_kind

    assert "HERE ATTESTATION IS A MOCK" in get_kind("TEE").security_model


def test_fetching_a_tee_value_is_refused() -> None:
    sim = mp.Simulator(spec())
    try:
        r = mp.evaluate(sim, lambda: mp.device("T0")(lambda u: u * 2)(
            mp.device("P0")(lambda: A)()))
        with pytest.raises(mp.MPRuntimeError, match="T0 holds a value inside the TEE"):
            mp.fetch(sim, r)
    finally:
        sim.close()
