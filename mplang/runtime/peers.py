"""Who is on the other end of a connection: certificate fingerprints mapped to the
parties of a cluster spec, with their roles.

A worker serves nodes (peer messages) and the spec's drivers (programs, fetches,
deletes, aborts). Everything else is refused, whatever a request says of itself.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from mplang.device.cluster import ClusterSpec
from mplang.runtime.identity import Certificate

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


class PeerDirectory:
    """The parties of one spec, by certificate fingerprint."""

    def __init__(self, spec: ClusterSpec):
        spec.require_certificates()
        self.spec = spec
        self.digest = spec.digest()
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

    def node_certificate(self, rank: int) -> Certificate:
        cert = self.spec.nodes[rank].certificate
        assert cert is not None
        return cert

    def certificates(self) -> list[Certificate]:
        return [p.certificate for p in self._peers.values()]

    def driver_named(self, fingerprint: str) -> Peer | None:
        peer = self.lookup(fingerprint)
        return peer if peer is not None and peer.role == "driver" else None
