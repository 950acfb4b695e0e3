"""The `spu` dialect: secret-shared computation with libspu.

``seal`` secret-shares a plaintext tensor held by one party among an SPU's
members, ``run`` executes a JAX function compiled by libspu on those shares,
and ``reveal`` reconstructs a result for one party. Every op carries the SPU's
configuration (members, protocol, field, fixed-point bits) as attributes, so a
program is self-contained. Kernels live in ``backends/spu_impl.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import jax
import spu.libspu as libspu
import spu.utils.frontend as spu_frontend

from mplang.dialects.common import LRUCache
from mplang.edsl.function import function
from mplang.edsl.graph import Graph
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import Primitive
from mplang.edsl.pytree import tree_flatten, tree_unflatten
from mplang.edsl.tracer import current_tracer
from mplang.edsl.typing import Mask, MPType, SecretShareType, TensorType, ValueType, numpy_dtype
from mplang.frontend.errors import MPTypeError

SHARE_SCHEME = "spu"
SUPPORTED_DTYPES = frozenset(["bool", "int8", "int16", "int32", "int64", "uint8", "uint16",
                              "uint32", "uint64", "float16", "float32", "float64"])

seal_p = Primitive("spu.seal", kind="communication", execution_model="multi_party",
                   doc="Secret-share one party's tensor among the SPU's members.")
run_p = Primitive("spu.run", kind="compute", execution_model="multi_party",
                  doc="Run a libspu executable on secret shares held by the SPU's members.")
reveal_p = Primitive("spu.reveal", kind="communication", execution_model="multi_party",
                     doc="Reconstruct secret shares for one party only.")


@dataclass(frozen=True)
class SpuConfig:
    """One SPU device: member ranks (in device order) and protocol settings."""

    device: str
    members: tuple[int, ...]
    protocol: str
    field: str
    fxp_fraction_bits: int = 0  # 0: libspu's default for the field

    @staticmethod
    def of(cluster: Any, device: Any) -> SpuConfig:
        """The config of SPU ``device`` of `ClusterSpec` ``cluster``."""
        return SpuConfig(device.name, tuple(cluster.rank_of(m) for m in device.members),
                         device.config.get("protocol", "SEMI2K"),
                         device.config.get("field", "FM64"),
                         int(device.config.get("fxp_fraction_bits", 0)))

    def attrs(self) -> dict[str, Any]:
        return {"device": self.device, "members": self.members, "protocol": self.protocol,
                "field": self.field, "fxp_fraction_bits": self.fxp_fraction_bits}

    @staticmethod
    def from_attrs(attrs: Any) -> SpuConfig:
        return SpuConfig(attrs["device"], tuple(attrs["members"]), attrs["protocol"],
                         attrs["field"], attrs["fxp_fraction_bits"])

    @property
    def mask(self) -> Mask:
        return Mask.of(self.members)

    def share_type(self, plaintext: TensorType) -> MPType:
        return MPType(SecretShareType(SHARE_SCHEME, plaintext), self.mask)


def _share(op: str, config: SpuConfig, t: ValueType, i: int) -> TensorType:
    if not (isinstance(t, MPType) and isinstance(t.base, SecretShareType)):
        raise MPTypeError(f"{op} on {config.device}: input {i} must be a secret share, got {t}")
    if t.pmask != config.mask:
        raise MPTypeError(f"{op} on {config.device}: input {i} ({t}) is shared among "
                          f"{t.pmask}, not among the device's members {config.mask}")
    return t.base.plaintext


@seal_p.def_type_rule
def _seal_rule(in_types: list[ValueType], attrs: dict[str, Any], regions: Sequence[Graph],
               world_size: int) -> list[ValueType]:
    config = SpuConfig.from_attrs(attrs)
    (x,) = in_types
    where = f"spu.seal into {config.device}"
    if not (isinstance(x, MPType) and isinstance(x.base, TensorType)):
        raise MPTypeError(f"{where}: expected a plaintext tensor, got {x}")
    if x.pmask is None or len(x.pmask) != 1:
        raise MPTypeError(f"{where}: the value ({x}) must be held by exactly one party")
    if x.base.dtype not in SUPPORTED_DTYPES:
        raise MPTypeError(f"{where}: SPU cannot hold dtype {x.base.dtype} ({x}); supported: "
                          f"{', '.join(sorted(SUPPORTED_DTYPES))}")
    if not config.mask.issubset(Mask.all(world_size)):
        raise MPTypeError(f"{where}: members {config.members} are outside the world")
    return [config.share_type(x.base)]


@function
def seal(x: MPObject, config: SpuConfig) -> MPObject:
    """Secret-share ``x`` (held by one party) among ``config``'s members."""
    return seal_p.bind([x], config.attrs())[0]


@reveal_p.def_type_rule
def _reveal_rule(in_types: list[ValueType], attrs: dict[str, Any], regions: Sequence[Graph],
                 world_size: int) -> list[ValueType]:
    config = SpuConfig.from_attrs(attrs)
    plaintext = _share("spu.reveal", config, in_types[0], 0)
    to: int = attrs["to"]
    if not 0 <= to < world_size:
        raise MPTypeError(f"spu.reveal from {config.device}: party {to} is outside the world")
    return [MPType(plaintext, Mask.of([to]))]


@function
def reveal(x: MPObject, config: SpuConfig, to: int) -> MPObject:
    """Reconstruct secret ``x`` for party ``to`` only."""
    return reveal_p.bind([x], {**config.attrs(), "to": int(to)})[0]


@run_p.def_type_rule
def _run_rule(in_types: list[ValueType], attrs: dict[str, Any], regions: Sequence[Graph],
              world_size: int) -> list[ValueType]:
    config = SpuConfig.from_attrs(attrs)
    op = f"spu.run[{attrs['fn']}]"
    ins = [_share(op, config, t, i) for i, t in enumerate(in_types)]
    expected = list(attrs["in_types"])
    if ins != expected:
        raise MPTypeError(f"{op} on {config.device}: inputs are ({', '.join(map(str, ins))}) "
                          f"but the executable expects ({', '.join(map(str, expected))})")
    return [config.share_type(t) for t in attrs["out_types"]]


@dataclass(frozen=True)
class _Compiled:
    executable: bytes
    out_types: tuple[TensorType, ...]
    out_tree: Any  # jax PyTreeDef of the function's result


_COMPILED = LRUCache(1024)
"""(fn, arg tree, static leaves, input types) -> `_Compiled`; reused functions compile once."""
_DYNAMIC = object()


def input_name(i: int) -> str:
    return f"in{i}"


def output_name(i: int) -> str:
    return f"out{i}"


def _compile(fn: Callable[..., Any], label: str, tree: Any, spec: tuple[Any, ...],
             in_types: tuple[TensorType, ...]) -> _Compiled:
    def flat(*arrays: Any) -> Any:
        it = iter(arrays)
        leaves = [next(it) if s is _DYNAMIC else s for s in spec]
        args, kwargs = tree_unflatten(tree, leaves)
        return fn(*args, **kwargs)

    avals = [jax.ShapeDtypeStruct(t.shape, numpy_dtype(t.dtype)) for t in in_types]
    secret = libspu.Visibility.VIS_SECRET
    try:
        executable, out_avals = spu_frontend.compile(
            spu_frontend.Kind.JAX, flat, avals, {}, [input_name(i) for i in range(len(avals))],
            [secret] * len(avals), lambda outs: [output_name(i) for i in range(len(outs))])
    except Exception as e:
        types = ", ".join(map(str, in_types))
        raise MPTypeError(f"{label}: could not compile the function for SPU on ({types}): "
                          f"{type(e).__name__}: {e}") from None
    leaves, out_tree = jax.tree_util.tree_flatten(out_avals)
    out_types = tuple(TensorType.of(a.dtype, a.shape) for a in leaves)
    return _Compiled(executable.SerializeToString(), out_types, out_tree)


def run(fn: Callable[..., Any], config: SpuConfig, *args: Any, label: str | None = None,
        **kwargs: Any) -> Any:
    """Run JAX function ``fn`` on secret shares; returns ``fn``'s output pytree of shares.

    Shares among the arguments are inputs; other leaves are compile-time constants.
    """
    name = getattr(fn, "__name__", "fn")
    label = label or f"spu.run[{name}] on {config.device}"
    current_tracer(label)
    leaves, tree = tree_flatten((args, kwargs))
    inputs: list[MPObject] = []
    spec: list[Any] = []
    for leaf in leaves:
        if isinstance(leaf, MPObject):
            inputs.append(leaf)
            spec.append(_DYNAMIC)
        else:
            spec.append(leaf)
    in_types = tuple(_share(label, config, x.mptype, i) for i, x in enumerate(inputs))
    try:
        key: tuple[Any, ...] | None = (fn, tree, tuple(spec),
                                       tuple(type(s) for s in spec), in_types)
        entry = _COMPILED.lookup(key)
    except TypeError:  # unhashable callable or constant: compile without caching
        key, entry = None, None
    if entry is None:
        entry = _compile(fn, label, tree, tuple(spec), in_types)
        if key is not None:
            _COMPILED.store(key, entry)
    attrs = {**config.attrs(), "fn": name, "executable": entry.executable,
             "in_types": in_types, "out_types": entry.out_types}
    outs = run_p.bind(inputs, attrs)
    return entry.out_tree.unflatten(outs)


__all__ = ["SpuConfig", "reveal", "run", "seal"]
