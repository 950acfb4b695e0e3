"""The ``psi`` dialect: private set intersection of parties' tables.

Multi-party ops over tables held by one party each, matched on a key column of the
same name and dtype on every side:

- ``psi.join`` (libpsi: RR22, KKRT or ECDH) of two tables (``a`` by party A, ``b`` by
  party B): each party gets its own rows for the shared keys (``inner``), or also its
  unmatched rows (``left``, ``full``), both results aligned row by row;
- ``psi.intersection_size``: only the number of distinct shared keys, for the
  parties named by ``reveal_to`` (ECDH over X25519, see `mplang.kernels.psi.count`);
- ``psi.join_n`` (ABY3 on secret shares, or libpsi: ECDH_3PC, ECDH_NPC, KKRT_NPC) of n
  tables: each holder gets its own rows for the keys all n hold, aligned;
- ``psi.ub_prepare`` and ``psi.ub_join``: unbalanced PSI (libpsi's ECDH-OPRF), a
  server's set prepared once into its data root, then joined with clients' small sets.

Declarations, type and flow rules; the kernels are in `mplang.kernels.psi.join`
(the join), `mplang.kernels.psi.count` (the count), `mplang.kernels.psi.join_n`
(n parties) and `mplang.kernels.psi.unbalanced` (unbalanced), the user-facing functions
in `mplang.libs.psi`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

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
from mplang.flows.engine import Analysis, PartyLabels
from mplang.flows.labels import Label, compared, join_all, membership, raw, source, subset
from mplang.frontend.feop import feop

mark_library(__file__)

PROTOCOLS = ("rr22", "kkrt", "ecdh")
"""libpsi's two-party protocols: RR22 (VOLE-based, the fastest), KKRT (OT-based),
ECDH (Diffie-Hellman over Curve25519; the least communication rounds)."""
JOINS = ("inner", "left", "full")
"""What ``psi.join`` keeps: shared keys only; also A's unmatched rows; also both sides'."""
NPC_PROTOCOLS = ("aby3", "ecdh_3pc", "ecdh_npc", "kkrt_npc")
"""The protocols of ``psi.join_n``: ``aby3`` (three or more parties; key hashes
intersected on secret shares among the first three holders, only the n-way keys
revealed), then libpsi's ECDH_3PC (three parties only), ECDH_NPC and KKRT_NPC (a tree
of two-party ECDH or KKRT PSIs, any number of parties)."""
COUNT_PROTOCOL, UB_PROTOCOL = "ecdh_cardinality", "ecdh_oprf_ub"
"""The protocols of ``psi.intersection_size`` and of unbalanced PSI, as policies name them."""
UB_FOLDER = "ub-psi"
"""The folder of a party's data root that holds its unbalanced-PSI state, one
subfolder per name."""
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,99}")


def _cost(op: Operation, model: CostModel) -> OpCost:
    """A few rounds moving about the size of both tables (a rough bound)."""
    moved = sum(value_bytes(v.type, model) for v in op.inputs)
    return OpCost(model.message_s(moved), 4)


_TRAITS = OpTraits(pure=True, communicates=True, runtimes=WORKER_AND_DRIVER)
_ROWS = Attr(str, default="", optional=True,
             doc="the symbol of the joined row count, shared by every result")
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
           "rows": _ROWS},
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


_N_TABLES = [Operand("tables", HELD_TABLE, variadic=True, doc="one table per holder")]
join_n_p = Primitive(
    "psi.join_n", kind="communication", execution_model="multi_party", traits=_TRAITS,
    operands=_N_TABLES,
    attrs={"key": _KEY,
           "protocol": Attr(str, required=True, choices=NPC_PROTOCOLS, doc="the protocol"),
           "rows": _ROWS},
    results=[Result("joined", HELD_TABLE, variadic=True, doc="each holder's rows, held by it")],
    cost=_cost,
    doc="Private set intersection of n parties' tables on a key column of distinct keys "
        "(ABY3 on secret shares, or libpsi); each holder gets its own rows for the keys all "
        "n hold, aligned by key.")
_UB_NAME = Attr(str, required=True, doc=f"the name of the server's state ({UB_FOLDER}/NAME "
                                        "in its data root)")
ub_prepare_p = Primitive(
    "psi.ub_prepare", kind="communication", execution_model="multi_party",
    traits=OpTraits(pure=False, communicates=False, runtimes=WORKER_AND_DRIVER),
    operands=[Operand("t", HELD_TABLE, doc="the server's table")],
    attrs={"key": _KEY, "name": _UB_NAME},
    results=[Result("keys", held(TensorType), doc="an int64 scalar: the distinct keys prepared")],
    cost=_cost,
    doc="The offline phase of unbalanced PSI: the server's keys, evaluated under its secret "
        "key (libpsi's ECDH-OPRF), stored in its data root under a name.")
ub_join_p = Primitive(  # with effects: the client keeps a copy of the server's set
    "psi.ub_join", kind="communication", execution_model="multi_party",
    traits=OpTraits(pure=False, communicates=True, runtimes=WORKER_AND_DRIVER),
    operands=[Operand("t", HELD_TABLE, doc="the client's table")],
    attrs={"key": _KEY, "name": _UB_NAME,
           "server": Attr(int, required=True, doc="the rank of the server")},
    results=[Result("joined", HELD_TABLE, doc="the client's rows whose key the server holds"),
             Result("rows", held(TensorType),
                    doc="an int64 scalar at the server: the client's row count")],
    cost=_cost,
    doc="The online phase of unbalanced PSI: the client's rows whose key the server's set "
        "(prepared by psi.ub_prepare) holds, for the client only.")


def _takes_part(a: Analysis, op: Operation, parties: Sequence[int], protocol: str = "") -> None:
    """Record that p takes part in ``op`` with ``protocol`` (default: the op's), if it is
    one of ``parties``: its policy's ``psi_protocols`` must list it."""
    if a.party in parties:
        a.psi.append((op, protocol or str(op.attrs["protocol"])))


def holders(op: Operation) -> tuple[int, int]:
    """The ranks of A and B, the holders of a psi op's two tables."""
    ta, tb = op.inputs[0].type, op.inputs[1].type
    assert isinstance(ta, MPType) and ta.pmask is not None
    assert isinstance(tb, MPType) and tb.pmask is not None
    return ta.pmask.parties[0], tb.pmask.parties[0]


def holders_n(op: Operation) -> tuple[int, ...]:
    """The ranks of the holders of a psi op's tables, in operand order."""
    ranks = []
    for v in op.inputs:
        assert isinstance(v.type, MPType) and v.type.pmask is not None
        ranks.append(v.type.pmask.parties[0])
    return tuple(ranks)


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
    dtypes = [key_dtype(op, name, t, holder, key)
              for name, t, holder in (("a", a, holder_a), ("b", b, holder_b))]
    if dtypes[0] != dtypes[1]:
        raise MPTypeError(f"{op}: key column {key!r} is {dtypes[0]} in a (held by party "
                          f"{holder_a}) but {dtypes[1]} in b (held by party {holder_b}); "
                          "cast one side so both keys have the same dtype")
    assert isinstance(a.base, TableType) and isinstance(b.base, TableType)
    return a.base, holder_a, b.base, holder_b, dtypes[0]


def key_dtype(op: str, what: str, t: MPType, holder: int, key: str) -> str:
    """The dtype of column ``key`` of table ``what`` (held by ``holder``)."""
    if not key:
        raise MPTypeError(f"{op}: the key must be a column name, got {key!r}")
    assert isinstance(t.base, TableType)
    found = dict(t.base.columns).get(key)
    if found is None:
        raise MPTypeError(f"{op}: {what} (held by party {holder}) has no key column "
                          f"{key!r}; its columns: {', '.join(c for c, _ in t.base.columns)}")
    return str(found)


def check_name(op: str, name: Any) -> str:
    """``name`` as the name of unbalanced-PSI state: letters, digits, ``_.-``."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise MPTypeError(f"{op}: name={name!r} must be 1 to 100 letters, digits, '_', '.' "
                          "or '-', starting with a letter or digit")
    return name


@join_p.def_type_rule
def _join_rule(sig: Signature) -> list[ValueType]:
    a, holder_a, b, holder_b, _ = key_types("psi.join", sig.a, sig.b, sig.key)
    rows = _rows_symbol("psi.join", sig)
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


def _rows_symbol(op: str, sig: Signature) -> str | None:
    """The symbol of a join's row count (its optional ``rows``), checked."""
    rows = sig.attrs.get("rows") or None
    if rows is not None and not is_symbolic(rows):
        raise MPTypeError(f"{op}: rows must be a symbol, got {rows!r}")
    return rows


@join_n_p.def_type_rule
def _join_n_rule(sig: Signature) -> list[ValueType]:
    op = "psi.join_n"
    tables: list[MPType] = list(sig.inputs)  # type: ignore[arg-type]
    if len(tables) < 2:
        raise MPTypeError(f"{op}: needs at least two tables, got {len(tables)}")
    ranks = [_holder(op, f"table {i}", t) for i, t in enumerate(tables)]
    if len(set(ranks)) != len(ranks):
        raise MPTypeError(f"{op}: the tables are held by parties {ranks}; each party may "
                          "hold one table only (join tables of one party locally, with "
                          "table.sql)")
    if sig.protocol == "ecdh_3pc" and len(tables) != 3:
        raise MPTypeError(f"{op}: protocol 'ecdh_3pc' joins exactly three tables, got "
                          f"{len(tables)}; use 'ecdh_npc' or 'kkrt_npc'")
    if sig.protocol == "aby3" and len(tables) < 3:
        raise MPTypeError(f"{op}: protocol 'aby3' needs at least three tables (three "
                          f"holders compute), got {len(tables)}; two tables join with "
                          "psi.join or 'kkrt_npc'")
    dtypes = [key_dtype(op, f"table {i}", t, r, sig.key)
              for i, (t, r) in enumerate(zip(tables, ranks, strict=True))]
    for i, dtype in enumerate(dtypes):
        if dtype != dtypes[0]:
            raise MPTypeError(f"{op}: key column {sig.key!r} is {dtypes[0]} in table 0 (held "
                              f"by party {ranks[0]}) but {dtype} in table {i} (held by party "
                              f"{ranks[i]}); cast so every key has the same dtype")
    out: list[ValueType] = []
    rows = _rows_symbol(op, sig)
    for t, r in zip(tables, ranks, strict=True):
        assert isinstance(t.base, TableType)
        out.append(MPType(TableType(t.base.columns, rows), Mask.of([r])))
    return out


@ub_prepare_p.def_type_rule
def _ub_prepare_rule(sig: Signature) -> list[ValueType]:
    op = "psi.ub_prepare"
    server = _holder(op, "t", sig.t)
    key_dtype(op, "t", sig.t, server, sig.key)
    check_name(op, sig.name)
    return [MPType(scalar("int64"), Mask.of([server]))]


@ub_join_p.def_type_rule
def _ub_join_rule(sig: Signature) -> list[ValueType]:
    op = "psi.ub_join"
    client, server = _holder(op, "t", sig.t), sig.server
    key_dtype(op, "t", sig.t, client, sig.key)
    check_name(op, sig.name)
    if type(server) is not int or not 0 <= server < sig.world_size or server == client:
        raise MPTypeError(f"{op}: server={server!r} must be a party of a {sig.world_size}-"
                          f"party world other than the client (party {client})")
    assert isinstance(sig.t.base, TableType)
    return [MPType(TableType(sig.t.base.columns, None), Mask.of([client])),
            MPType(scalar("int64"), Mask.of([server]))]


def _unowned(a: Analysis, op: Operation, tables: dict[int, Label]) -> None:
    """Note ``op`` if the table p joins (``tables``: by holder) is not p's data: its
    kernel then checks no row count against p's ``min_rows``."""
    label = tables.get(a.party)
    if a.party in tables and (label is None or not label.mine):
        a.unowned.append(op)


@join_p.def_flow
def _join_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Each holder keeps those of its rows whose keys the other holds: it learns which of
    its keys the other's table has (an intersection of their keys, raw membership if its
    own side is not its own data), and its rows become a subset chosen by the other's
    data, whose size each holder's kernel checks against its own ``min_rows`` at run time
    (where the table is its own data)."""
    holder_a, holder_b = holders(op)
    _takes_part(a, op, (holder_a, holder_b))
    la, lb = ins[0].get(holder_a), ins[1].get(holder_b)
    what = "which of the receiver's keys this party's table holds"
    seen_by_a, seen_by_b = membership(compared(la, lb)), membership(compared(lb, la))
    a.send(op, holder_a, seen_by_a, what)
    a.send(op, holder_b, seen_by_b, what)
    out_a, out_b = subset(la, seen_by_a, id(op)), subset(lb, seen_by_b, id(op))
    _unowned(a, op, {holder_a: la, holder_b: lb})
    return [{} if out_a is None else {holder_a: out_a},
            {} if out_b is None else {holder_b: out_b}]


@join_n_p.def_flow
def _join_n_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Each holder keeps those of its rows whose keys every other holder's table holds: a
    comparison between its keys and all the others' (``aby3`` reveals no more). With
    libpsi's protocols it may also learn which of its keys one other holder holds (the
    NPC tree) or how many keys two others share (ECDH_3PC): a comparison between its keys
    and each other holder's, as for ``psi.join`` with each of them; the label covers
    both."""
    ranks = holders_n(op)
    _takes_part(a, op, ranks)
    labels = [lab.get(r) for lab, r in zip(ins, ranks, strict=True)]
    out: list[PartyLabels] = []
    for i, (rank, mine) in enumerate(zip(ranks, labels, strict=True)):
        seen = membership(join_all(compared(mine, other) for j, other in enumerate(labels)
                                   if j != i))
        a.send(op, rank, seen, "which of the receiver's keys the other holders' tables hold")
        kept = subset(mine, seen, id(op))
        out.append({} if kept is None else {rank: kept})
    _unowned(a, op, dict(zip(ranks, labels, strict=True)))
    return out


@ub_prepare_p.def_flow
def _ub_prepare_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """The server writes its evaluated keys into its data root (its policy's ``writes``);
    the count of its keys stays with it."""
    _takes_part(a, op, holders_n(op), UB_PROTOCOL)
    a.write(op, f"{UB_FOLDER}/{op.attrs['name']}", holders_n(op)[0])
    return [{}]


@ub_join_p.def_flow
def _ub_join_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """The client keeps its rows whose keys the server's prepared set holds: a comparison
    between its keys and the server's (the prepared set is the server's data, from its
    data root). The client stores the server's evaluated set in its own data root."""
    (client,), server = holders_n(op), int(op.attrs["server"])
    folder = f"{UB_FOLDER}/{op.attrs['name']}"
    _takes_part(a, op, (client, server), UB_PROTOCOL)
    theirs = None
    if a.party == server:
        a.source(op, folder)
        theirs = source(folder, None, table=True)
    a.write(op, folder, client)
    seen = membership(compared(ins[0].get(client), theirs))
    a.send(op, client, seen, "which of the client's keys the server's prepared set holds")
    kept = subset(ins[0].get(client), seen, id(op))
    _unowned(a, op, {client: ins[0].get(client)})
    return [{} if kept is None else {client: kept}, {}]


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
    _takes_part(a, op, (holder_a, holder_b, *reveal_to), COUNT_PROTOCOL)
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


@feop(join_n_p, example='js = psi.join_n([a, b, c], key="id", protocol="aby3")')
@function
def join_n(tables: Sequence[MPObject], *, key: str, protocol: str) -> list[MPObject]:
    """n-party PSI of ``tables`` on column ``key``: each holder's rows, aligned (one row
    count, a symbol every result shares)."""
    rows = current_tracer("psi.join_n").fresh_symbol()
    return list(join_n_p.bind(list(tables), {"key": key, "protocol": protocol, "rows": rows}))


@feop(ub_prepare_p, example='n = psi.ub_prepare(t, key="id", name="customers")')
@function
def ub_prepare(t: MPObject, *, key: str, name: str) -> MPObject:
    """Prepare the server's table ``t`` for unbalanced PSI under ``name``."""
    return ub_prepare_p.bind([t], {"key": key, "name": name})[0]


@feop(ub_join_p, example='j, n = psi.ub_join(t, key="id", name="customers", server=0)')
@function
def ub_join(t: MPObject, *, key: str, name: str, server: int) -> tuple[MPObject, MPObject]:
    """The client's rows of ``t`` whose key the server's prepared set ``name`` holds, and
    the client's row count at the server."""
    joined, rows = ub_join_p.bind([t], {"key": key, "name": name, "server": server})
    return joined, rows


@feop(size_p, example='n = psi.intersection_size(a, b, key="id", reveal_to=(0, 1))')
@function
def intersection_size(a: MPObject, b: MPObject, *, key: str, reveal_to: tuple[int, ...]
                      ) -> MPObject:
    """The number of distinct keys of column ``key`` in both tables, held by ``reveal_to``."""
    return size_p.bind([a, b], {"key": key, "reveal_to": tuple(reveal_to)})[0]
