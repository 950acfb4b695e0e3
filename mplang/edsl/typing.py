"""The type system: base types (what a value is) and `MPType` (who holds it).

Types are immutable, compare by value and print in the compact form the IR
printer uses, e.g. ``f32[3,4]@{0,1}``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

_DTYPE_SHORT = {
    "bool": "bool",
    "int8": "i8",
    "int16": "i16",
    "int32": "i32",
    "int64": "i64",
    "uint8": "u8",
    "uint16": "u16",
    "uint32": "u32",
    "uint64": "u64",
    "float16": "f16",
    "bfloat16": "bf16",
    "float32": "f32",
    "float64": "f64",
    "complex64": "c64",
    "complex128": "c128",
}


@dataclass(frozen=True)
class Mask:
    """An immutable set of party ranks, stored as a bit mask."""

    bits: int

    def __post_init__(self) -> None:
        if self.bits < 0:
            raise ValueError(f"a party mask cannot be negative: {self.bits}")

    @staticmethod
    def of(parties: Iterable[int]) -> Mask:
        bits = 0
        for p in parties:
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 0:
                raise ValueError(f"party ranks are non-negative integers, got {p!r}")
            bits |= 1 << int(p)
        return Mask(bits)

    @staticmethod
    def all(world_size: int) -> Mask:
        return Mask((1 << world_size) - 1)

    @property
    def parties(self) -> tuple[int, ...]:
        return tuple(i for i in range(self.bits.bit_length()) if self.bits >> i & 1)

    def __iter__(self) -> Iterator[int]:
        return iter(self.parties)

    def __len__(self) -> int:
        return self.bits.bit_count()

    def __contains__(self, rank: object) -> bool:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or rank < 0:
            return False
        return bool(self.bits >> int(rank) & 1)

    def __and__(self, other: Mask) -> Mask:
        return Mask(self.bits & other.bits)

    def __or__(self, other: Mask) -> Mask:
        return Mask(self.bits | other.bits)

    def issubset(self, other: Mask) -> bool:
        return self.bits & ~other.bits == 0

    def __str__(self) -> str:
        return "{" + ",".join(str(p) for p in self.parties) + "}"

    def __repr__(self) -> str:
        return f"Mask({self})"


class BaseType:
    """What a value is, independent of where it lives."""

    __slots__ = ()


@dataclass(frozen=True)
class TensorType(BaseType):
    """A dense array with a numpy dtype name and a static shape (``()`` for scalars)."""

    dtype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPE_SHORT:
            raise ValueError(f"unsupported tensor dtype {self.dtype!r}")
        if not all(isinstance(d, int) and d >= 0 for d in self.shape):
            raise ValueError(f"tensor shape must be non-negative ints, got {self.shape!r}")

    @staticmethod
    def of(dtype: object, shape: Iterable[int]) -> TensorType:
        return TensorType(np.dtype(dtype).name, tuple(int(d) for d in shape))  # type: ignore[call-overload]

    @property
    def is_scalar(self) -> bool:
        return self.shape == ()

    def __str__(self) -> str:
        return f"{_DTYPE_SHORT[self.dtype]}[{','.join(str(d) for d in self.shape)}]"


def scalar(dtype: object) -> TensorType:
    """The rank-0 tensor type of ``dtype``."""
    return TensorType.of(dtype, ())


@dataclass(frozen=True)
class TableType(BaseType):
    """A relational table: ordered (column name, dtype name) pairs."""

    columns: tuple[tuple[str, str], ...]

    def __str__(self) -> str:
        cols = ",".join(f"{n}:{_DTYPE_SHORT.get(d, d)}" for n, d in self.columns)
        return f"table<{cols}>"


@dataclass(frozen=True)
class SecretShareType(BaseType):
    """One party's share of a secret-shared tensor (protocol named by ``scheme``)."""

    scheme: str
    plaintext: TensorType

    def __str__(self) -> str:
        return f"share<{self.scheme},{self.plaintext}>"


@dataclass(frozen=True)
class CiphertextType(BaseType):
    """A tensor encrypted under a homomorphic ``scheme``."""

    scheme: str
    plaintext: TensorType

    def __str__(self) -> str:
        return f"cipher<{self.scheme},{self.plaintext}>"


@dataclass(frozen=True)
class KeyType(BaseType):
    """An opaque key (``kind`` such as ``"paillier.public"``)."""

    kind: str

    def __str__(self) -> str:
        return f"key<{self.kind}>"


@dataclass(frozen=True)
class MPType:
    """A multi-party type: a base type plus the parties holding it (``None``: known at run time)."""

    base: BaseType
    pmask: Mask | None

    def __str__(self) -> str:
        return f"{self.base}@{self.pmask if self.pmask is not None else '?'}"

    def with_pmask(self, pmask: Mask | None) -> MPType:
        return MPType(self.base, pmask)


ValueType = BaseType | MPType
"""Values in a party-local region carry a bare `BaseType`; values at the simp level an `MPType`."""


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype called ``name`` (``bfloat16`` comes from ml_dtypes)."""
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
