"""The simp corpus: every simp primitive (`tests.dialects.corpus`)."""

from __future__ import annotations

from typing import Any

import numpy as np

from mplang import simp


def simp_corpus() -> Any:
    """Every simp primitive."""
    a = simp.constant((0,), np.int32(5))
    b = simp.constant((1,), np.int32(7))
    both = simp.converge(a, b)                       # 5 on party 0, 7 on party 1
    moved = simp.shuffle_static(both, {2: 0})        # 5 on party 2
    all3 = simp.converge(both, moved)                # [5, 7, 5]
    idx = (simp.prank() + 1) % 3                     # [1, 2, 0]
    got = simp.shuffle(all3, idx)                    # [7, 5, 5]
    flag = simp.constant((0, 1, 2), True)
    doubled = simp.uniform_cond(flag, lambda v: v * 2, lambda v: v - 1, got)
    _, acc = simp.while_loop(lambda s: s[0] < 3, lambda s: (s[0] + 1, s[1] + got),
                             (simp.constant((0, 1, 2), np.int32(0)), doubled))
    return all3, got, acc


SIMP_EXPECTED = ([5, 7, 5], [7, 5, 5], [14 + 21, 10 + 15, 10 + 15])


def check(result: Any) -> None:
    assert [[int(v) for v in part] for part in result] == [list(e) for e in SIMP_EXPECTED]
