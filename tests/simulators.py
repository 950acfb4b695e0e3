"""`simulated`: the one definition of a test module's simulator fixture."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import pytest

import mplang as mp


def simulated(cluster: int | mp.ClusterSpec = 3, *,
              scope: Literal["function", "module"] = "module", **options: Any) -> Any:
    """A fixture giving ``mp.Simulator(cluster, **options)``, shared by the tests of its
    ``scope`` and closed after them. In a test module: ``sim = simulated(2,
    policies="open")``; the fixture takes the name it is assigned to."""
    @pytest.fixture(scope=scope)
    def fixture() -> Iterator[mp.Simulator]:
        with mp.Simulator(cluster, **options) as simulator:
            yield simulator

    return fixture
