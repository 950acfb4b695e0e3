"""The ``phe`` dialect: partially homomorphic encryption (Paillier, OU) of tensors.

Inside ``pcall`` bodies::

    pk, sk = phe.keygen(scheme="paillier", key_bits=2048)   # on one party
    c = phe.encrypt(x, pk)             # any party holding pk
    d = phe.add(c, c) ; e = c * 3 + 1  # ciphertext + ciphertext or plaintext; * plaintext
    s = phe.sum(c, axis=0) ; v = phe.dot(c, w)
    b = phe.bucket_sum(c, bins, groups, n_groups=4, n_bins=32)  # histograms of c's rows
    y = phe.decrypt(d, sk)             # the key owner only

Types: `PublicKey` and `PrivateKey` name their key pair (``key``, unique in the
program), and `Ciphertext` ``[dtype, shape, key, scale]`` names the key it is
under, so mixing keys is a type error. A private key is key material: it never
leaves the party that made it (`BaseType.confined`).

Fixed-point encoding: a value ``v`` is encrypted as the integer ``round(v * scale)``.
Integer tensors use ``scale`` 1; float tensors `FLOAT_SCALE` (2**24) unless
``encrypt`` is given another. ``add`` needs equal keys and scales (a plaintext is
encoded at the ciphertext's scale); ``mul_plain`` and ``dot`` multiply scales (a
float plaintext is encoded at `FLOAT_SCALE`, an integer one at 1). ``decrypt``
divides by the scale and checks every value fits its dtype: an overflow is an
error naming the op, never a silently wrapped number.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar

import jax.numpy as jnp
import numpy as np

from mplang.analysis.cost_model import local_cost
from mplang.dialects.tensor import constant, run_jax
from mplang.edsl.attrs import Attr, NoneType
from mplang.edsl.errors import MPTypeError
from mplang.edsl.function import function
from mplang.edsl.location import mark_library
from mplang.edsl.object import MPObject, register_type_attributes, register_type_operator
from mplang.edsl.primitive import Constraint, Operand, Primitive, Result, Signature, of_type
from mplang.edsl.tracer import current_tracer
from mplang.edsl.traits import LOCAL_PURE, OpTraits
from mplang.edsl.typing import (
    BaseType,
    Dim,
    TensorType,
    TypeDecoder,
    TypeEncoder,
    ValueType,
    dim_text,
    is_symbolic,
    register_type,
)
from mplang.flows.phe_flows import (
    additive_flow,
    bucket_sum_flow,
    decrypt_flow,
    dot_flow,
    encrypt_flow,
    keygen_flow,
    mul_plain_flow,
    sum_flow,
)
from mplang.frontend.feop import feop

mark_library(__file__)

SCHEMES = ("paillier", "ou")
"""``paillier``: sf-heu's ZPaillier (additive, plaintexts up to about n/2); ``ou``:
Okamoto-Uchiyama (faster, plaintexts of about a third of the key's bits)."""
MIN_KEY_BITS, MAX_KEY_BITS = 1024, 8192
FLOAT_SCALE = 1 << 24
"""The default fixed-point scale of float tensors: about 7 decimal digits after the
point; a float encrypts as ``round(v * 2**24)``, which must fit a signed 64-bit integer."""
INT_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32")
FLOAT_DTYPES = ("float32", "float64")
DTYPES = INT_DTYPES + FLOAT_DTYPES
"""The dtypes a ciphertext may hold."""
WIRE_KEY_BYTES = 64 * 1024
"""The most bytes a serialized public key may take on the wire."""
WIRE_BYTES_PER_ELEMENT = 2 * MAX_KEY_BITS // 8 + 64
MAX_SYMBOLIC_CIPHERTEXTS = 1 << 21
"""The elements a ciphertext of a size known only at run time may have in one message
(about 1.2 GiB at `WIRE_BYTES_PER_ELEMENT`)."""
"""A bound of one serialized ciphertext element (at most ``2 * key_bits`` bits, framed)."""
MAX_SCALE_BITS = 512
"""Scales multiply with every plaintext multiplication; past 2**512 a result cannot be
decrypted reliably at any supported key size, so the type rules stop there."""
_LOCAL_RANDOM = OpTraits(pure=False, communicates=False)


def _check_scheme(scheme: Any, key_bits: Any) -> None:
    if scheme not in SCHEMES:
        raise MPTypeError(f"unknown PHE scheme {scheme!r}; use one of {', '.join(SCHEMES)}")
    if type(key_bits) is not int or not MIN_KEY_BITS <= key_bits <= MAX_KEY_BITS:
        raise MPTypeError(f"key_bits must be an int in [{MIN_KEY_BITS}, {MAX_KEY_BITS}], "
                          f"got {key_bits!r}")


def _check_key_id(key: Any) -> None:
    if not isinstance(key, str) or not key or len(key) > 64:
        raise MPTypeError(f"a key pair id must be a non-empty string, got {key!r}")


@dataclass(frozen=True)
class _KeyHalf(BaseType):
    """One half of PHE key pair ``key`` (the subclass says which: ``_label``)."""

    _label: ClassVar[str] = ""
    scheme: str
    key_bits: int
    key: str

    def __post_init__(self) -> None:
        _check_scheme(self.scheme, self.key_bits)
        _check_key_id(self.key)

    def to_json(self, encode: TypeEncoder) -> Any:
        return [self.scheme, self.key_bits, self.key]

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> _KeyHalf:
        if not isinstance(body, list) or len(body) != 3:
            raise ValueError("expected [scheme, key_bits, key]")
        return cls(*body)

    def __str__(self) -> str:
        return f"phe.{self._label}<{self.scheme}{self.key_bits},{self.key}>"


@register_type("phe.public_key")
@dataclass(frozen=True)
class PublicKey(_KeyHalf):
    """The public half of key pair ``key``: encrypts; moves freely between parties."""

    _label = "pk"

    def wire_bytes(self) -> int:
        return WIRE_KEY_BYTES + 256


@register_type("phe.private_key")
@dataclass(frozen=True)
class PrivateKey(_KeyHalf):
    """The private half of key pair ``key``: decrypts; never leaves the party that made it."""

    _label = "sk"
    confined = True


@register_type("phe.ciphertext")
@dataclass(frozen=True)
class Ciphertext(BaseType):
    """A ``dtype`` tensor of ``shape`` encrypted elementwise under key pair ``key``, each
    element the integer ``round(v * scale)``."""

    expansion = None
    dtype: str
    shape: tuple[Dim, ...]
    key: str
    scale: int

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise MPTypeError(f"a ciphertext holds one of {', '.join(DTYPES)}, "
                              f"not {self.dtype!r}")
        shape = self.shape
        if not isinstance(shape, tuple) or not all(
                (type(d) is int and d >= 0) or is_symbolic(d) for d in shape):
            raise MPTypeError(f"a ciphertext's shape must be a tuple of sizes or symbols, got "
                              f"{shape!r}")
        _check_key_id(self.key)
        if type(self.scale) is not int or not 1 <= self.scale < (1 << MAX_SCALE_BITS):
            raise MPTypeError(f"a ciphertext's scale must be an int in [1, 2**{MAX_SCALE_BITS}),"
                              f" got {self.scale!r}")
        if self.dtype in INT_DTYPES and self.scale != 1:
            raise MPTypeError(f"an integer ciphertext has scale 1, got {self.scale}")

    def plaintext(self) -> TensorType:
        return TensorType(self.dtype, self.shape)

    def wire_bytes(self) -> int:
        """Its elements at the largest key size, with the public key it carries (a size
        known only at run time: `MAX_SYMBOLIC_CIPHERTEXTS` elements)."""
        elements = self.plaintext().elements_bound(MAX_SYMBOLIC_CIPHERTEXTS)
        return max(elements, 1) * WIRE_BYTES_PER_ELEMENT + WIRE_KEY_BYTES + 256

    def to_json(self, encode: TypeEncoder) -> Any:
        return [self.dtype, list(self.shape), self.key, str(self.scale)]

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> Ciphertext:
        if not isinstance(body, list) or len(body) != 4 or not isinstance(body[1], list) \
                or not isinstance(body[3], str) or not body[3].isdigit() or len(body[3]) > 160:
            raise ValueError("expected [dtype, shape, key, scale (decimal string)]")
        return cls(body[0], tuple(body[1]), body[2], int(body[3]))

    def __str__(self) -> str:
        dims = ",".join(map(dim_text, self.shape))
        scale = "" if self.scale == 1 else f",scale=2^{self.scale.bit_length() - 1}" \
            if self.scale & (self.scale - 1) == 0 else f",scale={self.scale}"
        return f"phe.ct<{self.dtype}[{dims}],{self.key}{scale}>"


# ---------------------------------------------------------------- primitives

MAX_BUCKET_BINS = 127
"""The most bins `bucket_sum` takes per feature (sf-heu indexes bins with int8)."""
MAX_BUCKET_GROUPS = 1 << 16
"""The most groups `bucket_sum` takes."""
_INDEX_DTYPES = ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64")
_TARGETS = ("PPU",)
_CT = of_type(Ciphertext, name="a PHE ciphertext")
_PLAIN = Constraint(f"a plaintext tensor of {', '.join(DTYPES)} or bool",
                    lambda t: isinstance(t, TensorType) and t.dtype in (*DTYPES, "bool"))
_CT_OR_PLAIN = Constraint(f"{_CT} or {_PLAIN}", lambda t: _CT.test(t) or _PLAIN.test(t))
_INDEX = Constraint("an integer tensor",
                    lambda t: isinstance(t, TensorType) and t.dtype in _INDEX_DTYPES)
_PK = of_type(PublicKey, name="a PHE public key")
_SK = of_type(PrivateKey, name="a PHE private key")
_OUT = [Result("out", _CT)]
_PLAIN_SCALE = Attr((int, NoneType), default=None, min=1,
                    doc="the plaintext's fixed-point scale (None: FLOAT_SCALE for floats, "
                        "1 for integers)")

keygen_p = Primitive(
    "phe.keygen", kind="source", execution_model="single_rank", traits=_LOCAL_RANDOM,
    operands=[],
    attrs={"scheme": Attr(str, default="paillier", choices=SCHEMES, doc="the PHE scheme"),
           "key_bits": Attr(int, default=2048, min=MIN_KEY_BITS, max=MAX_KEY_BITS,
                            doc="the modulus size in bits"),
           "key": Attr(str, required=True, doc="the key pair's id, unique in the program")},
    results=[Result("pk", _PK), Result("sk", _SK)],
    targets=_TARGETS, cost=local_cost, doc="Generate a PHE key pair on one party.")
encrypt_p = Primitive(
    "phe.encrypt", kind="compute", execution_model="single_rank", traits=_LOCAL_RANDOM,
    operands=[Operand("x", _PLAIN), Operand("pk", _PK)],
    attrs={"scale": Attr(int, required=True, min=1,
                         doc="the fixed-point scale (1 for integer tensors)")},
    results=_OUT, targets=_TARGETS, cost=local_cost,
    doc="Encrypt a tensor under a public key.")
decrypt_p = Primitive(
    "phe.decrypt", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("c", _CT), Operand("sk", _SK)],
    results=[Result("out", of_type(TensorType, name="a tensor"))],
    targets=_TARGETS, cost=local_cost,
    doc="Decrypt a ciphertext with its private key, range-checked.")
add_p = Primitive(
    "phe.add", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("a", _CT), Operand("b", _CT_OR_PLAIN)], results=_OUT,
    targets=_TARGETS, cost=local_cost, doc="Add ciphertexts, or a ciphertext and a plaintext.")
sub_p = Primitive(
    "phe.sub", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("a", _CT), Operand("b", _CT_OR_PLAIN)], results=_OUT,
    targets=_TARGETS, cost=local_cost,
    doc="Subtract a ciphertext or a plaintext from a ciphertext.")
mul_plain_p = Primitive(
    "phe.mul_plain", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("c", _CT),
              Operand("x", _CT_OR_PLAIN, doc="a plaintext (a ciphertext is refused with a hint)")],
    attrs={"scale": _PLAIN_SCALE}, results=_OUT, targets=_TARGETS, cost=local_cost,
    doc="Multiply a ciphertext by a plaintext.")
sum_p = Primitive(
    "phe.sum", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("c", _CT)],
    attrs={"axis": Attr((int, NoneType), default=None, doc="the axis (None: every element)")},
    results=_OUT, targets=_TARGETS, cost=local_cost,
    doc="Sum a ciphertext's elements, all or along an axis.")
dot_p = Primitive(
    "phe.dot", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("c", _CT), Operand("x", _PLAIN)], attrs={"scale": _PLAIN_SCALE},
    results=_OUT, targets=_TARGETS, cost=local_cost,
    doc="A ciphertext vector or matrix times a plaintext vector or matrix.")
bucket_sum_p = Primitive(
    "phe.bucket_sum", kind="compute", execution_model="single_rank", traits=LOCAL_PURE,
    operands=[Operand("c", _CT), Operand("bins", _INDEX, doc="each row's bin per feature"),
              Operand("groups", _INDEX, variadic=True,
                      doc="at most one: each row's group id (none: every row in group 0)")],
    attrs={"n_bins": Attr(int, required=True, min=1, max=MAX_BUCKET_BINS,
                          doc="the bins per feature"),
           "n_groups": Attr(int, default=1, min=1, max=MAX_BUCKET_GROUPS,
                            doc="the number of groups")},
    results=_OUT, targets=_TARGETS, cost=local_cost,
    doc="Sum a ciphertext's rows per (group, feature, bin): histograms.")


def plain_scale(t: TensorType, scale: int | None = None) -> int:
    """The scale a plaintext multiplier of type ``t`` is encoded at: ``scale`` if given,
    else `FLOAT_SCALE` for floats and 1 for integers."""
    if scale is not None:
        return scale
    return FLOAT_SCALE if t.dtype in FLOAT_DTYPES else 1


def _scaled(op: str, scale: int) -> int:
    if scale >= 1 << MAX_SCALE_BITS:
        raise MPTypeError(f"{op}: the result's fixed-point scale would reach 2^"
                          f"{scale.bit_length() - 1}, past 2^{MAX_SCALE_BITS}; decrypt and "
                          "re-encrypt (or multiply by integers) before multiplying further")
    return scale


@keygen_p.def_type_rule
def _keygen_rule(sig: Signature) -> list[ValueType]:
    try:
        return [PublicKey(sig.scheme, sig.key_bits, sig.key),
                PrivateKey(sig.scheme, sig.key_bits, sig.key)]
    except MPTypeError as e:
        raise MPTypeError(f"phe.keygen: {e}") from None


@encrypt_p.def_type_rule
def _encrypt_rule(sig: Signature) -> list[ValueType]:
    op = "phe.encrypt"
    x: TensorType = sig.x
    pk: PublicKey = sig.pk
    if x.dtype == "bool":
        raise MPTypeError(f"{op}: cast booleans to an integer dtype before encrypting")
    if x.dtype in INT_DTYPES and sig.scale != 1:
        raise MPTypeError(f"{op}: integer tensors are encrypted at scale 1, got "
                          f"scale={sig.scale}")
    try:
        return [Ciphertext(x.dtype, x.shape, pk.key, sig.scale)]
    except MPTypeError as e:
        raise MPTypeError(f"{op}: {e}") from None


@decrypt_p.def_type_rule
def _decrypt_rule(sig: Signature) -> list[ValueType]:
    c: Ciphertext = sig.c
    sk: PrivateKey = sig.sk
    if sk.key != c.key:
        raise MPTypeError(f"phe.decrypt: {c} is under key pair {c.key}, but the private key "
                          f"is of key pair {sk.key}; only the owner of {c.key}'s private key "
                          "can decrypt it")
    return [TensorType(c.dtype, c.shape)]


def _broadcast(op: str, c: Ciphertext, x: TensorType) -> None:
    if x.shape != c.shape and x.shape != ():
        raise MPTypeError(f"{op}: the plaintext's shape {list(x.shape)} must equal the "
                          f"ciphertext's {list(c.shape)} or be a scalar")


@add_p.def_type_rule
@sub_p.def_type_rule
def _additive_rule(sig: Signature) -> list[ValueType]:
    op = sig.prim.name
    a: Ciphertext = sig.a
    b: Ciphertext | TensorType = sig.b
    if isinstance(b, Ciphertext):
        if b.key != a.key:
            raise MPTypeError(f"{op}: the operands are under different key pairs ({a} and "
                              f"{b}); both must be encrypted under one public key")
        if b.scale != a.scale:
            raise MPTypeError(f"{op}: the operands have different fixed-point scales ({a} "
                              f"and {b}); multiply the one of lower scale by an integer "
                              "to match, or decrypt and re-encrypt")
        if b.dtype != a.dtype or b.shape != a.shape:
            raise MPTypeError(f"{op}: the operands must have one dtype and shape, got {a} "
                              f"and {b}")
        return [a]
    _broadcast(op, a, b)
    if a.dtype in INT_DTYPES and b.dtype in FLOAT_DTYPES:
        raise MPTypeError(f"{op}: cannot add float {b} to integer ciphertext {a}; encrypt "
                          "a float tensor instead")
    return [a]


@mul_plain_p.def_type_rule
def _mul_plain_rule(sig: Signature) -> list[ValueType]:
    op = "phe.mul_plain"
    c: Ciphertext = sig.c
    x: Ciphertext | TensorType = sig.x
    if isinstance(x, Ciphertext):
        raise MPTypeError(f"{op}: cannot multiply two ciphertexts (additive homomorphic "
                          "encryption multiplies by plaintexts only); multiply on a secret-sharing "
                          "device instead")
    _broadcast(op, c, x)
    return [_product(op, c, x, c.shape, sig.scale)]


def _product(op: str, c: Ciphertext, x: TensorType, shape: tuple[Dim, ...],
             scale: int | None) -> Ciphertext:
    factor = plain_scale(x, scale)
    dtype = c.dtype if c.dtype in FLOAT_DTYPES or factor == 1 else "float64"
    try:
        return Ciphertext(dtype, shape, c.key, _scaled(op, c.scale * factor))
    except MPTypeError as e:
        raise MPTypeError(f"{op}: {e}") from None


@sum_p.def_type_rule
def _sum_rule(sig: Signature) -> list[ValueType]:
    op = "phe.sum"
    c: Ciphertext = sig.c
    axis: int | None = sig.axis
    if axis is None:
        return [Ciphertext(c.dtype, (), c.key, c.scale)]
    if len(c.shape) > 2:
        raise MPTypeError(f"{op}: sums along an axis take ciphertexts of at most 2 dimensions "
                          f"(got {c}); sum(c) adds every element")
    if not -len(c.shape) <= axis < len(c.shape):
        raise MPTypeError(f"{op}: axis {axis!r} is out of range for {c}")
    axis %= len(c.shape)
    shape = tuple(d for i, d in enumerate(c.shape) if i != axis)
    return [Ciphertext(c.dtype, shape, c.key, c.scale)]


@dot_p.def_type_rule
def _dot_rule(sig: Signature) -> list[ValueType]:
    op = "phe.dot"
    c: Ciphertext = sig.c
    x: TensorType = sig.x
    if len(c.shape) not in (1, 2) or len(x.shape) not in (1, 2):
        raise MPTypeError(f"{op}: takes a ciphertext vector or matrix and a plaintext vector "
                          f"or matrix, got {c} and {x}")
    if c.shape[-1] != x.shape[0]:
        raise MPTypeError(f"{op}: inner dimensions differ: {c} and {x}")
    shape = c.shape[:-1] + x.shape[1:]
    return [_product(op, c, x, shape, sig.scale)]


@bucket_sum_p.def_type_rule
def _bucket_sum_rule(sig: Signature) -> list[ValueType]:
    op = "phe.bucket_sum"
    c: Ciphertext = sig.c
    bins: TensorType = sig.bins
    groups: list[TensorType] = sig.groups
    if len(groups) > 1:
        raise MPTypeError(f"{op}: takes at most one group-id vector, got {len(groups)}")
    if len(c.shape) not in (1, 2):
        raise MPTypeError(f"{op}: sums the rows of a ciphertext vector (n) or matrix (n, k), "
                          f"got {c}")
    n = c.shape[0]
    if len(bins.shape) != 2 or bins.shape[0] != n or not isinstance(bins.shape[1], int) \
            or bins.shape[1] < 1:
        raise MPTypeError(f"{op}: the bins must be an integer matrix of shape [{n}, features] "
                          f"(row i: the bin of each feature of row i of the ciphertext), got "
                          f"{bins}")
    if groups and groups[0].shape != (n,):
        raise MPTypeError(f"{op}: the group ids must be an integer vector of shape [{n}] "
                          f"(-1: in no group), got {groups[0]}")
    shape = (sig.n_groups, bins.shape[1], sig.n_bins, *c.shape[1:])
    return [Ciphertext(c.dtype, shape, c.key, c.scale)]


# ---------------------------------------------------------------- flow rules
# A ciphertext carries its plaintext's label, sealed (holding it reveals nothing); its
# rows combine as in a tensor program; decrypting is a flow to the key's maker.

keygen_p.def_local_flow(keygen_flow)
encrypt_p.def_local_flow(encrypt_flow)
decrypt_p.def_local_flow(decrypt_flow)
add_p.def_local_flow(additive_flow)
sub_p.def_local_flow(additive_flow)
mul_plain_p.def_local_flow(mul_plain_flow)
sum_p.def_local_flow(sum_flow)
dot_p.def_local_flow(dot_flow)
bucket_sum_p.def_local_flow(bucket_sum_flow)


# ---------------------------------------------------------------- the frontend


def _operand(x: Any) -> MPObject:
    return x if isinstance(x, MPObject) else constant(np.asarray(x))


@feop(keygen_p, example='pk, sk = phe.keygen(scheme="paillier", key_bits=2048)')
@function
def keygen(*, scheme: str = "paillier", key_bits: int = 2048) -> tuple[MPObject, MPObject]:
    """A new key pair ``(public_key, private_key)`` of ``scheme`` with a ``key_bits``-bit
    modulus, made by the one party running this body."""
    tracer = current_tracer("phe.keygen")
    if not tracer.local:
        raise MPTypeError("phe.keygen is a party-local op; run it inside "
                          "simp.pcall((owner,), lambda: phe.keygen())")
    if tracer.parties is not None and len(tracer.parties) != 1:
        raise MPTypeError(f"phe.keygen: a key pair belongs to one party, but this body runs "
                          f"on parties {tracer.parties}; run it in a pcall on one party")
    attrs = {"scheme": scheme, "key_bits": key_bits, "key": tracer.fresh_id("k")}
    pk, sk = keygen_p.bind([], attrs)
    return pk, sk


@feop(encrypt_p, example="c = phe.encrypt(x, pk)")
@function
def encrypt(x: Any, pk: MPObject, *, scale: int | None = None) -> MPObject:
    """``x`` encrypted elementwise under ``pk``; floats at fixed-point ``scale``
    (default `FLOAT_SCALE`), integers at scale 1."""
    x = _operand(x)
    if scale is None:
        scale = FLOAT_SCALE if isinstance(x.base_type, TensorType) and \
            x.base_type.dtype in FLOAT_DTYPES else 1
    return encrypt_p.bind([x, pk], {"scale": scale})[0]


@feop(decrypt_p, example="y = phe.decrypt(c, sk)")
@function
def decrypt(c: MPObject, sk: MPObject) -> MPObject:
    """The plaintext of ``c`` (its dtype and shape); every value is checked to fit the
    dtype, and one that does not (an overflow) is an error naming this op."""
    return decrypt_p.bind([c, sk])[0]


@feop(add_p, example="d = phe.add(a, b)")
@function
def add(a: Any, b: Any) -> MPObject:
    """``a + b``: two ciphertexts under one key and scale, or a ciphertext and a plaintext
    (of its shape or a scalar), in either order."""
    if not isinstance(a, MPObject) or not isinstance(a.base_type, Ciphertext):
        a, b = b, a
    a, b = _aligned(a, _operand(b))
    return add_p.bind([a, b])[0]


@feop(sub_p, add_p, mul_plain_p, example="d = phe.sub(a, b)")
@function
def sub(a: Any, b: Any) -> MPObject:
    """``a - b`` for a ciphertext ``a`` and a ciphertext or plaintext ``b``; a plaintext
    minus a ciphertext is ``mul_plain(b, -1) + a``."""
    if not isinstance(a, MPObject) or not isinstance(a.base_type, Ciphertext):
        return add(mul_plain(b, np.int64(-1)), a)  # a plaintext minus a ciphertext
    a, b = _aligned(a, _operand(b))
    return sub_p.bind([a, b])[0]


def _aligned(a: MPObject, b: MPObject) -> tuple[MPObject, MPObject]:
    """``a`` and ``b`` at one scale when both are ciphertexts and the larger scale is a
    multiple of the smaller: the other is multiplied by 1.0 encoded at their ratio."""
    ta, tb = a.base_type, b.base_type
    if not (isinstance(ta, Ciphertext) and isinstance(tb, Ciphertext)) or ta.scale == tb.scale:
        return a, b
    low, high = (a, b) if ta.scale < tb.scale else (b, a)
    ratio, rest = divmod(max(ta.scale, tb.scale), min(ta.scale, tb.scale))
    if rest:
        return a, b
    low = mul_plain(low, np.float64(1.0), scale=ratio)
    return (low, high) if ta.scale < tb.scale else (high, low)


@feop(mul_plain_p, example="d = phe.mul_plain(c, x)")
@function
def mul_plain(c: Any, x: Any, *, scale: int | None = None) -> MPObject:
    """``c * x`` elementwise for ciphertext ``c`` and plaintext ``x`` (its shape or a
    scalar). ``x`` is encoded at ``scale`` (default: `FLOAT_SCALE` for floats, 1 for
    integers), and the result's scale is ``c``'s times that."""
    if not isinstance(c, MPObject) or not isinstance(c.base_type, Ciphertext):
        c, x = x, c
    return mul_plain_p.bind([_operand(c), _operand(x)], {"scale": scale})[0]


@feop(sum_p, example="s = phe.sum(c, axis=0)")
@function
def sum(c: MPObject, axis: int | None = None) -> MPObject:
    """The sum of ``c``'s elements (``axis=None``), or along ``axis`` of a vector or
    matrix."""
    return sum_p.bind([c], {"axis": axis})[0]


@feop(dot_p, example="g = phe.dot(c, x)")
@function
def dot(c: MPObject, x: Any, *, scale: int | None = None) -> MPObject:
    """Ciphertext vector or matrix ``c`` times plaintext vector or matrix ``x``
    (``c @ x``); ``x`` is encoded at ``scale`` as in `mul_plain`."""
    return dot_p.bind([c, _operand(x)], {"scale": scale})[0]


@feop(bucket_sum_p, example="h = phe.bucket_sum(c, bins, groups, n_groups=4, n_bins=32)")
@function
def bucket_sum(c: MPObject, bins: Any, groups: Any = None, *, n_groups: int = 1,
               n_bins: int) -> MPObject:
    """Histograms of ciphertext ``c``'s rows: ``out[g, f, b] = sum of c[i] over the rows i
    with groups[i] == g and bins[i, f] == b``.

    ``c`` is a vector (n) or a matrix (n, k) (one column per summed quantity);
    ``bins`` an integer matrix (n, features) of bin indices in ``[0, n_bins)``;
    ``groups`` an integer vector (n) of group ids in ``[-1, n_groups)`` (-1: the row
    is in no group; None: every row is in group 0). The result has shape
    ``(n_groups, features, n_bins)`` plus ``c``'s columns, with ``c``'s dtype, key and
    scale. Each row is added once per feature; an empty bucket decrypts to 0. The sums
    are products of ``c``'s ciphertexts, not re-randomized: add a fresh encryption of 0
    before sending them to the key owner if it must not relate them to its own
    encryptions.
    """
    inputs = [_operand(c), _operand(bins)] + ([] if groups is None else [_operand(groups)])
    return bucket_sum_p.bind(inputs, {"n_groups": n_groups, "n_bins": n_bins})[0]


# ---------------------------------------------------------------- numpy habits

NUMPY_HABITS = ("a PHE ciphertext takes c + d, c - d, c * x, c / x, -c, c @ x and x @ c (x a "
        "plaintext; c @ x is phe.dot), c.sum() and c.sum(axis=k) (phe.sum)")


def _is_ct(x: Any) -> bool:
    return isinstance(x, MPObject) and isinstance(x.base_type, Ciphertext)


def _matmul(a: Any, b: Any) -> MPObject:
    """``a @ b`` with one ciphertext: ``c @ x`` is `dot`; ``x @ c`` for a ciphertext vector
    ``c`` is ``dot(c, x.T)``."""
    if _is_ct(a) and _is_ct(b):
        raise MPTypeError(f"c @ d: two ciphertexts do not multiply under additive "
                          f"encryption; {NUMPY_HABITS}")
    if _is_ct(a):
        return dot(a, b)
    if len(b.base_type.shape) != 1:
        raise MPTypeError(f"x @ c: the ciphertext {b.base_type} is not a vector; phe.dot takes "
                          "the ciphertext on the left: encrypt the transpose cT and compute "
                          "(cT @ x.T), i.e. phe.dot(cT, x.T)")
    if not isinstance(a, MPObject):
        return dot(b, np.asarray(a).T)
    return dot(b, a if len(a.shape) < 2 else run_jax(jnp.transpose, a))


def _divide(c: Any, x: Any) -> MPObject:
    """``c / x``: ``c`` times the reciprocal of plaintext ``x``."""
    if _is_ct(x):
        raise MPTypeError(f"/: nothing divides by a ciphertext under additive encryption; "
                          f"{NUMPY_HABITS}")
    if isinstance(x, MPObject):
        return mul_plain(c, run_jax(_reciprocal, x))
    return mul_plain(c, 1.0 / np.asarray(x, np.float64))


def _reciprocal(x: Any) -> Any:
    return 1.0 / x


def _refuse(symbol: str) -> Callable[..., MPObject]:
    def refused(*operands: Any) -> MPObject:
        raise MPTypeError(f"{symbol} is not computable on a PHE ciphertext: {NUMPY_HABITS}; "
                          "decrypt first (mp.put to the key owner's PPU) or compute on a "
                          "secure device")

    return refused


def _sum_method(c: MPObject, axis: int | None = None, out: None = None) -> MPObject:
    """``c.sum(axis)``, also what ``np.sum(c, axis)`` calls (with ``out=None``)."""
    if out is not None:
        raise MPTypeError("c.sum: a ciphertext's sum is a new value; out= is not taken")
    return sum(c, axis)


@register_type_attributes(Ciphertext)
def _attribute(c: MPObject, name: str) -> Any:
    if name == "sum":
        return functools.partial(_sum_method, c)
    if name in ("shape", "dtype"):
        return getattr(c.base_type, name)
    if name.startswith("__"):
        raise AttributeError(name)
    raise MPTypeError(f"c.{name}: a PHE ciphertext has no attribute {name!r}; {NUMPY_HABITS}")


def _negative(c: MPObject) -> MPObject:
    return mul_plain(c, np.int64(-1))


_OPERATORS: dict[str, Callable[..., MPObject]] = {
    "add": add, "subtract": sub, "multiply": mul_plain, "matmul": _matmul, "divide": _divide,
    "negative": _negative}
for _name, _impl in _OPERATORS.items():
    register_type_operator(_name, Ciphertext)(_impl)
for _name, _symbol in {"floor_divide": "//", "remainder": "%", "power": "**", "less": "<",
                       "less_equal": "<=", "greater": ">", "greater_equal": ">=",
                       "equal": "==", "not_equal": "!=", "getitem": "c[...]"}.items():
    register_type_operator(_name, Ciphertext)(_refuse(_symbol))

__all__ = [
    "FLOAT_SCALE",
    "SCHEMES",
    "Ciphertext",
    "PrivateKey",
    "PublicKey",
    "add",
    "bucket_sum",
    "decrypt",
    "dot",
    "encrypt",
    "keygen",
    "mul_plain",
    "sub",
    "sum",
]
