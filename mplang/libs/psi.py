"""Private set intersection (PSI) of two parties' tables.

``a`` is a table held by one party (A) and ``b`` a table held by another (B),
both with a key column of the same name and dtype; no table ever leaves its
holder. Both functions work in a traced program and eagerly; a table placed on a
device (``mp.device("P0")``) keeps its device in the results of `join`::

    from mplang.libs import psi
    ja, jb = psi.join(a, b, "id", how="inner", protocol="rr22")
    n = psi.intersection_size(a, b, "id", reveal_to=(0, 1))

`join` runs libpsi (RR22, KKRT or ECDH; semi-honest) and returns each holder's own
rows, aligned: row ``i`` of ``ja`` (at A) and row ``i`` of ``jb`` (at B) belong
together. ``how``:

- ``"inner"``: the rows whose key both tables hold, ordered by key; a key A holds
  ``m`` times and B ``n`` times gives ``m * n`` rows, every pair once (A's rows as
  the outer loop, B's as the inner one, each in table order), as in SQL.
- ``"left"`` (A is the left side, libpsi's ``JOIN_TYPE_LEFT_JOIN``): the inner rows,
  then A's rows whose key B does not hold, by key; ``jb`` has a row of nulls (key
  included) at each of those positions.
- ``"full"`` (``JOIN_TYPE_FULL_JOIN``): the left result, then B's rows whose key A does
  not hold, by key, with rows of nulls in ``ja`` at those positions.

What each holder learns from `join`: the other's row count, which of its own keys
the other holds and how often (from the repeated rows), and for ``left``/``full``
how many unmatched rows the other contributes; never the other's unmatched keys
or any of its other columns. Duplicate keys are allowed (see ``inner``). Null
keys are refused at run time, on both holders at once.

`intersection_size` reveals only the number of distinct keys both tables hold, to
the parties in ``reveal_to``, by the Diffie-Hellman PSI-cardinality protocol over
X25519 (semi-honest, DDH): each holder learns the other's number of distinct
keys, and the count if it is named; a named party that holds neither table
learns the count (and, if no holder is named, both distinct-key counts). Its cost
is two X25519 multiplications per distinct key on each holder (about 35 µs each
in Python): use it for tables up to about 10^5 keys.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from mplang.device.kinds import place
from mplang.dialects import psi as _psi
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.location import mark_library
from mplang.edsl.object import MPObject
from mplang.edsl.typing import MPType

mark_library(__file__)

PROTOCOLS = _psi.PROTOCOLS
"""The PSI protocols `join` and `intersection_size` take: ``"rr22"``, ``"kkrt"``, ``"ecdh"``."""
JOINS = _psi.JOINS
"""The kinds of `join`: ``"inner"`` (shared keys), ``"left"`` (also A's unmatched rows),
``"full"`` (also both sides' unmatched rows)."""

__all__ = ["JOINS", "PROTOCOLS", "intersection_size", "join"]


def _holder(op: str, x: Any, what: str) -> int:
    if not isinstance(x, MPObject):
        raise MPTypeError(f"{op}: {what} must be an MPLang table held by one party, got "
                          f"{type(x).__name__}")
    t = x.mptype
    if not (isinstance(t, MPType) and t.pmask is not None and len(t.pmask) == 1):
        raise MPTypeError(f"{op}: {what} ({t}) must be held by exactly one party")
    return t.pmask.parties[0]


@function
def join(a: MPObject, b: MPObject, key: str, *, how: str = "inner",
         protocol: str = "rr22") -> tuple[MPObject, MPObject]:
    """PSI join of ``a`` (party A's table) and ``b`` (party B's) on column ``key``:
    ``(ja, jb)``, A's and B's own rows for the matched keys, aligned row by row (see
    the module docstring for ``how``: ``inner``, ``left``, ``full``; ``protocol``:
    ``rr22``, ``kkrt``, ``ecdh``). Policies: each holder learns which of its keys the
    other holds, a ``compare`` between two owners' keys as loaded (raw membership, for
    ``plaintext_to``, if a side is a constant or the driver's); aggregates over all
    the joined rows (a holder's own, and the other holder's, aligned with them) pass
    ``aggregate`` as the join keeps at least ``min_rows`` distinct keys (checked by each
    holder at run time); a part of them (a slice, a selection by a comparison) has a
    count that check does not cover."""
    op = "psi.join"
    _holder(op, a, "a")
    _holder(op, b, "b")
    if how not in JOINS:
        raise MPTypeError(f"{op}: how={how!r}; use one of {', '.join(JOINS)}")
    if protocol not in PROTOCOLS:
        raise MPTypeError(f"{op}: protocol={protocol!r}; use one of {', '.join(PROTOCOLS)}")
    ja, jb = _psi.join(a, b, key=key, how=how, protocol=protocol)
    return (place(ja, a.device) if a.device else ja,
            place(jb, b.device) if b.device else jb)


@function
def intersection_size(a: MPObject, b: MPObject, key: str, *,
                      reveal_to: int | Iterable[int] | None = None) -> MPObject:
    """The number of distinct values of column ``key`` that both ``a`` and ``b`` hold
    (an int64 scalar), held by the parties ``reveal_to`` only (default: both holders);
    nothing else about the intersection is revealed. Policies: a count of comparisons
    between two owners' keys (``compare``)."""
    op = "psi.intersection_size"
    holders = (_holder(op, a, "a"), _holder(op, b, "b"))
    if reveal_to is None:
        reveal_to = holders
    ranks = [reveal_to] if isinstance(reveal_to, int) else list(reveal_to)
    if not ranks or not all(type(r) is int for r in ranks):
        raise MPTypeError(f"{op}: reveal_to must be party ranks (ints), got {reveal_to!r}")
    return _psi.intersection_size(a, b, key=key, reveal_to=tuple(sorted(set(ranks))))
