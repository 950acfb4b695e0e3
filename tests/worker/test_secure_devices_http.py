"""PHE and TEE programs on real worker processes: keys, ciphertexts and results cross the wire
through their codecs; the private key stays at its owner."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import phe, simp

pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")


def test_phe_aggregation_across_workers(ctx: Any) -> None:
    vals = [np.arange(6, dtype=np.int32) * (i + 1) for i in range(3)]

    @mp.function
    def prog() -> Any:
        pk, sk = simp.pcall((0,), lambda: phe.keygen(key_bits=1024))
        pks = simp.shuffle_static(pk, {1: 0, 2: 0})
        cs = []
        for i in (1, 2):
            x = simp.constant((i,), vals[i])
            c = simp.pcall((i,), phe.encrypt, x, pks)
            cs.append(simp.shuffle_static(c, {1: i}) if i != 1 else c)
        total = simp.pcall((1,), lambda a, b: a + b + vals[0], *cs)
        return simp.pcall((0,), phe.decrypt, simp.shuffle_static(total, {0: 1}), sk)

    assert np.array_equal(mp.fetch(ctx, mp.evaluate(ctx, prog))[0], sum(vals))


def test_tee_attestation_and_sealing_across_workers(ctx: Any) -> None:
    """The TEE protocol at the simp level: party 2 quotes, party 0 checks the quote and
    seals its data to party 2, which opens it; X25519 public keys cross the wire."""
    from mplang import crypto
    from mplang.dialects import tee

    data = np.arange(8, dtype=np.float32)
    digest = "cd" * 32

    @mp.function
    def prog() -> Any:
        tee_pk, tee_sk = simp.pcall((2,), crypto.x25519_keygen)
        quote = simp.pcall((2,), lambda pk: tee.mock_quote(crypto.public_bytes(pk),
                                                           computation=digest), tee_pk)
        checked = simp.pcall((0,), lambda q: tee.verify_quote(q, computation=digest),
                             simp.shuffle_static(quote, {0: 2}))

        def seal(k: Any) -> Any:
            pk, sk = crypto.x25519_keygen()
            key = crypto.hkdf(crypto.x25519_shared(sk, k), info=b"t")
            return crypto.aes_encrypt(data, key, aad=b"x"), pk

        sealed, eph = simp.pcall((0,), seal, checked)
        sealed, eph = simp.shuffle_static(sealed, {2: 0}), simp.shuffle_static(eph, {2: 0})
        return simp.pcall((2,), lambda c, e, s: crypto.aes_decrypt(
            c, crypto.hkdf(crypto.x25519_shared(s, e), info=b"t"), like=data, aad=b"x") * 2,
            sealed, eph, tee_sk)

    out = mp.fetch(ctx, mp.evaluate(ctx, prog))
    assert out[0] is None and out[1] is None
    np.testing.assert_array_equal(out[2], data * 2)
