"""The kernel of ``psi.join_n``: n-party PSI among the holders of n tables.

With ``"aby3"`` (the default for three or more tables), the holders' key hashes are
secret-shared among the first three holders and intersected there; only the n-way
keys are revealed (`mplang.kernels.psi.aby3`). With libpsi's protocols
(``spu.psi.psi_execute`` with ``PROTOCOL_ECDH_3PC``, ``PROTOCOL_ECDH_NPC`` or
``PROTOCOL_KKRT_NPC``, its older "bucket" PSI) libpsi runs on one link among all the
holders (`mplang.kernels.psi.join` makes it), with holder 0 as its receiver and the
result broadcast to every holder; some holders learn more than the n-way keys (see
`mplang.libs.psi.join_n`). As for ``psi.join``, each holder hands libpsi only its
encoded keys and row numbers, in a private temporary folder, and rebuilds its rows
from its own table; the keys are distinct on every side, so sorting the shared rows
by key aligns the n results.

Before the protocol starts, every holder sends every other a hello (its row count, or
why it cannot take part: bad input, null or repeated keys), so a bad input fails all of
them at once. If a table is empty, no protocol runs: the intersection is empty.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.dialects import psi
from mplang.kernels.psi.aby3 import COMPUTE, plan, shared_index
from mplang.kernels.psi.join import (
    PsiState,
    backend,
    call_libpsi,
    check_rows,
    read_rows,
    sorted_rows,
    take_rows,
    write_keys,
)
from mplang.kernels.psi.session import (
    U64,
    Session,
    check_distinct,
    check_table,
    encode_keys,
    stopping,
    u64,
)
from mplang.runtime.interpreter import Call

if TYPE_CHECKING:
    import pyarrow as pa

_PROTOCOL = {"ecdh_3pc": "PROTOCOL_ECDH_3PC", "ecdh_npc": "PROTOCOL_ECDH_NPC",
             "kkrt_npc": "PROTOCOL_KKRT_NPC"}


def run_npc(protocol: str, keys: pa.Array, link: Any, folder: Path) -> np.ndarray:
    """libpsi's n-party PSI of this holder's encoded ``keys`` (distinct): the numbers of
    this holder's rows whose key every holder has, in libpsi's order."""
    from spu import psi as libpsi

    source, result = folder / "keys.csv", folder / "result.csv"
    write_keys(source, keys)
    config = libpsi.PsiExecuteConfig(
        protocol_conf=libpsi.PsiProtocolConfig(
            protocol=getattr(libpsi.PsiProtocol, _PROTOCOL[protocol]),
            receiver_rank=0, broadcast_result=True,
            ecdh_params=libpsi.EcdhParams(curve=libpsi.EllipticCurveType.CURVE_25519)),
        input_params=libpsi.InputParams(path=str(source), selected_keys=["k"],
                                        keys_unique=True),
        output_params=libpsi.OutputParams(path=str(result)))
    call_libpsi(libpsi.psi_execute, config, link)
    return read_rows(result, len(keys))


def shared_rows(protocol: str, table: pa.Table, key: str, counts: list[int],
                link: Any, session: Session, members: tuple[int, ...], rank: int
                ) -> pa.Table:
    """This holder's rows whose key all holders have, by key (``counts``: every
    holder's row count, from the hellos)."""
    keys = encode_keys(table.column(key))
    if min(counts) == 0:
        index = np.zeros(0, np.int64)
        for dst, name in list(session.pending):
            session.skip(dst, name)
    elif protocol == "aby3":
        index = shared_index(session, members, rank, keys, counts, link)
    else:
        with tempfile.TemporaryDirectory(prefix="mplang-psi-") as folder:
            index = run_npc(protocol, keys, link(), Path(folder))
        if len(index):
            index = sorted_rows(index, keys)[0]
    return take_rows(table, index)


@backend.kernel(psi.join_n_p)
def _join_n(call: Call, *tables: Any, key: str, protocol: str) -> list[Any]:
    state: PsiState = call.state("psi")
    rank = state.env.rank
    members = psi.holders_n(call.op)
    out: list[Any] = [None] * len(members)
    if rank not in members:
        return out
    side = members.index(rank)
    peers = [m for m in members if m != rank]
    aby3 = protocol == "aby3"
    planned = plan(members, rank) if aby3 else []
    session = Session.of(call, state.env, [(p, "hello") for p in peers] + planned)
    table = tables[side]
    session.refuse(call, check_table(table, key, rank)
                   or check_distinct(table, key, rank, "psi.join_n"))
    for p in peers:
        session.send(p, "hello", U64.pack(table.num_rows))

    def link() -> Any:
        among = members[:COMPUTE] if aby3 else members
        return state.links.link(among, *call.tag, among.index(rank), session.timeout)

    with stopping(call, session):
        counts = [table.num_rows if m == rank else u64(session.recv(m, "hello"), "hello")
                  for m in members]
        result = shared_rows(protocol, table, key, counts, link, session, members, rank)
    check_rows(call, result, key, "the n-party join of its table")
    out[side] = result
    return out
