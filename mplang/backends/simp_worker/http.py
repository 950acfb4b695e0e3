"""The HTTP worker: one party's server (FastAPI on uvicorn).

Endpoints (all but ``/health`` need a signed request, see `mplang.runtime.auth`):

- ``POST /run``: run a serialized graph on stored inputs; returns output URIs.
- ``POST /fetch``, ``/delete``: read or drop stored objects.
- ``POST /abort``: abandon an execution (waits on its messages fail at once).
- ``POST /msg``: a message from a peer party (shuffles, converge, secure-device traffic).

Bodies are a framed JSON header plus raw bytes; programs are decoded by the
schema-checked graph decoder and values by the value codec: nothing received
is unpickled or evaluated, and only ops with a kernel here can run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from mplang.backends.http_client import post
from mplang.backends.simp_worker.mailbox import Mailbox
from mplang.backends.simp_worker.state import SimpWorker
from mplang.backends.wire import (
    decode_value,
    encode_value,
    pack_message,
    split_frame,
)
from mplang.device.cluster import ClusterSpec
from mplang.dialects.common import LRUCache
from mplang.edsl.graph import Graph
from mplang.edsl.primitive import check_types
from mplang.edsl.serde import decode_graph_bundle
from mplang.frontend.errors import (
    MPCommunicationError,
    MPLangError,
    MPRuntimeError,
    MPSerializationError,
    MPVerifyError,
)
from mplang.runtime.auth import AuthError, Signer, Verifier
from mplang.runtime.backend import Tag
from mplang.runtime.object_store import ObjectStore
from mplang.runtime.options import RunOptions

log = logging.getLogger("mplang.worker")
DEFAULT_MAX_BODY = 2 << 30


class HttpCommunicator:
    """Sends are signed POSTs to the peer's ``/msg``; receives wait on this party's mailbox."""

    def __init__(self, rank: int, urls: list[str], signer: Signer, mailbox: Mailbox,
                 timeout: float, client: httpx.Client):
        self.rank = rank
        self.urls = urls
        self.signer = signer
        self.mailbox = mailbox
        self.timeout = timeout
        self.client = client

    def send(self, dst: int, tag: Tag, value: Any) -> None:
        parts = pack_message({"src": self.rank, "exec": tag[0], "key": tag[1]},
                             encode_value(value))
        try:
            post(self.client, self.signer, self.urls[dst], "/msg", parts)
        except httpx.HTTPError as e:
            raise MPCommunicationError(f"party {self.rank}: sending {tag[1]} to party {dst} "
                                       f"failed: {type(e).__name__}: {e}", party=self.rank) from e

    def recv(self, src: int, tag: Tag, timeout: float | None = None) -> Any:
        return self.mailbox.take(src, tag, self.timeout if timeout is None else timeout)


def _error(status: int, message: str, **extra: Any) -> JSONResponse:
    return JSONResponse({"error": message, **extra}, status_code=status)


def _str_or_none_list(value: Any, what: str) -> list[str | None]:
    if not isinstance(value, list) or not all(v is None or isinstance(v, str) for v in value):
        raise MPSerializationError(f"{what} must be a list of strings or nulls")
    return value


def _require_str(header: dict[str, Any], key: str) -> str:
    value = header.get(key)
    if not isinstance(value, str) or len(value) > 4096:
        raise MPSerializationError(f"field {key!r} must be a string")
    return value


def _run_options(header: dict[str, Any], exec_id: str) -> RunOptions:
    """The execution's options from a ``/run`` header (progress goes to the worker log)."""
    timeout = header.get("timeout")
    if timeout is not None and (type(timeout) not in (int, float) or not 0 < timeout <= 86400):
        raise MPSerializationError("field 'timeout' must be a positive number of seconds")

    def to_log(message: str) -> None:
        log.warning("execution %s: %s", exec_id, message)

    return RunOptions(parallel=header.get("parallel") is not False, timeout=timeout,
                      progress=to_log if header.get("progress") is True else None)


class WorkerServer:
    """The state behind one worker's HTTP app."""

    def __init__(self, cluster: ClusterSpec, node: str, secret: bytes, *, timeout: float = 60.0,
                 max_body: int = DEFAULT_MAX_BODY):
        self.cluster = cluster
        self.rank = cluster.rank_of(node)
        self.node = node
        self.max_body = max_body
        self.verifier = Verifier(secret, not_before=time.time())
        self.mailbox = Mailbox(self.rank)
        self.client = httpx.Client(timeout=httpx.Timeout(timeout, connect=5.0),
                                   verify=cluster.client_verify(),
                                   limits=httpx.Limits(max_connections=256))
        communicator = HttpCommunicator(self.rank, cluster.base_urls(), Signer(secret, node),
                                        self.mailbox, timeout, self.client)
        self.worker = SimpWorker(self.rank, cluster.world_size, communicator, ObjectStore(node),
                                 timeout=timeout, in_process=False)
        self.pool = ThreadPoolExecutor(max_workers=256, thread_name_prefix=f"mplang-{node}")
        self._programs = LRUCache(64)

    async def authenticated_body(self, request: Request) -> tuple[bytes, str]:
        """The request body and its authenticated sender (raises `AuthError`)."""
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            raise AuthError(f"body of {declared} bytes exceeds the {self.max_body} limit", 413)
        sender, checker = self.verifier.verify(request.method, request.url.path, request.headers)
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body:
                raise AuthError(f"body exceeds the {self.max_body} byte limit", 413)
            checker.feed(chunk)
        return checker.finish(), sender

    def program(self, payload: memoryview) -> Graph:
        """The decoded, verified and type-checked graph (cached per distinct payload)."""
        key = bytes(payload)
        graph: Graph | None = self._programs.lookup(key)
        if graph is None:
            graph, _ = decode_graph_bundle(payload, max_bytes=self.max_body)
            try:
                graph.verify()
                check_types(graph, self.cluster.world_size)
            except MPVerifyError as e:
                raise MPSerializationError(f"invalid program: {e}") from None
            self.check_kernels(graph)
            self._programs.store(key, graph)
        return graph

    def check_kernels(self, graph: Graph) -> None:
        for op in graph.walk():
            if self.worker.kernels.get(op.opcode) is None:
                raise MPSerializationError(f"op {op.opcode} has no kernel on this worker")

    def run(self, graph: Graph, inputs: list[str | None], exec_id: str, scope: str,
            options: RunOptions) -> list[str | None]:
        return self.worker.run(graph, inputs, exec_id, scope, options)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
        self.worker.scheduler.shutdown()
        self.client.close()


def create_app(server: WorkerServer) -> FastAPI:
    """The FastAPI application of one worker."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        server.close()

    app = FastAPI(title=f"MPLang worker {server.node}", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)

    @app.exception_handler(AuthError)
    async def _auth_failed(request: Request, exc: AuthError) -> JSONResponse:
        return _error(exc.status, str(exc))

    @app.exception_handler(MPSerializationError)
    async def _malformed(request: Request, exc: MPSerializationError) -> JSONResponse:
        return _error(400, str(exc))

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"status": "ok", "node": server.node, "rank": server.rank}

    @app.post("/run")
    async def run(request: Request) -> Response:
        header, payload = split_frame((await server.authenticated_body(request))[0])
        exec_id, scope = _require_str(header, "exec"), _require_str(header, "scope")
        inputs = _str_or_none_list(header.get("inputs"), "inputs")
        graph = server.program(payload)
        if len(inputs) != len(graph.inputs):
            raise MPSerializationError("the number of inputs does not match the graph")
        options = _run_options(header, exec_id)
        loop = asyncio.get_running_loop()
        try:
            outputs = await loop.run_in_executor(server.pool, server.run, graph, inputs,
                                                 exec_id, scope, options)
        except MPLangError as e:
            log.info("execution %s failed: %s", exec_id, e)
            return _error(500, str(e), kind=type(e).__name__, party=server.rank,
                          op=getattr(e, "op", None), key=getattr(e, "key", None),
                          loc=getattr(e, "loc", None))
        except Exception as e:  # a kernel bug must not take the worker down
            log.exception("execution %s crashed", exec_id)
            return _error(500, f"party {server.rank}: {type(e).__name__}: {e}",
                          kind="MPRuntimeError", party=server.rank, op=None)
        return JSONResponse({"outputs": outputs})

    @app.post("/fetch")
    async def fetch(request: Request) -> Response:
        header, _ = split_frame((await server.authenticated_body(request))[0])
        uri = _require_str(header, "uri")
        try:
            value = server.worker.store.get(uri)
        except MPRuntimeError as e:
            return _error(404, str(e))
        return StreamingResponse(iter(encode_value(value)), media_type="application/octet-stream")

    @app.post("/delete")
    async def delete(request: Request) -> Response:
        header, _ = split_frame((await server.authenticated_body(request))[0])
        for uri in _str_or_none_list(header.get("uris"), "uris"):
            if uri is not None:
                server.worker.store.delete(uri)
        return JSONResponse({"ok": True})

    @app.post("/abort")
    async def abort(request: Request) -> Response:
        header, _ = split_frame((await server.authenticated_body(request))[0])
        server.mailbox.abort(_require_str(header, "exec"), _require_str(header, "reason"))
        return JSONResponse({"ok": True})

    @app.post("/msg")
    async def message(request: Request) -> Response:
        body, sender = await server.authenticated_body(request)
        header, payload = split_frame(body)
        src = header.get("src")
        if type(src) is not int or not 0 <= src < server.cluster.world_size:
            raise MPSerializationError("field 'src' must be a party rank")
        if server.cluster.nodes[src].name != sender:
            raise AuthError(f"{sender!r} may not send messages as party {src}", 403)
        tag = (_require_str(header, "exec"), _require_str(header, "key"))
        server.mailbox.put(src, tag, decode_value(payload))
        return JSONResponse({"ok": True})

    return app


def _host_port(endpoint: str) -> tuple[str, int]:
    address = endpoint.split("://", 1)[-1].rstrip("/")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise MPLangError(f"endpoint {endpoint!r} must be host:port")
    return host.strip("[]"), int(port)


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


def serve(cluster: ClusterSpec, node: str, secret: bytes, *, timeout: float = 60.0) -> None:
    """Run ``node``'s worker on the endpoint the spec gives it, until interrupted."""
    host, port = _host_port(cluster.nodes[cluster.rank_of(node)].endpoint)
    check_port_free(host, port)
    server = WorkerServer(cluster, node, secret, timeout=timeout)
    tls = cluster.tls
    uvicorn.run(create_app(server), host=host, port=port, log_level="warning",
                ssl_certfile=tls.certfile if tls else None,
                ssl_keyfile=tls.keyfile if tls else None, timeout_keep_alive=30)
