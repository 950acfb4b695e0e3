"""The HTTP worker: one party's server, mutual TLS only (FastAPI on uvicorn).

Every request comes over a TLS 1.3 connection whose client certificate the
party's own cluster spec lists; the certificate decides who is asking
(`mplang.runtime.peers`), never a header or the body. Roles:

- drivers listed in the spec: ``POST /prepare`` and ``/run`` (programs),
  ``/fetch``, ``/delete``, ``/abort``;
- nodes: ``POST /msg`` (messages of a running execution, as the sending node);
- the node's own owner: ``POST /upload``; drivers: ``POST /describe``
  (`mplang.backends.simp_worker.data_routes`);
- anyone listed: ``GET /health``.

The same port speaks ``mplang/1`` (`mplang.backends.simp_worker.mux_server`) to
clients that offer it by ALPN: persistent connections that carry the same
requests, and the workers' messages to each other, on multiplexed streams.

Bodies are a framed JSON header plus raw bytes; programs are decoded by the
schema-checked graph decoder and values by the value codec: nothing received
is unpickled or evaluated, and only ops with a kernel here can run. A peer
message is admitted from its headers before its body is read
(`mplang.backends.simp_worker.executions`).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import logging
import re
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import uvicorn
import uvloop
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from mplang.backends.mux import ALPN
from mplang.backends.mux_client import SPEC_HEADER, MuxClients, host_port
from mplang.backends.simp_worker.consent import check_votes, sign_vote, split_program
from mplang.backends.simp_worker.data_routes import add_data_routes
from mplang.backends.simp_worker.executions import Executions, Run, WorkerLimits
from mplang.backends.simp_worker.mailbox import Mailbox, count_message
from mplang.backends.simp_worker.mux_server import mux_protocol
from mplang.backends.simp_worker.state import SimpWorker
from mplang.backends.simp_worker.tls import peer_of, tls_config
from mplang.backends.wire import (
    Buffer,
    decode_value,
    encode_value,
    payload_bytes,
    privacy_kind,
    split_frame,
)
from mplang.device.cluster import ClusterSpec, ClusterSpecError
from mplang.util.lru import LRUCache
from mplang.edsl.graph import Graph
from mplang.edsl.primitive import check_types
from mplang.edsl.serde import decode_graph_bundle
from mplang.edsl.errors import (
    MPLangError,
    MPRefusedError,
    MPSerializationError,
)
from mplang.policy.check import PolicyRefusedError
from mplang.policy.enforce import worker_policy
from mplang.runtime.audit import AuditLog
from mplang.runtime.backend import Tag, check_payloads
from mplang.runtime.identity import LocalIdentity, trust
from mplang.runtime.object_store import ObjectStore
from mplang.runtime.options import RunOptions
from mplang.runtime.peers import Peer, PeerDirectory, Role
from mplang.runtime.timeline import OpEvent, RunMonitor, monitoring, now_ns
from mplang.runtime.trace_file import events_to_wire

log = logging.getLogger("mplang.worker")

H_EXEC, H_KEY, H_PROGRAM, H_LINK = "x-mplang-exec", "x-mplang-key", "x-mplang-program", \
    "x-mplang-link"
"""Headers of a peer message: its execution, op key, program digest and whether it
carries link (secure-device protocol) bytes."""
_ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
_KEY_LIMIT = 1024
MAX_INLINE = 1 << 20
"""The most bytes of outputs a ``/run`` answer carries."""


def _program_digest(payload: memoryview | bytes) -> str:
    return hashlib.sha256(payload).hexdigest()


def _size(parts: list[Buffer]) -> int:
    return sum(memoryview(p).nbytes for p in parts)


def _refused_digest(header: dict[str, Any], payload: memoryview) -> str:
    """The digest of a refused request's program (of its whole payload if malformed)."""
    try:
        program, _ = split_program(header, payload)
    except MPLangError:
        program = payload
    return _program_digest(program)


def _who(peer: Peer) -> tuple[str, str]:
    """A peer's name and certificate fingerprint, as the audit log records them."""
    return peer.name, peer.certificate.fingerprint


class PeerCommunicator:
    """Sends are messages to the peer's ``/msg`` over this party's persistent connection
    to it, without waiting: a peer answers only to refuse one, and the refusal abandons
    that execution here. Receives wait on this party's mailbox."""

    def __init__(self, rank: int, clients: Callable[[], MuxClients], mailbox: Mailbox,
                 timeout: float, program_of: Callable[[str, str], str],
                 audit: AuditLog | None = None):
        self.rank = rank
        self._clients = clients
        self.mailbox = mailbox
        self.timeout = timeout
        self._program_of = program_of
        self.audit = audit

    def send(self, dst: int, tag: Tag, value: Any) -> None:
        exec_id, key = tag
        link = isinstance(value, bytes | bytearray | memoryview)
        parts = encode_value(value)
        headers = {H_EXEC: exec_id, H_KEY: key, H_PROGRAM: self._program_of(exec_id, key),
                   H_LINK: "1" if link else "0"}
        self._clients().send(dst, "/msg", parts, headers)
        count_message(self.rank, tag, "sent", value)
        if self.audit is not None:
            self.audit.message("send", exec_id, dst, key, privacy_kind(value), _size(parts),
                               True, link)

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
        value = self.mailbox.take(src, tag, self.timeout if timeout is None else timeout)
        count_message(self.rank, tag, "recv", value)
        return value


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _str_or_none_list(value: Any, what: str) -> list[str | None]:
    if not isinstance(value, list) or not all(
            v is None or (isinstance(v, str) and len(v) <= 256) for v in value):
        raise MPSerializationError(f"{what} must be a list of strings or nulls")
    return value


def _require_str(header: dict[str, Any], key: str, limit: int = 4096) -> str:
    value = header.get(key)
    if not isinstance(value, str) or len(value) > limit:
        raise MPSerializationError(f"field {key!r} must be a string of at most {limit} "
                                   "characters")
    return value


def _exec_id(value: Any) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise MPSerializationError("an execution id is 1 to 128 letters, digits or '_.:-'")
    return value


def _inline_limit(header: dict[str, Any]) -> int:
    limit = header.get("inline", 0)
    if type(limit) is not int or not 0 <= limit <= MAX_INLINE:
        raise MPSerializationError(f"field 'inline' must be a byte count from 0 to {MAX_INLINE}")
    return limit


def _run_options(header: dict[str, Any], exec_id: str) -> RunOptions:
    """The execution's options from a ``/run`` header (progress goes to the worker log)."""
    timeout = header.get("timeout")
    if timeout is not None and (type(timeout) not in (int, float) or not 0 < timeout <= 86400):
        raise MPSerializationError("field 'timeout' must be a positive number of seconds")

    def to_log(message: str) -> None:
        log.warning("execution %s: %s", exec_id, message)

    monitor = RunMonitor(exec_id, record=True) if header.get("trace") is True else None
    return RunOptions(parallel=header.get("parallel") is not False, timeout=timeout,
                      progress=to_log if header.get("progress") is True else None,
                      monitor=monitor)


@dataclass
class Prepared:
    """A run accepted by ``/prepare``, waiting for its ``/run``."""

    run: Run
    graph: Graph
    inputs: list[str | None]
    options: RunOptions
    expires: float
    inline: int = 0
    """Up to how many bytes of outputs the driver wants in the ``/run`` answer."""
    events: list[OpEvent] | None = None
    """The ops this run recorded, when the driver asked for a trace."""


class WorkerServer:
    """The state behind one worker's HTTP app."""

    def __init__(self, cluster: ClusterSpec, node: str, identity: LocalIdentity, *,
                 timeout: float = 60.0, limits: WorkerLimits | None = None,
                 spec_path: str | Path | None = None, audit_log: str | Path | None = None,
                 data_root: str | Path | None = None, policy: str | Path | None = None):
        self.peers = PeerDirectory(cluster)
        self.rank = cluster.rank_of(node)
        if identity.fingerprint != self.peers.node_certificate(self.rank).fingerprint:
            raise ClusterSpecError(f"the key given for {node} does not belong to the "
                                   f"certificate the spec lists for {node}")
        self.node = node
        self.identity = identity
        self.limits = limits or WorkerLimits()
        self.timeout = timeout
        self.spec_path = Path(spec_path) if spec_path else None
        self._spec_mtime = self.spec_path.stat().st_mtime_ns if self.spec_path else 0
        self.ssl_context = identity.server_context(self.peers.certificates())
        self.mailbox = Mailbox(self.rank, self.limits.mailbox_bytes)
        self.executions = Executions(self.rank, self.limits)
        self.ssl_context.set_alpn_protocols([ALPN, "http/1.1"])
        self.audit = AuditLog(audit_log, node, [n.name for n in cluster.nodes]) \
            if audit_log is not None else None
        """This node's audit log (none when ``audit_log`` is not given)."""
        self.communicator = PeerCommunicator(self.rank, lambda: self._clients, self.mailbox,
                                             timeout, self.executions.program_of, self.audit)
        self._clients = MuxClients(cluster, identity, timeout, self.communicator.refused)
        self.worker = SimpWorker(self.rank, cluster.world_size, self.communicator,
                                 ObjectStore(node),
                                 timeout=timeout, in_process=False, node=node,
                                 data_root=data_root)
        self.worker.guard = worker_policy(cluster, node, policy, spec_path)
        self.pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix=f"mplang-{node}")
        self._programs = LRUCache(64)
        self._prepared: dict[tuple[str, str], Prepared] = {}
        self._lock = threading.Lock()

    @property
    def cluster(self) -> ClusterSpec:
        return self.peers.spec

    # -- who is asking
    def peer(self, request: Request, role: Role) -> Peer:
        """The party whose certificate opened this connection, if it may act as ``role``."""
        return self.peer_for(peer_of(request.scope), request.headers.get(SPEC_HEADER), role,
                             request.url.path)

    def peer_for(self, fingerprint: str | None, digest: str | None, role: Role,
                 path: str) -> Peer:
        """The party with certificate ``fingerprint`` and spec ``digest``, if it may use
        ``path`` as ``role``."""
        peer = self.peers.lookup(fingerprint)
        if peer is None:
            shown = (fingerprint or "none")[:16]
            raise MPRefusedError(f"certificate {shown}... is not in {self.node}'s cluster spec "
                                 "(or has expired, or was revoked)", 403)
        if digest != self.peers.digest:
            raise MPRefusedError(f"cluster spec mismatch: {self.node} has spec "
                                 f"{self.peers.digest[:16]}..., {peer} sent "
                                 f"{(digest or 'none')[:16]}...: both must load the same spec",
                                 409)
        if peer.role != role:
            raise MPRefusedError(f"{peer} may not use {path} (only a {role} may)", 403)
        return peer

    def admit_message(self, sender: Peer, headers: Any, size: int) -> tuple[Peer, str, str, bool]:
        """Admit a peer's message of ``size`` bytes from its headers, before its body is
        read; returns what `deliver_message` needs."""
        assert sender.rank is not None
        exec_id = _exec_id(headers.get(H_EXEC))
        key = headers.get(H_KEY) or ""
        if not key.startswith("/") or len(key) > _KEY_LIMIT:
            raise MPSerializationError(f"header {H_KEY} must be an op key")
        link = headers.get(H_LINK) == "1"
        self.executions.admit(sender.rank, exec_id, key, headers.get(H_PROGRAM, ""), size, link)
        return sender, exec_id, key, link

    def deliver_message(self, sender: Peer, exec_id: str, key: str, link: bool,
                        payload: memoryview | bytes) -> None:
        """Decode an admitted message and put it in the mailbox."""
        assert sender.rank is not None
        value = decode_value(payload)
        self.mailbox.put(sender.rank, (exec_id, key), value, len(payload))
        if self.audit is not None:
            self.audit.message("recv", exec_id, sender.rank, key, privacy_kind(value),
                               len(payload), link=link)

    async def body(self, request: Request, limit: int | None = None) -> bytes | memoryview:
        """The request body; refuses (413) one over ``limit`` before reading it."""
        limit = self.limits.max_body_bytes if limit is None else limit
        declared = request.headers.get("content-length")
        if declared is None or not declared.isdigit():
            raise MPRefusedError("a request needs a content-length", 411)
        if int(declared) > limit:
            raise MPRefusedError(f"body of {declared} bytes exceeds the limit of {limit}", 413)
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > limit:
                raise MPRefusedError(f"body exceeds the limit of {limit} bytes", 413)
            chunks.append(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one chunk: not copied

    # -- programs
    def program(self, payload: memoryview) -> tuple[Graph, str]:
        """The decoded, verified and type-checked graph and its digest (cached by digest)."""
        digest = _program_digest(payload)
        graph: Graph | None = self._programs.lookup(digest)
        if graph is None:
            graph, _ = decode_graph_bundle(payload, max_bytes=self.limits.max_body_bytes)
            try:
                graph.verify()
                check_types(graph, self.cluster.world_size)
            except MPSerializationError:
                raise
            except MPLangError as e:  # a verifier or a type rule refused it
                raise MPSerializationError(f"invalid program: {e}") from None
            self.check_kernels(graph)
            check_payloads(graph)  # native payloads are vetted before C++ parses them here
            self._programs.store(digest, graph)
        return graph, digest

    def check_kernels(self, graph: Graph) -> None:
        for op in graph.walk():
            if self.worker.kernels.get(op.opcode) is None:
                raise MPSerializationError(f"op {op.opcode} has no kernel on this worker")

    def prepare(self, header: dict[str, Any], payload: memoryview, driver: Peer) -> Prepared:
        """Accept a run: decode and check its program, register it for its messages."""
        exec_id = _exec_id(header.get("exec"))
        scope = _require_str(header, "scope", _KEY_LIMIT)
        inputs = _str_or_none_list(header.get("inputs"), "inputs")
        parties = header.get("parties", [self.rank])
        world = self.cluster.world_size
        if not isinstance(parties, list) or not parties or self.rank not in parties or not all(
                type(p) is int and 0 <= p < world for p in parties):
            raise MPSerializationError(f"field 'parties' must list party ranks including "
                                       f"{self.rank}")
        program, openings = split_program(header, payload)
        graph, digest = self.program(program)
        if len(inputs) != len(graph.inputs):
            raise MPSerializationError("the number of inputs does not match the graph")
        options = _run_options(header, exec_id)
        graph = self.worker.accept(graph, openings, driver.certificate.fingerprint)
        run = self.executions.begin(exec_id, scope, driver.certificate.fingerprint, digest,
                                    graph, frozenset(parties), options.timeout)
        return Prepared(run, graph, inputs, options, time.monotonic() + self.timeout,
                        _inline_limit(header))

    def prepare_audited(self, header: dict[str, Any], payload: memoryview,
                        driver: Peer) -> Prepared:
        """`prepare`, recording the verdict in the audit log."""
        try:
            prepared = self.prepare(header, payload, driver)
        except MPLangError as e:
            if self.audit is not None:
                exec_id, scope = header.get("exec"), header.get("scope")
                self.audit.execution(
                    exec_id if isinstance(exec_id, str) and _ID.fullmatch(exec_id) else "",
                    scope[:_KEY_LIMIT] if isinstance(scope, str) else "",
                    _refused_digest(header, payload), _who(driver), "refused", str(e))
            raise
        if self.audit is not None:
            run = prepared.run
            self.audit.execution(run.exec_id, run.scope, run.program, _who(driver), "accepted",
                                 graph=prepared.graph)
        return prepared

    def hold(self, prepared: Prepared) -> None:
        """Keep a prepared run until its ``/run`` (or until it expires unstarted)."""
        with self._lock:
            self._sweep()
            self._prepared[(prepared.run.exec_id, prepared.run.scope)] = prepared

    def take_prepared(self, exec_id: str, scope: str, driver: Peer) -> Prepared:
        with self._lock:
            prepared = self._prepared.get((exec_id, scope))
            if prepared is not None and prepared.run.driver == driver.certificate.fingerprint:
                del self._prepared[(exec_id, scope)]
            else:
                prepared = None
        if prepared is None:
            raise MPRefusedError(f"execution {exec_id} (scope {scope!r}) was not prepared "
                                 "here by this driver", 409)
        return prepared

    def vote(self, prepared: Prepared) -> str:
        """This node's signed acceptance of a prepared run."""
        run = prepared.run
        return sign_vote(self.identity, run.exec_id, run.scope, run.program, self.peers.digest)

    def check_votes(self, prepared: Prepared, votes: Any) -> None:
        """Before a prepared run starts: every other party must have accepted the same
        program (`check_votes`); if not, the run is dropped and refused."""
        run = prepared.run
        try:
            check_votes(votes, self.peers, self.rank, run.parties, run.exec_id, run.scope,
                        run.program)
        except MPRefusedError as e:
            self.executions.end(run)
            self.mailbox.drop(run.exec_id, run.scope)
            if self.audit is not None:
                self.audit.end(run.exec_id, run.scope, str(e), refused=True)
            raise

    def fetch(self, uri: str, driver: Peer, limit: int | None = None) -> list[Buffer] | None:
        """Stored object ``uri``, encoded for ``driver`` if this party lets it have it
        (`SimpWorker.fetch`), or None if larger than ``limit`` bytes; the fetch is audited."""
        value = self.worker.fetch(uri, driver.certificate.fingerprint)
        if limit is not None and payload_bytes(value) > limit:
            return None
        parts = encode_value(value)
        if self.audit is not None:
            self.audit.fetch(_who(driver), uri, privacy_kind(value), _size(parts))
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

    def drop_prepared(self, exec_id: str) -> None:
        """Forget the prepared, unstarted runs of an aborted execution."""
        with self._lock:
            dropped = [self._prepared.pop(k) for k in list(self._prepared) if k[0] == exec_id]
        for prepared in dropped:
            self.executions.end(prepared.run)

    def _sweep(self) -> None:
        now = time.monotonic()
        for key in [k for k, p in self._prepared.items() if p.expires < now]:
            stale = self._prepared.pop(key)
            self.executions.end(stale.run)
            self.mailbox.drop(stale.run.exec_id, stale.run.scope)

    def execute(self, prepared: Prepared, driver: Peer) -> list[str | None]:
        run = prepared.run
        options = prepared.options
        try:
            with contextlib.ExitStack() as stack:
                if options.monitor is not None:  # concurrent runs of one execution share one
                    shared = stack.enter_context(monitoring(run.exec_id, options.monitor))
                    options = replace(options, monitor=shared)
                outputs = self.worker.run(prepared.graph, prepared.inputs, run.exec_id,
                                          run.scope, options,
                                          owner=driver.certificate.fingerprint)
                if options.monitor is not None:
                    prepared.events = options.monitor.drain()
        except Exception as e:
            if self.audit is not None:
                self.audit.end(run.exec_id, run.scope, f"{type(e).__name__}: {e}")
            raise
        finally:
            self.executions.end(run)
            self.mailbox.drop(run.exec_id, run.scope)
        if self.audit is not None:
            self.audit.end(run.exec_id, run.scope)
        return outputs

    # -- spec reload
    def reload_if_changed(self) -> bool:
        """Reload the spec file if it changed: certificates and drivers may change (revoke,
        rotate); nodes, endpoints and devices need a restart. Whether it reloaded."""
        if self.spec_path is None:
            return False
        try:
            mtime = self.spec_path.stat().st_mtime_ns
        except OSError:
            return False
        if mtime == self._spec_mtime:
            return False
        self._spec_mtime = mtime
        try:
            spec = ClusterSpec.from_yaml(self.spec_path)
            old = self.cluster
            if [(n.name, n.endpoint) for n in spec.nodes] != \
                    [(n.name, n.endpoint) for n in old.nodes] or spec.devices != old.devices:
                raise ClusterSpecError("nodes, endpoints and devices can change only with a "
                                       "restart")
            peers = PeerDirectory(spec)
            if peers.node_certificate(self.rank).fingerprint != self.identity.fingerprint:
                raise ClusterSpecError(f"the new spec gives {self.node} another certificate: "
                                       "restart this worker with its new key")
        except MPLangError as e:
            log.error("not reloading %s: %s", self.spec_path, e)
            return False
        trust(self.ssl_context, peers.certificates())
        old_clients, self._clients = self._clients, MuxClients(
            spec, self.identity, self.timeout, self.communicator.refused)
        self.peers = peers
        old_clients.close()
        log.warning("reloaded %s (spec %s...)", self.spec_path, peers.digest[:16])
        return True

    def watch_spec(self, stop: threading.Event, interval: float = 1.0) -> None:
        """Every ``interval``: reload the spec if it changed, forget expired prepared runs."""
        while not stop.wait(interval):
            self.reload_if_changed()
            with self._lock:
                self._sweep()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.worker.scheduler.shutdown()
        self._clients.close()
        if self.audit is not None:
            self.audit.close()


def create_app(server: WorkerServer) -> FastAPI:
    """The FastAPI application of one worker."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        server.close()

    app = FastAPI(title=f"MPLang worker {server.node}", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)

    @app.exception_handler(MPRefusedError)
    async def _refused(request: Request, exc: MPRefusedError) -> JSONResponse:
        log.warning("refused %s %s: %s", request.method, request.url.path, exc)
        return _error(exc.status, str(exc))

    @app.exception_handler(MPSerializationError)
    async def _malformed(request: Request, exc: MPSerializationError) -> JSONResponse:
        return _error(400, str(exc))

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        if server.peers.lookup(peer_of(request.scope)) is None:
            raise MPRefusedError("certificate not in this party's cluster spec", 403)
        return {"status": "ok", "node": server.node, "rank": server.rank,
                "fingerprint": server.identity.fingerprint, "spec": server.peers.digest}

    async def run_prepared(prepared: Prepared, driver: Peer, received_ns: int) -> Response:
        loop = asyncio.get_running_loop()
        exec_id = prepared.run.exec_id
        try:
            outputs = await loop.run_in_executor(server.pool, server.execute, prepared, driver)
        except MPLangError as e:
            log.info("execution %s failed: %s", exec_id, e)
            return _error(500, str(e), kind=type(e).__name__, party=server.rank,
                          op=getattr(e, "op", None), key=getattr(e, "key", None),
                          loc=getattr(e, "loc", None))
        except Exception as e:  # a kernel bug must not take the worker down
            log.exception("execution %s crashed", exec_id)
            return _error(500, f"party {server.rank}: {type(e).__name__}: {e}",
                          kind="MPRuntimeError", party=server.rank, op=None)
        inline = server.inline(outputs, driver, prepared.inline) if prepared.inline else {}
        answer: dict[str, Any] = {"outputs": outputs, "inline": inline}
        if prepared.events is not None:  # the driver aligns the events with these two times
            answer["trace"] = {"events": events_to_wire(prepared.events),
                               "received_ns": received_ns, "answered_ns": now_ns()}
        return JSONResponse(answer)

    async def checked(header: dict[str, Any], payload: memoryview, driver: Peer) -> Prepared:
        """`WorkerServer.prepare` off the event loop: decoding and vetting a new program
        may take a while (its native payloads are checked in a helper process)."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(server.pool, server.prepare_audited, header, payload,
                                          driver)

    @app.post("/prepare")
    async def prepare(request: Request) -> Response:
        driver = server.peer(request, "driver")
        header, payload = split_frame(await server.body(request))
        try:
            prepared = await checked(header, payload, driver)
        except MPRefusedError as e:  # this party's verdict: the driver aborts everywhere
            return _error(e.status, str(e), accepted=False, reason=str(e))
        server.hold(prepared)
        return JSONResponse({"accepted": True, "digest": prepared.run.program,
                             "vote": server.vote(prepared)})

    @app.post("/run")
    async def run(request: Request) -> Response:
        received_ns = now_ns()
        driver = server.peer(request, "driver")
        header, payload = split_frame(await server.body(request))
        if len(payload):  # a run on this party alone: prepared and started at once
            prepared = await checked(header, payload, driver)
        else:
            prepared = server.take_prepared(_exec_id(header.get("exec")),
                                            _require_str(header, "scope", _KEY_LIMIT), driver)
            server.check_votes(prepared, header.get("votes"))
            prepared.inline = _inline_limit(header)
        return await run_prepared(prepared, driver, received_ns)

    @app.post("/fetch")
    async def fetch(request: Request) -> Response:
        driver = server.peer(request, "driver")
        header, _ = split_frame(await server.body(request, 1 << 16))
        uri = _require_str(header, "uri", 256)
        try:
            parts = server.fetch(uri, driver)
        except PolicyRefusedError as e:
            return _error(403, str(e))
        except MPLangError as e:
            return _error(404, str(e))
        assert parts is not None
        return StreamingResponse(iter(parts), media_type="application/octet-stream")

    @app.post("/delete")
    async def delete(request: Request) -> Response:
        driver = server.peer(request, "driver")
        header, _ = split_frame(await server.body(request, 1 << 20))
        uris = [u for u in _str_or_none_list(header.get("uris"), "uris") if u is not None]
        deleted = sum(server.worker.delete(uri, driver.certificate.fingerprint)
                      for uri in uris)
        if server.audit is not None:
            server.audit.delete(_who(driver), uris, deleted)
        return JSONResponse({"deleted": deleted})

    @app.post("/abort")
    async def abort(request: Request) -> Response:
        driver = server.peer(request, "driver")
        header, _ = split_frame(await server.body(request, 1 << 16))
        exec_id = _exec_id(header.get("exec"))
        reason = _require_str(header, "reason")
        server.executions.abort(exec_id, driver.certificate.fingerprint)
        if server.audit is not None:
            server.audit.abort(exec_id, _who(driver), reason)
        server.drop_prepared(exec_id)
        server.mailbox.abort(exec_id, reason)
        return JSONResponse({"ok": True})

    @app.post("/msg")
    async def message(request: Request) -> Response:
        sender = server.peer(request, "node")
        declared = request.headers.get("content-length", "")
        if not declared.isdigit():
            raise MPRefusedError("a message needs a content-length", 411)
        admitted = server.admit_message(sender, request.headers, int(declared))
        server.deliver_message(*admitted, await server.body(request, int(declared)))
        return JSONResponse({"ok": True})

    add_data_routes(app, server)
    return app


def check_port_free(host: str, port: int) -> None:
    """Raise a clear error if ``host:port`` cannot be bound."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as e:
            raise MPLangError(f"cannot listen on {host}:{port}: {e.strerror or e} "
                              "(is another worker already running there?)") from None


def uvicorn_server(server: WorkerServer) -> uvicorn.Server:
    """The uvicorn server of ``server``'s app on the endpoint its spec gives it."""
    host, port = host_port(server.cluster.nodes[server.rank].endpoint)
    app = create_app(server)
    return uvicorn.Server(tls_config(app, host, port, server.ssl_context,
                                     mux_protocol(server, app),
                                     timeout_keep_alive=30, timeout_graceful_shutdown=1))


def serve(cluster: ClusterSpec, node: str, identity: LocalIdentity, *, timeout: float = 60.0,
          limits: WorkerLimits | None = None, spec_path: str | Path | None = None,
          on_ready: Callable[[WorkerServer], None] | None = None,
          audit_log: str | Path | None = None, data_root: str | Path | None = None,
          policy: str | Path | None = None) -> None:
    """Run ``node``'s worker on the endpoint the spec gives it, until interrupted; the
    spec file is reloaded when it changes; events go to the audit log ``audit_log``."""
    host, port = host_port(cluster.nodes[cluster.rank_of(node)].endpoint)
    check_port_free(host, port)
    server = WorkerServer(cluster, node, identity, timeout=timeout, limits=limits,
                          spec_path=spec_path, audit_log=audit_log, data_root=data_root,
                          policy=policy)
    userver = uvicorn_server(server)
    stop = threading.Event()
    threading.Thread(target=server.watch_spec, args=(stop,), daemon=True,
                     name="mplang-spec-watch").start()

    async def main() -> None:
        task = asyncio.create_task(userver.serve())
        while not userver.started and not task.done():
            await asyncio.sleep(0.02)
        if userver.started and on_ready is not None:
            on_ready(server)
        await task

    try:
        uvloop.run(main())  # the loop uvicorn itself would pick
    finally:
        stop.set()
