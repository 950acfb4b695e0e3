"""The kernels of unbalanced PSI (``psi.ub_prepare``, ``psi.ub_join``): libpsi's
ECDH-OPRF PSI (``spu.psi.ub_psi_execute``), its offline state in the parties' data roots.

Offline (``psi.ub_prepare``, on the server alone): libpsi evaluates the server's
distinct keys under a fresh secret key (``MODE_OFFLINE_GEN_CACHE``) into
``ub-psi/NAME/server-cache`` of its data root, beside its encoded keys
(``server-keys.csv``) and ``server.json``: the key column's name and type, the number of
keys and a random token naming this preparation, written last.

Online (``psi.ub_join``): the server sends its hello (the token, key type and count, or
why it cannot serve), the client answers with its row count and whether it needs the
server's evaluated set: a client keeps one copy per name (``ub-psi/NAME/client-cache``
and ``client.json`` with the token) and fetches a new one (``MODE_OFFLINE_TRANSFER_CACHE``)
when it has none or the server prepared the name again. Then ``MODE_ONLINE``: the client
blinds its keys, the server evaluates them, the client compares them with the copy and
rebuilds its rows from its own table with the row numbers libpsi returns.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.dialects import psi
from mplang.edsl.errors import MPRefusedError, MPRuntimeError
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
    FAILED,
    NO_STATE,
    Session,
    check_table,
    encode_keys,
    stopping,
)
from mplang.runtime.interpreter import Call
from mplang.storage import data_root

if TYPE_CHECKING:
    import pyarrow as pa

    from mplang.worker.state import SimpWorker

FORMAT = 1
"""The version of the server's ``server.json``; another version must be prepared again."""
_ANSWER = struct.Struct("<QB")
"""The client's answer to the server's hello: its row count, 1 if it needs the set."""


@dataclass(frozen=True)
class Prepared:
    """What ``server.json`` says of a server's prepared set."""

    key: str
    dtype: str
    keys: int
    token: str


def _folder(worker: SimpWorker, name: str, op: str, write: bool) -> Path:
    """The folder ``ub-psi/NAME`` of this party's data root (made if ``write``)."""
    marker = f"{psi.UB_FOLDER}/{name}/server.json"
    if write:
        return data_root.resolve_for_write(worker.data_root, marker, worker.node, op=op,
                                           extensions=(".json",)).parent
    base = Path(worker.data_root).resolve()
    folder = (base / psi.UB_FOLDER / name).resolve()
    if not folder.is_relative_to(base):
        raise MPRuntimeError(f"{op}: {psi.UB_FOLDER}/{name} escapes the data root of "
                             f"{worker.node}")
    return folder


def _solo_link(exec_id: str, key: str) -> Any:
    """A link of one party (libpsi's offline phase wants one, and sends nothing)."""
    import spu.libspu as libspu

    from mplang.kernels.spu.channel import route_logs

    route_logs()
    desc = libspu.link.Desc()
    desc.id = f"{exec_id}{key}/solo"
    desc.add_party("server", "mem:0")
    return libspu.link.create_mem(desc, 0)


def _config(mode: str, role: str, cache: Path, source: Path, result: Path) -> Any:
    from spu import psi as libpsi

    return libpsi.UbPsiExecuteConfig(
        mode=getattr(libpsi.UbPsiMode, mode), role=getattr(libpsi.UbPsiRole, role),
        server_receive_result=False, client_receive_result=True, cache_path=str(cache),
        input_params=libpsi.InputParams(path=str(source), selected_keys=["k"],
                                        keys_unique=False),
        output_params=libpsi.OutputParams(path=str(result)),
        join_conf=libpsi.ResultJoinConfig(type=libpsi.ResultJoinType.JOIN_TYPE_INNER_JOIN))


def prepare(folder: Path, key: str, column: pa.ChunkedArray, link: Any) -> int:
    """Write the server's state into ``folder``: returns the number of distinct keys."""
    import pyarrow.compute as pc
    from spu import psi as libpsi

    (folder / "server.json").unlink(missing_ok=True)  # incomplete until rewritten
    keys = pc.unique(encode_keys(column))
    source, cache = folder / "server-keys.csv", folder / "server-cache"
    write_keys(source, keys)
    shutil.rmtree(cache, ignore_errors=True)
    if len(keys):
        config = _config("MODE_OFFLINE_GEN_CACHE", "ROLE_SERVER", cache, source,
                         folder / "server-result.csv")
        call_libpsi(libpsi.ub_psi_execute, config, link)
    else:  # an empty set: every join is empty, libpsi does not run
        cache.mkdir()
    state = {"format": FORMAT, "key": key, "dtype": str(column.type), "keys": len(keys),
             "token": secrets.token_hex(16)}
    tmp = folder / "server.json.tmp"
    tmp.write_text(json.dumps(state))
    os.replace(tmp, folder / "server.json")
    return len(keys)


def load_prepared(folder: Path) -> Prepared | None:
    """The server's prepared state in ``folder``, None if missing, incomplete or of
    another format."""
    try:
        state = json.loads((folder / "server.json").read_text())
        if state.get("format") != FORMAT or not (folder / "server-cache").is_dir() \
                or not (folder / "server-keys.csv").is_file():
            return None
        return Prepared(str(state["key"]), str(state["dtype"]), int(state["keys"]),
                        str(state["token"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


@backend.kernel(psi.ub_prepare_p)
def _ub_prepare(call: Call, t: Any, *, key: str, name: str) -> list[Any]:
    state: PsiState = call.state("psi")
    if state.env.rank != psi.holders_n(call.op)[0]:
        return [None]
    worker: SimpWorker = call.state("simp")
    problem = check_table(t, key, state.env.rank)
    if problem is not None:
        raise call.error(problem[1])
    what = "op psi.ub_prepare" + (f" at {call.op.loc}" if call.op.loc else "")
    try:
        worker.check_write(what, f"{psi.UB_FOLDER}/{name}")
        folder = _folder(worker, name, "psi.ub_prepare", write=True)
        count = prepare(folder, key, t.column(key), _solo_link(*call.tag))
    except MPRuntimeError as e:
        raise call.error(str(e), type(e)) from None
    return [np.array(count, np.int64)]


def _serve(call: Call, client: int, name: str, key: str) -> int:
    """The server's part of ``psi.ub_join`` (set ``name``, key column ``key``): the
    client's row count."""
    state: PsiState = call.state("psi")
    worker: SimpWorker = call.state("simp")
    session = Session.of(call, state.env, [(client, "hello")])
    try:
        folder = _folder(worker, name, "psi.ub_join", write=False)
        prepared = load_prepared(folder)
    except MPRuntimeError:
        prepared = None
    if prepared is None or prepared.key != key:
        session.fail(NO_STATE)
        found = "" if prepared is None else f" (it was prepared for key {prepared.key!r})"
        raise call.error(f"party {state.env.rank} has no usable prepared set {name!r} for "
                         f"key {key!r} in its data root ({psi.UB_FOLDER}/{name}){found}; run "
                         f"psi.ub_prepare(table, {key!r}, name={name!r}) on party "
                         f"{state.env.rank} first")
    members = (state.env.rank, client)
    with stopping(call, session):
        session.send(client, "hello", json.dumps(
            {"token": prepared.token, "dtype": prepared.dtype, "keys": prepared.keys}).encode())
        rows, wants = _ANSWER.unpack(_answer(session.recv(client, "answer")))
        if rows == 0 or prepared.keys == 0:
            return int(rows)
        from spu import psi as libpsi

        with tempfile.TemporaryDirectory(prefix="mplang-psi-") as tmp:
            for mode in ("MODE_OFFLINE_TRANSFER_CACHE",) * wants + ("MODE_ONLINE",):
                config = _config(mode, "ROLE_SERVER", folder / "server-cache",
                                 folder / "server-keys.csv", Path(tmp) / "result.csv")
                link = state.links.link(members, call.interp.exec_id, f"{call.key}/{mode}", 0,
                                        session.timeout)
                call_libpsi(libpsi.ub_psi_execute, config, link)
    return int(rows)


def _answer(data: bytes) -> bytes:
    if len(data) != _ANSWER.size or data[-1] > 1:
        raise MPRuntimeError(f"the client's answer is malformed ({len(data)} bytes)")
    return data


def _hello(data: bytes, server: int) -> dict[str, Any]:
    try:
        hello = json.loads(data)
        if isinstance(hello, dict) and isinstance(hello.get("token"), str) and \
                isinstance(hello.get("dtype"), str) and type(hello.get("keys")) is int:
            return hello
    except ValueError:
        pass
    raise MPRuntimeError(f"party {server}'s hello is malformed")


def _client_token(folder: Path) -> str | None:
    try:
        token = json.loads((folder / "client.json").read_text())["token"]
        return str(token) if (folder / "client-cache").is_dir() else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _join(call: Call, table: Any, server: int, name: str, column: str) -> pa.Table:
    """The client's part of ``psi.ub_join`` (set ``name``, key column ``column``): its
    joined rows."""
    from spu import psi as libpsi

    state: PsiState = call.state("psi")
    worker: SimpWorker = call.state("simp")
    rank = state.env.rank
    session = Session.of(call, state.env, [(server, "answer")])
    session.refuse(call, check_table(table, column, rank))
    try:  # before any message: the policy's writes must allow the copy of the server's set
        worker.check_write("op psi.ub_join" + (f" at {call.op.loc}" if call.op.loc else ""),
                           f"{psi.UB_FOLDER}/{name}")
    except MPRefusedError:
        session.fail(FAILED)
        raise
    with stopping(call, session):
        hello = _hello(session.recv(server, "hello"), server)
        mine = str(table.column(column).type)
        if hello["dtype"] != mine:
            raise MPRuntimeError(f"key column {column!r} of party {rank}'s table is {mine}, "
                                 f"but party {server} prepared {name!r} with {hello['dtype']} "
                                 "keys; cast the key column to that type")
        folder = _folder(worker, name, "psi.ub_join", write=False)
        runs = table.num_rows > 0 and hello["keys"] > 0
        wants = runs and _client_token(folder) != hello["token"]
        if wants:
            folder = _folder(worker, name, "psi.ub_join", write=True)
            (folder / "client.json").unlink(missing_ok=True)
            shutil.rmtree(folder / "client-cache", ignore_errors=True)
        session.send(server, "answer", _ANSWER.pack(table.num_rows, int(wants)))
        if not runs:
            return take_rows(table, np.zeros(0, np.int64))
        keys = encode_keys(table.column(column))
        members = (server, rank)
        with tempfile.TemporaryDirectory(prefix="mplang-psi-") as tmp:
            source, result = Path(tmp) / "keys.csv", Path(tmp) / "result.csv"
            write_keys(source, keys)
            for mode in ("MODE_OFFLINE_TRANSFER_CACHE",) * wants + ("MODE_ONLINE",):
                config = _config(mode, "ROLE_CLIENT", folder / "client-cache", source, result)
                link = state.links.link(members, call.interp.exec_id, f"{call.key}/{mode}", 1,
                                        session.timeout)
                call_libpsi(libpsi.ub_psi_execute, config, link)
                if mode != "MODE_ONLINE":
                    (folder / "client.json").write_text(json.dumps({"token": hello["token"]}))
            index = read_rows(result, len(keys))
    return take_rows(table, sorted_rows(index, keys)[0] if len(index) else index)


@backend.kernel(psi.ub_join_p)
def _ub_join(call: Call, t: Any, *, key: str, name: str, server: int) -> list[Any]:
    rank, server = call.state("psi").env.rank, int(server)
    (client,) = psi.holders_n(call.op)
    if rank == server:
        return [None, np.array(_serve(call, client, name, key), np.int64)]
    if rank != client:
        return [None, None]
    result = _join(call, t, server, name, key)
    check_rows(call, result, key, "the unbalanced PSI join of its table")
    return [result, None]
