"""The ``psi`` dialect: private set intersection of two parties' tables.

Two multi-party ops over tables held by one party each (``a`` by party A, ``b``
by party B), matched on a key column of the same name and dtype on both sides:

- ``psi.join`` (libpsi: RR22, KKRT or ECDH): each party gets its own rows for the
  shared keys (``inner``), or also its unmatched rows (``left``, ``full``), both
  results aligned row by row;
- ``psi.intersection_size``: only the number of distinct shared keys, for the
  parties named by ``reveal_to`` (ECDH over X25519, see `mplang.backends.psi_impl`).

Definitions and type rules only; the kernels are in `mplang.backends.psi_impl` and
the user-facing functions in `mplang.libs.psi`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from mplang.dialects.table import TableType
from mplang.edsl.function import function
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.location import mark_library
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import Primitive
from mplang.edsl.typing import Mask, MPType, ValueType, scalar
from mplang.edsl.errors import MPTypeError
from mplang.frontend.feop import feop
from mplang.edsl.traits import WORKER_AND_DRIVER, OpTraits

mark_library(__file__)

PROTOCOLS = ("rr22", "kkrt", "ecdh")
"""libpsi's two-party protocols: RR22 (VOLE-based, the fastest), KKRT (OT-based),
ECDH (Diffie-Hellman over Curve25519; the least communication rounds)."""
JOINS = ("inner", "left", "full")
"""What ``psi.join`` keeps: shared keys only; also A's unmatched rows; also both sides'."""


def _cost(op: Operation, model: Any) -> Any:
    """A few rounds moving about the size of both tables (a rough bound)."""
    from mplang.analysis.cost_model import OpCost, value_bytes

    moved = sum(value_bytes(v.type, model) for v in op.inputs)
    return OpCost(model.message_s(moved), 4)


_TRAITS = OpTraits(pure=True, communicates=True, runtimes=WORKER_AND_DRIVER)
join_p = Primitive("psi.join", kind="communication", execution_model="multi_party",
                   traits=_TRAITS, cost=_cost,
                   doc="Private set intersection join of two parties' tables on a key column "
                       "(libpsi); each party gets its own rows, aligned with the other's.")
size_p = Primitive("psi.intersection_size", kind="communication", execution_model="multi_party",
                   traits=_TRAITS, cost=_cost,
                   doc="The number of distinct keys two parties' tables share, revealed to "
                       "the named parties only (ECDH over X25519).")


def _table(op: str, what: str, t: ValueType) -> tuple[TableType, int]:
    """The table type and the one holder of input ``what``."""
    if not (isinstance(t, MPType) and isinstance(t.base, TableType)):
        raise MPTypeError(f"{op}: {what} must be a table at the simp level, got {t}")
    if t.pmask is None or len(t.pmask) != 1:
        raise MPTypeError(f"{op}: {what} ({t}) must be held by exactly one party, known "
                          "when tracing")
    return t.base, t.pmask.parties[0]


def key_types(op: str, in_types: list[ValueType], key: Any
              ) -> tuple[TableType, int, TableType, int, str]:
    """Check the two tables and their key column; returns (a, A, b, B, key dtype)."""
    if len(in_types) != 2:
        raise MPTypeError(f"{op}: takes two tables, got {len(in_types)} inputs")
    a, holder_a = _table(op, "a", in_types[0])
    b, holder_b = _table(op, "b", in_types[1])
    if holder_a == holder_b:
        raise MPTypeError(f"{op}: a and b are both held by party {holder_a}; PSI runs between "
                          "two parties (join tables of one party locally, with table.sql)")
    if not isinstance(key, str) or not key:
        raise MPTypeError(f"{op}: the key must be a column name, got {key!r}")
    dtypes = []
    for name, t, holder in (("a", a, holder_a), ("b", b, holder_b)):
        found = dict(t.columns).get(key)
        if found is None:
            raise MPTypeError(f"{op}: {name} (held by party {holder}) has no key column "
                              f"{key!r}; its columns: {', '.join(c for c, _ in t.columns)}")
        dtypes.append(found)
    if dtypes[0] != dtypes[1]:
        raise MPTypeError(f"{op}: key column {key!r} is {dtypes[0]} in a (held by party "
                          f"{holder_a}) but {dtypes[1]} in b (held by party {holder_b}); "
                          "cast one side so both keys have the same dtype")
    return a, holder_a, b, holder_b, dtypes[0]


@join_p.def_type_rule
def _join_rule(sig: Signature) -> list[ValueType]:
    a, holder_a, b, holder_b, _ = key_types("psi.join", sig.inputs, sig.attrs.get("key"))
    if sig.regions:
        raise MPTypeError("psi.join: takes no sig.regions")
    if sig.attrs.get("how") not in JOINS:
        raise MPTypeError(f"psi.join: how must be one of {', '.join(JOINS)}, got "
                          f"{sig.attrs.get('how')!r}")
    if sig.attrs.get("protocol") not in PROTOCOLS:
        raise MPTypeError(f"psi.join: protocol must be one of {', '.join(PROTOCOLS)}, got "
                          f"{sig.attrs.get('protocol')!r}")
    return [MPType(TableType(a.columns, None), Mask.of([holder_a])),
            MPType(TableType(b.columns, None), Mask.of([holder_b]))]


@size_p.def_type_rule
def _size_rule(sig: Signature) -> list[ValueType]:
    key_types("psi.intersection_size", sig.inputs, sig.attrs.get("key"))
    if sig.regions:
        raise MPTypeError("psi.intersection_size: takes no sig.regions")
    reveal_to = sig.attrs.get("reveal_to")
    if not (isinstance(reveal_to, tuple) and reveal_to
            and all(type(r) is int and 0 <= r < sig.world_size for r in reveal_to)
            and list(reveal_to) == sorted(set(reveal_to))):
        raise MPTypeError(f"psi.intersection_size: reveal_to must be distinct parties of a "
                          f"{sig.world_size}-party world in increasing order, got {reveal_to!r}")
    return [MPType(scalar("int64"), Mask.of(reveal_to))]


@feop(join_p, example='ja, jb = psi.join(a, b, key="id", how="inner", '
                                       'protocol="rr22")')
@function
def join(a: MPObject, b: MPObject, *, key: str, how: str, protocol: str
         ) -> tuple[MPObject, MPObject]:
    """PSI join of ``a`` and ``b`` on column ``key``: each holder's rows, aligned."""
    ja, jb = join_p.bind([a, b], {"key": key, "how": how, "protocol": protocol})
    return ja, jb


@feop(size_p, example='n = psi.intersection_size(a, b, key="id", reveal_to=(0, 1))')
@function
def intersection_size(a: MPObject, b: MPObject, *, key: str, reveal_to: tuple[int, ...]
                      ) -> MPObject:
    """The number of distinct keys of column ``key`` in both tables, held by ``reveal_to``."""
    return size_p.bind([a, b], {"key": key, "reveal_to": tuple(reveal_to)})[0]
