"""Kernels of the `spu` dialect: libspu runtimes on each member party.

Shares travel between parties as `SpuShare` (plain bytes). Each ``spu.run``
gets its own libspu link, created through the worker's `SpuLinkFactory` under
a name unique to the execution and op, so concurrent executions never share a
link and a world that never uses its SPU never creates one.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import spu
import spu.libspu as libspu

from mplang.dialects.common import LRUCache
from mplang.dialects.spu import SpuConfig, input_name, output_name
from mplang.edsl.graph import Operation
from mplang.edsl.typing import MPType, SecretShareType, TensorType, numpy_dtype
from mplang.runtime.interpreter import Interpreter, KernelTable

if TYPE_CHECKING:
    from mplang.backends.simp_worker.state import SimpWorker

KERNELS = KernelTable()
_SECRET = libspu.Visibility.VIS_SECRET


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
        share = libspu.Share()
        share.meta = meta
        share.share_chunks = chunks
        return SpuShare(share)

    def __repr__(self) -> str:
        return "SpuShare(<secret share>)"


class SpuLinkFactory(Protocol):
    """Creates the libspu link of one member for one run of an SPU op; ``(exec_id, key)``
    is unique to that run."""

    def __call__(self, config: SpuConfig, exec_id: str, key: str, member_index: int) -> Any: ...


class MemLinkFactory:
    """libspu's in-memory links: all members live in this process."""

    def __init__(self, recv_timeout_s: float):
        self.recv_timeout_ms = int(recv_timeout_s * 1000)

    def __call__(self, config: SpuConfig, exec_id: str, key: str, member_index: int) -> Any:
        desc = link_desc(config, exec_id, key, self.recv_timeout_ms, "mem")
        return libspu.link.create_mem(desc, member_index)


def link_desc(config: SpuConfig, exec_id: str, key: str, recv_timeout_ms: int,
              transport: str) -> Any:
    """The libspu link description of one run of an SPU op among ``config``'s members."""
    desc = libspu.link.Desc()
    desc.id = f"{exec_id}{key}"
    desc.recv_timeout_ms = recv_timeout_ms
    for rank in config.members:
        desc.add_party(f"party{rank}", f"{transport}:{rank}")
    return desc


class SpuState:
    """The ``spu`` dialect state of one worker."""

    dialect_name = "spu"

    def __init__(self, link_factory: SpuLinkFactory):
        self.link_factory = link_factory


@functools.lru_cache(maxsize=64)
def runtime_config(protocol: str, field: str, fxp_fraction_bits: int) -> Any:
    config = libspu.RuntimeConfig(protocol=spu.parse_protocol_kind(protocol),
                                  field=spu.parse_field_type(field))
    config.fxp_fraction_bits = fxp_fraction_bits
    return config


def _runtime_config(config: SpuConfig) -> Any:
    return runtime_config(config.protocol, config.field, config.fxp_fraction_bits)


@functools.lru_cache(maxsize=64)
def _io(world: int, protocol: str, field: str, fxp_fraction_bits: int) -> Any:
    return spu.Io(world, runtime_config(protocol, field, fxp_fraction_bits))


def io_for(config: SpuConfig) -> Any:
    return _io(len(config.members), config.protocol, config.field, config.fxp_fraction_bits)


_EXECUTABLES = LRUCache(1024)


def _executable(data: bytes) -> Any:
    exe = _EXECUTABLES.lookup(data)
    if exe is None:
        exe = libspu.Executable()
        if not exe.ParseFromString(data):
            raise ValueError("malformed SPU executable")
        _EXECUTABLES.store(data, exe)
    return exe


def reconstruct(config: SpuConfig, shares: list[SpuShare], plaintext: TensorType) -> np.ndarray:
    """The plaintext of ``shares`` (one per member, in member order)."""
    value = io_for(config).reconstruct([s.to_libspu() for s in shares])
    return np.asarray(value).astype(numpy_dtype(plaintext.dtype), copy=False)


def _worker(interp: Interpreter) -> SimpWorker:
    worker: SimpWorker = interp.states["simp"]
    return worker


def _plaintext(op: Operation) -> TensorType:
    t = op.outputs[0].type if op.opcode == "spu.reveal" else op.inputs[0].type
    assert isinstance(t, MPType)
    base = t.base.plaintext if isinstance(t.base, SecretShareType) else t.base
    assert isinstance(base, TensorType)
    return base


@KERNELS.register("spu.seal")
def _seal(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    worker = _worker(interp)
    config = SpuConfig.from_attrs(op.attrs)
    owner_type = op.inputs[0].type
    assert isinstance(owner_type, MPType) and owner_type.pmask is not None
    (owner,) = owner_type.pmask.parties
    tag = (interp.exec_id, key)
    mine: SpuShare | None = None
    if worker.rank == owner:
        (x,) = args
        if x is None:
            raise RuntimeError("the owner does not hold the value to seal")
        shares = io_for(config).make_shares(np.asarray(x), _SECRET)
        for member, share in zip(config.members, shares, strict=True):
            if member == worker.rank:
                mine = SpuShare(share)
            else:
                worker.communicator.send(member, tag, SpuShare(share))
    if worker.rank not in config.members:
        return [None]
    return [mine if mine is not None else worker.communicator.recv(owner, tag)]


@KERNELS.register("spu.run")
def _run(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    worker = _worker(interp)
    config = SpuConfig.from_attrs(op.attrs)
    if worker.rank not in config.members:
        return [None] * len(op.outputs)
    state: SpuState = interp.states["spu"]
    link = state.link_factory(config, interp.exec_id, key, config.members.index(worker.rank))
    runtime = spu.Runtime(link, _runtime_config(config))
    for i, share in enumerate(args):
        if not isinstance(share, SpuShare):
            raise RuntimeError(f"input {i} is not a secret share held by this party")
        runtime.set_var(input_name(i), share.to_libspu())
    runtime.run(_executable(op.attrs["executable"]))
    return [SpuShare(runtime.get_var(output_name(i)))
            for i in range(len(op.outputs))]


@KERNELS.register("spu.reveal")
def _reveal(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    worker = _worker(interp)
    config = SpuConfig.from_attrs(op.attrs)
    to: int = op.attrs["to"]
    tag = (interp.exec_id, key)
    (share,) = args
    if worker.rank in config.members and worker.rank != to:
        worker.communicator.send(to, tag, share)
    if worker.rank != to:
        return [None]
    shares = [share if m == worker.rank else worker.communicator.recv(m, tag)
              for m in config.members]
    return [reconstruct(config, shares, _plaintext(op))]
