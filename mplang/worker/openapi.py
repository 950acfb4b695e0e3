"""The worker's HTTP API as an OpenAPI 3 document (`WORKER_API`).

The worker serves no schema itself (``create_app`` turns FastAPI's off); this
document describes what `mplang.worker.http.create_app` serves, for
readers and for the API fuzzing (``tests/security/test_worker_api_fuzz.py``,
``benchmarks/fuzz_worker_api.py``). A test checks that every route of the app is
in it.

Who may call what is decided by the client certificate of the mutual-TLS
connection, which OpenAPI cannot express: ``GET /health`` is open to every party
the spec lists, ``POST /msg`` to nodes only, ``POST /upload`` to the worker's own
node certificate only, the other paths to listed drivers only (403 otherwise; a
certificate no spec lists fails the handshake). Every request but ``/health``
must carry the sender's spec digest in ``x-mplang-spec`` (409 when it is missing
or differs). Request bodies are MPV1 frames (`mplang.transport.wire.pack_message`):
a length-prefixed JSON header, then raw payload bytes.
"""

from __future__ import annotations

import copy
from typing import Any

SPEC_DIGEST = {"type": "string", "pattern": "^[0-9a-f]{64}$",
               "description": "SHA-256 hex digest of the sender's cluster spec "
                              "(ClusterSpec.digest())"}
EXEC_ID = {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{1,128}$"}

_SPEC_HEADER = {"name": "x-mplang-spec", "in": "header", "required": True,
                "schema": SPEC_DIGEST,
                "description": "the sender's spec digest; 409 when missing or different"}

_FRAME = {
    "required": True,
    "description": "An MPV1 frame: b'MPV1', the JSON header's length (u32 little "
                   "endian), the JSON header, then the payload bytes.",
    "content": {"application/octet-stream": {"schema": {"type": "string",
                                                        "format": "binary"}}},
}

_ERROR = {"type": "object", "required": ["error"],
          "properties": {"error": {"type": "string"},
                         "kind": {"type": "string",
                                  "description": "PolicyRefusedError when this party's "
                                                 "policy refuses (the driver raises "
                                                 "MPRefusedError)"}}}

_FAILED_RUN = {
    "type": "object",
    "required": ["error", "kind", "party"],
    "properties": {
        "error": {"type": "string"},
        "kind": {"type": "string", "description": "the MPLangError subclass, e.g. "
                                                  "MPRuntimeError or MPCommunicationError"},
        "party": {"type": "integer", "minimum": 0},
        "op": {"type": ["string", "null"]},
        "key": {"type": ["string", "null"]},
        "loc": {"type": ["string", "null"]},
        "peer": {"type": ["integer", "null"], "description": "for a wait that failed, the "
                                                             "party it waited for"},
    },
}


_TYPED: dict[str, Any] = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "node": {"type": "string"},
                   "dtype": {"type": "string"},
                   "shape": {"type": "array", "items": {"type": "integer", "minimum": 0}}},
}


_SERIALIZED_TYPE: dict[str, Any] = {
    "type": "object", "required": ["type"],
    "properties": {"type": {"type": "object", "minProperties": 1, "maxProperties": 1,
                            "description": "a type as mplang.edsl.serde.encode_type gives it, "
                                           "e.g. {\"table.table\": [[[\"id\", \"int64\"]], "
                                           "null]}"}},
}


def _json(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _refusals(*statuses: int) -> dict[str, Any]:
    why = {
        "400": "malformed: a bad frame, header field, program or value",
        "403": "the certificate's party may not use this path, the execution or object "
               "belongs to another driver, or this party's policy refuses the program, a "
               "write it would make or the fetch",
        "404": "no such object for this driver",
        "408": "the body received nothing for --stall-seconds (the connection is closed)",
        "409": "spec digest missing or different; execution id reused, not running here "
               "yet, or aborted; the other parties' votes do not match this program",
        "410": "the execution has ended, was aborted or ran past its time limit",
        "411": "no content-length",
        "413": "body, message or declared value over this worker's limits",
        "429": "too many runs at once, the mailbox is full, or the bodies being received "
               "would exceed this worker's in-flight budget",
    }
    return {str(s): _json(_ERROR, why[str(s)]) for s in statuses}


def _post(summary: str, ok: dict[str, Any], statuses: tuple[int, ...],
          parameters: list[dict[str, Any]] | None = None,
          failed: dict[str, Any] | None = None) -> dict[str, Any]:
    responses = {"200": ok, **_refusals(*statuses, 408)}
    if failed is not None:
        responses["500"] = failed
    return {"post": {"summary": summary,
                     "parameters": [_SPEC_HEADER, *(parameters or [])],
                     "requestBody": _FRAME, "responses": responses}}


_DRIVER = (400, 403, 409, 411, 413)
_MSG_HEADERS = [
    {"name": "x-mplang-exec", "in": "header", "required": True, "schema": EXEC_ID,
     "description": "the execution the message belongs to"},
    {"name": "x-mplang-key", "in": "header", "required": True,
     "schema": {"type": "string", "pattern": "^/", "maxLength": 1024},
     "description": "the op key (the run's scope, '/', the op)"},
    {"name": "x-mplang-program", "in": "header", "required": True,
     "schema": {"type": "string", "maxLength": 64},
     "description": "SHA-256 hex digest of the sender's program (must be the receiver's)"},
    {"name": "x-mplang-link", "in": "header", "required": False,
     "schema": {"type": "string", "enum": ["0", "1"]},
     "description": "'1' for link (secure-device protocol) bytes"},
]

WORKER_API: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "MPLang worker", "version": "1",
             "description": "One party's worker, over mutual TLS (see the module docstring "
                            "of mplang.worker.openapi)."},
    "paths": {
        "/health": {"get": {
            "summary": "Liveness, this node's name, rank, fingerprint, spec digest, MPLang "
                       "version and devices (any listed party).",
            "parameters": [dict(_SPEC_HEADER, required=False)],
            "responses": {
                "200": _json({"type": "object",
                              "required": ["status", "node", "rank", "fingerprint", "spec"],
                              "properties": {"status": {"type": "string", "enum": ["ok"]},
                                             "node": {"type": "string"},
                                             "rank": {"type": "integer", "minimum": 0},
                                             "fingerprint": {"type": "string"},
                                             "spec": SPEC_DIGEST,
                                             "version": {"type": "string"},
                                             "devices": {"type": "array",
                                                         "items": {"type": "string"}},
                                             "refused_reload": {"type": "string"},
                                             "policy": {"type": "string"},
                                             "policy_reload_failed": {"type": "string"}}},
                             "the worker is up (refused_reload: why the spec file's "
                             "latest edit is not in force, if it is not; policy: the policy "
                             "in force, policy_reload_failed: why its file's is not)"),
                **_refusals(403)}}},
        "/run": _post(
            "Accept and run a program (driver). Header: exec, scope, inputs (object ids or "
            "null), parties (default: this one), program_bytes, and optionally inline, "
            "timeout, parallel, progress, name (the function's, for the audit log); "
            "payload: the committed program (graph bundle) and this party's openings. A "
            "run of several parties starts once every other party's vote has come (over "
            "mplang/1, path /vote) and matches.",
            _json({"type": "object", "required": ["outputs"],
                   "properties": {"outputs": {"type": "array",
                                              "items": {"type": ["string", "null"]}}}},
                  "the ids of the run's outputs on this party"),
            (*_DRIVER, 429),
            failed=_json(_FAILED_RUN, "the program failed while running")),
        "/fetch": _post(
            "An object's value (driver that made it). Header: uri.",
            {"description": "the value, encoded (mplang.transport.wire.encode_value)",
             "content": {"application/octet-stream": {"schema": {"type": "string",
                                                                 "format": "binary"}}}},
            (*_DRIVER, 404)),
        "/delete": _post(
            "Delete objects (driver that made them). Header: uris.",
            _json({"type": "object", "required": ["deleted"],
                   "properties": {"deleted": {"type": "integer", "minimum": 0}}},
                  "how many were deleted"),
            _DRIVER),
        "/abort": _post(
            "Abort an execution (its driver): its waits fail, its messages are dropped. "
            "Header: exec, reason.",
            _json({"type": "object", "required": ["ok"],
                   "properties": {"ok": {"type": "boolean"}}}, "aborted"),
            _DRIVER),
        "/close": _post(
            "The driver closed: drop what this worker keeps for it (its secure sessions).",
            _json({"type": "object", "required": ["ok"],
                   "properties": {"ok": {"type": "boolean"}}}, "dropped"),
            _DRIVER),
        "/upload": _post(
            "Store a tensor under a name for simp.load (this node's own certificate only). "
            "Header: name (1-128 of [A-Za-z0-9_.-]); payload: the value, encoded.",
            _json(_TYPED | {"required": ["name", "node", "dtype", "shape"]}, "stored"),
            (400, 403, 409, 411, 413)),
        "/budget": _post(
            "This node's privacy budget ledger (this node's own certificate only): the "
            "epsilon spent and left per source of its data, and the charges.",
            _json({"type": "object", "required": ["node", "budget", "spent", "left",
                                                  "charges"]}, "the ledger"),
            (400, 403, 409, 411, 413)),
        "/describe": _post(
            "The type of a private input, never its data (driver the node's policy accepts). "
            "Header: what ('file': path, key; 'object': name; or a registered kind, e.g. "
            "'table': path, format).",
            _json({"anyOf": [_TYPED | {"required": ["dtype", "shape"]}, _SERIALIZED_TYPE]},
                  "an array's or object's dtype and shape, or another input's type"),
            (*_DRIVER, 404)),
        "/msg": _post(
            "A message of a running execution from another node; the body is one encoded "
            "value. Admitted from its headers before the body is read.",
            _json({"type": "object", "required": ["ok"],
                   "properties": {"ok": {"type": "boolean"}}}, "queued"),
            (400, 403, 409, 410, 411, 413, 429), _MSG_HEADERS),
    },
}
"""The worker API (OpenAPI 3.1)."""


def worker_api() -> dict[str, Any]:
    """A copy of `WORKER_API` (callers may edit it)."""
    return copy.deepcopy(WORKER_API)
