"""The data corpus: tensor.load and simp.load (`tests.dialects.corpus`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mplang import simp, tensor


def data_corpus() -> Any:
    """tensor.load and simp.load: private inputs (types declared, since the corpus is
    compiled without a simulator to look them up)."""
    x = simp.pcall((0, 1), lambda: tensor.load("x.npy", dtype="int32", shape=(3,)))
    return x, simp.load(2, "v", dtype="int32", shape=(3,))


DATA_EXPECTED = ([[0, 1, 2], [0, 1, 2], None], [None, None, [7, 8, 9]])


def check(result: Any) -> None:
    for got, expected in zip(result, DATA_EXPECTED, strict=True):
        assert [None if v is None else np.asarray(v).tolist() for v in got] == expected
