"""A driver's ``/run``, ``/fetch`` and ``/delete``, served alike over HTTP/1.1 (the
worker's FastAPI app) and over ``mplang/1`` (straight from the connection, without the
app: they are the worker's most frequent requests, a run's outputs deleted after each).

A run is one task on the worker's pool: decode and accept the program
(`WorkerServer.accept`, which sends this party's vote in a run of several parties),
wait for the others' votes, run it, and build the answer.
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from mplang.cluster.peers import Peer
from mplang.edsl.errors import MPLangError, MPRefusedError, MPSerializationError
from mplang.policy.check import PolicyRefusedError
from mplang.records.trace_file import events_to_wire
from mplang.runtime.timeline import now_ns
from mplang.transport.request import require_str, str_or_none_list
from mplang.transport.wire import Buffer, split_frame
from mplang.worker.consent import VoteRefusal

if TYPE_CHECKING:
    from mplang.worker.server import WorkerServer

log = logging.getLogger("mplang.worker")

Answer = tuple[int, dict[str, Any]]
"""An HTTP status and the JSON object answered with it."""


def serve_run(server: WorkerServer, driver: Peer, body: bytes | memoryview,
              received_ns: int) -> Answer:
    """``driver``'s ``/run`` of ``body`` (framed header, committed program, openings):
    the run's outputs (with those small enough inline), or why it was refused (4xx:
    malformed, refused by this party's policy, the others' votes not matching) or failed
    (500, with the MPLang error's kind, op and source line)."""
    try:
        header, payload = split_frame(body)
        prepared = server.accept(header, payload, driver)
    except (MPRefusedError, MPSerializationError) as e:
        return refusal("POST", "/run", e)
    exec_id = prepared.run.exec_id
    try:
        outputs = server.start(prepared, driver)
    except (PolicyRefusedError, VoteRefusal) as e:  # this party's policy refuses what it
        log.info("execution %s refused: %s", exec_id, e)  # would do, or it lacks votes
        return e.status, _failure(server, e)
    except MPLangError as e:
        log.info("execution %s failed: %s", exec_id, e)
        return 500, {**_failure(server, e), "op": getattr(e, "op", None),
                     "key": getattr(e, "key", None), "loc": getattr(e, "loc", None),
                     "peer": getattr(e, "peer", None)}
    except Exception:  # a bug must not take the worker down; its text stays here
        log.exception("execution %s crashed", exec_id)
        return 500, {"error": f"execution {exec_id} crashed on {server.node} (its log has "
                              "the details)", "kind": "MPRuntimeError", "party": server.rank,
                     "op": None}
    answer: dict[str, Any] = {"outputs": outputs,
                              "inline": server.outputs.inline(outputs, driver, prepared.inline)}
    if prepared.events is not None:  # the driver aligns the events with these two times
        answer["trace"] = {"events": events_to_wire(prepared.events),
                           "received_ns": received_ns, "answered_ns": now_ns()}
    return 200, answer


def serve_fetch(server: WorkerServer, driver: Peer, body: bytes | memoryview
                ) -> tuple[int, list[Buffer]]:
    """``driver``'s ``/fetch`` of the stored value its body names: the value's encoded
    parts (200), or a JSON refusal (the party's policy's status; 404: no such value)."""
    try:
        header, _ = split_frame(body)
        parts = server.outputs.fetch(require_str(header, "uri", 256), driver)
    except (PolicyRefusedError, MPSerializationError) as e:  # the policy's status; 400
        status, answer = refusal("POST", "/fetch", e)
    except MPLangError as e:  # not here, or not this driver's: alike
        status, answer = 404, {"error": str(e)}
    else:
        assert parts is not None
        return 200, parts
    return status, [json.dumps(answer).encode()]


def serve_delete(server: WorkerServer, driver: Peer, body: bytes | memoryview) -> Answer:
    """``driver``'s ``/delete`` of the stored values its body names."""
    try:
        header, _ = split_frame(body)
        uris = [u for u in str_or_none_list(header.get("uris"), "uris") if u is not None]
    except MPSerializationError as e:
        return refusal("POST", "/delete", e)
    return 200, {"deleted": server.delete(uris, driver)}


def refusal(method: str, path: str, error: MPLangError) -> Answer:
    """The answer to a refused request (its status, the error's kind), else 400."""
    if not isinstance(error, MPRefusedError):  # malformed (MPSerializationError)
        return 400, {"error": str(error)}
    log.warning("refused %s %s: %s", method, path, error)
    return error.status, {"error": str(error), "kind": type(error).__name__}


def _failure(server: WorkerServer, error: MPLangError) -> dict[str, Any]:
    return {"error": str(error), "kind": type(error).__name__, "party": server.rank}
