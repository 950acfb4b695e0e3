"""``mplang status``: each node of a cluster spec asked for its ``/health`` over the
connection the spec pins, with what the answer (or its absence) means.

A node is *up* when its worker answers with the certificate the spec pins and the
same spec digest; otherwise `NodeStatus.problem` says what is wrong and what to do. So
does it for a node up whose policy file's latest edit did not load.
"""

from __future__ import annotations

import importlib.metadata
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from mplang.cluster.identity import LocalIdentity
    from mplang.device.cluster import ClusterSpec
    from mplang.transport.mux_client import MuxClients


def package_version() -> str:
    """The installed MPLang's version."""
    try:
        return importlib.metadata.version("mplang")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass
class NodeStatus:
    """What one node's worker answered: ``state`` is ``up``, ``down``, ``other
    certificate``, ``refuses us``, ``other spec`` or ``error``."""

    node: str
    endpoint: str
    pinned: str
    state: str = "down"
    presented: str | None = None
    spec: str | None = None
    version: str | None = None
    devices: list[str] = field(default_factory=list)
    problem: str | None = None


def _ask(clients: MuxClients, rank: int, status: NodeStatus, spec_digest: str, own: str,
         timeout: float) -> None:
    from mplang.cluster.identity import presented_fingerprint
    from mplang.transport.errors import (
        CertificateMismatch,
        StatusError,
        TransportError,
        UnreachableError,
        start_worker_hint,
    )
    from mplang.transport.mux_client import host_port

    node = status.node
    try:
        answer = clients.post(rank, "/health", [], timeout=timeout).json()
    except CertificateMismatch as e:
        status.state, status.presented = "other certificate", e.presented
        status.problem = (f"{node} runs with another certificate than the spec pins: give the "
                          f"spec the certificate its worker uses, or restart the worker with "
                          f"the key of the pinned one")
        return
    except UnreachableError as e:
        status.problem = f"{node} is down ({e}); {start_worker_hint(node)}"
        return
    except StatusError as e:
        status.state = "error"
        status.problem = f"{node} refused the question: {e}"
        return
    except TransportError:
        status.state = "refuses us"
        status.presented = presented_fingerprint(*host_port(status.endpoint), timeout)
        status.problem = (f"{node} does not accept this party's certificate (sha256 "
                          f"{own[:16]}...): the spec its worker runs with must list it")
        return
    status.presented, status.spec = answer.get("fingerprint"), answer.get("spec")
    status.version, status.devices = answer.get("version"), list(answer.get("devices") or [])
    if status.spec != spec_digest:
        status.state = "other spec"
        status.problem = (f"{node} runs with another spec (sha256 {str(status.spec)[:16]}..., "
                          f"this one is {spec_digest[:16]}...): give every party the same "
                          "cluster spec (its workers reload an edited file)")
    else:
        status.state = "up"
        if answer.get("policy_reload_failed"):
            status.problem = (f"{node} keeps the policy in force, {answer.get('policy')}: "
                              f"{answer['policy_reload_failed']} (fix the file: the worker "
                              "loads it within 2 s)")


def cluster_status(spec: ClusterSpec, identity: LocalIdentity,
                   timeout: float = 5.0) -> list[NodeStatus]:
    """Each node's status, asked at once."""
    from mplang.transport.mux_client import MuxClients

    clients = MuxClients(spec, identity, timeout)
    statuses = []
    for node in spec.nodes:
        assert node.certificate is not None  # MuxClients requires them
        statuses.append(NodeStatus(node.name, node.endpoint, node.certificate.fingerprint))
    try:
        with ThreadPoolExecutor(len(statuses)) as pool:
            for done in [pool.submit(_ask, clients, rank, status, spec.digest(),
                                     identity.fingerprint, timeout)
                         for rank, status in enumerate(statuses)]:
                done.result()
    finally:
        clients.close()
    return statuses


def _short(fingerprint: str | None) -> str:
    return fingerprint[:16] if fingerprint else "-"


def format_status(statuses: list[NodeStatus], spec_digest: str) -> str:
    """A table of ``statuses``, then one line per problem (or that all nodes are up)."""
    columns = ("NODE", "ENDPOINT", "STATE", "PINNED", "PRESENTED", "SPEC", "VERSION", "DEVICES")
    rows = [[s.node, s.endpoint, s.state, _short(s.pinned),
             "pinned" if s.presented == s.pinned else _short(s.presented),
             "-" if s.spec is None else "same" if s.spec == spec_digest else _short(s.spec),
             s.version or "-", ", ".join(s.devices) or "-"] for s in statuses]
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in [list(columns), *rows]]
    problems = [s.problem for s in statuses if s.problem]
    up = sum(s.state == "up" for s in statuses)
    lines.append(f"{up} of {len(statuses)} nodes up" + ("" if problems else
                 ", with the pinned certificates and this spec"))
    return "\n".join(lines + [f"- {p}" for p in problems])
