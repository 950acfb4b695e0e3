"""Shared fixtures for the execution-side tests.

``sim`` is a 3-party in-memory simulator; ``world`` is a simulator of each of
the world sizes in ``WORLD_SIZES`` (parametrized); ``mode`` is each of the two
driver execution modes. Every simulator is closed after its test.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest

import mplang as mp
from tests.simulators import simulated

WORLD_SIZES = (2, 3, 10, 32)
"""World sizes the multi-party semantics are checked on (32 is the slow one)."""

MODES = ("launch", "standard")
"""The two execution modes of `mp.evaluate`."""


sim = simulated(3, scope="function")
"""A 3-party simulator, closed after the test."""


sim2 = simulated(2, scope="function")
"""A 2-party simulator, closed after the test."""


@pytest.fixture(params=WORLD_SIZES, ids=lambda n: f"world{n}")
def world(request: pytest.FixtureRequest) -> Iterator[mp.Simulator]:
    """A simulator of each world size in ``WORLD_SIZES``, closed after the test."""
    simulator = mp.Simulator(request.param)
    try:
        yield simulator
    finally:
        simulator.close()


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """``"launch"`` and ``"standard"``, the modes of `mp.evaluate`."""
    return str(request.param)



def _eventually(condition: Callable[[], bool], timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def eventually() -> Callable[..., bool]:
    """Poll a condition until it holds: parties free collected objects asynchronously."""
    return _eventually
