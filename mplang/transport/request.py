"""Reading one request to a worker: its body, within a byte limit, and the fields of its
JSON header, checked (a malformed field raises `MPSerializationError`, answered 400)."""

from __future__ import annotations

import logging
import re
from typing import TYPE_CHECKING, Any

from mplang.edsl.errors import MPRefusedError, MPSerializationError
from mplang.runtime.options import RunOptions
from mplang.runtime.timeline import RunMonitor

if TYPE_CHECKING:  # the worker's HTTP layer brings the web framework in
    from starlette.requests import Request

    from mplang.transport.limits import WorkerLimits

log = logging.getLogger("mplang.worker")

ID = re.compile(r"[A-Za-z0-9_.:-]{1,128}")
"""A valid execution id."""
KEY_LIMIT = 1024
"""The longest op key or scope."""
MAX_INLINE = 1 << 20
"""The most bytes of outputs a ``/run`` answer carries."""
SMALL_BODY = 1 << 16
"""The largest body of ``/fetch``, ``/abort``, ``/close``, ``/describe`` and ``/health`` (a
JSON header)."""
URIS_BODY = 1 << 20
"""The largest body of ``/delete`` (a list of URIs)."""


async def read_body(request: Request, limit: int) -> bytes | memoryview:
    """The request body; refuses (413) one over ``limit`` bytes before reading it, and
    (400) one whose client went away before sending it all."""
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        raise MPRefusedError("a request needs a content-length", 411)
    if int(declared) > limit:
        raise MPRefusedError(f"body of {declared} bytes exceeds the limit of {limit}", 413)
    chunks, size, more = [], 0, True
    while more:  # the ASGI messages themselves: a disconnect is a refusal, not a crash
        message = await request.receive()
        if message["type"] == "http.disconnect":
            raise MPRefusedError(f"the client left after {size} of {declared} body bytes", 400)
        chunk, more = message.get("body", b""), message.get("more_body", False)
        size += len(chunk)
        if size > limit:
            raise MPRefusedError(f"body exceeds the limit of {limit} bytes", 413)
        if chunk:
            chunks.append(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)  # one chunk: not copied


def upload_limit(limits: WorkerLimits) -> int:
    """The largest ``/upload`` body: a value of the largest size and its header."""
    return min(limits.max_body_bytes, limits.max_value_bytes + SMALL_BODY)


def check_exec_id(value: Any) -> str:
    """``value`` as an execution id."""
    if not isinstance(value, str) or not ID.fullmatch(value):
        raise MPSerializationError("an execution id is 1 to 128 letters, digits or '_.:-'")
    return value


def require_str(header: dict[str, Any], key: str, limit: int = 4096) -> str:
    """Field ``key``: a string of at most ``limit`` characters."""
    value = header.get(key)
    if not isinstance(value, str) or len(value) > limit:
        raise MPSerializationError(f"field {key!r} must be a string of at most {limit} "
                                   "characters")
    return value


def str_or_none_list(value: Any, what: str) -> list[str | None]:
    """``value`` as a list of short strings or nulls (URIs, input names)."""
    if not isinstance(value, list) or not all(
            v is None or (isinstance(v, str) and len(v) <= 256) for v in value):
        raise MPSerializationError(f"{what} must be a list of strings or nulls")
    return value


def inline_limit(header: dict[str, Any]) -> int:
    """Field ``inline``: up to how many bytes of outputs the driver wants in the answer."""
    limit = header.get("inline", 0)
    if type(limit) is not int or not 0 <= limit <= MAX_INLINE:
        raise MPSerializationError(f"field 'inline' must be a byte count from 0 to {MAX_INLINE}")
    return limit


NAME_CHARS = 128
"""The most characters of a program's name the audit log keeps."""


def run_options(header: dict[str, Any], exec_id: str) -> RunOptions:
    """The execution's options from the header that prepares it (progress goes to the
    worker log)."""
    timeout = header.get("timeout")
    if timeout is not None and (type(timeout) not in (int, float) or not 0 < timeout <= 86400):
        raise MPSerializationError("field 'timeout' must be a positive number of seconds")

    def to_log(message: str) -> None:
        log.warning("execution %s: %s", exec_id, message)

    monitor = RunMonitor(exec_id, record=True) if header.get("trace") is True else None
    return RunOptions(parallel=header.get("parallel") is not False, timeout=timeout,
                      progress=to_log if header.get("progress") is True else None,
                      monitor=monitor, whole=header.get("whole") is True,
                      name=program_name(header))


def program_name(header: dict[str, Any]) -> str | None:
    """The function name the driver gives its program (for the audit log only)."""
    name = header.get("name")
    return name[:NAME_CHARS] if isinstance(name, str) else None
