"""The ``simp`` API as users see it: the dialect's primitives plus the context factories."""

from mplang.backends.simp_driver.http import make_driver
from mplang.backends.simp_driver.mem import make_simulator
from mplang.dialects.simp import (
    constant,
    converge,
    load,
    pcall,
    prank,
    shuffle,
    shuffle_static,
    uniform_cond,
    while_loop,
)

__all__ = [
    "constant",
    "converge",
    "load",
    "make_driver",
    "make_simulator",
    "pcall",
    "prank",
    "shuffle",
    "shuffle_static",
    "uniform_cond",
    "while_loop",
]
