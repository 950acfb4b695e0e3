"""`analyze`: dependency analysis and cost estimate of a program, as a report."""

from __future__ import annotations

from mplang.analysis.cost_model import CostModel
from mplang.analysis.report import AnalysisReport, build_report
from mplang.analysis.schedule import schedule
from mplang.edsl.errors import MPLangError
from mplang.edsl.graph import Graph
from mplang.edsl.program import Program
from mplang.runtime.backend import vet_program


def analyze(program: Program | Graph, cost_model: CostModel | None = None) -> AnalysisReport:
    """Levels, independent sets, critical path and rounds of ``program`` (or a bare `Graph`).

    The graph is verified first (`Graph.verify`): a malformed graph, such as
    ops that use each other's outputs, raises `MPVerifyError` naming the op. A received
    program (`mp.load`, `Program.from_bytes`) has its native payloads vetted before any
    is parsed, as the simulator does before running it (`MPSerializationError`).
    ``cost_model`` defaults to `CostModel()`.
    """
    model = cost_model if cost_model is not None else CostModel()
    if not isinstance(model, CostModel):
        raise MPLangError(f"analyze: cost_model must be a CostModel, got {model!r}")
    if isinstance(program, Program):
        vet_program(program)
        graph, name, world_size = program.graph, program.name, program.world_size
    elif isinstance(program, Graph):
        graph, name, world_size = program, "graph", None
    else:
        hint = " (compile it first: mp.compile(fn, world_size=n))" if callable(program) else ""
        raise MPLangError(f"analyze takes a Program or a Graph, got {program!r}{hint}")
    graph.verify()
    return build_report(schedule(graph, model), model, name, world_size)
