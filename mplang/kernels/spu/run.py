"""The backend of the `spu` dialect: libspu runtimes on each member party.

One registration gives its worker kernels, its per-worker state (how links are
made), the wire codec of `SpuShare` and the payload check of received ``spu.run``
ops. An ``spu.run`` runs on a secure session its device's members keep for the
driver across evaluations (`mplang.kernels.spu.sessions`), or, when the kept ones
are all busy, on a libspu link of its own made through the worker's
`SpuLinkFactory` under a name unique to the execution and op. A world that never
uses its SPU makes neither.
"""

from __future__ import annotations

import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.dialects import spu as _spu
from mplang.dialects.common import canonical_type
from mplang.dialects.spu import (
    SecretShareType,
    SpuConfig,
    executable_of,
    input_name,
    io_for,
    output_name,
    reconstruct,
    runtime_config_for,
    stablehlo_text,
)
from mplang.edsl.errors import MPSerializationError
from mplang.edsl.graph import Operation
from mplang.edsl.typing import MPType, TensorType
from mplang.flows.stablehlo import parse
from mplang.kernels.spu.sessions import SessionPools, run_in_session
from mplang.kernels.spu.sizes import sized_executable
from mplang.kernels.tensor import SHAPE_POLYMORPHISM, refuse_unsafe, refused_op
from mplang.records.audit import SECRET_SHARE
from mplang.runtime.backend import WorkerEnv, payload_refusal, register_backend
from mplang.runtime.interpreter import Call, Interpreter
from mplang.runtime.sandbox import NativePayloadChecker
from mplang.runtime.scheduler import blocking
from mplang.transport.wire import ValueCodec, register_value_codec
from mplang.util.lru import LRUCache

if TYPE_CHECKING:
    from mplang.kernels.spu.channel import SpuLinkFactory
    from mplang.worker.state import SimpWorker

BACKEND = register_backend("spu")


class SpuShare:
    """One party's share of a secret tensor.

    Within a process it wraps libspu's share object as is; `to_parts` and
    `from_parts` give the plain-bytes form for transports between processes.
    """

    __slots__ = ("_nbytes", "_share")

    def __init__(self, share: Any):
        self._share = share
        self._nbytes: int | None = None

    @property
    def nbytes(self) -> int:
        """The size of the share's serialized form."""
        if self._nbytes is None:
            meta, chunks = self.to_parts()
            self._nbytes = len(meta) + sum(len(c) for c in chunks)
        return self._nbytes

    def to_libspu(self) -> Any:
        return self._share

    def to_parts(self) -> tuple[bytes, list[bytes]]:
        """``(meta, chunks)``: libspu's serialized form of the share."""
        return bytes(self._share.meta), [bytes(c) for c in self._share.share_chunks]

    @staticmethod
    def from_parts(meta: bytes, chunks: list[bytes]) -> SpuShare:
        import spu.libspu as libspu

        share = libspu.Share()
        share.meta = meta
        share.share_chunks = chunks
        return SpuShare(share)

    def __repr__(self) -> str:
        return "SpuShare(<secret share>)"


def encode_share(share: SpuShare) -> list[bytes]:
    """A share as plain byte chunks: its meta, then its data chunks."""
    meta, chunks = share.to_parts()
    return [meta, *chunks]


_VARINT, _BYTES = 0, 2
_META_FIELDS = {1: _VARINT, 2: _VARINT, 3: _VARINT, 4: _BYTES, 5: _BYTES}
"""libspu's ValueMetaProto: data type, complex flag, visibility, shape, storage type."""
_CHUNK_FIELDS = {1: _VARINT, 2: _VARINT, 3: _BYTES}
"""libspu's ValueChunkProto: total bytes, chunk offset, content."""


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise ValueError("truncated or overlong varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if not byte & 0x80:
            return value, pos


def _check_message(data: bytes, fields: dict[int, int], what: str) -> dict[int, int | bytes]:
    """The fields of a protobuf message whose field numbers and wire types must match
    ``fields`` (checked before libspu parses the bytes)."""
    found: dict[int, int | bytes] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if fields.get(number) != wire:
            raise ValueError(f"{what}: unexpected field {number} (wire type {wire})")
        if wire == _VARINT:
            found[number], pos = _varint(data, pos)
        else:
            size, pos = _varint(data, pos)
            if pos + size > len(data):
                raise ValueError(f"{what}: field {number} runs past the end")
            found[number] = data[pos:pos + size]
            pos += size
    return found


def share_shape(share: SpuShare) -> tuple[int, ...]:
    """The shape a share's meta declares (what libspu allocates when it uses the share)."""
    meta, _ = share.to_parts()
    shape = _check_message(meta, _META_FIELDS, "share meta").get(4, b"")
    dims: list[int] = []
    pos = 0
    assert isinstance(shape, bytes)
    while pos < len(shape):
        key, pos = _varint(shape, pos)
        if key == (1 << 3 | _BYTES):  # packed dims
            size, pos = _varint(shape, pos)
            end = pos + size
            while pos < end:
                dim, pos = _varint(shape, pos)
                dims.append(dim)
        elif key == (1 << 3 | _VARINT):
            dim, pos = _varint(shape, pos)
            dims.append(dim)
        else:
            raise ValueError("share meta: malformed shape")
    return tuple(dims)


def share_data_bytes(share: SpuShare) -> int:
    """The bytes of data a share's chunks carry (ValueError if one is malformed)."""
    total = 0
    for chunk in share.to_parts()[1]:
        content = _check_message(chunk, _CHUNK_FIELDS, "share chunk").get(3, b"")
        total += len(content) if isinstance(content, bytes) else 0
    return total


def _received_share(value: Any, op: Operation, sender: int | str,
                    plaintext: TensorType) -> SpuShare:
    """A share a peer (rank ``sender``) or the driver sent for ``op``: it must be a share
    of the op's declared shape."""
    who = f"party {sender}" if isinstance(sender, int) else sender
    if not isinstance(value, SpuShare):
        raise RuntimeError(f"{who} sent a {type(value).__name__}, not a secret share")
    try:
        shape = share_shape(value)
    except ValueError as e:
        raise RuntimeError(f"{who} sent a malformed share: {e}") from None
    if not plaintext.admits(shape):
        raise RuntimeError(f"{who} sent a share of shape {shape}; {op.opcode} "
                           f"declares {plaintext.shape}")
    return value


def decode_share(parts: list[memoryview]) -> SpuShare:
    """The share of `encode_share`'s chunks, each field checked before libspu parses it;
    ValueError if malformed."""
    if len(parts) < 2:
        raise ValueError("a share is a meta chunk and at least one data chunk")
    meta = bytes(parts[0])
    storage = _check_message(meta, _META_FIELDS, "share meta").get(5, b"")
    if not isinstance(storage, bytes) or not storage.isascii() \
            or not storage.decode().isprintable():
        raise ValueError("share meta: storage type is not a printable name")
    chunks = [bytes(p) for p in parts[1:]]
    for chunk in chunks:
        fields = _check_message(chunk, _CHUNK_FIELDS, "share chunk")
        content, total, offset = fields.get(3, b""), fields.get(1, 0), fields.get(2, 0)
        if not (isinstance(content, bytes) and isinstance(total, int)
                and isinstance(offset, int) and offset + len(content) <= total):
            raise ValueError("share chunk: content exceeds its declared total")
    return SpuShare.from_parts(meta, chunks)


register_value_codec(ValueCodec(_spu.SecretShareType, SpuShare, encode_share, decode_share,
                                nbytes=lambda share: share.nbytes, privacy=SECRET_SHARE))


class SpuState:
    """The ``spu`` dialect state of one worker: how its SPU links are made.

    ``counted_links`` carry every protocol message through the worker's communicator,
    where a run's monitor counts them; a traced run uses them even when ``link_factory``
    (the default) is in-memory.
    """

    def __init__(self, link_factory: SpuLinkFactory, counted_links: SpuLinkFactory,
                 sessions: SessionPools):
        self.link_factory = link_factory
        self.counted_links = counted_links
        self.sessions = sessions
        """Kept sessions, by driver and device (`run_in_session`)."""

    def spec_changed(self) -> None:
        """Drop the kept sessions: the cluster spec changed."""
        self.sessions.clear()

    def driver_closed(self, owner: str) -> None:
        """Drop the sessions kept for driver ``owner``: it closed."""
        self.sessions.clear(owner)

    def links(self, interp: Interpreter) -> SpuLinkFactory:
        """The link factory for a run of ``interp``'s execution."""
        monitor = interp.options.monitor
        return self.counted_links if monitor is not None and monitor.record \
            else self.link_factory


@BACKEND.state
def _state(env: WorkerEnv) -> SpuState:
    """In-memory libspu links when all parties share this process; otherwise links over
    the worker's own communicator (authenticated, tagged by execution, abortable)."""
    from mplang.kernels.spu.channel import ChannelLinkFactory, MemLinkFactory

    channel = ChannelLinkFactory(env.communicator)
    sessions = SessionPools(channel.session)
    if env.in_process:
        return SpuState(MemLinkFactory(), channel, sessions)
    return SpuState(channel, channel, sessions)


_EXECUTABLES = LRUCache(1024)


def load_executable(data: bytes) -> Any:
    """libspu's executable of serialized ``data`` (parsed once, then cached); ValueError
    if malformed."""
    exe = _EXECUTABLES.lookup(data)
    if exe is None:
        import spu.libspu as libspu

        exe = libspu.Executable()
        if not exe.ParseFromString(data):
            raise ValueError("malformed SPU executable")
        _EXECUTABLES.store(data, exe)
    return exe


_FRAME = struct.Struct("<II")


def _payload(op: Operation) -> bytes:
    """What `vet_run` checks of an ``spu.run``: its StableHLO, name and executable."""
    text, name = op.attrs["stablehlo"], op.attrs["fn"].encode()
    return _FRAME.pack(len(text), len(name)) + text + name + op.attrs["executable"]


NOT_ITS_EXECUTABLE = "the executable is not what libspu compiles its StableHLO to"
"""`vet_run`'s refusal of an executable that does not match its StableHLO."""


def vet_run(payload: bytes) -> None:
    """Parse the StableHLO of an ``spu.run`` (framed by `_payload`), refuse the ops a
    received run_jax module may not use, and refuse an executable that is not what libspu
    compiles the StableHLO to. An empty executable (sizes known at run time) is compiled
    by each member for each run's sizes (`sized_executable`), which vets the refined
    module again. Runs in the payload checker's helper process."""
    size, name_size = _FRAME.unpack_from(payload)
    text = payload[_FRAME.size:_FRAME.size + size].decode()
    name = payload[_FRAME.size + size:_FRAME.size + size + name_size].decode()
    module = parse(text)
    main = module.functions.get("main")
    if main is None:
        raise MPSerializationError("the StableHLO has no main function")
    unsafe = {problem for op in module.walk()
              if (problem := refused_op(op.name, op.attrs.get("call_target_name")))}
    executable = payload[_FRAME.size + size + name_size:]
    if not executable:  # sizes known at run time: vetted again, static, per run's sizes
        refuse_unsafe(unsafe - SHAPE_POLYMORPHISM)
        return
    refuse_unsafe(unsafe)
    if executable_of(text, len(main.args), len(main.returned()), name) != executable:
        raise MPSerializationError(NOT_ITS_EXECUTABLE)


RUN_CHECKER = NativePayloadChecker(vet_run, "spu.run StableHLO")
"""The helper process that vets this process's received ``spu.run`` ops."""


@BACKEND.payload_check(_spu.run_p)
def _check_run(op: Operation) -> None:
    """The helper vets the StableHLO and executable (`vet_run`); then the StableHLO's
    ``main`` must take and give the op's declared types."""
    where = f"spu.run[{op.attrs['fn']}]"
    try:
        RUN_CHECKER.check(_payload(op), where)
    except MPSerializationError as e:
        field = "executable" if str(e).endswith(NOT_ITS_EXECUTABLE) else "stablehlo"
        raise payload_refusal(str(e), field) from None
    main = parse(stablehlo_text(op)).functions["main"]
    found = [[None if t is None else (t.dtype, t.shape) for t in types]
             for types in (main.arg_types, main.returned_types())]
    declared = [[(c.dtype, tuple(d if isinstance(d, int) else _DYNAMIC for d in c.shape))
                 for c in map(canonical_type, op.attrs[name])]
                for name in ("in_types", "out_types")]
    if found != declared:
        raise payload_refusal(f"{where}: its StableHLO takes and gives {found}, but the op "
                              f"declares {declared}", "stablehlo")


_DYNAMIC = -(1 << 63)
"""How parsed StableHLO gives a size known only at run time (MLIR's dynamic size)."""


def _worker(call: Call) -> SimpWorker:
    worker: SimpWorker = call.state("simp")
    return worker


def _plaintext(op: Operation) -> TensorType:
    t = op.outputs[0].type if op.prim is _spu.reveal_p else op.inputs[0].type
    assert isinstance(t, MPType)
    base = t.base.plaintext_type if isinstance(t.base, SecretShareType) else t.base
    assert isinstance(base, TensorType)
    return base


@BACKEND.kernel(_spu.seal_p)
def _seal(call: Call, x: Any) -> list[Any]:
    import spu.libspu as libspu

    worker = _worker(call)
    config = SpuConfig.from_attrs(call.op.attrs)
    owner_type = call.in_type(0)
    assert isinstance(owner_type, MPType) and owner_type.pmask is not None
    (owner,) = owner_type.pmask.parties
    mine: SpuShare | None = None
    if worker.rank == owner:
        if x is None:
            raise RuntimeError("the owner does not hold the value to seal")
        shares = io_for(config).make_shares(np.asarray(x), libspu.Visibility.VIS_SECRET)
        for member, share in zip(config.members, shares, strict=True):
            if member == worker.rank:
                mine = SpuShare(share)
            else:
                worker.communicator.send(member, call.tag, SpuShare(share))
    if worker.rank not in config.members:
        return [None]
    if mine is not None:
        return [mine]
    return [_received_share(worker.recv(call.interp, owner, call.key), call.op, owner,
                            _plaintext(call.op))]


@BACKEND.kernel(_spu.shares_p)
def _shares(call: Call, *, plaintext: TensorType, member: int, share: Any) -> list[Any]:
    """The member's share of a driver constant, from its (opened) private attribute."""
    if _worker(call).rank != member:
        return [None]
    if not (isinstance(share, tuple) and all(isinstance(p, bytes) for p in share)):
        raise RuntimeError("this member's share was not opened (a tuple of bytes expected)")
    try:
        decoded = decode_share([memoryview(p) for p in share])
    except ValueError as e:
        raise RuntimeError(f"the driver sent a malformed share: {e}") from None
    return [_received_share(decoded, call.op, "the driver", plaintext)]


@BACKEND.kernel(_spu.run_p)
def _run(call: Call, *args: Any, executable: bytes) -> list[Any]:
    import spu

    worker = _worker(call)
    config = SpuConfig.from_attrs(call.op.attrs)
    if worker.rank not in config.members:
        return [None] * len(call.op.outputs)
    for i, share in enumerate(args):
        if not isinstance(share, SpuShare):
            raise RuntimeError(f"input {i} is not a secret share held by this party")
    loaded = load_executable(executable or sized_executable(  # sizes at run time
        call.op, [share_shape(share) for share in args]))
    names = [input_name(i) for i in range(len(args))]
    outputs = [output_name(i) for i in range(len(call.op.outputs))]

    def body(runtime: Any) -> list[Any]:
        for name, share in zip(names, args, strict=True):
            runtime.set_var(name, share.to_libspu())
        runtime.run(loaded)
        results = [SpuShare(runtime.get_var(name)) for name in outputs]
        for name in names + outputs:  # a kept session holds nothing of this run (a failed
            runtime.del_var(name)  # run's session is dropped)
        return results

    state: SpuState = call.state("spu")
    timeout = call.interp.options.timeout or worker.timeout
    with blocking():  # the run waits on its peers' runs, which may wait for a slot
        kept = run_in_session(state.sessions, call, worker, config, timeout, body)
        if kept is not None:
            return kept
        link = state.links(call.interp)(config, *call.tag, config.members.index(worker.rank),
                                        timeout)
        return body(spu.Runtime(link, runtime_config_for(config)))


@BACKEND.kernel(_spu.reveal_p)
def _reveal(call: Call, share: Any, *, to: int) -> list[Any]:
    worker = _worker(call)
    config = SpuConfig.from_attrs(call.op.attrs)
    if worker.rank in config.members and worker.rank != to:
        worker.communicator.send(to, call.tag, share)
    if worker.rank != to:
        return [None]
    plaintext = _plaintext(call.op)
    shares = [share if m == worker.rank else
              _received_share(worker.recv(call.interp, m, call.key), call.op, m, plaintext)
              for m in config.members]
    return [reconstruct(config, [s.to_libspu() for s in shares], plaintext)]
