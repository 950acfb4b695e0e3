"""The ``simp`` API as users see it: the dialect's primitives plus the context factories."""

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
from mplang.driver.http import make_driver
from mplang.driver.mem import make_simulator

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
