"""A document's simulators as worker processes: `install` makes ``mp.Simulator(cluster,
data_roots=..., policies=...)`` start one ``mplang worker`` per node of ``cluster``
(`mplang.cluster.local.LocalCluster`, development keys) and return an ``mp.Driver`` for
them, which stops the workers when closed.

- ``data_roots``: each node's worker reads that folder (others: ``./data/NODE``, as the
  simulator's parties do);
- ``policies``: each node's worker runs the policy file the simulator would judge by
  (a folder of ``NODE.yaml`` or a mapping of nodes to files or to ``Policy`` objects,
  whose text it writes; default: the policy
  `mplang init` writes); ``"open"``, which a worker cannot be, becomes `OPEN`, a policy
  under which the parties let everything go;
- ``budget(node)`` asks ``node``'s worker for its privacy budget ledger (``mplang budget``).

``python tests/docs/markdown_blocks.py FILE.md --cwd DIR --workers`` runs a tutorial so.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import mplang as mp
from mplang.cluster.local import LocalCluster
from mplang.driver.upload_client import budget
from mplang.policy.policy import Policy
from tests.worker.support import free_ports

OPEN = """\
drivers: [driver]
plaintext_to: ["*"]
protocols: [SEMI2K, ABY3, CHEETAH, REF2K]
psi_protocols: [rr22, kkrt, ecdh, ecdh_cardinality, aby3, ecdh_3pc, ecdh_npc, kkrt_npc,
                ecdh_oprf_ub]
writes: ["**"]
"""
"""What ``policies="open"`` becomes on a worker: every party's data may go to anyone."""

STARTED: list[str] = []
"""A line per cluster `install`'s simulators started: its nodes and their policies."""


def _on_workers(cluster: mp.ClusterSpec | int = 3, *,
                data_roots: Mapping[str, str | os.PathLike[str]] | None = None,
                policies: Mapping[str, Any] | str | os.PathLike[str] | None = None,
                **options: Any) -> Any:
    spec = cluster if isinstance(cluster, mp.ClusterSpec) else mp.ClusterSpec.simple(cluster)
    data = spec.to_dict()  # ports free now: a document may run two clusters at once
    for node, port in zip(data["nodes"], free_ports(len(data["nodes"])), strict=True):
        node["endpoint"] = f"127.0.0.1:{port}"
    spec = mp.ClusterSpec.from_dict(data)
    names = [n.name for n in spec.nodes]
    local = LocalCluster(spec)
    roots = Path(local.spec_path).parent / "data"
    roots.mkdir()
    for name in names:  # the simulator's default: ./data/NODE
        source = Path((data_roots or {}).get(name, Path("data") / name)).resolve()
        source.mkdir(parents=True, exist_ok=True)
        (roots / name).symlink_to(source, target_is_directory=True)
    local.data_root = roots
    folder = Path(local.spec_path).parent / "policies"
    if policies == "open":
        for name in names:
            (folder / f"{name}.yaml").write_text(OPEN)
    elif policies is not None:
        chosen = {n: Path(policies) / f"{n}.yaml" for n in names} \
            if isinstance(policies, (str, os.PathLike)) else dict(policies)
        for name, chosen_policy in chosen.items():  # a file, or a Policy (its text)
            if isinstance(chosen_policy, Policy):
                (folder / f"{name}.yaml").write_text(chosen_policy.text)
            elif Path(chosen_policy).exists():
                shutil.copyfile(chosen_policy, folder / f"{name}.yaml")
    described = "open" if policies == "open" else "init" if policies is None else "files"
    STARTED.append(f"{len(names)} workers, policies {described}")
    local.start()
    driver = local.driver(**{k: v for k, v in options.items() if k == "timeout"})
    close = driver.close

    def close_all() -> None:
        try:
            close()
        finally:
            local.close()

    driver.close = close_all
    driver.budget = lambda node: budget(local.spec_path, node,  # as the simulator's
                                        key=local.keys_dir / f"{node}.key")
    return driver


def install() -> None:
    """Make ``mp.Simulator`` start workers (`_on_workers`)."""
    mp.Simulator = _on_workers  # type: ignore[misc,assignment]
