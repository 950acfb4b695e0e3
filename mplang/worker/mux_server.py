"""The worker's side of ``mplang/1`` connections (`mplang.transport.mux`).

A client that offers ``mplang/1`` by ALPN on the worker's port gets this
protocol instead of HTTP/1.1, on the same mutual-TLS connection; the peer is
the certificate of that connection. A message's HEAD names the path and the
headers of the same request over HTTP:

Every stream is authorized from its HEAD (`mplang.transport.admission`):
its peer's role for the path, its size, the worker's budget of bytes in flight.

- ``/msg`` (a peer's message of a running execution) is admitted from its HEAD
  before its body is read, received straight into its own buffer and put in the
  mailbox. It is answered only if refused, with the refusal's status, execution
  and key, so the sender can abandon that execution.
- ``/vote`` (a peer's vote for a run, `mplang.worker.votes`) goes to
  the vote box, and is answered likewise only if refused.
- ``/run``, ``/fetch`` and ``/delete`` are served without the app
  (`mplang.worker.run_route`), as the app serves them;
- every other path runs the worker's ASGI app, as uvicorn would run it for an
  HTTP request (``/health`` a GET, the others POSTs), and is answered with the app's
  status and body.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from mplang.cluster.peers import Peer
from mplang.edsl.errors import MPRefusedError, MPSerializationError
from mplang.runtime.timeline import now_ns
from mplang.transport.admission import authorize_head
from mplang.transport.connections import Ticket
from mplang.transport.mux import MuxProtocol, body_buffer
from mplang.transport.request import KEY_LIMIT, check_exec_id
from mplang.worker.messages import H_EXEC, H_KEY, Admitted
from mplang.worker.run_route import serve_delete, serve_fetch, serve_run

if TYPE_CHECKING:
    from mplang.worker.server import WorkerServer

log = logging.getLogger("mplang.worker")

_PATH_LIMIT = 256
_HEADER_LIMIT = 4096
ASGIApp = Callable[..., Any]


def _headers(head: dict[str, Any]) -> dict[str, str] | None:
    headers = head.get("headers")
    if not isinstance(headers, dict) or len(headers) > 32 or not all(
            isinstance(k, str) and isinstance(v, str) and len(k) <= 64 and len(v) <= _HEADER_LIMIT
            and k.isascii() and v.isascii() for k, v in headers.items()):
        return None
    return {k.lower(): v for k, v in headers.items()}


class WorkerMuxHandler:
    """Serves the requests and messages of one ``mplang/1`` connection."""

    def __init__(self, server: WorkerServer, app: ASGIApp, fingerprint: str | None,
                 ticket: Ticket | None = None):
        self.server = server
        self.app = app
        self.fingerprint = fingerprint
        self.ticket = ticket
        limits = server.limits
        self.protocol = MuxProtocol(self, max_streams=limits.max_streams,
                                    stall_seconds=limits.stall_seconds)
        self._messages: dict[int, Admitted] = {}
        self._senders: dict[int, Peer] = {}
        """The peer its HEAD authorized, for each ``/run``, ``/vote``, ``/fetch`` or
        ``/delete`` being received."""
        self._sizes: dict[int, int] = {}
        """The announced size of each admitted body being received (in the budget)."""
        self._in_flight = 0
        """Bytes announced by the bodies being received."""

    def on_head(self, stream: int, head: dict[str, Any], size: int) -> memoryview | None:
        path, headers = head.get("path"), _headers(head)
        if not isinstance(path, str) or not path.startswith("/") or len(path) > _PATH_LIMIT \
                or headers is None:
            return self._refuse_head(stream, {}, 400,
                                     "a request's HEAD needs a path and string headers")
        head["headers"] = headers  # checked and lower-cased, for on_body
        server = self.server
        limit = server.limits.max_body_bytes
        try:
            sender = authorize_head(server.peers, server.limits, server.node, server.rank,
                                    self.fingerprint, path, headers, size)
            if self._in_flight + size > limit:
                raise MPRefusedError(f"{self._in_flight + size} bytes would be in flight on one "
                                     f"connection, over the limit of {limit}", 429)
            server.inflight.take(size)
            if path == "/msg":
                try:
                    admitted = server.inbox.admit(sender, headers, size)
                except (MPRefusedError, MPSerializationError):
                    server.inflight.give(size)
                    raise
        except MPRefusedError as e:
            return self._refuse_head(stream, headers, e.status, str(e), path)
        except MPSerializationError as e:
            return self._refuse_head(stream, headers, 400, str(e), path)
        if path == "/msg":
            self._messages[stream] = admitted
        elif path in ("/run", "/vote", "/fetch", "/delete"):
            self._senders[stream] = sender
        if size:
            self._sizes[stream] = size
        self._in_flight += size
        return body_buffer(size)

    def on_body(self, stream: int, head: dict[str, Any], body: memoryview) -> None:
        self._release(stream)
        message = self._messages.pop(stream, None)
        if message is None:
            sender = self._senders.pop(stream, None)
            path = head["path"]
            if sender is not None and path == "/run":
                asyncio.get_running_loop().create_task(self._run(stream, sender, body))
            elif sender is not None and path in ("/fetch", "/delete"):
                self._serve_data(stream, path, sender, body)
            elif sender is not None:
                self._vote(stream, sender, head["headers"], body)
            else:
                asyncio.get_running_loop().create_task(self._serve(stream, head, body))
            return
        try:
            self.server.inbox.deliver(*message, body)
        except MPRefusedError as e:
            self._refuse(stream, head["headers"], e.status, str(e), "/msg")
        except MPSerializationError as e:
            self._refuse(stream, head["headers"], 400, str(e), "/msg")

    def _vote(self, stream: int, peer: Peer, headers: dict[str, str], body: memoryview) -> None:
        """Keep ``peer``'s vote (headers: its execution and scope; body: the vote)."""
        server = self.server
        assert peer.rank is not None  # a node: `authorize_head` gave /vote to nodes only
        try:
            exec_id = check_exec_id(headers.get(H_EXEC))
            scope = headers.get(H_KEY, "")
            if len(scope) > KEY_LIMIT or not body or not bytes(body).isascii():
                raise MPSerializationError("a vote needs a scope header and an ASCII body")
            if server.executions.aborted(exec_id):
                raise MPRefusedError(f"execution {exec_id} was aborted", 410)
            server.votes.put(peer.rank, exec_id, scope, bytes(body).decode())
        except MPRefusedError as e:
            self._refuse(stream, headers, e.status, str(e), "/vote")
        except MPSerializationError as e:
            self._refuse(stream, headers, 400, str(e), "/vote")

    def on_lost(self, error: BaseException | None) -> None:
        for stream in list(self._sizes):
            self._release(stream)
        self._messages.clear()
        self._senders.clear()
        if self.ticket is not None:
            self.ticket.release()
        if error is not None:
            log.warning("an mplang/1 connection%s closed: %s", self._who(), error)

    def _who(self) -> str:
        peer = self.server.peers.lookup(self.fingerprint)
        return f" from {peer}" if peer is not None else ""

    def _release(self, stream: int) -> None:
        """A body ended (received, or its connection lost): out of the budgets."""
        size = self._sizes.pop(stream, 0)
        self._in_flight -= size
        self.server.inflight.give(size)

    def _refuse_head(self, stream: int, headers: dict[str, str], status: int, error: str,
                     path: str = "") -> memoryview | None:
        """Refuse a message from its HEAD: answer now; its body is read and dropped (the
        stream keeps a byte counter only)."""
        self._refuse(stream, headers, status, error, path)
        return None

    def _refuse(self, stream: int, headers: dict[str, str], status: int, error: str,
                path: str) -> None:
        """Answer ``stream`` with a refusal; one of a peer message names its execution and
        key (from its checked ``headers``)."""
        if path != "/msg":
            log.warning("refused %s over mplang/1: %s", path[:64], error)
        answer = {"status": status, "error": error[:2000],
                  "exec": headers.get(H_EXEC), "key": headers.get(H_KEY)}
        if not self.protocol.closed:
            self.protocol.send(stream, answer, [json.dumps({"error": answer["error"]}).encode()])

    async def _run(self, stream: int, driver: Peer, body: memoryview) -> None:
        """Serve ``driver``'s ``/run`` (`serve_run`) and send its answer on ``stream``."""
        received_ns = now_ns()
        try:
            status, answer = await asyncio.get_running_loop().run_in_executor(
                self.server.pool, serve_run, self.server, driver, body, received_ns)
        except Exception:  # a bug in it: answered like the app's crashes
            log.exception("/run over mplang/1 crashed")
            status, answer = 500, {"error": "internal error"}
        self._answer(stream, status, [json.dumps(answer, separators=(",", ":")).encode()])

    def _serve_data(self, stream: int, path: str, driver: Peer, body: memoryview) -> None:
        """Serve ``driver``'s ``/fetch`` or ``/delete`` on the loop (both are quick)."""
        try:
            if path == "/fetch":
                status, parts = serve_fetch(self.server, driver, body)
            else:
                status, answer = serve_delete(self.server, driver, body)
                parts = [json.dumps(answer).encode()]
        except Exception:  # a bug in it: answered like the app's crashes
            log.exception("%s over mplang/1 crashed", path)
            status, parts = 500, [b'{"error":"internal error"}']
        self._answer(stream, status, parts)

    def _answer(self, stream: int, status: int, parts: list[Any]) -> None:
        if not self.protocol.closed:
            self.protocol.send(stream, {"status": status}, parts)

    async def _serve(self, stream: int, head: dict[str, Any], body: memoryview) -> None:
        """Run the worker's ASGI app on one request and send its answer on ``stream``."""
        path: str = head["path"]
        headers: dict[str, str] = {**head["headers"], "content-length": str(len(body))}
        scope = {
            "type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "GET" if path == "/health" else "POST", "scheme": "https", "path": path,
            "raw_path": path.encode(), "query_string": b"", "root_path": "",
            "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
            "client": None, "server": None, "state": {},
            "extensions": {"tls": {"peer_fingerprint": self.fingerprint}},
        }
        finished = asyncio.Event()
        delivered = False
        status, chunks = 500, []

        async def receive() -> dict[str, Any]:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            await finished.wait()
            return {"type": "http.disconnect"}

        async def send(message: dict[str, Any]) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif message["type"] == "http.response.body" and message.get("body"):
                chunks.append(message["body"])

        try:
            await self.app(scope, receive, send)
        except Exception:  # the app answers errors itself; this is a bug in it
            log.exception("%s over mplang/1 crashed", path)
            status, chunks = 500, [b'{"error":"internal error"}']
        finally:
            finished.set()
        if not self.protocol.closed:
            self.protocol.send(stream, {"status": status}, chunks)


def mux_protocol(server: WorkerServer,
                 app: ASGIApp) -> Callable[[str | None, Ticket | None], MuxProtocol]:
    """For `mplang.transport.tls`: the protocol of a new ``mplang/1``
    connection from the peer with certificate fingerprint ``fingerprint`` (``ticket``:
    its place in the connection caps, released when it closes)."""
    def make(fingerprint: str | None, ticket: Ticket | None) -> MuxProtocol:
        return WorkerMuxHandler(server, app, fingerprint, ticket).protocol
    return make
