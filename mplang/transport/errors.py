"""A worker's answers and the errors of requests to it, apart from the connections
(`mplang.transport.mux_client`), so that code handling them imports no event loop."""

from __future__ import annotations

import json
from typing import Any


class TransportError(Exception):
    """The worker could not be reached, or the connection broke or timed out."""


class NoAnswerError(TransportError):
    """The worker did not answer a request within its timeout."""


class UnreachableError(TransportError):
    """No connection to the worker could be made: nothing listens at its endpoint, the
    connection was refused, or the connection attempt timed out."""


class CertificateMismatch(UnreachableError):
    """The worker presented a certificate other than the one the spec pins for it."""

    def __init__(self, node: str, pinned: str, presented: str | None):
        self.node, self.pinned, self.presented = node, pinned, presented
        shown = f"sha256 {presented[:16]}..." if presented else "another certificate"
        super().__init__(f"it presented {shown}, but the cluster spec pins sha256 "
                         f"{pinned[:16]}... for {node}")


def unreachable_message(where: str, doing: str, error: UnreachableError, node: str) -> str:
    """Why ``where`` (party ``node``) could not ``doing``, and what to do about it."""
    if isinstance(error, CertificateMismatch):
        return (f"{where} is running, but not with the certificate the cluster spec pins, so "
                f"it cannot {doing} ({error}); give the spec the certificate its worker uses "
                f"(the NODE.crt beside that worker's key), or restart the worker with the key "
                f"of the pinned certificate")
    return f"{where} is not reachable, so it cannot {doing} ({error}); {start_worker_hint(node)}"


def start_worker_hint(node: str) -> str:
    """What to tell a user whose request found no worker for node ``node``."""
    return (f"is its worker running? Start the cluster's workers with `mplang up --cluster "
            f"cluster.yaml`, or this node's with `mplang worker --cluster cluster.yaml --node "
            f"{node} --key keys/{node}.key`")


class Reply:
    """A worker's answer: its status and body (a view of the received bytes)."""

    def __init__(self, status_code: int, content: memoryview):
        self.status_code = status_code
        self.content = content

    @property
    def text(self) -> str:
        return bytes(self.content).decode("utf-8", "replace")

    def json(self) -> Any:
        """The body as JSON; raises ValueError if it is not."""
        return json.loads(bytes(self.content))


class StatusError(Exception):
    """A worker answered with a 4xx status."""

    def __init__(self, message: str, response: Reply):
        super().__init__(message)
        self.response = response


def error_message(response: Reply, limit: int = 2000) -> str | None:
    """The ``error`` a worker's JSON answer gives (at most ``limit`` characters), or None
    if the answer is not such a JSON object."""
    try:
        body = response.json()
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    return error[:limit] if isinstance(error, str) else None


def refused_by_policy(response: Reply) -> bool:
    """Whether the worker's answer is its policy's refusal (``kind`` PolicyRefusedError),
    which the driver raises as an `MPRefusedError` with the party's message."""
    try:
        body = response.json()
    except ValueError:
        return False
    return isinstance(body, dict) and body.get("kind") == "PolicyRefusedError"
