"""Values leaving this party for a driver: one stored object at a time (``/fetch``), or
a run's outputs inlined in its ``/run`` answer. This party's policy decides
(`SimpWorker.fetch`), and every value that leaves is recorded in the audit log."""

from __future__ import annotations

import base64

from mplang.cluster.peers import Peer
from mplang.edsl.errors import MPLangError
from mplang.records.audit import AuditLog
from mplang.transport.wire import Buffer, encode_value, payload_bytes, privacy_kind
from mplang.worker.messages import encoded_size
from mplang.worker.state import SimpWorker


class Outputs:
    """Encodes stored values for the drivers this party lets have them."""

    def __init__(self, worker: SimpWorker, audit: AuditLog):
        self.worker = worker
        self.audit = audit

    def fetch(self, uri: str, driver: Peer, limit: int | None = None) -> list[Buffer] | None:
        """Stored object ``uri``, encoded for ``driver`` if this party lets it have it, or
        None if larger than ``limit`` bytes; the fetch is audited."""
        value = self.worker.fetch(uri, driver.certificate.fingerprint)
        if limit is not None and payload_bytes(value) > limit:
            return None
        parts = encode_value(value)
        self.audit.fetch(driver.audit_id, uri, privacy_kind(value), encoded_size(parts))
        return parts

    def inline(self, uris: list[str | None], driver: Peer, limit: int) -> dict[str, str]:
        """The outputs ``driver`` may fetch, up to ``limit`` bytes in all, for the ``/run``
        answer (base64 of the encoded value, by URI): a driver that fetches its results
        right away needs no second round trip."""
        inline: dict[str, str] = {}
        for uri in uris:
            if uri is None or limit <= 0:
                continue
            try:
                parts = self.fetch(uri, driver, limit)
            except MPLangError:  # not for the driver: it stays here
                continue
            if parts is not None:
                data = b"".join(parts)
                limit -= len(data)
                inline[uri] = base64.b64encode(data).decode()
        return inline
