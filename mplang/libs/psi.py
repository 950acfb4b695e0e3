"""Private set intersection (PSI) of parties' tables: `join` and `intersection_size` of
two, `join_n` of n, and unbalanced PSI (`ub_prepare` once, `ub_join` many times).

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

What each holder learns from `join`: the other's row count and number of distinct
keys, which of its own keys the other holds and how often (from the repeated rows),
and for ``left``/``full`` how many unmatched rows the other contributes; never the
other's unmatched keys or any of its other columns. Duplicate keys are allowed (see ``inner``). Null
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

from collections.abc import Iterable, Sequence
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

NPC_PROTOCOLS = _psi.NPC_PROTOCOLS
"""The protocols of `join_n`: ``"aby3"`` (three or more tables; reveals the n-way
intersection only), then libpsi's ``"ecdh_3pc"`` (three tables only), ``"ecdh_npc"``,
``"kkrt_npc"``."""

__all__ = ["JOINS", "NPC_PROTOCOLS", "PROTOCOLS", "intersection_size", "join", "join_n",
           "ub_join", "ub_prepare"]


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


@function
def join_n(tables: Sequence[MPObject], key: str, *, protocol: str | None = None
           ) -> list[MPObject]:
    """n-party PSI of ``tables`` (each held by another party; keys distinct within each
    table) on column ``key``: one table per holder, its own rows whose key every table
    holds, ordered by key, so row ``i`` of every result belongs to one key.

    ``protocol``:

    - ``"aby3"`` (the default for three or more tables): each holder secret-shares the
      hashes of its keys among the first three holders, which intersect them under
      ABY3 (semi-honest, honest majority: it holds while no two of those three
      collude); every holder learns the n-way keys and every holder's row count,
      nothing about keys fewer than n tables hold. Its cost grows with the sum of the
      row counts: about 33 s for three tables of 300,000 rows on two cores.
    - libpsi's ``"ecdh_3pc"`` (three tables), ``"ecdh_npc"`` and ``"kkrt_npc"`` (the
      default for two tables), semi-honest and faster, reveal more: with ``ecdh_3pc``
      (holders 0, 1, 2 in argument order), holders 0 and 1 also learn how many keys
      holders 1 and 2 share; with the NPC protocols, a tree of two-party PSIs, some
      holders learn which of their keys one other holder has (holder 0 with the largest
      other table) and the sizes of these partial intersections (see docs/psi.md).

    Policies: for each holder, a ``compare`` of its keys with every other holder's, and
    the joined rows as for `join`."""
    op = "psi.join_n"
    tables = list(tables)
    for i, t in enumerate(tables):
        _holder(op, t, f"table {i}")
    if protocol is None:
        protocol = "aby3" if len(tables) >= 3 else "kkrt_npc"
    if protocol not in NPC_PROTOCOLS:
        raise MPTypeError(f"{op}: protocol={protocol!r}; use one of {', '.join(NPC_PROTOCOLS)}")
    joined = _psi.join_n(tables, key=key, protocol=protocol)
    return [place(j, t.device) if t.device else j for j, t in zip(joined, tables, strict=True)]


@function
def ub_prepare(t: MPObject, key: str, *, name: str) -> MPObject:
    """The offline phase of unbalanced PSI, run by the holder of ``t`` (the server) alone:
    its distinct keys of column ``key``, evaluated under a fresh secret key (libpsi's
    ECDH-OPRF over Curve25519), stored with that key in its data root as
    ``ub-psi/NAME`` (its policy's ``writes`` must allow it). Returns the number of
    distinct keys prepared (an int64 scalar at the server). Preparing a name again
    replaces its state; clients then fetch the new set on their next `ub_join`."""
    _holder("psi.ub_prepare", t, "t")
    return _psi.ub_prepare(t, key=key, name=name)


@function
def ub_join(t: MPObject, key: str, *, server: int, name: str) -> MPObject:
    """The online phase of unbalanced PSI between the holder of ``t`` (a client) and party
    ``server``, which prepared ``name`` with `ub_prepare`: the client's rows whose key
    the server's set holds, ordered by (key, row), at the client only; duplicate keys
    allowed. The first join of a client with a prepared set copies the server's
    evaluated set into the client's data root (``ub-psi/NAME``); later joins reuse it.
    The client learns which of its keys the server holds and the server's number of
    keys; the server learns the client's row count and number of distinct keys, never
    which. Policies: a ``compare`` of the client's keys with the server's prepared set;
    both parties' ``writes`` must allow ``ub-psi/NAME``."""
    op = "psi.ub_join"
    _holder(op, t, "t")
    if type(server) is not int:
        raise MPTypeError(f"{op}: server must be a party rank (int), got {server!r}")
    joined, _ = _psi.ub_join(t, key=key, name=name, server=server)
    return place(joined, t.device) if t.device else joined
