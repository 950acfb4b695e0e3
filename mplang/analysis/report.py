"""`AnalysisReport`: the result of `mp.analyze`, with a plain-text table as ``str``."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from mplang.analysis.cost_model import CostModel
from mplang.analysis.schedule import GraphSchedule
from mplang.analysis.usedef import UseDef
from mplang.edsl.graph import Graph, Operation
from mplang.util.tables import html_table

_OUTPUTS_WIDTH = 40


@dataclass(frozen=True)
class OpSummary:
    """One top-level op as the report lists it."""

    index: int
    opcode: str
    label: str
    """The opcode with the op's function name if it has one, e.g. ``simp.pcall[square]``."""
    outputs: str
    """The op's results with their types, e.g. ``%4: i32[]@{1}``."""
    level: int
    cost_s: float
    """Estimated seconds, its regions included."""
    rounds: int
    start_s: float
    """Earliest start: when the last op it depends on finishes."""
    depth: int
    """Ops the op puts on a dependency chain: 1, or for an op with regions, from its regions."""
    nested_ops: int
    critical: bool
    """Whether the op is on the reported critical path."""


@dataclass(frozen=True)
class AnalysisReport:
    """Dependency analysis and cost estimate of a program's graph.

    ``levels`` lists op indices of the top-level graph by level (entry 0 is
    level 1); ``ops[i]`` describes op ``i``. Ops of one level never depend on
    each other, so each level is an independent set and ``max_parallelism``
    is the size of the largest. ``critical_path`` is in seconds under
    ``cost_model``; ``rounds`` the longest chain of message rounds. Regions
    are analysed inside: ``num_ops`` and ``op_counts`` include their ops,
    ``nested_depth`` counts the longest chain with regions expanded, and
    `region` gives the analysis of an op's regions.
    """

    name: str
    world_size: int | None
    cost_model: CostModel
    num_ops: int
    num_top_level_ops: int
    depth: int
    nested_depth: int
    critical_path: float
    critical_ops: tuple[int, ...]
    max_parallelism: int
    rounds: int
    levels: list[list[int]] = field(repr=False)
    ops: list[OpSummary] = field(repr=False)
    op_counts: dict[str, int] = field(repr=False)
    schedule: GraphSchedule = field(repr=False)

    @property
    def graph(self) -> Graph:
        """The analyzed top-level graph."""
        return self.schedule.graph

    @property
    def use_def(self) -> UseDef:
        """Definer and users of every value of the top-level graph."""
        return self.schedule.use_def

    @property
    def independent_sets(self) -> list[list[int]]:
        """The levels with more than one op."""
        return [lv for lv in self.levels if len(lv) > 1]

    def dependencies(self, index: int) -> tuple[int, ...]:
        """The ops that op ``index`` waits for (its data, and the effect order)."""
        return self.schedule.deps.preds[index]

    def users(self, index: int) -> tuple[int, ...]:
        """The ops waiting for op ``index``."""
        return self.schedule.deps.succs[index]

    def region(self, index: int) -> tuple[GraphSchedule, ...]:
        """The analyses of the regions of op ``index`` (empty for ops without regions)."""
        return self.schedule.regions.get(index, ())

    def __str__(self) -> str:
        return format_report(self)

    def _repr_html_(self) -> str:
        return html_report(self)


def op_label(op: Operation) -> str:
    fn = op.attrs.get("fn") or op.attrs.get("callee")
    return f"{op.opcode}[{fn}]" if isinstance(fn, str) else op.opcode


def build_report(schedule: GraphSchedule, cost_model: CostModel, name: str,
                 world_size: int | None) -> AnalysisReport:
    graph = schedule.graph
    critical = set(schedule.critical_ops)
    ops = []
    for i, op in enumerate(graph.operations):
        estimate = schedule.estimates[i]
        outputs = ", ".join(f"%{v.name}: {v.type}" for v in op.outputs)
        ops.append(OpSummary(i, op.opcode, op_label(op), outputs, schedule.level[i],
                             estimate.cost.seconds, estimate.cost.rounds, schedule.start_s[i],
                             estimate.depth, estimate.nested_ops, i in critical))
    counts = Counter(op.opcode for op in graph.walk())
    return AnalysisReport(
        name=name, world_size=world_size, cost_model=cost_model,
        num_ops=schedule.num_ops, num_top_level_ops=len(graph.operations),
        depth=schedule.depth, nested_depth=schedule.nested_depth,
        critical_path=schedule.critical_path_s, critical_ops=schedule.critical_ops,
        max_parallelism=schedule.max_parallelism, rounds=schedule.rounds,
        levels=schedule.levels, ops=ops, op_counts=dict(sorted(counts.items())),
        schedule=schedule)


def format_seconds(seconds: float) -> str:
    """``seconds`` with a readable unit, 4 significant digits."""
    if seconds == 0:
        return "0 s"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds / 1e-9:.4g} ns"


def _format_rate(bytes_per_s: float) -> str:
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_s >= scale:
            return f"{bytes_per_s / scale:.4g} {unit}"
    return f"{bytes_per_s:.4g} B/s"


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[:width - 3] + "..."


def _summary(report: AnalysisReport) -> list[tuple[str, str]]:
    m = report.cost_model
    in_regions = report.num_ops - report.num_top_level_ops
    summary = [
        ("ops", f"{report.num_ops} ({report.num_top_level_ops} top level, "
                f"{in_regions} in regions)"),
        ("depth", f"{report.depth} levels (nested depth {report.nested_depth})"),
        ("max parallelism", str(report.max_parallelism)),
        ("critical path", f"{format_seconds(report.critical_path)} "
                          f"({len(report.critical_ops)} ops, marked *)"),
        ("rounds", str(report.rounds)),
        ("cost model", f"latency {format_seconds(m.latency_s)}, bandwidth "
                       f"{_format_rate(m.bandwidth_bytes_per_s)}, op {format_seconds(m.op_s)} "
                       f"+ {format_seconds(m.element_s)}/element, share x{m.share_factor:g}, "
                       f"loop iterations {m.loop_iterations}"),
    ]
    return summary


_HEADER = ("level", "op", "operation", "outputs", "cost", "start", "rounds", "")


def _rows(report: AnalysisReport) -> list[tuple[str, ...]]:
    """One row per top-level op, grouped by level (the level on its first op)."""
    rows: list[tuple[str, ...]] = []
    for lv, indices in enumerate(report.levels, 1):
        for n, i in enumerate(indices):
            s = report.ops[i]
            label = s.label + (f" +{s.nested_ops} in regions" if s.nested_ops else "")
            rows.append((str(lv) if n == 0 else "", f"#{i}", label,
                         _clip(s.outputs, _OUTPUTS_WIDTH), format_seconds(s.cost_s),
                         format_seconds(s.start_s), str(s.rounds), "*" if s.critical else ""))
    return rows


def _title(report: AnalysisReport) -> str:
    where = f" ({report.world_size} parties)" if report.world_size is not None else ""
    return f"analysis of @{report.name}{where}"


def html_report(report: AnalysisReport) -> str:
    """The report as two HTML tables (what a notebook shows): the summary, then the ops."""
    return (html_table(("", ""), _summary(report), _title(report))
            + html_table((*_HEADER[:-1], "critical"), _rows(report)))


def format_report(report: AnalysisReport) -> str:
    """Summary lines, then one row per top-level op grouped by level."""
    summary, header, rows = _summary(report), _HEADER, _rows(report)
    key_width = max(len(k) for k, _ in summary)
    lines = [_title(report)]
    lines += [f"  {k.ljust(key_width)}  {v}" for k, v in summary]
    if not rows:
        return "\n".join([*lines, "", "(no ops)"])
    widths = [max(len(r[c]) for r in (header, *rows)) for c in range(len(header))]
    right = {0, 1, 4, 5, 6}

    def row(cells: tuple[str, ...]) -> str:
        parts = [c.rjust(w) if k in right else c.ljust(w)
                 for k, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "  ".join(parts).rstrip()

    lines += ["", row(header), "  ".join("-" * w for w in widths[:-1])]
    lines += [row(r) for r in rows]
    return "\n".join(lines)
