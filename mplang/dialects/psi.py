"""The ``psi`` dialect: private set intersection of two parties' tables.

Two multi-party ops over tables held by one party each (``a`` by party A, ``b``
by party B), matched on a key column of the same name and dtype on both sides:

- ``psi.join`` (libpsi: RR22, KKRT or ECDH): each party gets its own rows for the
  shared keys (``inner``), or also its unmatched rows (``left``, ``full``), both
  results aligned row by row;
- ``psi.intersection_size``: only the number of distinct shared keys, for the
  parties named by ``reveal_to`` (ECDH over X25519, see `mplang.backends.psi_count`).

Declarations, type and flow rules; the kernels are in `mplang.backends.psi_impl`
(the join) and `mplang.backends.psi_count` (the count), the user-facing functions
in `mplang.libs.psi`.
"""

from __future__ import annotations

from collections.abc import Sequence

from mplang.analysis.cost_model import CostModel, OpCost, value_bytes
from mplang.dialects.table import TableType
from mplang.edsl.attrs import Attr
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.graph import Operation
from mplang.edsl.location import mark_library
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import Operand, Primitive, Result, Signature, held
from mplang.edsl.tracer import current_tracer
from mplang.edsl.traits import WORKER_AND_DRIVER, OpTraits
from mplang.edsl.typing import Mask, MPType, TensorType, ValueType, is_symbolic, scalar
from mplang.frontend.feop import feop
from mplang.policy.flows import Analysis, PartyLabels
from mplang.policy.labels import compared, raw, subset

mark_library(__file__)

PROTOCOLS = ("rr22", "kkrt", "ecdh")
"""libpsi's two-party protocols: RR22 (VOLE-based, the fastest), KKRT (OT-based),
ECDH (Diffie-Hellman over Curve25519; the least communication rounds)."""
JOINS = ("inner", "left", "full")
"""What ``psi.join`` keeps: shared keys only; also A's unmatched rows; also both sides'."""


def _cost(op: Operation, model: CostModel) -> OpCost:
    """A few rounds moving about the size of both tables (a rough bound)."""
    moved = sum(value_bytes(v.type, model) for v in op.inputs)
    return OpCost(model.message_s(moved), 4)


_TRAITS = OpTraits(pure=True, communicates=True, runtimes=WORKER_AND_DRIVER)
HELD_TABLE = held(TableType, name="a table at the simp level")
_TABLES = [Operand("a", HELD_TABLE, doc="party A's table"),
           Operand("b", HELD_TABLE, doc="party B's table")]
_KEY = Attr(str, required=True, doc="the key column, of one name and dtype in both tables")
join_p = Primitive(
    "psi.join", kind="communication", execution_model="multi_party", traits=_TRAITS,
    operands=_TABLES,
    attrs={"key": _KEY,
           "how": Attr(str, default="inner", choices=JOINS, doc="which rows to keep"),
           "protocol": Attr(str, default="rr22", choices=PROTOCOLS, doc="libpsi's protocol"),
           "rows": Attr(str, default="", optional=True,
                        doc="the symbol of the joined row count, shared by both results")},
    results=[Result("ja", HELD_TABLE, doc="A's rows, held by A"),
             Result("jb", HELD_TABLE, doc="B's rows, held by B")],
    cost=_cost,
    doc="Private set intersection join of two parties' tables on a key column (libpsi); "
        "each party gets its own rows, aligned with the other's.")
size_p = Primitive(
    "psi.intersection_size", kind="communication", execution_model="multi_party",
    traits=_TRAITS, operands=_TABLES,
    attrs={"key": _KEY,
           "reveal_to": Attr(tuple, required=True,
                             doc="the parties that learn the count, in increasing order")},
    results=[Result("count", held(TensorType), doc="an int64 scalar")], cost=_cost,
    doc="The number of distinct keys two parties' tables share, revealed to the named "
        "parties only (ECDH over X25519).")


def holders(op: Operation) -> tuple[int, int]:
    """The ranks of A and B, the holders of a psi op's two tables."""
    ta, tb = op.inputs[0].type, op.inputs[1].type
    assert isinstance(ta, MPType) and ta.pmask is not None
    assert isinstance(tb, MPType) and tb.pmask is not None
    return ta.pmask.parties[0], tb.pmask.parties[0]


def counter_of(members: tuple[int, int], reveal_to: Sequence[int]) -> int:
    """The party that counts in ``psi.intersection_size``: A if it may learn the count,
    else B, else the first named."""
    for holder in members:
        if holder in reveal_to:
            return holder
    return reveal_to[0]


def _holder(op: str, what: str, t: MPType) -> int:
    """The one holder of input ``what``."""
    if t.pmask is None or len(t.pmask) != 1:
        raise MPTypeError(f"{op}: {what} ({t}) must be held by exactly one party, known "
                          "when tracing")
    return t.pmask.parties[0]


def key_types(op: str, a: MPType, b: MPType, key: str
              ) -> tuple[TableType, int, TableType, int, str]:
    """Check the two tables and their key column; returns (a, A, b, B, key dtype)."""
    holder_a, holder_b = _holder(op, "a", a), _holder(op, "b", b)
    if holder_a == holder_b:
        raise MPTypeError(f"{op}: a and b are both held by party {holder_a}; PSI runs between "
                          "two parties (join tables of one party locally, with table.sql)")
    if not key:
        raise MPTypeError(f"{op}: the key must be a column name, got {key!r}")
    assert isinstance(a.base, TableType) and isinstance(b.base, TableType)
    dtypes = []
    for name, t, holder in (("a", a.base, holder_a), ("b", b.base, holder_b)):
        found = dict(t.columns).get(key)
        if found is None:
            raise MPTypeError(f"{op}: {name} (held by party {holder}) has no key column "
                              f"{key!r}; its columns: {', '.join(c for c, _ in t.columns)}")
        dtypes.append(found)
    if dtypes[0] != dtypes[1]:
        raise MPTypeError(f"{op}: key column {key!r} is {dtypes[0]} in a (held by party "
                          f"{holder_a}) but {dtypes[1]} in b (held by party {holder_b}); "
                          "cast one side so both keys have the same dtype")
    return a.base, holder_a, b.base, holder_b, dtypes[0]


@join_p.def_type_rule
def _join_rule(sig: Signature) -> list[ValueType]:
    a, holder_a, b, holder_b, _ = key_types("psi.join", sig.a, sig.b, sig.key)
    rows = sig.attrs.get("rows") or None
    if rows is not None and not is_symbolic(rows):
        raise MPTypeError(f"psi.join: rows must be a symbol, got {rows!r}")
    return [MPType(TableType(a.columns, rows), Mask.of([holder_a])),
            MPType(TableType(b.columns, rows), Mask.of([holder_b]))]


@size_p.def_type_rule
def _size_rule(sig: Signature) -> list[ValueType]:
    key_types("psi.intersection_size", sig.a, sig.b, sig.key)
    reveal_to = sig.reveal_to
    if not (reveal_to and all(type(r) is int and 0 <= r < sig.world_size for r in reveal_to)
            and list(reveal_to) == sorted(set(reveal_to))):
        raise MPTypeError(f"psi.intersection_size: reveal_to must be distinct parties of a "
                          f"{sig.world_size}-party world in increasing order, got {reveal_to!r}")
    return [MPType(scalar("int64"), Mask.of(reveal_to))]


@join_p.def_flow
def _join_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Each holder keeps those of its rows whose keys the other holds: it learns which of
    its keys the other's table has (a comparison between their keys, raw membership if
    its own side is not its own data), and its rows become a subset chosen by the other's
    data, whose size each holder's kernel checks against its own ``min_rows`` at run time."""
    holder_a, holder_b = holders(op)
    la, lb = ins[0].get(holder_a), ins[1].get(holder_b)
    what = "which of the receiver's keys this party's table holds"
    seen_by_a, seen_by_b = compared(la, lb), compared(lb, la)
    a.send(op, holder_a, seen_by_a, what)
    a.send(op, holder_b, seen_by_b, what)
    out_a, out_b = subset(la, seen_by_a, id(op)), subset(lb, seen_by_b, id(op))
    return [{} if out_a is None else {holder_a: out_a},
            {} if out_b is None else {holder_b: out_b}]


@size_p.def_flow
def _size_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """The intersection size is a count of comparisons between the two tables' keys (raw
    membership if a side is not its holder's own data); row counts are public, as
    shapes are."""
    holder_a, holder_b = holders(op)
    count = compared(ins[0].get(holder_a), ins[1].get(holder_b))
    if count is not None and count.mine and count.form == "rowwise":
        count = raw([count])
    reveal_to = tuple(op.attrs["reveal_to"])
    counter = counter_of((holder_a, holder_b), reveal_to)
    for r in dict.fromkeys((counter, *reveal_to)):
        a.send(op, r, count, "the intersection size")
    return [{} if count is None or not count.mine else dict.fromkeys(reveal_to, count)]


@feop(join_p, example='ja, jb = psi.join(a, b, key="id", how="inner", protocol="rr22")')
@function
def join(a: MPObject, b: MPObject, *, key: str, how: str = "inner", protocol: str = "rr22"
         ) -> tuple[MPObject, MPObject]:
    """PSI join of ``a`` and ``b`` on column ``key``: each holder's rows, aligned (one row
    count, a symbol shared by both results: ``table<...>[?n0]``)."""
    rows = current_tracer("psi.join").fresh_symbol()
    ja, jb = join_p.bind([a, b], {"key": key, "how": how, "protocol": protocol,
                                  "rows": rows})
    return ja, jb


@feop(size_p, example='n = psi.intersection_size(a, b, key="id", reveal_to=(0, 1))')
@function
def intersection_size(a: MPObject, b: MPObject, *, key: str, reveal_to: tuple[int, ...]
                      ) -> MPObject:
    """The number of distinct keys of column ``key`` in both tables, held by ``reveal_to``."""
    return size_p.bind([a, b], {"key": key, "reveal_to": tuple(reveal_to)})[0]
