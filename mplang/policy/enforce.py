"""Policies in the runtimes: guards for simulated parties, policy files for workers."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mplang.device.cluster import ClusterSpec
from mplang.edsl.errors import MPLangError
from mplang.policy.check import Guard
from mplang.policy.policy import Policy


def as_policy(policy: Policy | str | os.PathLike[str]) -> Policy:
    """``policy`` itself, or the policy file it names."""
    return policy if isinstance(policy, Policy) else Policy.load(policy)


def install_guards(workers: Sequence[Any], cluster: ClusterSpec,
                   policies: Mapping[str, Policy | str | os.PathLike[str]]) -> None:
    """Give each simulated worker whose node ``policies`` names a `Guard`."""
    names = [n.name for n in cluster.nodes]
    unknown = sorted(set(policies) - set(names))
    if unknown:
        raise MPLangError(f"policies names nodes {unknown} that the cluster does not have "
                          f"(its nodes: {', '.join(names)})")
    for node, policy in policies.items():
        rank = names.index(node)
        workers[rank].guard = Guard(as_policy(policy), rank, names)


def node_policy(node: str, path: str | os.PathLike[str] | None,
                spec_path: str | os.PathLike[str] | None) -> Policy:
    """``node``'s policy: the file ``path``, else ``policies/<node>.yaml`` next to the spec
    if it exists, else `Policy.default`."""
    if path is None and spec_path is not None:
        candidate = Path(spec_path).parent / "policies" / f"{node}.yaml"
        path = candidate if candidate.exists() else None
    return Policy.load(path) if path is not None else Policy.default()


def worker_policy(cluster: ClusterSpec, node: str, path: str | os.PathLike[str] | None,
                  spec_path: str | os.PathLike[str] | None) -> Guard:
    """The guard of HTTP worker ``node``: its policy file ``path``, else
    ``policies/<node>.yaml`` next to the spec if it exists, else `Policy.default`."""
    policy = node_policy(node, path, spec_path)
    names = [n.name for n in cluster.nodes]
    return Guard(policy, names.index(node), names, driver_names(cluster))


def driver_names(cluster: ClusterSpec) -> dict[str, str]:
    """The names of ``cluster``'s drivers by certificate fingerprint (`Guard.drivers`)."""
    return {d.certificate.fingerprint: d.name for d in cluster.drivers}
