"""Policies in the runtimes: guards for simulated parties, policy files for workers."""

from __future__ import annotations

import hashlib
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mplang.device.cluster import ClusterSpec
from mplang.edsl.errors import MPLangError
from mplang.policy.check import Guard
from mplang.policy.policy import Policy, PolicyError


def as_policy(policy: Policy | str | os.PathLike[str]) -> Policy:
    """``policy`` itself, or the policy file it names."""
    return policy if isinstance(policy, Policy) else Policy.load(policy)


def simulated_policies(cluster: ClusterSpec, policies: Mapping[str, Policy | str |
                       os.PathLike[str]] | str | os.PathLike[str] | None
                       ) -> dict[str, Policy] | None:
    """Each simulated node's policy: the one ``policies`` maps it to, else
    ``policies/NODE.yaml`` in the folder ``policies`` names, else the one ``mplang init``
    writes for it; None for ``policies="open"``."""
    from mplang.cluster.local import init_policies

    names = [n.name for n in cluster.nodes]
    if isinstance(policies, str) and policies == "open":
        return None
    chosen: Mapping[str, Policy | str | os.PathLike[str]] = {}
    if isinstance(policies, (str, os.PathLike)):
        folder = Path(policies)
        if not folder.is_dir():
            raise MPLangError(f"policies={os.fspath(policies)!r} is not a folder of NODE.yaml "
                              "files (give a folder, a mapping of nodes to policies, or 'open')")
        chosen = {n: folder / f"{n}.yaml" for n in names if (folder / f"{n}.yaml").exists()}
    elif policies is not None:
        chosen = policies
    unknown = sorted(set(chosen) - set(names))
    if unknown:
        raise MPLangError(f"policies names nodes {unknown} that the cluster does not have "
                          f"(its nodes: {', '.join(names)})")
    defaults = init_policies(cluster)
    return {n: as_policy(chosen[n]) if n in chosen else defaults[n] for n in names}


def install_guards(workers: Sequence[Any], cluster: ClusterSpec,
                   policies: Mapping[str, Policy | str | os.PathLike[str]] | str | os.PathLike[str]
                   | None) -> None:
    """Give each simulated worker a `Guard` of its node's `simulated_policies`;
    ``policies="open"`` installs none and says so."""
    chosen = simulated_policies(cluster, policies)
    if chosen is None:
        print("mplang: Simulator(policies='open'): no party checks any policy; workers with "
              "the policies `mplang init` writes may refuse what runs here", file=sys.stderr)
        return
    names = [n.name for n in cluster.nodes]
    for rank, node in enumerate(names):
        workers[rank].guard = Guard(chosen[node], rank, names)


def node_policy(node: str, path: str | os.PathLike[str] | None,
                spec_path: str | os.PathLike[str] | None) -> Policy:
    """``node``'s policy: the file ``path``, else ``policies/<node>.yaml`` next to the spec
    if it exists, else `Policy.default`."""
    if path is None and spec_path is not None:
        candidate = Path(spec_path).parent / "policies" / f"{node}.yaml"
        path = candidate if candidate.exists() else None
    return Policy.load(path) if path is not None else Policy.default()


def worker_policy(cluster: ClusterSpec, node: str, path: str | os.PathLike[str] | None,
                  spec_path: str | os.PathLike[str] | None) -> tuple[Guard, PolicyFile | None]:
    """The guard of HTTP worker ``node`` and the policy file it watches: ``path``, else
    ``policies/<node>.yaml`` next to the spec (the default policy while it does not
    exist), else none (`Policy.default`)."""
    file = PolicyFile(path) if path is not None else None if spec_path is None else \
        PolicyFile(Path(spec_path).parent / "policies" / f"{node}.yaml", required=False)
    names = [n.name for n in cluster.nodes]
    return Guard(file.policy if file else Policy.default(), names.index(node), names,
                 driver_names(cluster)), file


def _read(path: Path) -> tuple[bytes | None, str | None]:
    """The file's bytes and their SHA-256 (None, None: it cannot be read)."""
    try:
        return (data := path.read_bytes()), hashlib.sha256(data).hexdigest()
    except OSError:
        return None, None


class PolicyFile:
    """A worker's policy file, loaded again when its bytes change and then stay the same
    for one more call (`reload`: a file caught half-written is not taken): an edit that
    does not load keeps the policy in force, and `failed` says why until one does. A
    file not ``required`` stands for the default policy while it does not exist."""

    def __init__(self, path: str | os.PathLike[str], required: bool = True):
        self.path = Path(path)
        self.digest = self._seen = self._pending = _read(self.path)[1]
        """The SHA-256 of the file whose policy is in force (None: the default policy)."""
        self.policy = Policy.load(self.path) if required or self.digest else Policy.default()
        self.failed: str | None = None

    def reload(self) -> Policy | None:
        """The file's policy if its bytes changed, the same at this call as at the last,
        else None; raises `PolicyError` naming the file (and line) if it does not load."""
        data, seen = _read(self.path)
        if seen == self._seen or seen != self._pending:
            self._pending = seen
            return None
        self._seen = seen
        try:
            policy = Policy.load(self.path) if data is None else \
                Policy.parse(data.decode("utf-8"), str(self.path))
        except (PolicyError, ValueError) as e:  # ValueError: the bytes are not UTF-8
            self.failed = str(e) if isinstance(e, PolicyError) else \
                f"cannot read policy {self.path}: {e}"
            raise PolicyError(self.failed) from None
        self.policy, self.digest, self.failed = policy, seen, None
        return policy

    def state(self) -> dict[str, str]:
        """The policy in force, and why the file's latest edit is not (``/health``)."""
        shown = f"{self.path} (sha256 {self.digest[:16]}...)" if self.digest else \
            f"the default policy ({self.path} does not exist)"
        return {"policy": shown} | ({"policy_reload_failed": self.failed} if self.failed else {})


def driver_names(cluster: ClusterSpec) -> dict[str, str]:
    """The names of ``cluster``'s drivers by certificate fingerprint (`Guard.drivers`)."""
    return {d.certificate.fingerprint: d.name for d in cluster.drivers}
