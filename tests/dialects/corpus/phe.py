"""The phe corpus: every phe primitive (`tests.dialects.corpus`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

import mplang as mp
from mplang import phe, simp, tensor


def phe_corpus() -> Any:
    """Every phe primitive: keys at party 0, encryption and arithmetic at party 1."""
    x = np.arange(6, dtype=np.int32).reshape(2, 3)
    pk, sk = simp.pcall((0,), lambda: phe.keygen(key_bits=1024))
    pk1 = simp.shuffle_static(pk, {1: 0})

    def work(k: Any) -> Any:
        c = phe.encrypt(tensor.constant(x), k)
        d = phe.sub(phe.add(c, c), phe.mul_plain(c, np.int32(2)))  # 0
        return (phe.add(d, c), phe.sum(c, axis=1), phe.dot(c, np.ones(3, np.int32)),
                phe.bucket_sum(c, np.array([[1], [0]], np.int8), n_bins=2))

    outs = simp.pcall((1,), work, pk1)
    return [simp.pcall((0,), phe.decrypt, simp.shuffle_static(o, {0: 1}), sk) for o in outs]


def check(result: Any) -> None:
    x = np.arange(6).reshape(2, 3)
    wants = [x, x.sum(1), x @ np.ones(3), x[::-1].reshape(1, 1, 2, 3)]
    for got, want in zip([r[0] for r in result], wants, strict=True):
        np.testing.assert_array_equal(got, want)


def _phe_run(sim: mp.Simulator) -> tuple[Any, Any, Any]:
    return mp.evaluate(sim, lambda: _phe_keys_and_ciphertext())


def _phe_keys_and_ciphertext() -> Any:
    pk, sk = simp.pcall((0,), lambda: phe.keygen(key_bits=1024))
    c = simp.pcall((0,), lambda k: phe.encrypt(np.arange(6, dtype=np.int32).reshape(2, 3), k),
                   pk)
    return pk, sk, c


def phe_values(sim: mp.Simulator, which: int) -> tuple[list[Any], Callable[[list[Any]], None]]:
    """Party 0's PHE public key (``which`` 0) or a ciphertext under it (2)."""
    from mplang.kernels.phe import decrypt_in_range

    pk, sk, c = _phe_run(sim)
    value, private = sim.held([pk, sk, c][which])[0], sim.held(sk)[0]

    def check(decoded: list[Any]) -> None:
        for d in decoded:
            if which == 0:
                assert d.raw == value.raw and d.fingerprint == value.fingerprint
            else:
                got = decrypt_in_range(private, d, phe.Ciphertext("int32", (2, 3), "k0", 1))
                np.testing.assert_array_equal(got, np.arange(6).reshape(2, 3))

    return [value], check


VALUES = {"phe.public_key": lambda sim: phe_values(sim, 0),
          "phe.ciphertext": lambda sim: phe_values(sim, 2)}
"""Codec kind -> a run giving values of that kind, and a check of decoded values."""
