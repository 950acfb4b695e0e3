"""The driver's questions about the parties' private inputs: a worker's ``/describe``
answers with the type of a file in its data root or of an uploaded object (never
the data), which the driver needs to trace a program that loads it.

Arrays and uploaded objects are answered as ``{"dtype", "shape"}``; other kinds of
input (``{"what": "table", ...}``, any kind a worker registered with
`mplang.storage.data_root.register_describer`) as ``{"type": T}``, a type in its
serialized form (`mplang.edsl.serde.encode_type`), decoded and checked here."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from mplang.edsl.errors import MPRefusedError, MPRuntimeError, MPSerializationError
from mplang.edsl.serde import decode_type
from mplang.edsl.typing import DTYPES, BaseType, TensorType
from mplang.transport.errors import (
    Reply,
    StatusError,
    TransportError,
    UnreachableError,
    error_message,
    refused_by_policy,
    unreachable_message,
)
from mplang.transport.wire import pack_message

if TYPE_CHECKING:
    from mplang.transport.mux_client import MuxClients

MAX_RANK = 64


def _answer_type(answer: Any, where: str) -> TensorType:
    dtype = answer.get("dtype") if isinstance(answer, dict) else None
    shape = answer.get("shape") if isinstance(answer, dict) else None
    if not (isinstance(dtype, str) and dtype in DTYPES and isinstance(shape, list)
            and len(shape) <= MAX_RANK and all(type(d) is int and d >= 0 for d in shape)):
        raise MPRuntimeError(f"{where} answered /describe with a malformed type: "
                             f"{str(answer)[:200]}")
    return TensorType(dtype, tuple(shape))


def _answer_base_type(answer: Any, where: str) -> BaseType:
    body = answer.get("type") if isinstance(answer, dict) else None
    try:
        vtype = decode_type(body, "type")
    except (MPSerializationError, RecursionError) as e:
        raise MPRuntimeError(f"{where} answered /describe with a malformed type: "
                             f"{str(e)[:300]}") from None
    if not isinstance(vtype, BaseType):
        raise MPRuntimeError(f"{where} answered /describe with {vtype}, not a party-local "
                             "type")
    return vtype


def _error_text(response: Reply) -> str:
    return error_message(response, 1000) or f"{response.status_code} {response.text[:300]}"


def _ask(clients: MuxClients, rank: int, where: str, fields: dict[str, Any]) -> Any:
    """The JSON answer of worker ``rank`` to ``/describe`` of ``fields``."""
    try:
        response = clients.post(rank, "/describe", pack_message(fields, []))
    except StatusError as e:
        status = e.response.status_code
        if status in (400, 404) and not refused_by_policy(e.response):  # a bad question
            raise MPRuntimeError(_error_text(e.response), party=rank) from None
        hint = ("" if refused_by_policy(e.response) or status not in (403, 409) else
                f" ({where} did not accept this driver)")
        refused = MPRefusedError(f"{where}: {_error_text(e.response)}{hint}", status)
        refused.party = rank
        raise refused from None
    except UnreachableError as e:
        raise MPRuntimeError(unreachable_message(where, "answer for the type of a private input",
                                                 e, clients.nodes[rank]), party=rank) from e
    except TransportError as e:
        raise MPRuntimeError(f"{where} could not be asked for the type of a private input "
                             f"({type(e).__name__}: {e})", party=rank) from e
    if response.status_code != 200:
        raise MPRuntimeError(f"{where}: {_error_text(response)}", party=rank)
    try:
        return response.json()
    except ValueError:
        return None


def describe_remote(clients: MuxClients, rank: int, where: str,
                    fields: dict[str, Any]) -> TensorType:
    """Ask worker ``rank`` (described as ``where`` in errors) for the type ``fields``
    name: ``{"what": "file", "path": ..., "key": ...}`` or ``{"what": "object",
    "name": ...}``."""
    return _answer_type(_ask(clients, rank, where, fields), where)


def describe_remote_input(clients: MuxClients, rank: int, where: str,
                          fields: dict[str, Any]) -> BaseType:
    """Ask worker ``rank`` for the type of an input of a registered kind, e.g.
    ``{"what": "table", "path": "a.csv", "format": "csv"}``; the answer is decoded and
    checked like any received type."""
    return _answer_base_type(_ask(clients, rank, where, fields), where)
