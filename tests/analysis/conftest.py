"""Shared fixture of the analysis tests: a cost model with round numbers."""

from __future__ import annotations

import pytest

from mplang.analysis import CostModel


@pytest.fixture
def model() -> CostModel:
    """0.5 s latency, 1000 B/s, 0.01 s per local op plus 0.001 s per element."""
    return CostModel(latency_s=0.5, bandwidth_bytes_per_s=1000.0, op_s=0.01, element_s=0.001)
