"""Dependency analysis of graphs: use-def chains, topological levels,
independent sets, and the critical path and message rounds under a `CostModel`.

Start with `analyze` (``mp.analyze``); the modules also work on any `Graph`:
`usedef` (chains), `levels` (dependencies, levels), `cost_model` (per-op
estimates), `schedule` (critical path through regions), `report` (the result
and its table), and the round estimates of secure-device executables.
"""

from mplang.analysis.analyze import analyze
from mplang.analysis.cost_model import CostModel, OpCost, value_bytes
from mplang.analysis.levels import (
    Dependencies,
    independent_sets,
    op_dependencies,
    topological_levels,
)
from mplang.analysis.report import AnalysisReport, OpSummary
from mplang.analysis.schedule import GraphSchedule, OpEstimate, schedule
from mplang.analysis.usedef import GRAPH_INPUT, UseDef, build_use_def

__all__ = [
    "GRAPH_INPUT",
    "AnalysisReport",
    "CostModel",
    "Dependencies",
    "GraphSchedule",
    "OpCost",
    "OpEstimate",
    "OpSummary",
    "UseDef",
    "analyze",
    "build_use_def",
    "independent_sets",
    "op_dependencies",
    "schedule",
    "topological_levels",
    "value_bytes",
]
