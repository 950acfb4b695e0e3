"""``mplang check``: each party's data flows in a saved program and its verdict."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from mplang.cluster.commitments import program_digest
from mplang.device.cluster import ClusterSpec
from mplang.edsl.graph import Graph
from mplang.edsl.program import load
from mplang.edsl.typing import MPType
from mplang.flows.engine import PartyLabels
from mplang.flows.labels import Flow
from mplang.policy.check import check
from mplang.policy.enforce import node_policy, simulated_policies
from mplang.policy.policy import Policy
from mplang.runtime.backend import vet_program


def check_program(cluster_path: str | os.PathLike[str] | None,
                  program_path: str | os.PathLike[str],
                  policy_path: str | os.PathLike[str] | None = None, node: str | None = None,
                  out: Callable[[str], None] = print, *,
                  policies: str | os.PathLike[str] | None = None,
                  data_root: str | os.PathLike[str] | None = None) -> bool:
    """Print the program digest, then for ``node`` (default: every node) its data flows
    and its verdict under ``policy_path`` (default: each node's own policy, as its worker
    would load it: ``policies/<node>.yaml`` next to the spec, else `Policy.default`).
    Without a spec (``cluster_path`` None) the nodes are the simulator's for the
    program's parties, each with ``policies/NODE.yaml`` if the folder ``policies`` has
    it, else the policy ``mplang init`` writes; ``data_root`` (a folder per node) is
    checked to hold the files each node's data the program loads. Whether every checked
    node accepts the program."""
    program = load(program_path)
    cluster = ClusterSpec.from_yaml(cluster_path) if cluster_path is not None \
        else ClusterSpec.simple(program.world_size)
    vet_program(program)  # before the rules parse its payloads, as a worker would
    names = [n.name for n in cluster.nodes]
    given = Policy.load(policy_path) if policy_path is not None else None
    digest = program_digest(program.graph, cluster.world_size)
    out(f"program {program.name}: digest {digest}")
    simulated = simulated_policies(cluster, policies if policies and Path(policies).is_dir()
                                   else None) if cluster_path is None else None
    accepted = True
    for rank in [cluster.rank_of(node)] if node is not None else range(cluster.world_size):
        policy = given or (simulated[names[rank]] if simulated is not None
                           else node_policy(names[rank], None, cluster_path))
        verdict = check(program.graph, cluster.world_size, rank, policy, names=names,
                        digest=digest, input_labels=earlier_inputs(program.graph, rank))
        out(f"{names[rank]} ({policy.source}): "
            + ("accepts" if verdict.accepted else "REFUSES"))
        if program.graph.inputs:
            out(f"  note: the program's {len(program.graph.inputs)} input(s) come from "
                "earlier runs and count as this node's raw data here; its worker judges "
                "them by what they hold")
        root = Path(data_root or ".") / names[rank]
        for name in verdict.sources if data_root is not None else ():
            if not (root / name).exists():
                out(f"  note: the program loads {name}, which {root} does not hold")
        for flow in verdict.flows or ["no data of this node leaves it"]:
            out(f"  flow: {flow}")
        for reason in verdict.reasons:
            out(f"  refused: {reason}")
        accepted = accepted and verdict.accepted
    return accepted


def earlier_inputs(graph: Graph, rank: int) -> list[PartyLabels | None]:
    """Labels of ``graph``'s inputs at party ``rank``: each input it may hold is an
    earlier run's output, possibly its data as it is (raw), since this check cannot
    see what that run recorded."""
    labels: list[PartyLabels | None] = []
    for i, v in enumerate(graph.inputs):
        t = v.type
        held = not isinstance(t, MPType) or t.pmask is None or rank in t.pmask
        labels.append({rank: Flow("raw", frozenset([f"input {i}"]))} if held else None)
    return labels
