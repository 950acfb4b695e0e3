"""A worker's cluster spec file, reloaded when it changes. Certificates and drivers may
change while the worker runs (a key revoked or rotated, a driver added); its nodes,
their endpoints and the devices need a restart of every worker: ranks, links and the
devices' runtimes (their links and keys, the programs accepted and running) are made
from them, and workers that load such a change one by one would disagree on a
program's meaning while they do. A reload that changes them is refused, saying what
changed (`restart_changes`)."""

from __future__ import annotations

import os
from pathlib import Path

from mplang.cluster.peers import PeerDirectory
from mplang.device.cluster import ClusterSpec, ClusterSpecError, Device


def _device(d: Device) -> str:
    config = f", config {dict(d.config)}" if d.config else ""
    return f"kind {d.kind}, members {', '.join(d.members)}{config}"


def restart_changes(old: ClusterSpec, new: ClusterSpec) -> list[str]:
    """What ``new`` changes of ``old`` that only a restart of every worker applies."""
    changes = []
    old_nodes = [(n.name, n.endpoint) for n in old.nodes]
    new_nodes = [(n.name, n.endpoint) for n in new.nodes]
    if old_nodes != new_nodes:
        shown = ", ".join(f"{name} at {endpoint}" for name, endpoint in new_nodes)
        changes.append(f"the nodes change to {shown} (were "
                       f"{', '.join(f'{n} at {e}' for n, e in old_nodes)})")
    for name in sorted(set(old.devices) | set(new.devices)):
        before, after = old.devices.get(name), new.devices.get(name)
        if after is not None and before is None:
            changes.append(f"device {name!r} is added ({_device(after)})")
        elif before is not None and after is None:
            changes.append(f"device {name!r} is removed (was {_device(before)})")
        elif before is not None and after is not None and before != after:
            changes.append(f"device {name!r} changes to {_device(after)} (was "
                           f"{_device(before)})")
    return changes


class SpecFile:
    """The spec file a worker was started with, and when it last changed."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self._mtime = self.path.stat().st_mtime_ns

    def changed_peers(self, old: PeerDirectory, rank: int,
                      fingerprint: str) -> PeerDirectory | None:
        """The peers of the file's new spec when it changed since the last call (None when
        it did not). Raises `ClusterSpecError` when the new spec is invalid, changes what
        needs a restart, or gives node ``rank`` a certificate other than ``fingerprint``."""
        try:
            mtime = self.path.stat().st_mtime_ns
        except OSError:
            return None
        if mtime == self._mtime:
            return None
        self._mtime = mtime
        spec = ClusterSpec.from_yaml(self.path)
        changes = restart_changes(old.spec, spec)
        if changes:
            raise ClusterSpecError(f"{'; '.join(changes)}: nodes, endpoints and devices "
                                   "change only when every worker restarts with the new spec")
        peers = PeerDirectory(spec)
        if peers.node_certificate(rank).fingerprint != fingerprint:
            raise ClusterSpecError(f"the new spec gives {spec.nodes[rank].name} another "
                                   "certificate: restart this worker with its new key")
        return peers
