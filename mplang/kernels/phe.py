"""Kernels and wire codecs of the ``phe`` dialect, on sf-heu (``heu``).

Runtime values: `PhePublicKey` (the serialized public key and its fingerprint),
`PhePrivateKey` (sf-heu's key kit; it has no wire form: key material never
leaves its party) and `PheCiphertext` (a 2-D sf-heu ciphertext array and the
public key it is under). sf-heu's arrays have at most two dimensions: a tensor
of shape ``s`` is stored as `storage_shape` ``(rows, cols)``, and sums along an
axis are products with a ones-vector.

Kernels check key fingerprints at run time too (ciphertexts under different
keys, a private key of another pair). ``phe.decrypt`` decodes to integers of
any size and refuses values that do not fit the dtype (`decrypt_in_range`).
"""

from __future__ import annotations

import hashlib
import math
import struct
import threading
from fractions import Fraction
from typing import Any

import numpy as np

from mplang.dialects.phe import (
    FLOAT_DTYPES,
    MAX_KEY_BITS,
    WIRE_KEY_BYTES,
    Ciphertext,
    PrivateKey,
    PublicKey,
    add_p,
    bucket_sum_p,
    decrypt_p,
    dot_p,
    encrypt_p,
    keygen_p,
    mul_plain_p,
    plain_scale,
    sub_p,
    sum_p,
)
from mplang.dialects.symbolic import shape_of_elements
from mplang.edsl.errors import MPPublicError, MPRuntimeError, MPSerializationError
from mplang.edsl.primitive import Primitive
from mplang.edsl.typing import TensorType
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Call
from mplang.transport.wire import ValueCodec, register_value_codec

INSTALL_HINT = ("PHE needs the sf-heu package: pip install 'mplang[phe]' (sf-heu ships "
                "wheels for CPython 3.10 and 3.11 on Linux and macOS)")
_HEU_SCHEMES = {"paillier": "ZPaillier", "ou": "OU"}
_FAST_LIMIT = 1 << 62
"""Plaintexts below this magnitude are encoded from int64 arrays; larger ones as
Python integers."""


def heu() -> tuple[Any, Any]:
    """sf-heu's ``(heu.phe, heu.numpy)`` modules, or an error saying how to install them."""
    try:
        from heu import numpy as hnp
        from heu import phe
    except ImportError:
        raise MPPublicError(INSTALL_HINT) from None
    return phe, hnp


def storage_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    """The 2-D shape sf-heu stores a tensor of ``shape`` in: ``()`` as ``(1, 1)``, ``(n,)``
    as ``(1, n)``, a matrix as itself, more dimensions as ``(prod(shape[:-1]), shape[-1])``."""
    if len(shape) == 0:
        return 1, 1
    if len(shape) == 1:
        return 1, shape[0]
    return math.prod(shape[:-1]), shape[-1]


# ---------------------------------------------------------------- runtime values


class PhePublicKey:
    """A PHE public key: ``scheme``, modulus size and serialized key, with its fingerprint
    (the first 16 bytes of the SHA-256 of the serialized key)."""

    __slots__ = ("_kit", "fingerprint", "key_bits", "raw", "scheme")

    def __init__(self, scheme: str, key_bits: int, raw: bytes, kit: Any = None):
        self.scheme, self.key_bits, self.raw = scheme, key_bits, raw
        self.fingerprint = hashlib.sha256(raw).digest()[:16]
        self._kit = kit

    @property
    def kit(self) -> Any:
        """sf-heu's encrypting and evaluating kit for this key (made on first use)."""
        if self._kit is None:
            self._kit = _destination_kit(self.raw)
        return self._kit

    def __repr__(self) -> str:
        return f"PhePublicKey({self.scheme}{self.key_bits}, {self.fingerprint.hex()[:12]})"


class PhePrivateKey:
    """A PHE key pair's private half (sf-heu's full kit). It has no wire form."""

    __slots__ = ("kit", "public")

    def __init__(self, kit: Any, public: PhePublicKey):
        self.kit, self.public = kit, public

    def __repr__(self) -> str:
        return f"PhePrivateKey(of {self.public.fingerprint.hex()[:12]})"


class PheCiphertext:
    """An sf-heu ciphertext array (2-D storage) under public key ``public``."""

    __slots__ = ("array", "public")

    def __init__(self, array: Any, public: PhePublicKey):
        self.array, self.public = array, public

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.array.shape)

    def __repr__(self) -> str:
        return f"PheCiphertext({list(self.shape)}, key {self.public.fingerprint.hex()[:12]})"


_KITS: dict[bytes, Any] = {}
_KITS_LOCK = threading.Lock()
_MAX_KITS = 64


def _destination_kit(raw: bytes) -> Any:
    """sf-heu's kit for the serialized public key ``raw`` (one per key per process)."""
    with _KITS_LOCK:
        kit = _KITS.get(raw)
    if kit is None:
        phe, hnp = heu()
        kit = hnp.setup(phe.PublicKey.load_from(raw))
        with _KITS_LOCK:
            if len(_KITS) >= _MAX_KITS:
                _KITS.pop(next(iter(_KITS)))
            _KITS[raw] = kit
    return kit


# ---------------------------------------------------------------- encoding


def _integers(what: str, x: np.ndarray, scale: int) -> tuple[np.ndarray, bool]:
    """``round(x * scale)`` as int64 (fast) or Python integers (object array); ``True`` when
    int64."""
    if x.dtype == np.bool_:
        x = x.astype(np.int64)
    if x.dtype.kind in "iu":
        peak = int(np.abs(x.astype(np.int64)).max()) if x.size else 0
        if peak * scale < _FAST_LIMIT:
            return x.astype(np.int64) * np.int64(scale), True
        flat = [int(v) * scale for v in x.reshape(-1).tolist()]
        return np.array(flat, dtype=object).reshape(x.shape), False
    xf = x.astype(np.float64)
    if x.size and not np.isfinite(xf).all():
        raise ValueError(f"{what}: cannot encode NaN or infinity")
    scaled = np.rint(xf * float(scale))
    if not x.size or float(np.abs(scaled).max()) < _FAST_LIMIT:
        return scaled.astype(np.int64), True
    flat = [round(Fraction(v) * scale) for v in xf.reshape(-1).tolist()]
    return np.array(flat, dtype=object).reshape(x.shape), False


def encode(kit: Any, what: str, x: Any, shape: tuple[int, ...], scale: int) -> Any:
    """Plaintext ``x`` (broadcast to ``shape``) at fixed-point ``scale`` as an sf-heu
    plaintext array in the storage shape of ``shape``."""
    arr = np.broadcast_to(np.asarray(x), shape).reshape(storage_shape(shape))
    ints, fast = _integers(what, arr, scale)
    encoder = kit.integer_encoder(scale=1) if fast else kit.bigint_encoder()
    return kit.array(np.ascontiguousarray(ints) if fast else ints, encoder)


def logical_shape(t: Ciphertext | TensorType, storage: tuple[int, int]) -> tuple[int, ...]:
    """The shape of a value of type ``t`` stored as an sf-heu array of ``storage``: its
    type's, with a size known only at run time solved from the stored elements."""
    shape = shape_of_elements(t.plaintext(), storage[0] * storage[1])
    if shape is None or storage_shape(shape) != storage:
        raise ValueError(f"a ciphertext stored as {list(storage)} cannot be a {t}")
    return shape


def sized(t: Ciphertext | TensorType, x: Any) -> tuple[int, ...]:
    """The shape plaintext ``x`` gives type ``t``: ``x``'s, if it has ``t``'s static sizes
    (a size known only at run time takes ``x``'s)."""
    shape = np.shape(x)
    if not t.plaintext().admits(shape):
        raise ValueError(f"a value of shape {list(shape)} cannot be a {t}")
    return tuple(shape)


def decrypt_in_range(private: PhePrivateKey, c: PheCiphertext, t: Ciphertext) -> np.ndarray:
    """The plaintext of ``c`` (type ``t``) as a ``t.dtype`` array of ``t.shape``. Every value
    is decoded as an integer of any size, divided by ``t.scale`` and checked against the
    dtype's range: a value that does not fit (an overflow in the computation) raises
    ValueError, never wraps."""
    plain = private.kit.decryptor().decrypt(c.array).to_numpy(private.kit.bigint_encoder())
    values = np.asarray(plain, dtype=object).reshape(-1)
    dtype = np.dtype(t.dtype)
    if t.dtype in FLOAT_DTYPES:
        try:
            out = values.astype(np.float64) / float(t.scale) if values.size \
                else np.zeros(0, np.float64)
        except OverflowError:
            out = np.array([np.inf])
        limit = float(np.finfo(dtype).max)
        if out.size and not (np.abs(out) <= limit).all():
            worst = max(values.tolist(), key=abs)
            raise ValueError(f"a decrypted value (about 2^{abs(worst).bit_length()} / scale "
                             f"2^{t.scale.bit_length() - 1}) does not fit {t.dtype}: the "
                             "computation overflowed the plaintext space or the dtype")
        return out.astype(dtype).reshape(logical_shape(t, c.shape))
    info = np.iinfo(dtype)
    if values.size:
        low, high = min(values.tolist()), max(values.tolist())
        if low < info.min or high > info.max:
            worst = high if high > info.max else low
            raise ValueError(f"a decrypted value ({_magnitude(worst)}) does not fit {t.dtype} "
                             f"[{info.min}, {info.max}]: the computation overflowed; encrypt "
                             "a wider dtype (int64) or reduce the values")
    return values.astype(dtype).reshape(logical_shape(t, c.shape))


def _magnitude(v: int) -> str:
    return str(v) if abs(v) < 10**24 else f"{'-' if v < 0 else ''}about 2^{abs(v).bit_length()}"


# ---------------------------------------------------------------- kernels

backend = register_backend("phe")


def _wrong(call: Call, message: str) -> MPRuntimeError:
    """A wrong operand kind or key: the message names types and key fingerprints only."""
    return call.error(message, MPPublicError)


def _ciphertext(call: Call, value: Any, what: str) -> PheCiphertext:
    if not isinstance(value, PheCiphertext):
        raise _wrong(call, f"{what} is {type(value).__name__}, not a PHE ciphertext")
    return value


def _same_key(call: Call, a: PheCiphertext, b: PheCiphertext) -> None:
    if a.public.fingerprint != b.public.fingerprint:
        raise _wrong(call, f"the operands are under different keys ({a!r} and {b!r})")


def _encoded(call: Call, kit: Any, x: Any, shape: tuple[int, ...], scale: int) -> Any:
    """``encode``, its refusal an error of this op."""
    try:
        return encode(kit, call.op.opcode, x, shape, scale)
    except ValueError as e:
        raise call.error(str(e)) from None


@backend.kernel(keygen_p)
def _keygen(call: Call, *, scheme: str, key_bits: int) -> list[Any]:
    phe, hnp = heu()
    kit = hnp.setup(getattr(phe.SchemaType, _HEU_SCHEMES[scheme]), key_bits)
    public = PhePublicKey(scheme, key_bits, kit.public_key().serialize(), kit)
    return [public, PhePrivateKey(kit, public)]


@backend.kernel(encrypt_p)
def _encrypt(call: Call, x: Any, public: Any) -> list[Any]:
    want, t = call.in_type(1), call.out_type()
    assert isinstance(want, PublicKey) and isinstance(t, Ciphertext)
    if not isinstance(public, PhePublicKey) or (public.scheme, public.key_bits) != \
            (want.scheme, want.key_bits):
        raise _wrong(call, f"the key is {public!r}, not a {want}")
    plain = _encoded(call, public.kit, x, sized(t, x), t.scale)
    return [PheCiphertext(public.kit.encryptor().encrypt(plain), public)]


@backend.kernel(decrypt_p)
def _decrypt(call: Call, value: Any, private: Any) -> list[Any]:
    c = _ciphertext(call, value, "the value")
    if not isinstance(private, PhePrivateKey):
        raise _wrong(call, f"the key is {type(private).__name__}, not a PHE private key")
    if private.public.fingerprint != c.public.fingerprint:
        raise _wrong(call, f"{c!r} is not under this private key's pair "
                           f"({private!r}): decrypting it would give garbage")
    t = call.in_type(0)
    assert isinstance(t, Ciphertext)
    try:
        return [decrypt_in_range(private, c, t)]
    except ValueError as e:
        raise call.error(str(e)) from None


def _additive(prim: Primitive) -> None:
    """Register the kernel of ``phe.add`` or ``phe.sub`` (they differ in the evaluator call)."""
    @backend.kernel(prim)
    def run(call: Call, first: Any, second: Any) -> list[Any]:
        a = _ciphertext(call, first, "the first operand")
        t = call.in_type(0)
        assert isinstance(t, Ciphertext)
        evaluator = a.public.kit.evaluator()
        combine = evaluator.add if prim is add_p else evaluator.sub
        if isinstance(call.in_type(1), Ciphertext):
            b = _ciphertext(call, second, "the second operand")
            _same_key(call, a, b)
            return [PheCiphertext(combine(a.array, b.array), a.public)]
        plain = _encoded(call, a.public.kit, second, logical_shape(t, a.shape), t.scale)
        return [PheCiphertext(combine(a.array, plain), a.public)]


_additive(add_p)
_additive(sub_p)


@backend.kernel(mul_plain_p)
def _mul_plain(call: Call, value: Any, x: Any, *, scale: int) -> list[Any]:
    c = _ciphertext(call, value, "the ciphertext")
    plain = _encoded(call, c.public.kit, x, logical_shape(call.in_type(0), c.shape),
                     plain_scale(call.in_type(1), scale))
    return [PheCiphertext(c.public.kit.evaluator().mul(c.array, plain), c.public)]


def _ones(kit: Any, shape: tuple[int, int]) -> Any:
    return kit.array(np.ones(shape, dtype=np.int64), kit.integer_encoder(scale=1))


@backend.kernel(sum_p)
def _sum(call: Call, value: Any, *, axis: int | None) -> list[Any]:
    c = _ciphertext(call, value, "the value")
    t = call.in_type(0)
    assert isinstance(t, Ciphertext)
    kit = c.public.kit
    evaluator = kit.evaluator()
    rows, cols = c.shape
    if axis is None or len(t.shape) <= 1:
        if rows * cols == 0:
            zero = encode(kit, "phe.sum", 0, (), 1)
            return [PheCiphertext(kit.encryptor().encrypt(zero), c.public)]
        box = c.array[0:1, 0:1]
        box[0, 0] = evaluator.sum(c.array)
        return [PheCiphertext(box, c.public)]
    if axis % 2 == 0:  # (1, rows) @ (rows, cols): a row of column sums
        return [PheCiphertext(evaluator.matmul(_ones(kit, (1, rows)), c.array), c.public)]
    column = evaluator.matmul(c.array, _ones(kit, (cols, 1)))  # (rows, 1)
    return [PheCiphertext(column.transpose(), c.public)]


@backend.kernel(dot_p)
def _dot(call: Call, value: Any, x: Any, *, scale: int) -> list[Any]:
    c = _ciphertext(call, value, "the ciphertext")
    x = np.asarray(x)
    matrix = x.reshape(x.shape[0], -1) if x.ndim == 2 else x.reshape(-1, 1)
    plain = _encoded(call, c.public.kit, matrix, matrix.shape,
                     plain_scale(call.in_type(1), scale))
    product = c.public.kit.evaluator().matmul(c.array, plain)  # (rows, cols of x)
    if len(call.in_type(0).shape) == 2 and x.ndim == 1:  # (m, 1) -> stored as a row
        product = product.transpose()
    return [PheCiphertext(product, c.public)]


def _index_array(call: Call, value: Any, what: str, low: int, high: int) -> np.ndarray:
    """``value`` as an array, after checking every entry lies in ``[low, high)``."""
    arr = np.asarray(value)
    if arr.size and (int(arr.min()) < low or int(arr.max()) >= high):
        bad = arr[(arr < low) | (arr >= high)].reshape(-1)[0]
        raise call.error(f"{what} must lie in [{low}, {high}), found {int(bad)}")
    return arr


@backend.kernel(bucket_sum_p)
def _bucket_sum(call: Call, value: Any, bin_index: Any, *group_ids: Any, n_bins: int,
                n_groups: int) -> list[Any]:
    c = _ciphertext(call, value, "the value")
    t, out_t = call.in_type(0), call.out_type()
    assert isinstance(t, Ciphertext) and isinstance(out_t, Ciphertext)
    bins = _index_array(call, bin_index, "every bin index", 0, n_bins)
    n, features = bins.shape
    groups = np.zeros(n, np.int64) if not group_ids else \
        _index_array(call, group_ids[0], "every group id", -1, n_groups)
    kit = c.public.kit
    rows, cols = storage_shape(out_t.plaintext().static_shape("phe.bucket_sum"))
    if n == 0:  # no rows: every bucket is an encryption of 0
        zero = encode(kit, "phe.bucket_sum", 0, (rows, cols), out_t.scale)
        return [PheCiphertext(kit.encryptor().encrypt(zero), c.public)]
    x = c.array if len(t.shape) == 2 else c.array.transpose()  # (n, k): one row per element
    masks = [np.ascontiguousarray((groups == g).astype(np.int8).reshape(1, n))
             for g in range(n_groups)]
    order = np.ascontiguousarray(bins, dtype=np.int8)
    parts = kit.evaluator().batch_feature_wise_bucket_sum(x, masks, order, n_bins, False)
    block = features * n_bins  # each part: (features * n_bins, k), feature-major
    if len(t.shape) == 2:
        if n_groups == 1:
            return [PheCiphertext(parts[0], c.public)]
        out = parts[0][[0] * rows, :]
        for g, part in enumerate(parts):
            out[g * block:(g + 1) * block, :] = part
        return [PheCiphertext(out, c.public)]
    out = parts[0][[0] * rows, [0] * cols]  # a vector's histograms: (groups * features, bins)
    for g, part in enumerate(parts):
        for f in range(features):
            out[g * features + f, :] = part[list(range(f * n_bins, (f + 1) * n_bins)), 0]
    return [PheCiphertext(out, c.public)]


# ---------------------------------------------------------------- wire codecs

_KEY_HEAD = struct.Struct("<4s16sI")
_CT_HEAD = struct.Struct("<4sII")
_MAX_RAW_KEY = WIRE_KEY_BYTES
_SCHEME_CODES = {"paillier": b"PHEP", "ou": b"PHEO"}
_CODE_SCHEMES = {v: k for k, v in _SCHEME_CODES.items()}


def _encode_public(pk: PhePublicKey) -> list[bytes]:
    return [_KEY_HEAD.pack(_SCHEME_CODES[pk.scheme], pk.fingerprint, pk.key_bits), pk.raw]


def _decode_public(head: memoryview, raw: memoryview) -> PhePublicKey:
    if head.nbytes != _KEY_HEAD.size:
        raise ValueError(f"phe public key: header of {head.nbytes} bytes, expected "
                                   f"{_KEY_HEAD.size}")
    code, fingerprint, key_bits = _KEY_HEAD.unpack(head)
    scheme = _CODE_SCHEMES.get(code)
    if scheme is None:
        raise ValueError(f"phe public key: unknown scheme code {code!r}")
    if not 0 < raw.nbytes <= _MAX_RAW_KEY or key_bits > MAX_KEY_BITS:
        raise ValueError(f"phe public key: {raw.nbytes} bytes for a {key_bits}-bit "
                                   "key is out of range")
    pk = PhePublicKey(scheme, key_bits, bytes(raw))
    if pk.fingerprint != fingerprint:
        raise ValueError("phe public key: the fingerprint does not match the key")
    try:
        kit = pk.kit
        bound = int(str(kit.public_key().plaintext_bound()))
    except MPRuntimeError:
        raise
    except Exception as e:  # sf-heu's parser raises its own errors on malformed bytes
        raise ValueError(f"phe public key: sf-heu cannot read it: {e}") from None
    if bound.bit_length() > key_bits:
        raise ValueError(f"phe public key: a {bound.bit_length()}-bit plaintext "
                                   f"space does not belong to a {key_bits}-bit key")
    return pk


def _decode_public_chunks(chunks: list[memoryview]) -> PhePublicKey:
    if len(chunks) != 2:
        raise ValueError(f"phe public key: expected 2 chunks, got {len(chunks)}")
    return _decode_public(*chunks)


def _encode_ciphertext(c: PheCiphertext) -> list[bytes]:
    _, hnp = heu()
    rows, cols = c.shape
    return [*_encode_public(c.public), _CT_HEAD.pack(b"PHEC", rows, cols),
            c.array.serialize(hnp.MatrixSerializeFormat.Best)]


def _decode_ciphertext(chunks: list[memoryview]) -> PheCiphertext:
    """A ciphertext from a peer: its public key is validated, its shape checked against
    the header; sf-heu parses the array (no pickle). Raises ValueError if malformed."""
    if len(chunks) != 4:
        raise ValueError(f"phe ciphertext: expected 4 chunks, got {len(chunks)}")
    public = _decode_public(chunks[0], chunks[1])
    head, body = chunks[2], chunks[3]
    if head.nbytes != _CT_HEAD.size:
        raise ValueError("phe ciphertext: bad array header")
    magic, rows, cols = _CT_HEAD.unpack(head)
    if magic != b"PHEC":
        raise ValueError(f"phe ciphertext: bad magic {magic!r}")
    per_element = 2 * public.key_bits // 8
    if rows * cols * per_element > 4 * body.nbytes + 64:
        raise ValueError(f"phe ciphertext: {body.nbytes} bytes cannot hold "
                                   f"{rows}x{cols} ciphertexts")
    _, hnp = heu()
    try:
        array = hnp.CiphertextArray.load_from(bytes(body), hnp.MatrixSerializeFormat.Best)
    except Exception as e:
        raise ValueError(f"phe ciphertext: sf-heu cannot read the array: {e}") \
            from None
    if tuple(array.shape) != (rows, cols):
        raise ValueError(f"phe ciphertext: the array is {list(array.shape)}, the "
                                   f"header says [{rows}, {cols}]")
    return PheCiphertext(array, public)


def _refuse_private(value: PhePrivateKey) -> list[bytes]:
    raise MPSerializationError("a PHE private key is key material: it never leaves the party "
                               "that made it")


def _refuse_private_decode(chunks: list[memoryview]) -> PhePrivateKey:
    raise ValueError("a PHE private key never crosses the wire")


register_value_codec(ValueCodec(PublicKey, PhePublicKey, _encode_public,
                                _decode_public_chunks,
                                nbytes=lambda pk: _KEY_HEAD.size + len(pk.raw)))
register_value_codec(ValueCodec(Ciphertext, PheCiphertext, _encode_ciphertext,
                                _decode_ciphertext, privacy="ciphertext"))
register_value_codec(ValueCodec(PrivateKey, PhePrivateKey, _refuse_private,
                                _refuse_private_decode, privacy="key material"))
