"""Kernels of the `crypto` dialect, on the ``cryptography`` package (OpenSSL).

The primitives are small pure functions of bytes (`aes_gcm_seal`, `aes_gcm_open`,
`x25519`, `hkdf_sha256`, `ed25519_sign`, `ed25519_verify` …) so that the standard
test vectors can inject keys and nonces; the kernels turn tensors into their raw
little-endian C-order bytes, call them, and name the party and op on failure.

Runtime values: `PublicKeyValue` (sendable, with a checking wire codec) and the key
material `PrivateKeyValue`, `SymmetricKeyValue` and `SharedSecretValue`, whose codecs
refuse to encode: key material never leaves the party that holds it (the simp type
rules refuse to move it first; the codecs are the runtime's second line).
Each primitive imports ``cryptography`` when called, so importing this module does not.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from mplang.dialects import crypto as _crypto
from mplang.dialects.crypto import (
    AES_KEY_BYTES,
    ALGORITHMS,
    MAX_KEY_BYTES,
    NONCE_BYTES,
    OVERHEAD,
    PUBLIC_KEY_BYTES,
    SymmetricKey,
)
from mplang.dialects.symbolic import shape_of_elements
from mplang.edsl.errors import MPPublicError, MPSerializationError
from mplang.edsl.typing import TensorType, numpy_dtype
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Call
from mplang.transport.wire import Buffer, ValueCodec, register_value_codec

BACKEND = register_backend("crypto")

AUTH_FAILED = ("authentication failed: the ciphertext or its associated data was tampered "
               "with, or the key is wrong")
KEY_MATERIAL = "key material"
"""The `ValueCodec.privacy` of private keys, symmetric keys and shared secrets."""


class CryptoError(MPPublicError):
    """A primitive refused its input: a ciphertext that does not authenticate, a key of the
    wrong size, a low-order X25519 public key. Kernels re-raise it naming party and op."""


# ---------------------------------------------------------------- the primitives


def _need(value: bytes, size: int, what: str) -> None:
    if not isinstance(value, bytes) or len(value) != size:
        got = f"{len(value)} bytes" if isinstance(value, bytes) else type(value).__name__
        raise CryptoError(f"{what} must be {size} bytes, got {got}")


def aes_gcm_seal(key: bytes, plaintext: bytes, aad: bytes, nonce: bytes | None = None) -> bytes:
    """AES-256-GCM: ``nonce ‖ ciphertext ‖ tag`` of ``plaintext`` under ``key``,
    authenticating ``aad``; ``nonce`` None draws 12 bytes from the OS CSPRNG."""
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    _need(key, AES_KEY_BYTES, "an AES-256-GCM key")
    if nonce is None:
        nonce = os.urandom(NONCE_BYTES)
    _need(nonce, NONCE_BYTES, "an AES-GCM nonce")
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def aes_gcm_open(key: bytes, sealed: bytes, aad: bytes) -> bytes:
    """The plaintext of ``sealed`` (``nonce ‖ ciphertext ‖ tag``) under ``key`` and ``aad``;
    raises `CryptoError` ("authentication failed: …") unless the tag verifies."""
    from cryptography.exceptions import InvalidTag
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

    _need(key, AES_KEY_BYTES, "an AES-256-GCM key")
    if len(sealed) < OVERHEAD:
        raise CryptoError(f"a sealed message has at least {OVERHEAD} bytes (nonce and tag), "
                          f"got {len(sealed)}")
    try:
        return AESGCM(key).decrypt(sealed[:NONCE_BYTES], sealed[NONCE_BYTES:], aad)
    except InvalidTag:
        raise CryptoError(AUTH_FAILED) from None


def x25519_public(private_raw: bytes) -> bytes:
    """The X25519 public key (``X25519(k, 9)``) of the 32-byte private scalar ``private_raw``."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    _need(private_raw, 32, "an X25519 private key")
    return X25519PrivateKey.from_private_bytes(private_raw).public_key().public_bytes_raw()


def x25519(private_raw: bytes, public_raw: bytes) -> bytes:
    """The X25519 function of RFC 7748: the 32-byte shared secret of a private scalar and a
    peer's public u-coordinate. Refuses a low-order peer key (an all-zero secret)."""
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey

    _need(private_raw, 32, "an X25519 private key")
    _need(public_raw, PUBLIC_KEY_BYTES, "an X25519 public key")
    sk = X25519PrivateKey.from_private_bytes(private_raw)
    try:
        shared = sk.exchange(X25519PublicKey.from_public_bytes(public_raw))
    except ValueError:  # OpenSSL refuses the all-zero result itself
        shared = bytes(32)
    if not any(shared):
        raise CryptoError("X25519: the peer's public key is a low-order point (the shared "
                          "secret is all zeros); refusing it")
    return shared


def hkdf_sha256(ikm: bytes, info: bytes, length: int, salt: bytes | None = None) -> bytes:
    """HKDF-SHA256 of RFC 5869: ``length`` bytes derived from ``ikm``, ``info`` and ``salt``
    (None: no salt, i.e. 32 zero bytes)."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    if type(length) is not int or not 1 <= length <= MAX_KEY_BYTES:
        raise CryptoError(f"HKDF-SHA256 gives 1 to {MAX_KEY_BYTES} bytes, not {length!r}")
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=salt, info=info).derive(ikm)


def ed25519_public(private_seed: bytes) -> bytes:
    """The Ed25519 public key of the 32-byte private key (seed) ``private_seed``."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    _need(private_seed, 32, "an Ed25519 private key")
    return Ed25519PrivateKey.from_private_bytes(private_seed).public_key().public_bytes_raw()


def ed25519_sign(private_seed: bytes, msg: bytes) -> bytes:
    """The 64-byte Ed25519 signature of ``msg`` (RFC 8032; deterministic)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    _need(private_seed, 32, "an Ed25519 private key")
    return Ed25519PrivateKey.from_private_bytes(private_seed).sign(msg)


def ed25519_verify(public_raw: bytes, msg: bytes, sig: bytes) -> bool:
    """Whether ``sig`` is a valid Ed25519 signature of ``msg`` under ``public_raw``; False
    (never an error) for a bad signature or a key that is no curve point."""
    from cryptography.exceptions import InvalidSignature
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if len(public_raw) != PUBLIC_KEY_BYTES or len(sig) != 64:
        return False
    try:
        Ed25519PublicKey.from_public_bytes(public_raw).verify(sig, msg)
    except (InvalidSignature, ValueError):
        return False
    return True


def sha256(data: bytes) -> bytes:
    """The SHA-256 digest of ``data``."""
    return hashlib.sha256(data).digest()


def tensor_bytes(value: Any, t: TensorType) -> bytes:
    """The raw little-endian C-order bytes of ``value`` as a tensor of type ``t``."""
    dtype = numpy_dtype(t.dtype)
    arr = np.asarray(value, dtype=dtype)
    if not t.admits(arr.shape):
        raise CryptoError(f"the value has shape {arr.shape}, its type is {t}")
    return np.ascontiguousarray(arr, dtype=dtype.newbyteorder("<")).tobytes()


def bytes_tensor(data: bytes, t: TensorType) -> np.ndarray:
    """The tensor of type ``t`` whose raw little-endian C-order bytes are ``data``."""
    dtype = numpy_dtype(t.dtype)
    shape = shape_of_elements(t, len(data) // dtype.itemsize)
    if shape is None or len(data) % dtype.itemsize:
        raise CryptoError(f"{len(data)} bytes cannot be a {t}")
    return np.frombuffer(data, dtype=dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _u8(data: bytes) -> np.ndarray:
    return np.frombuffer(data, dtype=np.uint8).copy()


# ---------------------------------------------------------------- runtime values


class PublicKeyValue:
    """A public key: its algorithm and its 32 raw bytes. Immutable; compares by value."""

    __slots__ = ("algorithm", "raw")
    algorithm: str
    raw: bytes

    def __init__(self, algorithm: str, raw: bytes):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"public key: unknown algorithm {algorithm!r}")
        if not isinstance(raw, bytes) or len(raw) != PUBLIC_KEY_BYTES:
            raise ValueError(f"public key: expected {PUBLIC_KEY_BYTES} raw bytes, got "
                             f"{len(raw) if isinstance(raw, bytes) else type(raw).__name__}")
        object.__setattr__(self, "algorithm", algorithm)
        object.__setattr__(self, "raw", raw)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a public key is immutable")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, PublicKeyValue) and \
            (self.algorithm, self.raw) == (other.algorithm, other.raw)

    def __hash__(self) -> int:
        return hash((self.algorithm, self.raw))

    def __repr__(self) -> str:
        return f"PublicKeyValue({self.algorithm}, {self.raw.hex()})"


class _KeyMaterial:
    """Secret bytes held by one party: the repr never shows them, they do not pickle, and
    two values are equal only if they are the same object."""

    __slots__ = ("raw",)
    raw: bytes

    def __init__(self, raw: bytes):
        if not isinstance(raw, bytes):
            raise ValueError(f"{type(self).__name__}: expected bytes, got {type(raw).__name__}")
        object.__setattr__(self, "raw", raw)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("key material is immutable")

    def __reduce__(self) -> Any:
        raise TypeError(f"{type(self).__name__} is key material and is not serialized")

    def __repr__(self) -> str:
        return f"{type(self).__name__}(<{len(self.raw)} secret bytes>)"


class PrivateKeyValue(_KeyMaterial):
    """A private key of ``algorithm``: the X25519 scalar or the Ed25519 seed (32 bytes)."""

    __slots__ = ("algorithm",)
    algorithm: str

    def __init__(self, algorithm: str, raw: bytes):
        if algorithm not in ALGORITHMS:
            raise ValueError(f"private key: unknown algorithm {algorithm!r}")
        if not isinstance(raw, bytes) or len(raw) != 32:
            raise ValueError("private key: expected 32 raw bytes")
        super().__init__(raw)
        object.__setattr__(self, "algorithm", algorithm)

    def __repr__(self) -> str:
        return f"PrivateKeyValue({self.algorithm}, <{len(self.raw)} secret bytes>)"


class SymmetricKeyValue(_KeyMaterial):
    """A secret key (32 bytes for AES-256-GCM; ``hkdf`` makes other lengths)."""

    __slots__ = ()


class SharedSecretValue(_KeyMaterial):
    """The 32-byte output of an X25519 agreement."""

    __slots__ = ()


# ---------------------------------------------------------------- wire codecs


def _encode_public(pk: PublicKeyValue) -> list[Buffer]:
    return [pk.algorithm.encode("ascii"), pk.raw]


def _decode_public(chunks: list[memoryview]) -> PublicKeyValue:
    """A public key from a peer: the algorithm name and the 32 raw bytes, both checked."""
    if len(chunks) != 2:
        raise MPSerializationError(f"malformed value: crypto.public_key: expected 2 chunks "
                                   f"(algorithm, key), got {len(chunks)}")
    name, raw = bytes(chunks[0]), bytes(chunks[1])
    algorithm = next((a for a in ALGORITHMS if a.encode("ascii") == name), None)
    if algorithm is None:
        raise MPSerializationError(f"malformed value: crypto.public_key: unknown algorithm "
                                   f"{name[:32]!r}")
    if len(raw) != PUBLIC_KEY_BYTES:
        raise MPSerializationError(f"malformed value: crypto.public_key: {len(raw)} key bytes, "
                                   f"expected {PUBLIC_KEY_BYTES}")
    return PublicKeyValue(algorithm, raw)


def _refuse(kind: str) -> Any:
    def encode(value: Any) -> Sequence[Buffer]:
        raise MPSerializationError(f"cannot send a {kind}: key material never leaves the "
                                   "party that holds it")

    def decode(chunks: list[memoryview]) -> Any:
        raise MPSerializationError(f"malformed value: {kind}: key material is never sent; "
                                   "refusing a received one")

    return encode, decode


register_value_codec(ValueCodec(_crypto.PublicKey, PublicKeyValue, _encode_public,
                                _decode_public,
                                nbytes=lambda pk: len(pk.algorithm) + len(pk.raw)))
for _type, _cls in ((_crypto.PrivateKey, PrivateKeyValue),
                    (_crypto.SymmetricKey, SymmetricKeyValue),
                    (_crypto.SharedSecret, SharedSecretValue)):
    _enc, _dec = _refuse(_type.type_tag.removeprefix("crypto.").replace("_", " "))
    register_value_codec(ValueCodec(_type, _cls, _enc, _dec, privacy=KEY_MATERIAL))


# ---------------------------------------------------------------- kernels


def _expect(call: Call, value: Any, cls: type, what: str, algorithm: str | None = None) -> Any:
    if not isinstance(value, cls) or (algorithm is not None
                                      and getattr(value, "algorithm", None) != algorithm):
        kind = f"an {algorithm} {cls.__name__}" if algorithm else f"a {cls.__name__}"
        raise call.error(f"{what} is {value!r}, not {kind}")
    return value


def _aes_key(call: Call, value: Any) -> bytes:
    key = _expect(call, value, SymmetricKeyValue, "the key")
    if len(key.raw) != AES_KEY_BYTES:
        raise call.error(f"the key has {len(key.raw)} bytes, AES-256-GCM takes "
                         f"{AES_KEY_BYTES}")
    return bytes(key.raw)


def _run(call: Call, fn: Any, *args: Any) -> Any:
    try:
        return fn(*args)
    except CryptoError as e:
        raise call.error(str(e), MPPublicError) from None


def _bytes(call: Call, value: Any, i: int) -> bytes:
    """`tensor_bytes` of ``value``, operand ``i`` of the op (a tensor)."""
    t = call.in_type(i)
    assert isinstance(t, TensorType), t
    return _run(call, tensor_bytes, value, t)


@BACKEND.kernel(_crypto.dialect.prims.aes_keygen)
def _aes_keygen(call: Call) -> list[Any]:
    t = call.out_type()
    assert isinstance(t, SymmetricKey)
    return [SymmetricKeyValue(os.urandom(t.length))]


@BACKEND.kernel(_crypto.dialect.prims.random_bits)
def _random_bits(call: Call, *, count: int, bits: int) -> list[Any]:
    words = np.frombuffer(os.urandom(4 * count), dtype="<u4") >> (32 - bits)
    return [words.astype(np.int32)]


@BACKEND.kernel(_crypto.dialect.prims.aes_encrypt)
def _aes_encrypt(call: Call, x: Any, key: Any, *, aad: bytes) -> list[Any]:
    plain = _bytes(call, x, 0)
    return [_u8(_run(call, aes_gcm_seal, _aes_key(call, key), plain, aad))]


@BACKEND.kernel(_crypto.dialect.prims.aes_decrypt)
def _aes_decrypt(call: Call, c: Any, key: Any, *, like: TensorType, aad: bytes) -> list[Any]:
    sealed = _bytes(call, c, 0)
    plain = _run(call, aes_gcm_open, _aes_key(call, key), sealed, aad)
    return [_run(call, bytes_tensor, plain, like)]


@BACKEND.kernel(_crypto.dialect.prims.sha256)
def _sha256(call: Call, x: Any) -> list[Any]:
    return [_u8(sha256(_bytes(call, x, 0)))]


def _keypair(algorithm: str) -> list[Any]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
    from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey

    if algorithm == "x25519":
        sk = X25519PrivateKey.generate()
        raw, pub = sk.private_bytes_raw(), sk.public_key().public_bytes_raw()
    else:
        ssk = Ed25519PrivateKey.generate()
        raw, pub = ssk.private_bytes_raw(), ssk.public_key().public_bytes_raw()
    return [PublicKeyValue(algorithm, pub), PrivateKeyValue(algorithm, raw)]


@BACKEND.kernel(_crypto.dialect.prims.x25519_keygen)
def _x25519_keygen(call: Call) -> list[Any]:
    return _keypair("x25519")


@BACKEND.kernel(_crypto.dialect.prims.ed25519_keygen)
def _ed25519_keygen(call: Call) -> list[Any]:
    return _keypair("ed25519")


@BACKEND.kernel(_crypto.dialect.prims.x25519_shared)
def _x25519_shared(call: Call, private: Any, peer: Any) -> list[Any]:
    sk = _expect(call, private, PrivateKeyValue, "the private key", "x25519")
    pk = _expect(call, peer, PublicKeyValue, "the peer key", "x25519")
    return [SharedSecretValue(_run(call, x25519, sk.raw, pk.raw))]


@BACKEND.kernel(_crypto.dialect.prims.hkdf)
def _hkdf(call: Call, ikm: Any, *, info: bytes, length: int, salt: bytes | None) -> list[Any]:
    if not isinstance(ikm, SharedSecretValue | SymmetricKeyValue):
        raise call.error(f"the input key material is {ikm!r}, not a shared secret or "
                         "a symmetric key")
    return [SymmetricKeyValue(_run(call, hkdf_sha256, ikm.raw, info, length, salt))]


@BACKEND.kernel(_crypto.dialect.prims.sign)
def _sign(call: Call, m: Any, sk: Any) -> list[Any]:
    ssk = _expect(call, sk, PrivateKeyValue, "the signing key", "ed25519")
    msg = _bytes(call, m, 0)
    return [_u8(ed25519_sign(ssk.raw, msg))]


@BACKEND.kernel(_crypto.dialect.prims.verify)
def _verify(call: Call, m: Any, sig: Any, pk: Any) -> list[Any]:
    spk = _expect(call, pk, PublicKeyValue, "the public key", "ed25519")
    msg = _bytes(call, m, 0)
    signature = _bytes(call, sig, 1)
    return [np.array(ed25519_verify(spk.raw, msg, signature), dtype=np.bool_)]


@BACKEND.kernel(_crypto.dialect.prims.public_bytes)
def _public_bytes(call: Call, public: Any) -> list[Any]:
    pk = _expect(call, public, PublicKeyValue, "the public key")
    return [_u8(pk.raw)]


@BACKEND.kernel(_crypto.dialect.prims.public_key)
def _public_key(call: Call, b: Any, *, algorithm: str) -> list[Any]:
    raw = _bytes(call, b, 0)
    if len(raw) != PUBLIC_KEY_BYTES:
        raise call.error(f"a {algorithm} public key has {PUBLIC_KEY_BYTES} bytes, "
                         f"got {len(raw)}")
    return [PublicKeyValue(algorithm, raw)]
