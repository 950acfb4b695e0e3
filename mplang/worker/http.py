"""The HTTP worker: one party's server, mutual TLS only (FastAPI on uvicorn).

Every request comes over a TLS 1.3 connection whose client certificate the
party's own cluster spec lists; the certificate decides who is asking
(`mplang.cluster.peers`), never a header or the body. Roles:

- drivers listed in the spec: ``POST /run`` (programs), ``/fetch``, ``/delete``,
  ``/abort``, ``/close``;
- nodes: ``POST /msg`` (messages of a running execution, as the sending node), and
  over ``mplang/1`` only, ``/vote`` (`mplang.worker.votes`);
- the node's own owner: ``POST /upload``; drivers: ``POST /describe``
  (`mplang.worker.data_routes`);
- anyone listed: ``GET /health``.

The same port speaks ``mplang/1`` (`mplang.worker.mux_server`) to
clients that offer it by ALPN: persistent connections that carry the same
requests, and the workers' messages to each other, on multiplexed streams.

Bodies are a framed JSON header plus raw bytes; programs are decoded by the
schema-checked graph decoder and values by the value codec: nothing received
is unpickled or evaluated, and only ops with a kernel here can run. A peer
message is admitted from its headers before its body is read
(`mplang.worker.messages`). The routes read requests and answer;
what they do is `WorkerServer`'s (`mplang.worker.server`).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import socket
import threading
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import uvicorn
import uvloop
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from mplang.cluster.identity import LocalIdentity
from mplang.cluster.status import package_version
from mplang.device.cluster import ClusterSpec
from mplang.edsl.errors import MPLangError, MPRefusedError, MPSerializationError
from mplang.runtime.timeline import now_ns
from mplang.transport.admission import BudgetedBodies
from mplang.transport.connections import ConnectionGate, raise_descriptor_limit
from mplang.transport.limits import WorkerLimits
from mplang.transport.mux_client import host_port
from mplang.transport.request import (
    SMALL_BODY,
    URIS_BODY,
    check_exec_id,
    read_body,
    require_str,
)
from mplang.transport.tls import peer_of, tls_server
from mplang.transport.wire import split_frame
from mplang.worker.data_routes import add_data_routes
from mplang.worker.mux_server import mux_protocol
from mplang.worker.run_route import refusal, serve_delete, serve_fetch, serve_run
from mplang.worker.server import WorkerServer

log = logging.getLogger("mplang.worker")


def create_app(server: WorkerServer) -> FastAPI:
    """The FastAPI application of one worker."""
    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        server.close()

    app = FastAPI(title=f"MPLang worker {server.node}", docs_url=None, redoc_url=None,
                  openapi_url=None, lifespan=lifespan)

    @app.exception_handler(MPRefusedError)
    @app.exception_handler(MPSerializationError)
    async def _refused(request: Request, exc: MPLangError) -> JSONResponse:
        status, answer = refusal(request.method, request.url.path, exc)
        return JSONResponse(answer, status_code=status,  # 408: the rest of the body is not
                            headers={"connection": "close"} if status == 408 else None)

    @app.get("/health")
    async def health(request: Request) -> dict[str, Any]:
        if server.peers.lookup(peer_of(request.scope)) is None:
            raise MPRefusedError("certificate not in this party's cluster spec", 403)
        spec = server.peers.spec
        answer = {"status": "ok", "node": server.node, "rank": server.rank,
                  "fingerprint": server.identity.fingerprint, "spec": server.peers.digest,
                  "version": package_version(),
                  "devices": [d.name for d in spec.devices.values() if server.node in d.members]}
        if server.peers.refused_reload is not None:  # the spec on disk is not in force
            answer["refused_reload"] = server.peers.refused_reload
        if server.policy_file is not None:
            answer.update(server.policy_file.state())
        return answer

    @app.post("/run")
    async def run(request: Request) -> Response:
        """Accept a program and run it (`serve_run`)."""
        received_ns = now_ns()
        driver = server.peer(request, "driver")
        body = await read_body(request, server.limits.max_body_bytes)
        loop = asyncio.get_running_loop()
        status, answer = await loop.run_in_executor(server.pool, serve_run, server, driver,
                                                    body, received_ns)
        return JSONResponse(answer, status_code=status)

    @app.post("/fetch")
    async def fetch(request: Request) -> Response:
        driver = server.peer(request, "driver")
        status, parts = serve_fetch(server, driver, await read_body(request, SMALL_BODY))
        if status != 200:
            return Response(b"".join(parts), status, media_type="application/json")
        return StreamingResponse(iter(parts), media_type="application/octet-stream")

    @app.post("/delete")
    async def delete(request: Request) -> Response:
        driver = server.peer(request, "driver")
        status, answer = serve_delete(server, driver, await read_body(request, URIS_BODY))
        return JSONResponse(answer, status_code=status)

    @app.post("/abort")
    async def abort(request: Request) -> Response:
        driver = server.peer(request, "driver")
        header, _ = split_frame(await read_body(request, SMALL_BODY))
        server.abort(check_exec_id(header.get("exec")), driver, require_str(header, "reason"))
        return JSONResponse({"ok": True})

    @app.post("/close")
    async def close(request: Request) -> Response:
        driver = server.peer(request, "driver")
        await read_body(request, SMALL_BODY)
        server.worker.states.driver_closed(driver.certificate.fingerprint)
        return JSONResponse({"ok": True})

    @app.post("/msg")
    async def message(request: Request) -> Response:
        sender = server.peer(request, "node")
        declared = request.headers.get("content-length", "")
        if not declared.isdigit():
            raise MPRefusedError("a message needs a content-length", 411)
        if int(declared) > server.limits.max_body_bytes:
            raise MPRefusedError(f"body of {declared} bytes exceeds the limit of "
                                 f"{server.limits.max_body_bytes}", 413)
        admitted = server.inbox.admit(sender, request.headers, int(declared))
        server.inbox.deliver(*admitted, await read_body(request, int(declared)))
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


def uvicorn_server(server: WorkerServer, listen: str | None = None) -> uvicorn.Server:
    """The uvicorn server of ``server``'s app on ``listen`` (``host:port``), by default
    the endpoint its spec gives it."""
    host, port = host_port(listen or server.cluster.nodes[server.rank].endpoint)
    app = create_app(server)
    return tls_server(BudgetedBodies(app, server.inflight, server.limits), host, port,
                      server.trust.context, ConnectionGate(server.limits),
                      mux_protocol(server, app), server.trust.opened, timeout_keep_alive=30,
                      timeout_graceful_shutdown=1)


def freeze_startup_heap() -> None:
    """Hide every object alive after start-up (the modules, JAX's tables) from the garbage
    collector: its full collections, which a first evaluation's checks trigger, then walk
    only what evaluations allocate (about 175,000 fewer objects, ~70 ms a pass)."""
    gc.collect()
    gc.freeze()


def serve(cluster: ClusterSpec, node: str, identity: LocalIdentity, *, timeout: float = 60.0,
          limits: WorkerLimits | None = None, spec_path: str | Path | None = None,
          on_ready: Callable[[WorkerServer], None] | None = None,
          audit_log: str | Path | None = None, data_root: str | Path | None = None,
          policy: str | Path | None = None, listen: str | None = None,
          state_dir: str | Path | None = None) -> None:
    """Run ``node``'s worker on the endpoint the spec gives it (or on ``listen``, when
    peers reach it through a proxy at that endpoint), until interrupted; the spec file is
    reloaded when it changes; events go to the audit log ``audit_log``; what must survive
    a restart (the privacy budget ledger) is kept in ``state_dir``."""
    host, port = host_port(listen or cluster.nodes[cluster.rank_of(node)].endpoint)
    check_port_free(host, port)
    raise_descriptor_limit()
    server = WorkerServer(cluster, node, identity, timeout=timeout, limits=limits,
                          spec_path=spec_path, audit_log=audit_log, data_root=data_root,
                          policy=policy, state_dir=state_dir)
    userver = uvicorn_server(server, listen)
    freeze_startup_heap()
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
