"""A worker's cluster spec file, reloaded when it changes. Certificates and drivers may
change while the worker runs (a key revoked or rotated, a driver added); its nodes,
their endpoints and the devices need a restart."""

from __future__ import annotations

import os
from pathlib import Path

from mplang.cluster.peers import PeerDirectory
from mplang.device.cluster import ClusterSpec, ClusterSpecError


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
        if [(n.name, n.endpoint) for n in spec.nodes] != \
                [(n.name, n.endpoint) for n in old.spec.nodes] or spec.devices != old.spec.devices:
            raise ClusterSpecError("nodes, endpoints and devices can change only with a restart")
        peers = PeerDirectory(spec)
        if peers.node_certificate(rank).fingerprint != fingerprint:
            raise ClusterSpecError(f"the new spec gives {spec.nodes[rank].name} another "
                                   "certificate: restart this worker with its new key")
        return peers
