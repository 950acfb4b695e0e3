"""Fixtures for the device-layer tests.

``make_spec`` builds custom clusters through `mp.ClusterSpec.from_dict` (one
PPU per node and one SPU over all of them); ``stored`` lists what each party's
object store holds, for the secrecy checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

import mplang as mp

SpecFactory = Callable[..., mp.ClusterSpec]


def spec_dict(n: int, protocol: str | None = None, field: str = "FM64",
              fxp_fraction_bits: int | None = None, spu: str = "S") -> dict[str, Any]:
    """Nodes ``n0..``, PPUs ``P0..`` and SPU ``spu`` over every node (``protocol`` None:
    the SPU kind's default for ``n`` members)."""
    config: dict[str, Any] = {"field": field}
    if protocol is not None:
        config["protocol"] = protocol
    if fxp_fraction_bits is not None:
        config["fxp_fraction_bits"] = fxp_fraction_bits
    devices: dict[str, Any] = {f"P{i}": {"kind": "PPU", "members": [f"n{i}"]} for i in range(n)}
    devices[spu] = {"kind": "SPU", "members": [f"n{i}" for i in range(n)], "config": config}
    return {"nodes": [{"name": f"n{i}", "endpoint": f"127.0.0.1:{7100 + i}"} for i in range(n)],
            "devices": devices}


@pytest.fixture
def make_spec() -> SpecFactory:
    """``make_spec(n, protocol=..., field=..., fxp_fraction_bits=...)`` -> a ClusterSpec."""

    def make(n: int, protocol: str | None = None, field: str = "FM64",
             fxp_fraction_bits: int | None = None, spu: str = "S") -> mp.ClusterSpec:
        return mp.ClusterSpec.from_dict(spec_dict(n, protocol, field, fxp_fraction_bits, spu))

    return make




def _stored(sim: mp.Simulator, rank: int) -> list[Any]:
    store = sim.mesh.workers[rank].store
    with store._lock:  # the store has no public listing; read it under its lock
        return [value for _, value in store._values.values()]


@pytest.fixture
def stored() -> Callable[[mp.Simulator, int], list[Any]]:
    """``stored(sim, rank)``: every value party ``rank``'s object store holds."""
    return _stored
