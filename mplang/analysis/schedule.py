"""Critical path and rounds of a graph under a `CostModel`, through its regions.

Every op gets an estimate: ops without regions from `cost_model.leaf_cost`,
ops with regions from the analyses of their regions, by their ``regions``
trait (`REGION_RULES`): a call costs its body; a branch one predicate check
plus its costlier branch; a loop with ``n = loop_iterations``: ``(n + 1) *
(cond + check) + n * body``. Along the
dependencies of `levels.op_dependencies`, an op starts when the last op it
depends on finishes; the critical path is the latest finish, the rounds the
longest chain counted in message rounds.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from mplang.analysis.cost_model import CostModel, OpCost, leaf_cost, predicate_check
from mplang.analysis.levels import Dependencies, op_dependencies, op_levels
from mplang.analysis.usedef import UseDef, build_use_def
from mplang.edsl.graph import Graph, Operation


@dataclass(frozen=True)
class OpEstimate:
    """One op's estimate: its cost and the ops it contributes to a dependency chain."""

    cost: OpCost
    depth: int
    """Ops on the op's own longest chain: 1 without regions, else from its regions."""
    nested_ops: int = 0
    """Ops inside its regions, recursively."""


@dataclass(frozen=True)
class GraphSchedule:
    """The dependency analysis and cost estimate of one graph (and, inside, its regions)."""

    graph: Graph
    use_def: UseDef
    deps: Dependencies
    level: tuple[int, ...]
    """The level of each op (1 for ops that depend on nothing)."""
    estimates: tuple[OpEstimate, ...]
    start_s: tuple[float, ...]
    """Earliest start of each op: when the last op it depends on finishes."""
    finish_s: tuple[float, ...]
    start_round: tuple[int, ...]
    """Rounds completed on the longest chain before each op starts."""
    critical_path_s: float
    critical_ops: tuple[int, ...]
    """The ops on one critical path, first to last."""
    rounds: int
    nested_depth: int
    """The longest dependency chain counted in ops, regions expanded."""
    num_ops: int
    """Ops of the graph and of all its regions."""
    regions: dict[int, tuple[GraphSchedule, ...]] = field(default_factory=dict)
    """The schedules of the regions of each op that has regions."""

    @property
    def levels(self) -> list[list[int]]:
        """Op indices by level: entry 0 holds the level-1 ops."""
        out: list[list[int]] = [[] for _ in range(max(self.level, default=0))]
        for index, lv in enumerate(self.level):
            out[lv - 1].append(index)
        return out

    @property
    def depth(self) -> int:
        """The number of levels."""
        return max(self.level, default=0)

    @property
    def max_parallelism(self) -> int:
        """The size of the largest level."""
        return max((len(lv) for lv in self.levels), default=0)


RegionRule = Callable[[Operation, Sequence[GraphSchedule], CostModel], OpEstimate]


def _call(op: Operation, regions: Sequence[GraphSchedule], model: CostModel) -> OpEstimate:
    """Calls and unknown ops with regions: their regions one after another."""
    return OpEstimate(OpCost(sum(r.critical_path_s for r in regions),
                             sum(r.rounds for r in regions)),
                      sum(r.nested_depth for r in regions))


def _uniform_cond(op: Operation, regions: Sequence[GraphSchedule],
                  model: CostModel) -> OpEstimate:
    check = predicate_check(model) if op.attrs.get("verify_uniform", True) else OpCost(0.0)
    return OpEstimate(OpCost(check.seconds + max(r.critical_path_s for r in regions),
                             check.rounds + max(r.rounds for r in regions)),
                      max(r.nested_depth for r in regions))


def _while_loop(op: Operation, regions: Sequence[GraphSchedule],
                model: CostModel) -> OpEstimate:
    cond, body = regions
    n, check = model.loop_iterations, predicate_check(model)
    return OpEstimate(
        OpCost((n + 1) * (cond.critical_path_s + check.seconds) + n * body.critical_path_s,
               (n + 1) * (cond.rounds + check.rounds) + n * body.rounds),
        (n + 1) * cond.nested_depth + n * body.nested_depth)


REGION_RULES: dict[str | None, RegionRule] = {
    "call": _call,
    "branch": _uniform_cond,
    "loop": _while_loop,
}
"""How an op's estimate follows from its regions', by the op's ``regions`` trait
(default: `_call`)."""


def schedule(graph: Graph, model: CostModel) -> GraphSchedule:
    """Analyse ``graph`` and, recursively, its regions under ``model``."""
    use_def = build_use_def(graph)
    deps = op_dependencies(graph)
    level = op_levels(graph, deps)  # also rejects dependency cycles
    estimates: list[OpEstimate] = []
    regions: dict[int, tuple[GraphSchedule, ...]] = {}
    for index, op in enumerate(graph.operations):
        if op.regions:
            inner = tuple(schedule(r, model) for r in op.regions)
            regions[index] = inner
            estimate = REGION_RULES.get(op.traits.regions, _call)(op, inner, model)
            nested = sum(r.num_ops for r in inner)
            estimates.append(OpEstimate(estimate.cost, estimate.depth, nested))
        else:
            estimates.append(OpEstimate(leaf_cost(op, model), 1))
    order = sorted(range(len(level)), key=lambda i: (level[i], i))
    start = [0.0] * len(order)
    finish = [0.0] * len(order)
    start_round = [0] * len(order)
    chain = [0] * len(order)
    for i in order:
        preds = deps.preds[i]
        start[i] = max((finish[p] for p in preds), default=0.0)
        finish[i] = start[i] + estimates[i].cost.seconds
        start_round[i] = max((start_round[p] + estimates[p].cost.rounds for p in preds),
                             default=0)
        chain[i] = estimates[i].depth + max((chain[p] for p in preds), default=0)
    critical = _critical_ops(deps, finish)
    return GraphSchedule(
        graph=graph, use_def=use_def, deps=deps, level=tuple(level),
        estimates=tuple(estimates), start_s=tuple(start), finish_s=tuple(finish),
        start_round=tuple(start_round),
        critical_path_s=max(finish, default=0.0),
        critical_ops=critical,
        rounds=max((start_round[i] + estimates[i].cost.rounds for i in order), default=0),
        nested_depth=max(chain, default=0),
        num_ops=len(order) + sum(e.nested_ops for e in estimates),
        regions=regions)


def _critical_ops(deps: Dependencies, finish: list[float]) -> tuple[int, ...]:
    """One longest path: from the latest-finishing op back along the latest predecessor."""
    if not finish:
        return ()
    node = max(range(len(finish)), key=lambda i: (finish[i], -i))
    path = [node]
    while deps.preds[node]:
        node = max(deps.preds[node], key=lambda p: (finish[p], -p))
        path.append(node)
    return tuple(reversed(path))
