"""Fixtures of the PHE tests: a simulator and 1024-bit keys (fast; production uses 2048)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import mplang as mp

pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")

KEY_BITS = 1024


@pytest.fixture(scope="module")
def sim2() -> Iterator[mp.Simulator]:
    sim = mp.Simulator(2)
    try:
        yield sim
    finally:
        sim.close()
