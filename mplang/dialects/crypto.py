"""The `crypto` dialect: party-local keys, authenticated encryption, hashing and signatures.

Every op runs inside a party-local region (a ``simp.pcall`` body):

- ``aes_keygen`` / ``aes_encrypt`` / ``aes_decrypt``: AES-256-GCM; a ciphertext is a
  uint8 tensor ``nonce (12) ‖ ciphertext ‖ tag (16)`` that may travel like any tensor;
- ``x25519_keygen`` / ``x25519_shared`` / ``hkdf``: X25519 key agreement and
  HKDF-SHA256 key derivation (RFC 7748, RFC 5869);
- ``ed25519_keygen`` / ``sign`` / ``verify``: Ed25519 signatures (RFC 8032);
- ``sha256``; ``public_bytes`` / ``public_key``: a public key as a uint8[32] tensor
  and back;
- ``random_bits``: uniform random integers from the OS CSPRNG, the running party's
  secret contribution to noise drawn jointly inside a secure device (`mplang.libs.dp`).

Tensors enter the primitives as their raw little-endian, C-order bytes. Private keys,
symmetric keys and shared secrets are *confined* types (`BaseType.confined`): the simp
type rules refuse to move them, to run a pcall on them at another party or to fetch
them, so key material stays at the party that made it. Public keys move freely.
Keygens and ``aes_encrypt`` draw randomness, so they are not pure (never merged or
removed by passes). The kernels are in `mplang.kernels.crypto`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, ClassVar

import numpy as np

from mplang.dialects import tensor
from mplang.dialects.common import canonical_type
from mplang.dialects.symbolic import scaled_size
from mplang.edsl.attrs import Attr
from mplang.edsl.errors import MPTypeError
from mplang.edsl.graph import Operation
from mplang.edsl.object import MPObject
from mplang.edsl.traits import OpTraits
from mplang.edsl.typing import (
    BaseType,
    Dim,
    TensorType,
    TypeDecoder,
    TypeEncoder,
    dim_text,
    numpy_dtype,
    register_type,
)
from mplang.flows.dp_flows import entropy_flow
from mplang.flows.engine import Analysis, enclave_aware
from mplang.flows.labels import Flow, Label, raw
from mplang.frontend.module import FeModule

__all__ = [
    "ALGORITHMS",
    "PrivateKey",
    "PublicKey",
    "SharedSecret",
    "SymmetricKey",
    "aes_decrypt",
    "aes_encrypt",
    "aes_keygen",
    "ed25519_keygen",
    "hkdf",
    "public_bytes",
    "public_key",
    "random_bits",
    "sha256",
    "sign",
    "verify",
    "x25519_keygen",
    "x25519_shared",
]

ALGORITHMS = ("x25519", "ed25519")
"""The asymmetric algorithms: X25519 key agreement and Ed25519 signatures."""
AES_KEY_BYTES = 32
NONCE_BYTES = 12
TAG_BYTES = 16
OVERHEAD = NONCE_BYTES + TAG_BYTES
"""Bytes an AES-GCM ciphertext adds to its plaintext: the nonce and the tag."""
PUBLIC_KEY_BYTES = 32
SIGNATURE_BYTES = 64
DIGEST_BYTES = 32
MIN_KEY_BYTES = 16
MAX_KEY_BYTES = 255 * 32
"""The longest HKDF-SHA256 output (RFC 5869: 255 hash lengths)."""
MAX_RANDOM_WORDS = 1 << 24
"""The most words one ``random_bits`` draws."""

RANDOM = OpTraits(pure=False, communicates=False)
"""Traits of a local op that draws randomness: passes keep every call (no CSE, no DCE)."""


def _check_algorithm(algorithm: Any) -> None:
    if algorithm not in ALGORITHMS:
        raise ValueError(f"expected an algorithm in {list(ALGORITHMS)}, got {algorithm!r}")


# ---------------------------------------------------------------- the types


@dataclass(frozen=True)
class _AsymmetricKey(BaseType):
    """One half of an ``algorithm`` key pair (the subclass says which)."""

    _role: ClassVar[str] = ""
    _suffix: ClassVar[str] = ""
    algorithm: str

    def __post_init__(self) -> None:
        try:
            _check_algorithm(self.algorithm)
        except ValueError as e:
            raise MPTypeError(f"{self._role}: {e}") from None

    def to_json(self, encode: TypeEncoder) -> Any:
        return self.algorithm

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> _AsymmetricKey:
        _check_algorithm(body)
        return cls(body)

    def __str__(self) -> str:
        return f"{self.algorithm}.{self._suffix}"


@register_type("crypto.public_key")
@dataclass(frozen=True)
class PublicKey(_AsymmetricKey):
    """A public key of ``algorithm`` (32 raw bytes at run time); free to move and fetch."""

    _role = "public key"
    _suffix = "pk"


@register_type("crypto.private_key")
@dataclass(frozen=True)
class PrivateKey(_AsymmetricKey):
    """A private key of ``algorithm``: key material confined to the party that made it."""

    _role = "private key"
    _suffix = "sk"
    confined = True


@register_type("crypto.symmetric_key")
@dataclass(frozen=True)
class SymmetricKey(BaseType):
    """A secret key of ``length`` bytes (AES-256-GCM takes 32): confined key material."""

    length: int = AES_KEY_BYTES
    confined = True

    def __post_init__(self) -> None:
        if type(self.length) is not int or not MIN_KEY_BYTES <= self.length <= MAX_KEY_BYTES:
            raise MPTypeError(f"a symmetric key has {MIN_KEY_BYTES} to {MAX_KEY_BYTES} bytes, "
                              f"got {self.length!r}")

    def to_json(self, encode: TypeEncoder) -> Any:
        return self.length

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> SymmetricKey:
        if type(body) is not int or not MIN_KEY_BYTES <= body <= MAX_KEY_BYTES:
            raise ValueError(f"expected a key length in [{MIN_KEY_BYTES}, {MAX_KEY_BYTES}], "
                             f"got {body!r}")
        return SymmetricKey(body)

    def __str__(self) -> str:
        return f"symkey[{self.length}]"


@register_type("crypto.shared_secret")
@dataclass(frozen=True)
class SharedSecret(BaseType):
    """The 32-byte output of an X25519 agreement: confined key material, input of ``hkdf``."""

    confined = True

    def to_json(self, encode: TypeEncoder) -> Any:
        return []

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> SharedSecret:
        if body != []:
            raise ValueError(f"expected [], got {body!r}")
        return SharedSecret()

    def __str__(self) -> str:
        return "x25519.shared"


# ---------------------------------------------------------------- type-rule helpers


def nbytes(t: TensorType, offset: int = 0) -> Dim:
    """The raw bytes of a tensor of type ``t`` (plus ``offset``): an expression of its
    symbols when its size is known only at run time (`scaled_size`)."""
    return scaled_size(t, numpy_dtype(t.dtype).itemsize, offset)


def _bytes_tensor(op: str, what: str, t: TensorType, size: int) -> TensorType:
    if t != TensorType("uint8", (size,)):
        raise MPTypeError(f"{op}: {what} must be u8[{size}], got {t}")
    return t


def _aes_key(op: str, t: SymmetricKey) -> SymmetricKey:
    if t.length != AES_KEY_BYTES:
        raise MPTypeError(f"{op}: the key must be a {AES_KEY_BYTES}-byte symmetric key, got {t}")
    return t


def _algorithm(op: str, what: str, t: PrivateKey | PublicKey, algorithm: str) -> None:
    if t.algorithm != algorithm:
        raise MPTypeError(f"{op}: {what} must be an {algorithm} {t._role}, got {t}")


def _bytes_attr(op: str, name: str, value: Any) -> bytes:
    """A bytes argument of a frontend op (a bytearray or memoryview becomes bytes)."""
    if isinstance(value, bytearray | memoryview):
        value = bytes(value)
    if not isinstance(value, bytes):
        raise MPTypeError(f"{op}: {name} must be bytes, got {type(value).__name__}")
    return value


# ---------------------------------------------------------------- flow rules
# Key material carries no party's data. A key p derives from a TEE key whose quote p
# itself checked (`tee.verify_quote`) is attested for that quote's computation, and so
# is a ciphertext p encrypts under it: only that enclave opens it, and what it opens
# stays p's data inside the enclave (`Analysis.local` lets it reach the attested region
# only). Any other ciphertext is ``sealed``: no flow until it is decrypted, which is a
# flow of the plaintext to the party that decrypts.


@enclave_aware
def key_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Keys carry no data; one derived from an attested key is attested too."""
    if any(lab is not None and lab.mine for lab in ins):
        return [raw(ins)] * len(op.outputs)
    attested = {lab.enclave for lab in ins if lab is not None and lab.enclave}
    marker = Flow("foreign", enclave=attested.pop()) if len(attested) == 1 else None
    return [marker] * len(op.outputs)


@enclave_aware
def seal_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """A ciphertext of the plaintext's label: sealed, and for the attested enclave if the
    key is attested."""
    x, key = ins[0], ins[1]
    if key is not None and key.mine:
        return [raw([x, key])]
    if x is None or not x.mine:
        return [x]
    enclave = key.enclave if key is not None else ""
    return [replace(x, sealed=True, enclave=enclave)]


@enclave_aware
def open_flow(a: Analysis, op: Operation, ins: list[Label], own: bool) -> list[Label]:
    """Decrypting: inside the attested enclave p's data stays there; elsewhere it is a
    flow of the plaintext to the party that decrypts."""
    c = ins[0]
    if c is None or not c.mine or not c.sealed:
        return [c]
    plain = replace(c, sealed=False)
    if not c.enclave and not own and a.runner is not None:
        a.send(op, a.runner, plain, "the plaintext it decrypts")
    return [plain]


# ---------------------------------------------------------------- the ops

dialect = FeModule("crypto")
"""The crypto ops; their primitives are ``dialect.prims.<name>`` (``dialect.prims.sha256``).
Every op runs on the party-local values of one party (any single-party device); the
flow rule is the conservative one (`FeModule`'s default)."""


def _local(value: Any) -> Any:
    """A tensor argument: a numpy array becomes a local constant; the rest is left to the
    op (which refuses anything but MPLang values)."""
    return tensor.constant(value) if isinstance(value, np.ndarray | np.generic) else value


@dialect.simple_op(traits=RANDOM, flow=key_flow, example="k = crypto.aes_keygen()")
def aes_keygen() -> SymmetricKey:
    """A fresh random AES-256-GCM key (32 bytes from the OS CSPRNG)."""
    return SymmetricKey(AES_KEY_BYTES)


@dialect.simple_op("aes_encrypt", traits=RANDOM, flow=seal_flow,
                   example='c = crypto.aes_encrypt(x, k, aad=b"header")')
def _aes_encrypt(x: TensorType, key: SymmetricKey, *, aad: bytes = b"") -> TensorType:
    """Encrypt tensor ``x`` with AES-256-GCM under a fresh random nonce, authenticating
    ``aad``: a uint8 tensor ``nonce ‖ ciphertext ‖ tag`` of ``28 + x.nbytes`` bytes."""
    _aes_key("crypto.aes_encrypt", key)
    return TensorType("uint8", (nbytes(x, OVERHEAD),))


def aes_encrypt(x: Any, key: MPObject, *, aad: bytes = b"") -> MPObject:
    """Encrypt tensor ``x`` with AES-256-GCM key ``key`` under a fresh random nonce,
    authenticating ``aad``: a uint8 tensor ``nonce (12) ‖ ciphertext ‖ tag (16)``."""
    return _aes_encrypt(_local(x), key, aad=_bytes_attr("crypto.aes_encrypt", "aad", aad))


@dialect.simple_op("aes_decrypt", flow=open_flow,
                   example='y = crypto.aes_decrypt(c, k, like=x, aad=b"header")')
def _aes_decrypt(c: TensorType, key: SymmetricKey, *, like: TensorType, aad: bytes = b""
                 ) -> TensorType:
    """Decrypt and authenticate an ``aes_encrypt`` ciphertext into a tensor of type ``like``;
    fails at run time if the ciphertext, ``aad`` or the key is not the one encrypted with."""
    op = "crypto.aes_decrypt"
    _aes_key(op, key)
    size = nbytes(like, OVERHEAD)
    if c.dtype != "uint8" or len(c.shape) != 1 or c.shape[0] != size:
        raise MPTypeError(f"{op}: the ciphertext must be u8[{dim_text(size)}] (nonce, tag "
                          f"and the {dim_text(nbytes(like))} bytes of {like}), got {c}")
    return like


def like_type(like: Any) -> TensorType:
    """The tensor type ``like`` stands for: a traced value's type, a numpy array's (with the
    dtype the array gets as a constant in a program), a `TensorType`, or ``(dtype, shape)``."""
    op = "crypto.aes_decrypt"
    if isinstance(like, MPObject):
        base = like.base_type
        if not isinstance(base, TensorType):
            raise MPTypeError(f"{op}: 'like' must be a tensor, got {base}")
        return base
    if isinstance(like, TensorType):
        return like
    if isinstance(like, tuple) and len(like) == 2:
        dtype, shape = like
        try:
            return TensorType.of(dtype, shape)
        except (TypeError, ValueError) as e:
            raise MPTypeError(f"{op}: 'like' {like!r} is not (dtype, shape): {e}") from None
    if isinstance(like, np.ndarray | np.generic):
        return canonical_type(TensorType.of(like.dtype, like.shape))
    raise MPTypeError(f"{op}: 'like' must be a traced tensor, a numpy array, a TensorType or "
                      f"(dtype, shape), got {type(like).__name__}")


def aes_decrypt(c: Any, key: MPObject, *, like: Any, aad: bytes = b"") -> MPObject:
    """Decrypt and authenticate ciphertext ``c`` (from ``aes_encrypt``) with ``key`` and
    ``aad`` into a tensor of ``like``'s dtype and shape (``like``: a traced tensor, a numpy
    array, a `TensorType` or ``(dtype, shape)``). A tampered ciphertext, other ``aad`` or
    another key fails at run time ("authentication failed")."""
    return _aes_decrypt(_local(c), key, like=like_type(like),
                        aad=_bytes_attr("crypto.aes_decrypt", "aad", aad))


@dialect.simple_op("sha256", example="h = crypto.sha256(x)")
def _sha256(x: TensorType) -> TensorType:
    """The SHA-256 digest (u8[32]) of a tensor's raw little-endian C-order bytes."""
    return TensorType("uint8", (DIGEST_BYTES,))


def sha256(x: Any) -> MPObject:
    """The SHA-256 digest (u8[32]) of tensor ``x``'s raw little-endian C-order bytes."""
    return _sha256(_local(x))


@dialect.simple_op(traits=RANDOM, flow=entropy_flow,
                   attrs={"count": Attr(int, required=True, min=1, max=MAX_RANDOM_WORDS,
                                        doc="how many words"),
                          "bits": Attr(int, default=30, min=1, max=31,
                                       doc="random bits per word")},
                   example="r = crypto.random_bits(count=8, bits=30)")
def random_bits(*, count: int, bits: int = 30) -> TensorType:
    """``count`` int32 words, each uniform in ``[0, 2**bits)``, from the OS CSPRNG. The
    words are the running party's secret: the flow analysis labels them so, and a
    differentially private release checks that each member's contribution is such a
    fresh draw (`mplang.flows.dp_flows`)."""
    return TensorType("int32", (count,))


@dialect.simple_op(traits=RANDOM, flow=key_flow, example="pk, sk = crypto.x25519_keygen()")
def x25519_keygen() -> tuple[PublicKey, PrivateKey]:
    """A fresh X25519 key pair: (public key, private key)."""
    return PublicKey("x25519"), PrivateKey("x25519")


@dialect.simple_op(flow=key_flow, example="s = crypto.x25519_shared(sk, peer_pk)")
def x25519_shared(sk: PrivateKey, pk: PublicKey) -> SharedSecret:
    """The X25519 shared secret of private key ``sk`` and a peer's public key ``pk``
    (the same at both ends); refuses a low-order peer key at run time."""
    _algorithm("crypto.x25519_shared", "the key", sk, "x25519")
    _algorithm("crypto.x25519_shared", "the peer key", pk, "x25519")
    return SharedSecret()


@dialect.simple_op("hkdf", flow=key_flow,
                   attrs={"length": Attr(int, default=AES_KEY_BYTES, min=MIN_KEY_BYTES,
                                         max=MAX_KEY_BYTES, doc="the key's bytes")},
                   example='k = crypto.hkdf(s, info=b"session", length=32)')
def _hkdf(ikm: SharedSecret | SymmetricKey, *, info: bytes = b"", length: int,
          salt: bytes | None = None) -> SymmetricKey:
    """Derive a ``length``-byte symmetric key from a shared secret or symmetric key with
    HKDF-SHA256 (RFC 5869)."""
    return SymmetricKey(length)


def hkdf(ikm: MPObject, *, info: bytes = b"", length: int = AES_KEY_BYTES,
         salt: bytes | None = None) -> MPObject:
    """Derive a ``length``-byte symmetric key from ``ikm`` (a shared secret or a symmetric
    key) with HKDF-SHA256 (RFC 5869), binding ``info``; ``salt`` None is no salt. A 32-byte
    result is an ``aes_encrypt`` key."""
    op = "crypto.hkdf"
    return _hkdf(ikm, info=_bytes_attr(op, "info", info), length=length,
                 salt=None if salt is None else _bytes_attr(op, "salt", salt))


@dialect.simple_op(traits=RANDOM, example="spk, ssk = crypto.ed25519_keygen()")
def ed25519_keygen() -> tuple[PublicKey, PrivateKey]:
    """A fresh Ed25519 signing key pair: (public key, private key)."""
    return PublicKey("ed25519"), PrivateKey("ed25519")


@dialect.simple_op("sign", example="sig = crypto.sign(m, ssk)")
def _sign(m: TensorType, sk: PrivateKey) -> TensorType:
    """The Ed25519 signature (u8[64]) of a tensor's raw bytes under an Ed25519 private key."""
    _algorithm("crypto.sign", "the key", sk, "ed25519")
    return TensorType("uint8", (SIGNATURE_BYTES,))


def sign(m: Any, sk: MPObject) -> MPObject:
    """The Ed25519 signature (u8[64]) of tensor ``m``'s raw bytes under private key ``sk``."""
    return _sign(_local(m), sk)


@dialect.simple_op("verify", example="ok = crypto.verify(m, sig, spk)")
def _verify(m: TensorType, sig: TensorType, pk: PublicKey) -> TensorType:
    """Whether a signature of a tensor's raw bytes is valid under an Ed25519 public key: a
    bool scalar, False (never an error) for a bad signature."""
    op = "crypto.verify"
    _bytes_tensor(op, "the signature", sig, SIGNATURE_BYTES)
    _algorithm(op, "the key", pk, "ed25519")
    return TensorType("bool", ())


def verify(m: Any, sig: Any, pk: MPObject) -> MPObject:
    """Whether ``sig`` (u8[64]) is a valid Ed25519 signature of tensor ``m``'s raw bytes
    under public key ``pk``: a bool scalar, False (never an error) for a bad signature."""
    return _verify(_local(m), _local(sig), pk)


@dialect.simple_op(flow=key_flow, example="b = crypto.public_bytes(pk)")
def public_bytes(pk: PublicKey) -> TensorType:
    """The raw 32 bytes (u8[32]) of public key ``pk``, to hash or send as a tensor."""
    return TensorType("uint8", (PUBLIC_KEY_BYTES,))


@dialect.simple_op("public_key", attrs={"algorithm": Attr(str, required=True,
                                                         choices=ALGORITHMS)},
                   example='pk = crypto.public_key(b, algorithm="x25519")')
def _public_key_rule(b: TensorType, *, algorithm: str) -> PublicKey:
    """The public key of an algorithm whose raw bytes are a u8[32] tensor (the inverse of
    ``public_bytes``)."""
    _bytes_tensor("crypto.public_key", "the raw key", b, PUBLIC_KEY_BYTES)
    return PublicKey(algorithm)


def public_key(b: Any, *, algorithm: str) -> MPObject:
    """The ``algorithm`` public key whose raw bytes are the u8[32] tensor ``b`` (the inverse
    of ``public_bytes``; the kernel checks the length again)."""
    return _public_key_rule(_local(b), algorithm=algorithm)
