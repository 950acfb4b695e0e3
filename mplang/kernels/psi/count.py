"""The Diffie-Hellman PSI-cardinality protocol of ``psi.intersection_size``, over X25519.

Each holder hashes its distinct keys to curve points (`hash_points`), raises them to
its secret scalar, and the other holder raises them again; doubly-blinded sets are
sorted (so no order links them to the keys) and only their overlap is counted, by
one party (`mplang.dialects.psi.counter_of`) that shares the count with the others
named in ``reveal_to``. Semi-honest security under DDH.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

from mplang.dialects.psi import counter_of
from mplang.edsl.errors import MPRuntimeError
from mplang.kernels.psi.session import U64, Session, encode_keys, u64

if TYPE_CHECKING:
    import pyarrow as pa
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

_POINT = 32
_DOMAIN = b"mplang psi.intersection_size v1\x00"


def hash_points(keys: pa.Array) -> list[bytes]:
    """Each distinct key hashed to an X25519 u-coordinate (SHA-256, top bit cleared)."""
    import pyarrow.compute as pc

    distinct = pc.unique(encode_keys(keys))
    points = []
    for value in distinct.to_pylist():
        digest = bytearray(hashlib.sha256(_DOMAIN + str(value).encode()).digest())
        digest[31] &= 0x7F
        points.append(bytes(digest))
    return points


def blind(secret: X25519PrivateKey, points: Sequence[bytes]) -> bytes:
    """``secret`` times every point, sorted (so the order says nothing), concatenated."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PublicKey

    try:
        out = sorted(secret.exchange(X25519PublicKey.from_public_bytes(p)) for p in points)
    except ValueError:
        raise MPRuntimeError("a point of small order was received (a peer deviated from "
                             "the protocol)") from None
    return b"".join(out)


def split_points(data: bytes, what: str) -> list[bytes]:
    """The points concatenated in message ``data``."""
    if len(data) % _POINT:
        raise MPRuntimeError(f"{what}: {len(data)} bytes is not a whole number of points")
    return [data[i: i + _POINT] for i in range(0, len(data), _POINT)]


def size_plan(rank: int, members: tuple[int, int], reveal_to: Sequence[int]
              ) -> list[tuple[int, str]]:
    """The messages ``rank`` sends in one ``psi.intersection_size``."""
    counter = counter_of(members, reveal_to)
    plan: list[tuple[int, str]] = []
    if rank in members:
        peer = members[1 - members.index(rank)]
        plan.append((peer, "blinded"))
        if rank != counter:
            plan.append((counter, "twice"))
    if rank == counter:
        plan += [(r, "count") for r in reveal_to if r != counter]
    return plan


def count_shared(rank: int, members: tuple[int, int], reveal_to: Sequence[int],
                 keys: pa.Array | None, session: Session) -> int | None:
    """This party's part of the protocol: the count where ``rank`` is in ``reveal_to``.

    Holder H blinds its distinct keys with its secret and sends them to the other
    holder, which blinds them again: the counter gets both twice-blinded sets (one
    of them computed by itself when it is a holder) and counts their overlap."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    counter = counter_of(members, reveal_to)

    def other(holder: int) -> int:
        return members[1 - members.index(holder)]

    twice: dict[int, list[bytes]] = {}
    """holder -> its keys, blinded by both holders"""
    if rank in members:
        assert keys is not None
        secret = X25519PrivateKey.generate()
        session.send(other(rank), "blinded", blind(secret, hash_points(keys)))
        theirs = blind(secret, split_points(session.recv(other(rank), "blinded"),
                                            "blinded keys"))
        if rank == counter:
            twice[other(rank)] = split_points(theirs, "twice-blinded keys")
        else:
            session.send(counter, "twice", theirs)
    if rank != counter:
        return u64(session.recv(counter, "count"), "count") if rank in reveal_to else None
    for holder in members:
        if holder != rank:  # it sends the other holder's keys, blinded by both
            twice[other(holder)] = split_points(session.recv(holder, "twice"),
                                                "twice-blinded keys")
    shared = len(set(twice[members[0]]) & set(twice[members[1]]))
    for r in reveal_to:
        if r != counter:
            session.send(r, "count", U64.pack(shared))
    return shared
