"""Who is on the other end of a connection: certificate fingerprints mapped to the
parties of a cluster spec, with their roles.

A worker serves nodes (peer messages) and the spec's drivers (programs, fetches,
deletes, aborts). Everything else is refused, whatever a request says of itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mplang.cluster.identity import Certificate
from mplang.device.cluster import ClusterSpec
from mplang.edsl.errors import MPRefusedError

Role = Literal["node", "driver"]


@dataclass(frozen=True)
class Peer:
    """A party known by its certificate: a node (with its rank) or a driver."""

    name: str
    role: Role
    certificate: Certificate
    rank: int | None = None

    def __str__(self) -> str:
        return f"{self.role} {self.name!r}"

    @property
    def audit_id(self) -> tuple[str, str]:
        """Name and certificate fingerprint: how an audit log records this party."""
        return self.name, self.certificate.fingerprint


class PeerDirectory:
    """The parties of one spec, by certificate fingerprint."""

    def __init__(self, spec: ClusterSpec):
        spec.require_certificates()
        self.spec = spec
        self.digest = spec.digest()
        self.refused_reload: str | None = None
        """Why the worker serving this spec did not load its changed spec file (a spec
        mismatch says so)."""
        self._peers: dict[str, Peer] = {}
        for rank, node in enumerate(spec.nodes):
            assert node.certificate is not None
            self._peers[node.certificate.fingerprint] = Peer(node.name, "node", node.certificate,
                                                             rank)
        for driver in spec.drivers:
            self._peers[driver.certificate.fingerprint] = Peer(driver.name, "driver",
                                                               driver.certificate)

    def lookup(self, fingerprint: str | None) -> Peer | None:
        """The party presenting the certificate ``fingerprint`` (None: unknown or expired)."""
        peer = self._peers.get(fingerprint or "")
        if peer is None or peer.certificate.expired():
            return None
        return peer

    def authorize(self, fingerprint: str | None, digest: str | None, role: Role, path: str,
                  here: str) -> Peer:
        """The party presenting certificate ``fingerprint`` and spec ``digest``, if it may
        use ``path`` on node ``here`` as ``role``. Refused (`MPRefusedError`): an unknown
        or expired certificate (403), another spec (409), another role (403)."""
        peer = self.lookup(fingerprint)
        if peer is None:
            shown = (fingerprint or "none")[:16]
            raise MPRefusedError(f"certificate {shown}... is not in {here}'s cluster spec "
                                 "(or has expired, or was revoked)", 403)
        if digest != self.digest:
            why = self.refused_reload or "both must load the same spec"
            raise MPRefusedError(f"cluster spec mismatch: {here} has spec "
                                 f"{self.digest[:16]}..., {peer} sent "
                                 f"{(digest or 'none')[:16]}...: {why}", 409)
        if peer.role != role:
            raise MPRefusedError(f"{peer} may not use {path} (only a {role} may)", 403)
        return peer

    def node_certificate(self, rank: int) -> Certificate:
        cert = self.spec.nodes[rank].certificate
        assert cert is not None
        return cert

    def certificates(self) -> list[Certificate]:
        return [p.certificate for p in self._peers.values()]

