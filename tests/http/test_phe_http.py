"""A PHE program on real worker processes: keys, ciphertexts and results cross the wire
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
