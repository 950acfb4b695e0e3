"""The crypto corpus: every crypto primitive (`tests.dialects.corpus`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mplang as mp
from mplang import crypto, simp, tensor


def crypto_corpus() -> Any:
    """Every crypto primitive: key agreement, AES-GCM both ways, signatures, hashing."""
    x = np.arange(4, dtype=np.int32)
    pk0, sk0 = simp.pcall((0,), crypto.x25519_keygen)
    pk1, sk1 = simp.pcall((1,), crypto.x25519_keygen)
    raw1 = simp.shuffle_static(simp.pcall((1,), crypto.public_bytes, pk1), {0: 1})
    k0 = simp.pcall((0,), lambda sk, b: crypto.hkdf(crypto.x25519_shared(
        sk, crypto.public_key(b, algorithm="x25519")), info=b"corpus"), sk0, raw1)
    k1 = simp.pcall((1,), lambda sk, pk: crypto.hkdf(crypto.x25519_shared(sk, pk),
                                                     info=b"corpus"),
                    sk1, simp.shuffle_static(pk0, {1: 0}))
    c = simp.pcall((0,), lambda k: crypto.aes_encrypt(tensor.constant(x), k, aad=b"a"), k0)
    y = simp.pcall((1,), lambda c, k: crypto.aes_decrypt(c, k, like=x, aad=b"a"),
                   simp.shuffle_static(c, {1: 0}), k1)

    def signed() -> Any:
        spk, ssk = crypto.ed25519_keygen()
        crypto.random_bits(count=4)
        digest = crypto.sha256(tensor.constant(x))
        return crypto.verify(digest, crypto.sign(digest, ssk), spk), \
            crypto.aes_encrypt(digest, crypto.aes_keygen())

    ok, sealed = simp.pcall((2,), signed)
    return y, ok, sealed, pk0


def check(result: Any) -> None:
    y, ok, sealed, pk0 = result
    assert [None if v is None else np.asarray(v).tolist() for v in y] == \
        [None, [0, 1, 2, 3], None]
    assert bool(ok[2]) is True and sealed[2].shape == (60,) and pk0[0].algorithm == "x25519"


def crypto_public_key_value(sim: mp.Simulator) -> tuple[list[Any], Callable[[list[Any]], None]]:
    """X25519 public keys made by two parties."""
    pk = mp.evaluate(sim, lambda: simp.pcall((0, 1), crypto.x25519_keygen)[0])
    values = [v for v in sim.held(pk) if v is not None]
    expected = [(v.algorithm, v.raw) for v in values]

    def check(decoded: list[Any]) -> None:
        assert [(v.algorithm, v.raw) for v in decoded] == expected

    return values, check


VALUES = {"crypto.public_key": crypto_public_key_value}
"""Codec kind -> a run giving values of that kind, and a check of decoded values."""
