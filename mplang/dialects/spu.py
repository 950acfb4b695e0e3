"""The `spu` dialect: secret-shared computation with libspu.

``seal`` secret-shares a plaintext tensor held by one party among an SPU's
members, ``run`` executes a JAX function compiled by libspu on those shares,
``reveal`` reconstructs a result for one party, and ``shares`` gives one member
its share of a constant the driver secret-shared. Every op carries the SPU's
configuration (members, protocol, field, fixed-point bits and, for SEMI2K, the
Beaver source) as attributes, so a program is self-contained. ``run`` also
carries the StableHLO its executable was compiled from: the flow rule and the
round estimate read it, and workers check that it compiles to the executable.
The share type, the ops' declarations, type, flow and cost rules live here;
kernels, the share codec and the payload check in ``kernels/spu/``, the
device kind in ``device/spu.py``.
"""

from __future__ import annotations

import functools
import json
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import jax
import numpy as np
from jax import export as jax_export
from jax._src.config import jax_export_calling_convention_version
from jax._src.lib import xla_client
from jax.extend.mlir import hlo_to_stablehlo
from jax.extend.mlir import ir as _ir
from jax.interpreters.mlir import make_ir_context

from mplang.dialects.common import remember_located, trace_failure
from mplang.dialects.simp import converge_p
from mplang.dialects.symbolic import avals, exported, probe_text
from mplang.edsl.attrs import Attr, NoneType
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.graph import Operation
from mplang.edsl.object import MPObject
from mplang.edsl.primitive import Operand, Primitive, Result, Signature, held
from mplang.edsl.private import Commitment
from mplang.edsl.pytree import tree_flatten, tree_unflatten
from mplang.edsl.tracer import current_tracer
from mplang.edsl.traits import WORKER_AND_DRIVER, OpTraits
from mplang.edsl.typing import (
    DTYPES,
    MAX_SYMBOLIC_ELEMENTS,
    BaseType,
    Mask,
    MPType,
    TensorType,
    TypeDecoder,
    TypeEncoder,
    ValueType,
    numpy_dtype,
    register_type,
)
from mplang.flows.dp_flows import release_flow
from mplang.flows.engine import Analysis, PartyLabels, conservative, everywhere
from mplang.flows.labels import approved, row_count, suppressed
from mplang.flows.program_flows import labels_through
from mplang.flows.stablehlo import hlo
from mplang.flows.vouched import (
    Approvable,
    Releasing,
    Suppressing,
    library_attrs,
    min_rows_of,
    vouched,
)
from mplang.frontend.cache import CompileCache
from mplang.frontend.feop import feop

ir: Any = _ir  # the MLIR bindings ship no type stubs
SHARE_SCHEME = "spu"
SHARE_BYTES_PER_ELEMENT = 2 * 16
"""The most bytes one party's share of one element takes: two 128-bit ring elements."""
SHARE_META_BYTES = 4096
"""A bound of a share's metadata and chunk framing (its shape, storage type, offsets)."""
SUPPORTED_DTYPES = DTYPES - {"bfloat16", "complex64", "complex128"}
"""Dtypes libspu can secret-share."""


@register_type("share")
@dataclass(frozen=True)
class SecretShareType(BaseType):
    """One party's share of a secret-shared tensor (protocol family named by ``scheme``)."""

    scheme: str
    plaintext_type: TensorType
    expansion = None

    def plaintext(self) -> TensorType:
        return self.plaintext_type

    def wire_bytes(self) -> int:
        """Two ring elements of the widest field (FM128) per element, the most any
        protocol gives one party (ABY3 holds two replicated shares), and the share's
        metadata; a size known only at run time counts as `MAX_SYMBOLIC_ELEMENTS`."""
        elements = self.plaintext_type.elements_bound(MAX_SYMBOLIC_ELEMENTS)
        return elements * SHARE_BYTES_PER_ELEMENT + SHARE_META_BYTES

    def __str__(self) -> str:
        return f"share<{self.scheme},{self.plaintext_type}>"

    def to_json(self, encode: TypeEncoder) -> Any:
        return [self.scheme, encode(self.plaintext_type)]

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> SecretShareType:
        scheme, plain = body
        inner = decode(plain, f"{path}[1]")
        if not isinstance(scheme, str) or not isinstance(inner, TensorType):
            raise ValueError("expected [scheme, tensor type]")
        return SecretShareType(scheme, inner)


def _message_cost(op: Operation, model: Any) -> Any:
    """Seal: the owner sends each member its shares; reveal: each member sends the receiver
    its shares. The members' messages travel in parallel."""
    from mplang.analysis.cost_model import OpCost, value_bytes

    shares = op.outputs if op.opcode == seal_p.name else op.inputs
    return OpCost(model.message_s(sum(value_bytes(v.type, model) for v in shares)), 1)


def stablehlo_text(op: Operation) -> str:
    """The StableHLO of an ``spu.run`` as text (bytes that are no UTF-8 replaced: such text
    does not parse)."""
    return bytes(op.attrs["stablehlo"]).decode(errors="replace")


def run_rounds(op: Operation, model: Any) -> int:
    """Estimated protocol rounds of an ``spu.run`` (see `mplang.analysis.spu_rounds`)."""
    from mplang.analysis.spu_rounds import estimate_spu_rounds

    text = analysis_text(op)
    return 0 if text is None else estimate_spu_rounds(text, op.attrs["field"],
                                                      model.loop_iterations)


def _run_cost(op: Operation, model: Any) -> Any:
    """Each round moves about one share of the largest operand or result."""
    from mplang.analysis.cost_model import OpCost, local_cost, value_bytes

    rounds = run_rounds(op, model)
    largest = max((value_bytes(v.type, model) for v in (*op.inputs, *op.outputs)), default=0.0)
    return OpCost(local_cost(op, model).seconds + rounds * model.message_s(largest), rounds)


def _shares_cost(op: Operation, model: Any) -> Any:
    """Local: the share arrives inside the program."""
    from mplang.analysis.cost_model import local_cost

    return local_cost(op, model)


PROTOCOLS = {"SEMI2K": None, "ABY3": 3, "CHEETAH": 2}
"""Protocol name -> the exact number of members it needs (None: two or more)."""
FIELDS = ("FM32", "FM64", "FM128")
"""libspu's rings."""
DEFAULT_FRACTION_BITS = {"FM32": 8, "FM64": 18, "FM128": 26}
"""libspu's fixed-point fraction bits per ring when a config names none (its
``fxp_fraction_bits=0``): what an SPU of that field computes with."""
BEAVERS = ("TrustedFirstParty", "TrustedThirdParty")
"""SEMI2K's Beaver sources in this libspu (its MultiParty source is refused by libspu
0.10's SEMI2K: "unsupported beaver type")."""
CONFIG_ATTRS = {
    "device": Attr(str, required=True, doc="the SPU device's name"),
    "members": Attr(tuple, required=True, doc="the member ranks, in device order"),
    "protocol": Attr(str, required=True, choices=tuple(PROTOCOLS), doc="libspu's protocol"),
    "field": Attr(str, required=True, choices=FIELDS, doc="libspu's ring"),
    "fxp_fraction_bits": Attr(int, default=0, min=0, max=63,
                              doc="fixed-point fraction bits (0: libspu's default)"),
    "beaver": Attr(str, default="", choices=("", *BEAVERS),
                   doc="SEMI2K's Beaver source (empty for other protocols)"),
    "ttp": Attr((dict, NoneType), default=None,
                doc="libspu TTPBeaverConfig fields for beaver TrustedThirdParty"),
}
"""The attributes every ``spu`` op carries: its SPU's configuration (`SpuConfig.attrs`)."""
SHARE = held(SecretShareType, name="mp<share>")
PLAIN = held(TensorType, name="mp<tensor>")
_TRAITS = OpTraits(pure=True, runtimes=WORKER_AND_DRIVER)

seal_p = Primitive(
    "spu.seal", kind="communication", execution_model="multi_party", traits=_TRAITS,
    operands=[Operand("x", PLAIN, doc="the plaintext, held by one party")],
    attrs=CONFIG_ATTRS, results=[Result("share", SHARE)], targets=("SPU",),
    cost=_message_cost, doc="Secret-share one party's tensor among the SPU's members.")
run_p = Primitive(
    "spu.run", kind="compute", execution_model="multi_party", traits=_TRAITS,
    operands=[Operand("args", SHARE, variadic=True)],
    attrs={**CONFIG_ATTRS,
           "fn": Attr(str, default="fn", doc="the function's name, for readers"),
           "executable": Attr(bytes, required=True,
                              doc="the serialized libspu Executable (empty where a size is "
                                  "known only at run time: each member compiles the "
                                  "StableHLO for each run's sizes)"),
           "stablehlo": Attr(bytes, required=True,
                             doc="the StableHLO text (UTF-8) the executable compiles from"),
           "in_types": Attr(tuple, required=True, doc="the plaintext types of the inputs"),
           "out_types": Attr(tuple, required=True, doc="the plaintext types of the results"),
           "library": Attr(str, default="", optional=True,
                           doc="the registered library function run (policy.vouched), if any"),
           "library_args": Attr(tuple, default=(), optional=True,
                                doc="its static int and float arguments")},
    results=[Result("outs", SHARE, variadic=True)], targets=("SPU",), cost=_run_cost,
    doc="Run a libspu executable on secret shares held by the SPU's members.")
reveal_p = Primitive(
    "spu.reveal", kind="communication", execution_model="multi_party", traits=_TRAITS,
    operands=[Operand("x", SHARE)],
    attrs={**CONFIG_ATTRS, "to": Attr(int, required=True, min=0, doc="the receiving rank")},
    results=[Result("y", PLAIN)], targets=("SPU",), cost=_message_cost,
    doc="Reconstruct secret shares for one party only.")
shares_p = Primitive(
    "spu.shares", kind="source", execution_model="multi_party", traits=_TRAITS,
    operands=[],
    attrs={**CONFIG_ATTRS,
           "plaintext": Attr(TensorType, required=True, doc="the secret's type"),
           "member": Attr(int, required=True, min=0, doc="the rank receiving this share"),
           "share": Attr((tuple, Commitment), required=True,
                         doc="libspu's share (meta, then chunks), private to the member")},
    results=[Result("share", SHARE)], targets=("SPU",), cost=_shares_cost,
    doc="One member's share of a driver constant the driver secret-shared.")


DEFAULT_PROTOCOLS = {2: "CHEETAH", 3: "ABY3"}
"""The protocol an SPU of that many members runs when its config names none. Neither
makes one member the others' dealer; other member counts must name a protocol."""
DEFAULT_BEAVER = "TrustedFirstParty"
"""SEMI2K's Beaver source when its config names none (libspu's own default)."""
TTP_DEFAULTS = {"asym_crypto_schema": "SM2", "adjust_rank": 0, "transport_protocol": "http"}
"""libspu ``TTPBeaverConfig`` fields a ``ttp`` config may leave out."""


def default_protocol(members: int) -> str | None:
    """The protocol of an SPU of ``members`` members whose config names none."""
    return DEFAULT_PROTOCOLS.get(members)


@dataclass(frozen=True)
class SpuConfig:
    """One SPU device: member ranks (in device order) and protocol settings.

    ``beaver`` (SEMI2K only: who makes the multiplication triples) is
    ``TrustedFirstParty`` or ``TrustedThirdParty``; ``ttp`` holds the
    ``(field, value)`` pairs of libspu's ``TTPBeaverConfig`` for the latter.
    """

    device: str
    members: tuple[int, ...]
    protocol: str
    field: str
    fxp_fraction_bits: int = 0  # 0: libspu's default for the field (`DEFAULT_FRACTION_BITS`)
    beaver: str = ""  # "" for protocols without a Beaver source
    ttp: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        if self.protocol == "SEMI2K" and not self.beaver:
            object.__setattr__(self, "beaver", DEFAULT_BEAVER)

    @staticmethod
    def of(cluster: Any, device: Any) -> SpuConfig:
        """The config of SPU ``device`` of `ClusterSpec` ``cluster``."""
        config = device.config
        protocol = config.get("protocol") or default_protocol(len(device.members))
        if protocol is None:
            raise MPTypeError(f"SPU {device.name}: {len(device.members)} members and no "
                              "protocol in its config")
        field = config.get("field", "FM64")
        return SpuConfig(device.name, tuple(cluster.rank_of(m) for m in device.members),
                         protocol, field,
                         int(config.get("fxp_fraction_bits") or DEFAULT_FRACTION_BITS[field]),
                         config.get("beaver", "") if protocol == "SEMI2K" else "",
                         tuple(sorted({**TTP_DEFAULTS, **config["ttp"]}.items()))
                         if config.get("ttp") else ())

    def attrs(self) -> dict[str, Any]:
        """The config as op attributes (`CONFIG_ATTRS`; what `from_attrs` reads back)."""
        return {"device": self.device, "members": self.members, "protocol": self.protocol,
                "field": self.field, "fxp_fraction_bits": self.fxp_fraction_bits,
                "beaver": self.beaver, "ttp": dict(self.ttp) if self.ttp else None}

    @staticmethod
    def from_attrs(attrs: Any) -> SpuConfig:
        """The config stored in an op's attributes by `attrs`."""
        return SpuConfig(attrs["device"], tuple(attrs["members"]), attrs["protocol"],
                         attrs["field"], attrs["fxp_fraction_bits"], attrs["beaver"],
                         tuple(sorted((attrs["ttp"] or {}).items())))

    @property
    def mask(self) -> Mask:
        """The member ranks as a party mask."""
        return Mask.of(self.members)

    def share_type(self, plaintext: TensorType, holders: Mask | None = None) -> MPType:
        """The type of ``plaintext`` secret-shared among this device's members (held by
        ``holders``, default all members)."""
        return MPType(SecretShareType(SHARE_SCHEME, plaintext),
                      self.mask if holders is None else holders)


def _share(op: str, config: SpuConfig, t: ValueType, i: int) -> TensorType:
    """The plaintext type of input ``i``, a share among ``config``'s members."""
    if not (isinstance(t, MPType) and isinstance(t.base, SecretShareType)):
        raise MPTypeError(f"{op} on {config.device}: input {i} must be a secret share, got {t}")
    if t.pmask != config.mask:
        raise MPTypeError(f"{op} on {config.device}: input {i} ({t}) is shared among "
                          f"{t.pmask}, not among the device's members {config.mask}")
    return t.base.plaintext_type


def _check_device(where: str, config: SpuConfig, dtype: str, world_size: int) -> None:
    """Refuse a dtype libspu cannot hold and members outside the world."""
    if dtype not in SUPPORTED_DTYPES:
        raise MPTypeError(f"{where}: SPU cannot hold dtype {dtype}; supported: "
                          f"{', '.join(sorted(SUPPORTED_DTYPES))}")
    if not config.mask.issubset(Mask.all(world_size)):
        raise MPTypeError(f"{where}: members {config.members} are outside the world")


# ---------------------------------------------------------------- seal / reveal / shares


@seal_p.def_type_rule
def _seal_rule(sig: Signature) -> list[ValueType]:
    config = SpuConfig.from_attrs(sig.attrs)
    x: MPType = sig.x
    where = f"spu.seal into {config.device}"
    if x.pmask is None or len(x.pmask) != 1:
        raise MPTypeError(f"{where}: the value ({x}) must be held by exactly one party")
    assert isinstance(x.base, TensorType)
    _check_device(where, config, x.base.dtype, sig.world_size)
    return [config.share_type(x.base)]


@feop(seal_p, example="s = spu.seal(x, config)")
@function
def seal(x: MPObject, config: SpuConfig) -> MPObject:
    """Secret-share ``x`` (held by one party) among ``config``'s members."""
    return seal_p.bind([x], config.attrs())[0]


@reveal_p.def_type_rule
def _reveal_rule(sig: Signature) -> list[ValueType]:
    config = SpuConfig.from_attrs(sig.attrs)
    plaintext = _share("spu.reveal", config, sig.x, 0)
    if sig.to >= sig.world_size:
        raise MPTypeError(f"spu.reveal from {config.device}: party {sig.to} is outside the "
                          "world")
    return [MPType(plaintext, Mask.of([sig.to]))]


@feop(reveal_p, example="y = spu.reveal(s, config, to=0)")
@function
def reveal(x: MPObject, config: SpuConfig, to: int) -> MPObject:
    """Reconstruct secret ``x`` for party ``to`` only."""
    return reveal_p.bind([x], {**config.attrs(), "to": int(to)})[0]


@shares_p.def_type_rule
def _shares_rule(sig: Signature) -> list[ValueType]:
    config = SpuConfig.from_attrs(sig.attrs)
    where = f"spu.shares on {config.device}"
    _check_device(where, config, sig.plaintext.dtype, sig.world_size)
    if sig.member not in config.members:
        raise MPTypeError(f"{where}: party {sig.member} is not one of its members "
                          f"{config.members}")
    return [config.share_type(sig.plaintext, Mask.of([sig.member]))]


@shares_p.def_private
def _shares_private(op: Operation) -> dict[str, Mask | None]:
    """The share is private to its member."""
    return {"share": Mask.of([op.attrs["member"]])}


shares_p.def_flow(conservative)


@feop(shares_p, converge_p,
      example="s = spu.share_constant(np.arange(3, dtype=np.int32), config)")
def share_constant(value: np.ndarray, config: SpuConfig) -> MPObject:
    """``value``, a driver constant, secret-shared now (by the driver) among ``config``'s
    members: one ``spu.shares`` per member, private to it (no member receives the
    plaintext), merged by ``simp.converge``."""
    import spu.libspu as libspu

    shares = io_for(config).make_shares(value, libspu.Visibility.VIS_SECRET)
    attrs = {**config.attrs(), "plaintext": TensorType.of(value.dtype, value.shape)}
    parts = [shares_p.bind([], {**attrs, "member": member, "share": (
        bytes(share.meta), *(bytes(c) for c in share.share_chunks))})[0]
        for member, share in zip(config.members, shares, strict=True)]
    return converge_p.bind(parts)[0]


# ---------------------------------------------------------------- run


@run_p.def_type_rule
def _run_rule(sig: Signature) -> list[ValueType]:
    config = SpuConfig.from_attrs(sig.attrs)
    op = f"spu.run[{sig.fn}]"
    ins = [_share(op, config, t, i) for i, t in enumerate(sig.args)]
    if ins != list(sig.in_types):
        raise MPTypeError(f"{op} on {config.device}: inputs are ({', '.join(map(str, ins))}) "
                          f"but the executable expects ({', '.join(map(str, sig.in_types))})")
    return [config.share_type(t) for t in sig.out_types]


@dataclass(frozen=True)
class _Compiled:
    stablehlo: bytes
    executable: bytes
    out_types: tuple[TensorType, ...]
    out_tree: Any  # jax PyTreeDef of the function's result


_COMPILED: CompileCache[_Compiled] = CompileCache(
    "spu.run", 1024,
    same=lambda a, b: (a.stablehlo, a.executable) == (b.stablehlo, b.executable))
"""(fn, arg tree, static leaves, input types) -> `_Compiled`; reused functions compile once."""
_DYNAMIC = object()


def input_name(i: int) -> str:
    return f"in{i}"


def output_name(i: int) -> str:
    return f"out{i}"


def lower(fn: Callable[..., Any], avals: list[Any], located: bool = False
          ) -> tuple[str, Any]:
    """``fn`` on ``avals`` as StableHLO text (lowered as libspu's JAX frontend lowers it,
    with its patch of JAX's float sort, then through XLA's HLO, which legalizes the ops
    libspu cannot parse) and its output avals; ``located``: the text with each op's
    source location (a program carries it without)."""
    import spu.utils.frontend as spu_frontend

    hlo, out_avals = patched_for_libspu(
        lambda: spu_frontend._jax_compilation(fn, (), None, avals, {}))
    with make_ir_context():
        module = ir.Module.parse(hlo_to_stablehlo(hlo))
        return str(module.operation.get_asm(enable_debug_info=located)), out_avals


def patched_for_libspu(lowering: Callable[[], Any]) -> Any:
    """``lowering()`` under libspu's JAX frontend patches (its float sort), with JAX's
    ``interpreter`` platform registered as libspu's frontend does."""
    import spu.utils.frontend as spu_frontend
    from jax._src.xla_bridge import _backends, register_backend_factory
    from jax.interpreters.xla import Backend

    with spu_frontend._jax_lock:
        if "interpreter" not in _backends:
            register_backend_factory("interpreter", Backend, priority=-100)
        patches = spu_frontend._patch_jax()
        try:
            return lowering()
        finally:
            spu_frontend._restore_jax_patch(patches)


def lower_symbolic(fn: Callable[..., Any], in_types: tuple[TensorType, ...]
                   ) -> tuple[str, Any]:
    """``fn`` on inputs of sizes known only at run time, exported once (``jax.export``,
    shape-polymorphic StableHLO text) for each member to refine and compile for each run's
    sizes (`mplang.kernels.spu.sizes`); and its output avals, with symbolic sizes."""
    exp = patched_for_libspu(lambda: jax_export.export(
        jax.jit(fn, keep_unused=True), platforms=["interpreter"])(*avals(in_types)))
    with make_ir_context():
        return (str(ir.Module.parse(exp.mlir_module())),
                jax.tree_util.tree_unflatten(exp.out_tree, exp.out_avals))


@functools.lru_cache(maxsize=64)
def exported_run(stablehlo: bytes, in_types: tuple[TensorType, ...],
                 out_types: tuple[TensorType, ...]) -> jax_export.Exported:
    """The ``jax.export.Exported`` of the shape-polymorphic StableHLO text of an
    ``spu.run`` whose sizes are known only at run time (`lower_symbolic`)."""
    bytecode = xla_client._xla.mlir.serialize_portable_artifact(
        stablehlo.decode(), hlo.get_current_version(), True)
    return exported(bytecode, in_types, out_types, "interpreter",
                    jax_export_calling_convention_version.value, range(len(in_types)))


@functools.lru_cache(maxsize=64)
def _probe(stablehlo: bytes, in_types: tuple[TensorType, ...],
           out_types: tuple[TensorType, ...]) -> str | None:
    try:
        exp = exported_run(stablehlo, in_types, out_types)
    except Exception:  # not StableHLO: the analyses treat it as unknown
        return None
    return probe_text(exp, in_types, patched_for_libspu)


def analysis_text(op: Operation) -> str | None:
    """The StableHLO an analysis of ``spu.run`` ``op`` reads: its text, or, where sizes
    are known only at run time, the module refined to probe sizes
    (`mplang.dialects.symbolic`; None if it does not refine)."""
    if op.attrs["executable"]:
        return stablehlo_text(op)
    return _probe(bytes(op.attrs["stablehlo"]), tuple(op.attrs["in_types"]),
                  tuple(op.attrs["out_types"]))


def executable_of(stablehlo: str, inputs: int, outputs: int, name: str) -> bytes:
    """The serialized libspu executable that StableHLO ``stablehlo`` compiles to, with
    ``inputs`` secret inputs and ``outputs`` results (named by `input_name`,
    `output_name`)."""
    import spu as spu_api
    import spu.libspu as libspu

    source = libspu.CompilationSource(libspu.SourceIRType.STABLEHLO, stablehlo.encode(),
                                      [libspu.Visibility.VIS_SECRET] * inputs)
    code = spu_api.compile(source, libspu.CompilerOptions())
    executable = libspu.Executable(name=name, code=code,
                                   input_names=[input_name(i) for i in range(inputs)],
                                   output_names=[output_name(i) for i in range(outputs)])
    data: bytes = executable.SerializeToString()
    return data


_COMPILING = threading.RLock()
"""Held while a function is lowered and compiled for libspu (drivers trace from many
threads)."""


def compiled(fn: Callable[..., Any], avals: list[Any], name: str) -> bytes:
    """The serialized libspu executable of JAX function ``fn`` on ``avals``, every input
    secret (named by `input_name`, its outputs by `output_name`)."""
    with _COMPILING:
        stablehlo, out_avals = lower(fn, avals)
        outputs = len(jax.tree_util.tree_leaves(out_avals))
        return executable_of(stablehlo, len(avals), outputs, name)


def _compile(fn: Callable[..., Any], name: str, label: str, tree: Any, spec: tuple[Any, ...],
             in_types: tuple[TensorType, ...]) -> _Compiled:
    def flat(*arrays: Any) -> Any:
        it = iter(arrays)
        leaves = [next(it) if s is _DYNAMIC else s for s in spec]
        args, kwargs = tree_unflatten(tree, leaves)
        return fn(*args, **kwargs)

    def located() -> str:  # the same lowering, with source locations
        with _COMPILING:
            return lower(flat, shapes, located=True)[0]

    symbolic = not all(t.is_static for t in in_types)
    try:
        with _COMPILING:  # lowering patches JAX for libspu: one thread at a time
            if symbolic:  # exported once; each member compiles it for each run's sizes
                stablehlo, out_avals = lower_symbolic(flat, in_types)
            else:
                shapes = [jax.ShapeDtypeStruct(t.shape, numpy_dtype(t.dtype)) for t in in_types]
                stablehlo, out_avals = lower(flat, shapes)
                remember_located(stablehlo.encode(), located)
            leaves, out_tree = jax.tree_util.tree_flatten(out_avals)
            executable = b"" if symbolic else executable_of(stablehlo, len(in_types),
                                                              len(leaves), name)
    except Exception as e:
        types = ", ".join(map(str, in_types))
        raise MPTypeError(f"{label}: could not compile the function for SPU on ({types}): "
                          f"{trace_failure(e)}") from None
    out_types = tuple(TensorType.of(a.dtype, a.shape) for a in leaves)
    return _Compiled(stablehlo.encode(), executable, out_types, out_tree)


@feop(run_p, op_kind="compiler", dialects=["spu", "stablehlo"],
      capabilities={"caching": {"scope": "process", "key_strategy": "signature"}},
      example="z = spu.run(lambda a, b: a < b, config, x, y)")
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
    key = (fn, tree, tuple(spec), tuple(type(s) for s in spec), in_types)
    entry = _COMPILED.get_or_compile(
        key, lambda: _compile(fn, name, label, tree, tuple(spec), in_types), label)
    attrs = {**config.attrs(), "fn": name, "executable": entry.executable,
             "stablehlo": entry.stablehlo, "in_types": in_types,
             "out_types": entry.out_types, **library_attrs(fn)}
    outs = run_p.bind(inputs, attrs)
    return entry.out_tree.unflatten(outs)


def _derive(fn: Callable[..., Any], in_types: tuple[TensorType, ...]) -> str:
    """The StableHLO text `run` records for ``fn`` on shares of ``in_types``."""
    _, tree = tree_flatten((tuple(range(len(in_types))), {}))
    name = getattr(fn, "__name__", "fn")
    spec = (_DYNAMIC,) * len(in_types)
    return _compile(fn, name, name, tree, spec, in_types).stablehlo.decode()


@functools.lru_cache(maxsize=64)
def runtime_config(protocol: str, field: str, fxp_fraction_bits: int, beaver: str = "",
                   ttp: tuple[tuple[str, Any], ...] = ()) -> Any:
    """libspu's runtime configuration for one protocol, field, fixed-point setting and
    (SEMI2K) Beaver source with its trusted third party's ``TTPBeaverConfig`` fields."""
    import spu as spu_api
    import spu.libspu as libspu

    config = libspu.RuntimeConfig(protocol=spu_api.parse_protocol_kind(protocol),
                                  field=spu_api.parse_field_type(field))
    config.fxp_fraction_bits = fxp_fraction_bits
    if beaver:
        config.beaver_type = spu_api.parse_beaver_type(beaver)
    if ttp:
        # libspu's binding cannot assign a TTPBeaverConfig to a RuntimeConfig, but parses
        # it from JSON (server_public_key as PEM text); the two messages merge as protobuf.
        extra = libspu.RuntimeConfig()
        if not extra.ParseFromJsonString(json.dumps({"beaver_type": beaver,
                                                     "ttp_beaver_config": dict(ttp)})):
            raise ValueError(f"libspu rejects the TTP Beaver config {dict(ttp)}")
        merged = libspu.RuntimeConfig()
        if not merged.ParseFromString(config.SerializeToString() + extra.SerializeToString()):
            raise ValueError("libspu rejects the merged runtime config")
        config = merged
    return config


def runtime_config_for(config: SpuConfig) -> Any:
    """libspu's runtime configuration of ``config``'s SPU."""
    return runtime_config(config.protocol, config.field, config.fxp_fraction_bits,
                          config.beaver, config.ttp)


@functools.lru_cache(maxsize=64)
def _io(world: int, protocol: str, field: str, fxp_fraction_bits: int) -> Any:
    import spu as spu_api

    return spu_api.Io(world, runtime_config(protocol, field, fxp_fraction_bits))


def io_for(config: SpuConfig) -> Any:
    """libspu's share maker and reconstructor for ``config``'s members."""
    return _io(len(config.members), config.protocol, config.field, config.fxp_fraction_bits)


def reconstruct(config: SpuConfig, shares: list[Any], plaintext: TensorType) -> np.ndarray:
    """The plaintext of libspu ``shares`` (one per member, in member order)."""
    value = io_for(config).reconstruct(shares)
    return np.asarray(value).astype(numpy_dtype(plaintext.dtype), copy=False)


# ---------------------------------------------------------------- flow rules
# Sealing sends secret shares (not plaintext), so the label follows the shares to
# every member unchecked; ``spu.run`` carries labels through the StableHLO its
# executable compiles from; ``spu.reveal`` is a declassification to the receiving
# party, which the data owner's policy must allow.


def _device_use(a: Analysis, op: Operation, sealed_from: int | None = None) -> None:
    if a.party in op.attrs["members"] or sealed_from == a.party:
        a.devices.append((op, dict(op.attrs)))


@seal_p.def_flow
def _seal_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Shares are not plaintext: the label follows them to every member, unchecked. A size
    known only at run time is not hidden: the members learn the row count (`row_count`)."""
    holders = a.holders(op.inputs[0])
    src = holders[0] if len(holders) == 1 else None
    _device_use(a, op, src)
    label = ins[0].get(src) if src is not None else everywhere(ins[0])
    plain = op.inputs[0].type
    if label is not None and isinstance(plain, MPType) and isinstance(plain.base, TensorType) \
            and not plain.base.is_static:
        for member in op.attrs["members"]:
            a.send(op, member, row_count(label), "the row count of the shares it receives")
    return [{} if label is None else dict.fromkeys(op.attrs["members"], label)]


@run_p.def_flow
def _run_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """Labels through the StableHLO of the executable, to every member; a registered
    library function's suppressed groups hold at least its ``min_rows`` rows (for the
    party whose rows choose them, its outputs are ``approved``, as an approvable
    function's are); a vouched release's outputs are noisy (`release_flow`). Groups
    chosen by the same value (its first input) are the same groups."""
    _device_use(a, op)
    entry = vouched(op, stablehlo_text(op), _derive) if op.attrs.get("library") else None
    if isinstance(entry, Releasing):
        return release_flow(a, op, ins, entry)
    result = labels_through(analysis_text(op), [everywhere(v) for v in ins], len(op.outputs),
                            op.loc or "")
    a.observe(op, result.observed)
    outputs = result.outputs
    if isinstance(entry, Approvable) or (isinstance(entry, Suppressing) and any(
            lab is not None and lab.form == "raw" for lab in outputs)):
        outputs = [approved(entry.release, map(everywhere, ins))] * len(outputs)
    elif isinstance(entry, Suppressing) and any(lab is not None and lab.gated
                                               for lab in outputs):
        outputs = [suppressed(lab, min_rows_of(op, entry), gate=id(op.inputs[0]),
                              partition=entry.partition) for lab in outputs]
    members = op.attrs["members"]
    return [{} if lab is None else dict.fromkeys(members, lab) for lab in outputs]


@reveal_p.def_flow
def _reveal_flow(a: Analysis, op: Operation, ins: list[PartyLabels]) -> list[PartyLabels]:
    """A declassification to the receiving party."""
    _device_use(a, op)
    to: int = op.attrs["to"]
    label = everywhere(ins[0])
    a.send(op, to, label, f"the value revealed from {op.attrs['device']}")
    return [{} if label is None else {to: label}]


__all__ = ["SecretShareType", "SpuConfig", "reveal", "run", "seal"]
