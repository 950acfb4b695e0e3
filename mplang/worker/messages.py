"""Messages between the workers of an execution: `PeerCommunicator` sends them, and
`Inbox` admits a received one from its headers before its body is read, then decodes it
into this party's mailbox. Both sides record each message in the audit log."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from mplang.cluster.peers import Peer
from mplang.edsl.errors import MPSerializationError
from mplang.records.audit import AuditLog
from mplang.runtime.backend import Tag
from mplang.transport.mux_client import MuxClients
from mplang.transport.request import KEY_LIMIT, check_exec_id
from mplang.transport.wire import Buffer, decode_value, encode_value, privacy_kind
from mplang.worker.executions import Executions, RunRefusal
from mplang.worker.mailbox import Mailbox, count_message

log = logging.getLogger("mplang.worker")

H_EXEC, H_KEY, H_PROGRAM, H_LINK = "x-mplang-exec", "x-mplang-key", "x-mplang-program", \
    "x-mplang-link"
"""Headers of a peer message: its execution, op key, program digest and whether it
carries link (secure-device protocol) bytes."""


def encoded_size(parts: list[Buffer]) -> int:
    """The bytes of an encoded value (`encode_value`'s parts)."""
    return sum(memoryview(p).nbytes for p in parts)


class PeerCommunicator:
    """Sends are messages to the peer's ``/msg`` over this party's persistent connection
    to it, without waiting: a peer answers only to refuse one, and the refusal abandons
    that execution here. Receives wait on this party's mailbox."""

    def __init__(self, rank: int, clients: Callable[[], MuxClients], mailbox: Mailbox,
                 timeout: float, executions: Executions, audit: AuditLog):
        self.rank = rank
        self._clients = clients
        self.mailbox = mailbox
        self.timeout = timeout
        self._executions = executions
        self.audit = audit

    def send(self, dst: int, tag: Tag, value: Any) -> None:
        exec_id, key = tag
        program = self._executions.program_of(exec_id, key, dst)
        link = isinstance(value, bytes | bytearray | memoryview)
        parts = encode_value(value)
        headers = {H_EXEC: exec_id, H_KEY: key, H_PROGRAM: program,
                   H_LINK: "1" if link else "0"}
        self._clients().send(dst, "/msg", parts, headers)
        count_message(self.rank, tag, "sent", value)
        self.audit.message("send", exec_id, dst, key, privacy_kind(value),
                           encoded_size(parts), True, link)

    def refused(self, rank: int, answer: dict[str, Any], body: memoryview) -> None:
        """Party ``rank`` refused a message (or it could not be sent): abandon its
        execution here, so no wait of it outlives the refusal."""
        exec_id, key = answer.get("exec"), answer.get("key")
        if not isinstance(exec_id, str):
            return
        reason = (f"party {rank} refused {str(key)[:200]}: {answer.get('status')} "
                  f"{str(answer.get('error'))[:500]}")
        log.warning("execution %s: %s", exec_id, reason)
        self.mailbox.abort(exec_id, reason)

    def recv(self, src: int, tag: Tag, timeout: float | None = None) -> Any:
        """Party ``src``'s message under ``tag``, waiting at most ``timeout`` and never
        past the time limit of the run it is for (a later message would be refused)."""
        wait = self.timeout if timeout is None else timeout
        left = self._executions.time_left(*tag)
        value = self.mailbox.take(src, tag, wait if left is None else max(0.0, min(wait, left)))
        count_message(self.rank, tag, "recv", value)
        return value


Admitted = tuple[Peer, str, str, bool]
"""A message admitted from its headers: sender, execution id, op key, whether link bytes."""


class Inbox:
    """Received peer messages: admitted by their run (`Executions.admit`), then put in the
    mailbox."""

    def __init__(self, executions: Executions, mailbox: Mailbox, audit: AuditLog):
        self.executions = executions
        self.mailbox = mailbox
        self.audit = audit

    def admit(self, sender: Peer, headers: Mapping[str, str], size: int) -> Admitted:
        """Admit ``sender``'s message of ``size`` bytes from its headers, before its body
        is read; returns what `deliver` needs."""
        assert sender.rank is not None
        exec_id = check_exec_id(headers.get(H_EXEC))
        key = headers.get(H_KEY) or ""
        if not key.startswith("/") or len(key) > KEY_LIMIT:
            raise MPSerializationError(f"header {H_KEY} must be an op key")
        link = headers.get(H_LINK) == "1"
        try:
            self.executions.admit(sender.rank, exec_id, key, headers.get(H_PROGRAM, ""), size,
                                  link)
        except RunRefusal as e:  # the run will never get this message: it stops with why
            self.mailbox.abort(exec_id, f"party {self.mailbox.rank} refused party "
                               f"{sender.rank}'s message for {key[:200]}: {e}", refused=True)
            raise
        return sender, exec_id, key, link

    def deliver(self, sender: Peer, exec_id: str, key: str, link: bool,
                payload: memoryview | bytes) -> None:
        """Decode an admitted message and put it in the mailbox."""
        assert sender.rank is not None
        value = decode_value(payload)
        self.mailbox.put(sender.rank, (exec_id, key), value, len(payload))
        self.audit.message("recv", exec_id, sender.rank, key, privacy_kind(value),
                           len(payload), link=link)
