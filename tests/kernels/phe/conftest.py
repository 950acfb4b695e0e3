"""Fixtures of the PHE tests: a simulator and 1024-bit keys (fast; production uses 2048)."""

from __future__ import annotations

import pytest

from tests.simulators import simulated

pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")

KEY_BITS = 1024


sim2 = simulated(2)
