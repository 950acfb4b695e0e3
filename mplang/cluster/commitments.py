"""Commitments to private attributes, their openings, and the digests parties agree on.

`commit` replaces each private attribute of a graph (declared by its
primitive's `Primitive.def_private`) by a `Commitment`, ``sha256(nonce ||
canonical bytes of the value)``, and gives each party the openings (value,
nonce) of the attributes it may see. Every party receives the same committed
graph, so the execution digest (sha256 of its bytes) is the same everywhere
and binds every constant; `open_program` checks a party's openings against
the commitments and puts the values back. `program_digest` hides every
private value behind a placeholder of its type: it names the program, not its
constants, and stays the same across runs.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mplang.edsl.errors import MPRefusedError, MPSerializationError
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.primitive import get_primitive
from mplang.edsl.private import Commitment
from mplang.edsl.serde import decode_attrs, encode_attrs, encode_graph_bundle
from mplang.edsl.typing import BaseType, Mask, MPType, TensorType

NONCE_BYTES = 16
Opening = tuple[Any, bytes]
"""A private value and the nonce of its commitment."""
Openings = dict[str, Opening]
"""Openings by attribute path: ``"3/0/1:value"`` is attribute ``value`` of op 1 of region 0
of op 3 of the top-level graph."""


@dataclass(frozen=True)
class Committed:
    """A graph with its private attributes committed, and each party's openings."""

    graph: Graph
    openings: tuple[Openings, ...]


def canonical_bytes(value: Any) -> bytes:
    """The deterministic serialized form of an attribute value (what a commitment binds)."""
    return encode_attrs({"value": value})


def _digest(nonce: bytes, value: Any) -> bytes:
    return hashlib.sha256(nonce + canonical_bytes(value)).digest()


def _type_of(value: Any) -> BaseType | None:
    if isinstance(value, Commitment):
        return value.type
    if isinstance(value, np.ndarray):
        return TensorType.of(value.dtype, value.shape)
    return None


def _runners(op: Operation, outer: Mask | None) -> Mask | None:
    """The parties that run ``op``'s regions: the holders of its outputs (else of its
    inputs); ``outer`` for an op of a party-local region; None when not known statically."""
    types = [v.type for v in op.outputs if isinstance(v.type, MPType)] or \
        [v.type for v in op.inputs if isinstance(v.type, MPType)]
    if not types:
        return outer
    mask = Mask(0)
    for t in types:
        if t.pmask is None:
            return None
        mask = mask | t.pmask
    return mask


AttrRewrite = Callable[[str, Operation, str, Any, Mask], Any]
"""``rewrite(path, op, attr name, value, parties that may see it) -> new value``."""


def _rewrite(graph: Graph, world_size: int, rewrite: AttrRewrite, prefix: str = "",
             running: Mask | None = None) -> Graph:
    """``graph`` with every private attribute passed through ``rewrite`` (the same graph
    object when nothing changes)."""
    ops: list[Operation] = []
    changed = False
    for index, op in enumerate(graph.operations):
        path = f"{prefix}{index}"
        prim = get_primitive(op.opcode)
        private = {} if prim is None else prim.private_attrs(op)
        attrs = dict(op.attrs)
        for name, seen_by in private.items():
            viewers = seen_by if seen_by is not None else running
            if viewers is None:
                viewers = Mask.all(world_size)
            attrs[name] = rewrite(f"{path}:{name}", op, name, op.attrs[name], viewers)
        inner = _runners(op, running)
        regions = tuple(_rewrite(r, world_size, rewrite, f"{path}/{i}/", inner)
                        for i, r in enumerate(op.regions))
        if any(attrs[k] is not op.attrs[k] for k in private) or \
                any(a is not b for a, b in zip(regions, op.regions, strict=True)):
            op = op.replace(attrs=attrs, regions=regions)
            changed = True
        ops.append(op)
    return Graph(graph.inputs, ops, graph.outputs) if changed else graph


_COMMITTED: weakref.WeakKeyDictionary[Graph, Committed] = weakref.WeakKeyDictionary()
_COMMIT_LOCK = threading.Lock()


def commit(graph: Graph, world_size: int) -> Committed:
    """``graph`` with its private attributes committed, and the openings per party.

    Nonces are drawn once per graph object: running the same program again sends
    the same committed form.
    """
    with _COMMIT_LOCK:  # one set of nonces per graph, also when parties ask at once
        cached = _COMMITTED.get(graph)
        if cached is None or len(cached.openings) != world_size:
            cached = _COMMITTED[graph] = _commit(graph, world_size)
        return cached


def _commit(graph: Graph, world_size: int) -> Committed:
    openings: list[Openings] = [{} for _ in range(world_size)]

    def hide(path: str, op: Operation, name: str, value: Any, viewers: Mask) -> Any:
        if isinstance(value, Commitment):
            return value
        nonce = os.urandom(NONCE_BYTES)
        for rank in viewers:
            if rank < world_size:
                openings[rank][path] = (value, nonce)
        return Commitment(_digest(nonce, value), _type_of(value))

    return Committed(_rewrite(graph, world_size, hide), tuple(openings))


def _where(path: str, op: Operation, name: str, rank: int) -> str:
    loc = f" (traced at {op.loc})" if op.loc else ""
    return f"party {rank}: op #{path.partition(':')[0]} {op.opcode}{loc}, attribute {name!r}"


def _holds_commitment(value: Any) -> bool:
    if isinstance(value, Commitment):
        return True
    if isinstance(value, list | tuple):
        return any(_holds_commitment(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_commitment(v) for v in value.values())
    return False


def _refuse_stray_commitments(graph: Graph, rank: int, prefix: str = "") -> None:
    """Refuse (`MPRefusedError`, 400) a commitment in any attribute its op does not
    declare private: only private values may be hidden from a party."""
    for index, op in enumerate(graph.operations):
        path = f"{prefix}{index}"
        prim = get_primitive(op.opcode)
        private = {} if prim is None else prim.private_attrs(op)
        for name, value in op.attrs.items():
            if name not in private and _holds_commitment(value):
                raise MPRefusedError(f"{_where(f'{path}:{name}', op, name, rank)}: a "
                                     f"commitment in an attribute {op.opcode} does not "
                                     "declare private", 400)
        for i, region in enumerate(op.regions):
            _refuse_stray_commitments(region, rank, f"{path}/{i}/")


def open_program(graph: Graph, openings: Mapping[str, Opening], rank: int,
                 world_size: int) -> Graph:
    """The graph party ``rank`` runs: ``graph`` (as received, committed) with its openings
    checked against their commitments and substituted.

    Refuses (`MPRefusedError`, 400) a commitment in an attribute its op does not declare
    private, an opening that does not match, a missing opening for an attribute this
    party may see, and an opening for any other attribute.
    """
    _refuse_stray_commitments(graph, rank)
    unused = dict(openings)

    def reveal(path: str, op: Operation, name: str, value: Any, viewers: Mask) -> Any:
        if not isinstance(value, Commitment) or rank not in viewers:
            return value
        opening = unused.pop(path, None)
        if opening is None:
            raise MPRefusedError(f"{_where(path, op, name, rank)}: the driver sent no opening "
                                 "for this party's committed value", 400)
        plain, nonce = opening
        if _digest(nonce, plain) != value.digest:
            raise MPRefusedError(f"{_where(path, op, name, rank)}: the opening does not match "
                                 "its commitment", 400)
        if _type_of(plain) != value.type:
            raise MPRefusedError(f"{_where(path, op, name, rank)}: the opened value is "
                                 f"{_type_of(plain)}, its commitment declares {value.type}",
                                 400)
        return plain

    opened = _rewrite(graph, world_size, reveal)
    if unused:
        raise MPRefusedError(f"party {rank}: openings for attributes this party may not see "
                             f"or that the program does not have: {sorted(unused)[:5]}", 400)
    return opened


_PROGRAM_DIGESTS: weakref.WeakKeyDictionary[Graph, str] = weakref.WeakKeyDictionary()


def program_digest(graph: Graph, world_size: int) -> str:
    """sha256 (hex) of ``graph`` with every private value, open or committed, replaced by
    a placeholder of its type: the same across runs and across constant values."""
    digest = _PROGRAM_DIGESTS.get(graph)
    if digest is None:
        blank = _rewrite(graph, world_size, lambda path, op, name, value, viewers:
                         Commitment(bytes(32), _type_of(value)))
        digest = hashlib.sha256(encode_graph_bundle(blank, {})).hexdigest()
        _PROGRAM_DIGESTS[graph] = digest
    return digest


def encode_openings(openings: Openings) -> bytes:
    """The wire form of one party's openings."""
    return encode_attrs({path: (value, nonce) for path, (value, nonce) in openings.items()})


def decode_openings(data: bytes | memoryview) -> Openings:
    """Openings from `encode_openings` bytes (schema-checked)."""
    if not len(data):
        return {}
    decoded = decode_attrs(data, "openings")
    out: Openings = {}
    for path, item in decoded.items():
        if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[1], bytes)
                and len(item[1]) >= NONCE_BYTES):
            raise MPSerializationError(f"malformed program: openings.{path}: expected "
                                       f"(value, nonce of {NONCE_BYTES}+ bytes)")
        out[path] = (item[0], item[1])
    return out


def vote_message(exec_id: str, scope: str, digest: str, spec_digest: str,
                 parties: Iterable[int]) -> bytes:
    """What a party signs to accept execution ``exec_id`` (``scope``) of the program with
    execution digest ``digest``, run by ``parties``, under the cluster spec with digest
    ``spec_digest``."""
    return b"mplang-accept\x00" + json.dumps(
        [exec_id, scope, digest, spec_digest, sorted(parties)]).encode()


def encode_vote(signature: bytes) -> str:
    return base64.b64encode(signature).decode()


def decode_vote(vote: Any) -> bytes | None:
    """A vote's signature bytes (None if it is not base64 of a plausible size)."""
    if not isinstance(vote, str) or len(vote) > 512:
        return None
    try:
        return base64.b64decode(vote, validate=True)
    except ValueError:
        return None
