"""The worker's private-input endpoints.

- ``POST /upload``: the node's own owner (a client presenting this node's own
  certificate, as ``mplang put`` does) stores a tensor under a name, which
  programs read with ``simp.load``. Everyone else is refused (403).
- ``POST /budget``: the node's own owner reads its privacy budget ledger
  (`mplang.policy.ledger`); everyone else is refused (403).
- ``POST /describe``: a driver this node's policy accepts asks for the type (dtype and shape) of a
  file in this node's data root or of an uploaded object, to trace a program that
  loads it; or (``what``: a kind registered with
  `mplang.storage.data_root.register_describer`, e.g. ``table``) for the type of
  another kind of input, answered as ``{"type": T}`` in its serialized form. The data
  itself never leaves the worker.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from mplang.edsl.errors import MPRefusedError, MPRuntimeError, MPSerializationError
from mplang.edsl.serde import encode_type
from mplang.edsl.typing import BaseType, TensorType
from mplang.policy.check import PolicyRefusedError
from mplang.storage import data_root
from mplang.storage.data_root import MissingData
from mplang.storage.named_objects import check_name
from mplang.transport.request import SMALL_BODY, read_body, upload_limit
from mplang.transport.wire import decode_value, split_frame

if TYPE_CHECKING:
    from mplang.cluster.peers import Peer
    from mplang.worker.server import WorkerServer


def _type_json(vtype: BaseType) -> dict[str, Any]:
    if isinstance(vtype, TensorType):
        return {"dtype": vtype.dtype, "shape": list(vtype.shape)}
    return {"type": encode_type(vtype)}


def _str_field(header: dict[str, Any], field: str, *, optional: bool = False) -> str | None:
    value = header.get(field)
    if value is None and optional:
        return None
    if not isinstance(value, str) or not value or len(value) > data_root.MAX_PATH:
        raise MPSerializationError(f"field {field!r} must be a non-empty string of at most "
                                   f"{data_root.MAX_PATH} characters")
    return value


def _describe(server: WorkerServer, header: dict[str, Any]) -> BaseType:
    worker = server.worker
    what = header.get("what")
    if what == "file":
        path = _str_field(header, "path")
        assert path is not None
        return data_root.describe(worker.data_root, path, _str_field(header, "key",
                                                                     optional=True),
                                  worker.node)
    if what == "object":
        return worker.named.describe(check_name(_str_field(header, "name")))
    return data_root.describe_input(worker.data_root, header, worker.node)


def _check_driver(server: WorkerServer, driver: Peer) -> None:
    """A driver this node's policy does not accept learns nothing about its data."""
    guard = server.worker.guard
    name = None if guard is None else guard.driver_name(driver.certificate.fingerprint)
    if guard is not None and name is not None and not guard.policy.accepts_driver(name):
        raise PolicyRefusedError(f"{server.node}'s policy does not accept driver {name!r} "
                                 f"(drivers: [{', '.join(guard.policy.drivers or ())}] in "
                                 f"{guard.policy.source})")


def _store(server: WorkerServer, name: str, payload: memoryview) -> TensorType:
    value = decode_value(payload)
    if not isinstance(value, np.ndarray):
        raise MPSerializationError(f"upload: {name!r} must be a tensor, got a "
                                   f"{type(value).__name__}")
    if value.nbytes > server.limits.max_value_bytes:
        raise MPRefusedError(f"upload: {name!r} has {value.nbytes} bytes, over the limit "
                             f"of {server.limits.max_value_bytes}", 413)
    return server.worker.named.put(name, value)


def _own_node(server: WorkerServer, request: Request, what: str) -> None:
    """Refuse (403) anyone but the node's own owner (``what``: what it may not do)."""
    owner = server.peer(request, "node")
    if owner.rank != server.rank:
        raise MPRefusedError(f"{owner} may not {what} {server.node}: only the node's own key "
                             "may", 403)


def add_data_routes(app: FastAPI, server: WorkerServer) -> None:
    """Add ``/upload``, ``/budget`` and ``/describe`` to ``server``'s app."""

    @app.post("/upload")
    async def upload(request: Request) -> JSONResponse:
        _own_node(server, request, "upload to")
        header, payload = split_frame(await read_body(request, upload_limit(server.limits)))
        try:
            name = check_name(header.get("name"), "upload")
        except MPRuntimeError as e:
            raise MPSerializationError(str(e)) from None
        loop = asyncio.get_running_loop()
        vtype = await loop.run_in_executor(server.pool, _store, server, name, payload)
        server.audit.upload(name, len(payload), _type_json(vtype))
        return JSONResponse({"name": name, "node": server.node, **_type_json(vtype)})

    @app.post("/budget")
    async def budget(request: Request) -> JSONResponse:
        _own_node(server, request, "read the budget of")
        await read_body(request, SMALL_BODY)
        guard = server.worker.guard
        report = guard.ledger.report(guard.policy.dp_budget()) if guard is not None else \
            {"budget": None, "spent": {}, "left": {}, "charges": []}
        return JSONResponse({"node": server.node, **report})

    @app.post("/describe")
    async def describe(request: Request) -> JSONResponse:
        driver = server.peer(request, "driver")
        _check_driver(server, driver)
        header, _ = split_frame(await read_body(request, SMALL_BODY))
        loop = asyncio.get_running_loop()
        try:
            vtype = await loop.run_in_executor(server.pool, _describe, server, header)
        except MissingData as e:
            return JSONResponse({"error": str(e)}, status_code=404)
        except MPRuntimeError as e:
            return JSONResponse({"error": str(e)}, status_code=400)
        server.audit.describe(driver.audit_id,
                              str(header.get("path") or header.get("name")),
                              _type_json(vtype))
        return JSONResponse(_type_json(vtype))
