"""mplang-cms: count-min sketches as an MPLang dialect, written as an out-of-tree plugin.

Importing this module registers, without touching MPLang itself:

- the type ``SketchType(width, depth, seed)`` (serialized under the tag ``cms.sketch``);
- the party-local ops ``cms.build``, ``cms.merge`` and ``cms.query`` (each declared
  once by its type-only function, `FeModule.simple_op`; their primitives are
  ``dialect.prims.build`` ...) and the multi-party op ``cms.aggregate`` (a `Primitive`
  declaring its operands, attributes, results, targets, cost and flow rules);
- their worker kernels (numpy), registered on the primitive objects, and a per-worker
  state;
- the wire codec of the runtime value `Sketch`;
- the device kind ``CMS``: one node that receives sketches, never raw items.

A count-min sketch of a multiset of integers is a ``depth x width`` table of
counts: item ``x`` adds one to ``counts[i, h_i(x)]`` in every row ``i``, and the
estimate of ``x``'s count is ``min_i counts[i, h_i(x)]``. Estimates never fall
below the true count; with ``width = ceil(e / eps)`` and ``depth = ceil(ln(1 /
delta))`` they exceed it by more than ``eps`` times the number of items with
probability at most ``delta``. Sketches with equal parameters add up: the sum
of two sketches is the sketch of the union of their multisets.

Hashing (deterministic from the seed, the same on every party and every
platform): row ``i`` uses the Carter-Wegman universal hash

    h_i(x) = ((a_i * (x mod P) + b_i) mod P) mod width,   P = 2**31 - 1 (a prime)

where ``x mod P`` is taken on the item as a signed 64-bit integer (unsigned
64-bit items are reduced as unsigned), and ``a_i``, ``b_i`` come from
``d = SHA-256(f"mplang-cms:{seed}:{i}")``: ``a_i = 1 + (le64(d[0:8]) mod (P - 1))``
and ``b_i = le64(d[8:16]) mod P`` (``le64``: the bytes as a little-endian
unsigned integer). All products stay below 2**62, so int64 arithmetic is exact.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from mplang.analysis.cost_model import CostModel, OpCost, value_bytes
from mplang.device.cluster import ClusterSpec, ClusterSpecError, Device
from mplang.device.kinds import (
    DeviceKind,
    adopt_move,
    describe,
    place,
    register_kind,
    register_move,
)
from mplang.device.ppu import call_on_party, rank_of
from mplang.dialects import simp
from mplang.edsl.attrs import Attr, ConfigField, ConfigSchema
from mplang.edsl.context import ExecutionContext
from mplang.edsl.errors import FeConfigError, MPSerializationError, MPTypeError
from mplang.edsl.function import function
from mplang.edsl.graph import Operation
from mplang.edsl.location import mark_library
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import Operand, Primitive, Result, Signature, held
from mplang.edsl.traits import WORKER_AND_DRIVER, OpTraits
from mplang.edsl.typing import (
    BaseType,
    Mask,
    MPType,
    TensorType,
    TypeDecoder,
    TypeEncoder,
    ValueType,
    register_type,
)
from mplang.flows.engine import conservative
from mplang.frontend.feop import feop
from mplang.frontend.module import FeModule
from mplang.runtime.backend import WorkerEnv, register_backend
from mplang.runtime.interpreter import Call
from mplang.transport.wire import ValueCodec, register_value_codec

mark_library(__file__)  # ops traced in this module are located at the user's line

__all__ = [
    "PRIME",
    "SKETCH_CONFIG",
    "Sketch",
    "SketchType",
    "aggregate",
    "build",
    "hash_params",
    "merge",
    "query",
]

# ---------------------------------------------------------------- the hash family

PRIME = (1 << 31) - 1
"""The prime ``P`` of the hash family (a Mersenne prime)."""
MAX_WIDTH = 1 << 20
MAX_DEPTH = 32
MAX_SEED = (1 << 63) - 1
INT_DTYPES = frozenset(["int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64"])
"""The dtypes of items and keys."""


def check_params(width: Any, depth: Any, seed: Any) -> None:
    """Raise ValueError unless ``width``, ``depth`` and ``seed`` are ints in range."""
    for name, value, high in (("width", width, MAX_WIDTH), ("depth", depth, MAX_DEPTH),
                              ("seed", seed, MAX_SEED)):
        low = 0 if name == "seed" else 1
        if type(value) is not int or not low <= value <= high:
            raise ValueError(f"sketch {name} must be an int in [{low}, {high}], got {value!r}")


def hash_params(seed: int, depth: int) -> np.ndarray:
    """``[[a_0, b_0], ..., [a_{depth-1}, b_{depth-1}]]`` (int64) of the hash family."""
    rows = []
    for i in range(depth):
        d = hashlib.sha256(f"mplang-cms:{seed}:{i}".encode()).digest()
        rows.append((1 + int.from_bytes(d[0:8], "little") % (PRIME - 1),
                     int.from_bytes(d[8:16], "little") % PRIME))
    return np.array(rows, dtype=np.int64).reshape(depth, 2)


def buckets(seed: int, depth: int, width: int, keys: np.ndarray) -> np.ndarray:
    """``h_i(key)`` for every row ``i`` and key: an int64 array ``[depth, keys.size]``."""
    flat = np.asarray(keys).reshape(-1)
    if flat.dtype.name not in INT_DTYPES:
        raise ValueError(f"sketch keys must be integers, got dtype {flat.dtype}")
    if flat.dtype == np.uint64:
        x = (flat % np.uint64(PRIME)).astype(np.int64)
    else:
        x = np.mod(flat.astype(np.int64), PRIME)
    ab = hash_params(seed, depth)
    return ((ab[:, :1] * x[None, :] + ab[:, 1:]) % PRIME) % width


# ---------------------------------------------------------------- the runtime value


class Sketch:
    """A count-min sketch: ``counts[i, j]`` (int64, ``[depth, width]``) counts the items
    that row ``i`` hashes to bucket ``j``. Immutable: merging makes a new sketch."""

    __slots__ = ("counts", "depth", "seed", "width")

    def __init__(self, width: int, depth: int, seed: int, counts: np.ndarray):
        check_params(width, depth, seed)
        if not isinstance(counts, np.ndarray) or counts.dtype != np.int64 \
                or counts.shape != (depth, width):
            raise ValueError(f"sketch counts must be int64[{depth},{width}], got "
                             f"{getattr(counts, 'dtype', type(counts).__name__)}"
                             f"{list(getattr(counts, 'shape', []))}")
        if counts.size and counts.min() < 0:
            raise ValueError("sketch counts must be non-negative")
        counts = np.ascontiguousarray(counts)
        counts.setflags(write=False)
        self.width, self.depth, self.seed, self.counts = width, depth, seed, counts

    @staticmethod
    def of_items(items: np.ndarray, width: int, depth: int, seed: int) -> Sketch:
        """The sketch of the multiset of ``items`` (an integer array of any shape)."""
        check_params(width, depth, seed)
        rows = buckets(seed, depth, width, items)
        counts = np.stack([np.bincount(r, minlength=width) for r in rows]).astype(np.int64)
        return Sketch(width, depth, seed, counts.reshape(depth, width))

    def merge(self, other: Sketch) -> Sketch:
        """The sketch of both multisets (the parameters must be equal)."""
        if (self.width, self.depth, self.seed) != (other.width, other.depth, other.seed):
            raise ValueError(f"cannot merge {self!r} with {other!r}: parameters differ")
        return Sketch(self.width, self.depth, self.seed, self.counts + other.counts)

    def query(self, keys: np.ndarray) -> np.ndarray:
        """The estimated count of each key (int64, ``keys``' shape)."""
        keys = np.asarray(keys)
        rows = buckets(self.seed, self.depth, self.width, keys)
        estimate = self.counts[np.arange(self.depth)[:, None], rows].min(axis=0)
        return estimate.astype(np.int64).reshape(keys.shape)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sketch) and \
            (self.width, self.depth, self.seed) == (other.width, other.depth, other.seed) \
            and bool(np.array_equal(self.counts, other.counts))

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return (f"Sketch(width={self.width}, depth={self.depth}, seed={self.seed}, "
                f"items={int(self.counts[0].sum())})")


# ---------------------------------------------------------------- the type


@register_type("cms.sketch")
@dataclass(frozen=True)
class SketchType(BaseType):
    """A count-min sketch with ``depth`` rows of ``width`` counters, hashed with ``seed``.

    The seed is part of the type: sketches hashed differently cannot be merged,
    and the type rules say so while tracing.
    """

    width: int
    depth: int
    seed: int

    def __post_init__(self) -> None:
        try:
            check_params(self.width, self.depth, self.seed)
        except ValueError as e:
            raise MPTypeError(str(e)) from None

    def plaintext(self) -> TensorType:
        return TensorType("int64", (self.depth, self.width))

    def to_json(self, encode: TypeEncoder) -> Any:
        return [self.width, self.depth, self.seed]

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> SketchType:
        if not isinstance(body, list) or len(body) != 3:
            raise ValueError("expected [width, depth, seed]")
        return SketchType(*body)

    def attrs(self) -> dict[str, int]:
        """The attributes of a ``cms.build`` that makes a sketch of this type."""
        return {"width": self.width, "depth": self.depth, "seed": self.seed}

    def __str__(self) -> str:
        return f"cms<{self.depth}x{self.width},seed={self.seed}>"


# ---------------------------------------------------------------- the frontend ops

SKETCH_CONFIG = ConfigSchema({
    "width": ConfigField(int, default=256, min=1, max=MAX_WIDTH, doc="counters per row"),
    "depth": ConfigField(int, default=4, min=1, max=MAX_DEPTH, doc="rows (hash functions)"),
    "seed": ConfigField(int, default=0, min=0, max=MAX_SEED, doc="seed of the hash family"),
})
"""The parameters of a sketch: ``cms.build``'s attributes and a CMS device's config."""

dialect = FeModule("cms")


def _int_tensor(what: str, t: TensorType) -> TensorType:
    if t.dtype not in INT_DTYPES:
        raise MPTypeError(f"{what} must be an integer tensor, got {t}")
    return t


@dialect.simple_op(config_schema=SKETCH_CONFIG,
                   example="s = cms.build(x, width=256, depth=4, seed=7)")
def build(x: TensorType, *, width: int, depth: int, seed: int) -> SketchType:
    """Count the items of integer tensor ``x`` (any shape) into a new sketch."""
    _int_tensor("cms.build: the items", x)
    return SketchType(width, depth, seed)


@dialect.simple_op(example="s = cms.merge(a, b)")
def merge(a: SketchType, b: SketchType) -> SketchType:
    """Add two sketches of the same type: the sketch of both multisets."""
    if a != b:
        raise MPTypeError(f"cms.merge: cannot merge {a} with {b}: the widths, depths "
                          "and seeds must be equal")
    return a


@dialect.simple_op(example="counts = cms.query(s, keys)")
def query(s: SketchType, keys: TensorType) -> TensorType:
    """The estimated count of each key (int64, shaped like ``keys``); never below the truth."""
    return TensorType("int64", _int_tensor("cms.query: keys", keys).shape)


# ---------------------------------------------------------------- a multi-party op


def _aggregate_cost(op: Operation, model: CostModel) -> OpCost:
    """The holders send their sketches to ``to`` in parallel: one round, one sketch each."""
    return OpCost(model.message_s(value_bytes(op.inputs[0].type, model)), 1)


aggregate_p = Primitive(
    "cms.aggregate", kind="communication", execution_model="multi_party",
    traits=OpTraits(pure=True, communicates=True, runtimes=WORKER_AND_DRIVER),
    operands=[Operand("s", held(SketchType, name="a sketch at the simp level"))],
    attrs={"to": Attr(int, required=True, doc="the party that receives the sum")},
    results=[Result("total", held(SketchType))], targets=("CMS",),
    cost=_aggregate_cost, flow=conservative,
    doc="Sum the sketches of every holder at one party.")


@aggregate_p.def_type_rule
def _aggregate_rule(sig: Signature) -> list[ValueType]:
    s: MPType = sig.s
    if s.pmask is None:
        raise MPTypeError(f"cms.aggregate: the holders of {s} must be known when tracing")
    if not 0 <= sig.to < sig.world_size:
        raise MPTypeError(f"cms.aggregate: 'to' must be a party of a {sig.world_size}-party "
                          f"world, got {sig.to!r}")
    return [MPType(s.base, Mask.of([sig.to]))]


@feop(aggregate_p, example="total = cms.aggregate(s, to=0)")
@function
def aggregate(s: MPObject, *, to: int) -> MPObject:
    """The sum of the sketches of every party holding ``s``, held by party ``to`` only."""
    return aggregate_p.bind([s], {"to": to})[0]


# ---------------------------------------------------------------- the backend

backend = register_backend("cms")


@dataclass(frozen=True)
class CmsState:
    """What the ``cms`` kernels of one worker know: its rank and links (``cms.aggregate``)."""

    env: WorkerEnv


@backend.state
def _state(env: WorkerEnv) -> CmsState:
    return CmsState(env)


def _expect_sketch(call: Call, value: Any, t: SketchType, what: str) -> Sketch:
    if not isinstance(value, Sketch) or (value.width, value.depth, value.seed) != \
            (t.width, t.depth, t.seed):
        raise call.error(f"{what} is {value!r}, not a sketch of type {t}")
    return value


@backend.kernel(dialect.prims.build)
def _build(call: Call, x: Any, *, width: int, depth: int, seed: int) -> list[Any]:
    return [Sketch.of_items(np.asarray(x), width, depth, seed)]


@backend.kernel(dialect.prims.merge)
def _merge(call: Call, a: Any, b: Any) -> list[Any]:
    t = call.out_type()
    assert isinstance(t, SketchType)
    a = _expect_sketch(call, a, t, "input 0")
    b = _expect_sketch(call, b, t, "input 1")
    return [a.merge(b)]


@backend.kernel(dialect.prims.query)
def _query(call: Call, s: Any, keys: Any) -> list[Any]:
    t = call.in_type(0)
    assert isinstance(t, SketchType)
    return [_expect_sketch(call, s, t, "input 0").query(np.asarray(keys))]


@backend.kernel(aggregate_p)
def _aggregate(call: Call, mine: Any, *, to: int) -> list[Any]:
    env: WorkerEnv = call.state("cms").env
    t = call.in_type(0)
    assert isinstance(t, MPType) and isinstance(t.base, SketchType) and t.pmask is not None
    if env.rank in t.pmask:
        mine = _expect_sketch(call, mine, t.base, "this party's sketch")
    if env.rank != to:
        if env.rank in t.pmask:
            env.communicator.send(to, call.tag, mine)
        return [None]
    total = mine if env.rank in t.pmask else None
    timeout = call.interp.options.timeout or env.timeout
    for src in t.pmask:
        if src != env.rank:
            got = env.communicator.recv(src, call.tag, timeout)
            got = _expect_sketch(call, got, t.base, f"the sketch of party {src}")
            total = got if total is None else total.merge(got)
    return [total]


# ---------------------------------------------------------------- the wire codec

_HEADER = struct.Struct("<4sIIQ")
_MAGIC = b"CMS1"


def _encode(s: Sketch) -> list[bytes | memoryview]:
    counts = s.counts.astype("<i8", copy=False)
    return [_HEADER.pack(_MAGIC, s.width, s.depth, s.seed), counts.reshape(-1).view(np.uint8).data]


def _decode(chunks: list[memoryview]) -> Sketch:
    """A sketch from a peer: every size, parameter and count is checked; nothing unpickled."""
    if len(chunks) != 2:
        raise MPSerializationError(f"cms sketch: expected 2 chunks (header, counts), "
                                   f"got {len(chunks)}")
    head, body = chunks
    if head.nbytes != _HEADER.size:
        raise MPSerializationError(f"cms sketch: header of {head.nbytes} bytes, expected "
                                   f"{_HEADER.size}")
    magic, width, depth, seed = _HEADER.unpack(head)
    if magic != _MAGIC:
        raise MPSerializationError(f"cms sketch: bad magic {magic!r}")
    try:
        check_params(width, depth, seed)
    except ValueError as e:
        raise MPSerializationError(f"cms sketch: {e}") from None
    if body.nbytes != 8 * width * depth:
        raise MPSerializationError(f"cms sketch: {body.nbytes} bytes of counts, expected "
                                   f"{8 * width * depth} for {depth}x{width}")
    counts = np.frombuffer(body, dtype="<i8").astype(np.int64, copy=False)
    if counts.size and counts.min() < 0:
        raise MPSerializationError("cms sketch: negative counts")
    return Sketch(width, depth, seed, counts.reshape(depth, width))


register_value_codec(ValueCodec(SketchType, Sketch, _encode, _decode,
                                nbytes=lambda s: _HEADER.size + s.counts.nbytes))


# ---------------------------------------------------------------- the device kind


def device_type(device: Device) -> SketchType:
    """The sketch type of CMS ``device`` (from its config, defaults filled in)."""
    config = SKETCH_CONFIG.validate(f"CMS {device.name!r}", device.config)
    return SketchType(config["width"], config["depth"], config["seed"])


class CMS(DeviceKind):
    """A sketch aggregator: one node that receives count-min sketches, never raw items.

    A tensor moving onto it is sketched by each party that holds it, and only the
    sketches travel (summed at the aggregator by ``cms.aggregate``). A function on
    it runs on the aggregator with sketch arguments; numpy arguments become constants.
    """

    name = "CMS"
    security_model = ("the aggregator sees every contributor's sketch (approximate counts "
                      "of its items), never the items themselves")

    def validate(self, device: Device, config: Mapping[str, Any]) -> None:
        if len(device.members) != 1:
            raise ClusterSpecError(f"CMS {device.name!r} needs exactly one member, "
                                   f"got {len(device.members)}")
        try:
            device_type(device)
        except FeConfigError as e:
            raise ClusterSpecError(str(e)) from None

    def call(self, cluster: ClusterSpec, device: Device, fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> Any:
        return call_on_party(rank_of(cluster, device), fn, args, kwargs, what)

    def adopt(self, cluster: ClusterSpec, obj: MPObject, t: MPType, device: Device,
              what: str) -> MPObject:
        want, rank = device_type(device), rank_of(cluster, device)
        if t.pmask is None:
            raise MPTypeError(f"{what}: {describe(obj)} has holders known only at run time; "
                              f"{device.name} must know whose sketches to sum")
        if isinstance(t.base, SketchType) and t.base != want:
            raise MPTypeError(f"{what}: {describe(obj)} is not a sketch of {device.name} "
                              f"({want})")
        if isinstance(t.base, TensorType):
            try:
                obj = simp.pcall(t.pmask, lambda x: build(x, **want.attrs()), obj)
            except MPTypeError as e:
                raise MPTypeError(f"{what}: {e}") from None
        elif not isinstance(t.base, SketchType):
            raise MPTypeError(f"{what}: {describe(obj)} cannot move to CMS {device.name}: "
                              "it takes integer tensors and sketches")
        if t.pmask != Mask.of([rank]):  # the sketches of other parties travel to the device
            obj = aggregate(obj, to=rank)
        return place(obj, device.name)

    def constant(self, cluster: ClusterSpec, device: Device, value: Any, what: str) -> MPObject:
        items = simp.constant((rank_of(cluster, device),), value)
        t = items.mptype
        assert isinstance(t, MPType)
        return self.adopt(cluster, items, t, device, what)

    def fetch(self, ctx: ExecutionContext, cluster: ClusterSpec, device: Device,
              obj: MPObject) -> Any:
        return ctx.fetch_object(obj)[rank_of(cluster, device)]


CMS_KIND = register_kind(CMS())


register_move("PPU", "CMS")(adopt_move(CMS_KIND))  # sketched by the holder, then sent


@register_move("CMS", "PPU")
def _send(cluster: ClusterSpec, obj: MPObject, src: Device, dst: Device, what: str) -> MPObject:
    moved = simp.shuffle_static(obj, {rank_of(cluster, dst): rank_of(cluster, src)})
    return place(moved, dst.name)
