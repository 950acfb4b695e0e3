"""The type system: base types (what a value is) and `MPType` (who holds it).

Types are immutable, compare by value and print in the compact form the IR
printer uses, e.g. ``f32[3,4]@{0,1}``.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import ml_dtypes
import numpy as np

from mplang.edsl.errors import MPTypeError

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
DTYPES = frozenset(_DTYPE_SHORT)
"""The dtype names a tensor may have (numpy names; ``bfloat16`` from ml_dtypes)."""


MAX_PARTIES = 1024
"""The most parties a world may have (ranks are below it): a bound on what a
received program may make a party compute with its masks."""


@dataclass(frozen=True)
class Mask:
    """An immutable set of party ranks, stored as a bit mask."""

    bits: int

    def __post_init__(self) -> None:
        if self.bits < 0:
            raise MPTypeError(f"a party mask cannot be negative: {self.bits}")
        if self.bits.bit_length() > MAX_PARTIES:
            raise MPTypeError(f"a party mask names a rank of {MAX_PARTIES} or more")

    @staticmethod
    def of(parties: Iterable[int]) -> Mask:
        """The mask of ``parties`` (non-negative ranks below `MAX_PARTIES`)."""
        bits = 0
        for p in parties:
            if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 0:
                raise MPTypeError(f"party ranks are non-negative integers, got {p!r}")
            if p >= MAX_PARTIES:
                raise MPTypeError(f"party rank {p} is not below {MAX_PARTIES}")
            bits |= 1 << int(p)
        return Mask(bits)

    @staticmethod
    def all(world_size: int) -> Mask:
        """The mask of every party of a world of ``world_size``."""
        if not 0 <= world_size <= MAX_PARTIES:
            raise MPTypeError(f"a world has 0 to {MAX_PARTIES} parties, not {world_size}")
        return Mask((1 << world_size) - 1)

    @property
    def parties(self) -> tuple[int, ...]:
        """The ranks in the mask, ascending."""
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
        """Whether every party of this mask is also in ``other``."""
        return self.bits & ~other.bits == 0

    def __str__(self) -> str:
        return "{" + ",".join(str(p) for p in self.parties) + "}"

    def __repr__(self) -> str:
        return f"Mask({self})"


TypeEncoder = Callable[["ValueType"], Any]
"""``encode(type)``: encodes a nested type as JSON-ready data."""
TypeDecoder = Callable[[Any, str], "ValueType"]
"""``decode(json, field_path)``: decodes a nested type, naming ``field_path`` on errors."""


class BaseType:
    """What a value is, independent of where it lives.

    Each concrete type registers a serialization tag with `register_type` and
    implements ``to_json`` / ``from_json``. For the cost analysis a type may name
    the tensor it stands for (``plaintext``) and how many bytes it takes per
    plaintext byte (``expansion``: 1 for plain data; ``None`` for a secret share or
    ciphertext, whose factor the cost model supplies).
    """

    __slots__ = ()
    type_tag: ClassVar[str]
    expansion: ClassVar[float | None] = 1.0
    confined: ClassVar[bool] = False
    """Key material (a private or symmetric key): a value of this type never leaves the
    party that made it. The simp type rules refuse to move it (``shuffle_static``,
    ``shuffle``, ``converge``), a ``pcall`` runs on it only at its holder, and no party
    fetches it."""

    def plaintext(self) -> TensorType | None:
        """The tensor this value holds or hides (None: no tensor, e.g. a key)."""
        return None

    def wire_bytes(self) -> int | None:
        """An upper bound of the bytes a value of this type takes on the wire, for types
        whose size ``expansion`` cannot say (a ciphertext's depends on its key); None:
        derive it from ``plaintext`` and ``expansion``."""
        return None

    def to_json(self, encode: TypeEncoder) -> Any:
        """The JSON body of this type (``encode`` serializes nested types)."""
        raise NotImplementedError

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> BaseType:
        """Rebuild from `to_json`'s body; raise TypeError/ValueError/KeyError if malformed."""
        raise NotImplementedError


_TYPES: dict[str, type[BaseType]] = {}
T = TypeVar("T", bound=type[BaseType])


def register_type(tag: str) -> Callable[[T], T]:
    """Class decorator: serialize the type under ``tag`` (one tag per type)."""
    def deco(cls: T) -> T:
        if tag in _TYPES or tag == "mp":
            raise ValueError(f"type tag {tag!r} is already registered")
        cls.type_tag = tag
        _TYPES[tag] = cls
        return cls

    return deco


def type_for_tag(tag: str) -> type[BaseType] | None:
    """The type class registered under ``tag``."""
    return _TYPES.get(tag)


def registered_types() -> dict[str, type[BaseType]]:
    """Every registered base type, by serialization tag."""
    return dict(_TYPES)


Dim = int | str
"""A tensor dimension: a size known while tracing, or a size known only at run time
(`is_symbolic`): a symbol such as ``"n0"``, or an expression JAX derived from symbols
(``"2*n0"``, ``"n0 + 1"``). Values of one symbol have the same size at run time."""
_SYMBOLIC = re.compile(r"[A-Za-z0-9_ +*()-]*[A-Za-z_][A-Za-z0-9_ +*()-]*")
_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
MAX_SYMBOLIC = 64
"""The longest symbolic dimension (its text)."""
MAX_SYMBOLIC_ELEMENTS = 1 << 25
"""The elements a value whose size is known only at run time may have in one message: the
bound a receiver puts on it (its worker's in-flight budget bounds the total)."""


def is_symbolic(d: object) -> bool:
    """Whether ``d`` is a well-formed symbolic dimension (see `Dim`)."""
    return (type(d) is str and 0 < len(d) <= MAX_SYMBOLIC and _SYMBOLIC.fullmatch(d)
            is not None and d.count("(") == d.count(")"))


def symbols_of(d: Dim) -> frozenset[str]:
    """The symbols dimension ``d`` depends on (none for a static size)."""
    return frozenset(_SYMBOL.findall(d)) if isinstance(d, str) else frozenset()


def dim_text(d: Dim) -> str:
    """A dimension as types print it: ``3``, or ``?n0`` for a symbolic one."""
    return f"?{d.replace(' ', '')}" if isinstance(d, str) else str(d)


@register_type("tensor")
@dataclass(frozen=True)
class TensorType(BaseType):
    """A dense array with a numpy dtype name and a shape (``()`` for scalars), whose
    dimensions are sizes or symbols known only at run time (`Dim`)."""

    dtype: str
    shape: tuple[Dim, ...]

    def __post_init__(self) -> None:
        if self.dtype not in _DTYPE_SHORT:
            raise MPTypeError(f"unsupported tensor dtype {self.dtype!r}")
        if not all((type(d) is int and d >= 0) or is_symbolic(d) for d in self.shape):
            raise MPTypeError(f"tensor shape must be non-negative ints or symbols, got "
                              f"{self.shape!r}")
        if any(isinstance(d, str) and " " in d for d in self.shape):  # one spelling each
            object.__setattr__(self, "shape", tuple(
                d.replace(" ", "") if isinstance(d, str) else d for d in self.shape))

    def plaintext(self) -> TensorType:
        return self

    def to_json(self, encode: TypeEncoder) -> Any:
        return [self.dtype, list(self.shape)]

    @classmethod
    def from_json(cls, body: Any, decode: TypeDecoder, path: str) -> TensorType:
        dtype, shape = body
        if not isinstance(shape, list):
            raise ValueError("shape must be a list")
        return TensorType(dtype, tuple(shape))

    @staticmethod
    def of(dtype: object, shape: Iterable[Any]) -> TensorType:
        """The tensor type of anything numpy takes as a dtype, and ``shape`` (ints, or
        symbolic dimensions: strings, or JAX's symbolic dimension expressions)."""
        try:
            name = np.dtype(dtype).name  # type: ignore[call-overload]
        except TypeError as e:
            raise MPTypeError(f"not a dtype: {dtype!r} ({e})") from None
        return TensorType(name, tuple(d if isinstance(d, str) else
                                      int(d) if _is_int(d) else str(d) for d in shape))

    @property
    def is_scalar(self) -> bool:
        """Whether the shape is ``()``."""
        return self.shape == ()

    @property
    def is_static(self) -> bool:
        """Whether every dimension is known while tracing (no symbol)."""
        return all(type(d) is int for d in self.shape)

    def static_shape(self, op: str) -> tuple[int, ...]:
        """The shape, whose sizes ``op`` needs while tracing; `MPTypeError` naming ``op``
        when one is known only at run time."""
        if not self.is_static:
            raise MPTypeError(f"{op}: {self} has a size known only at run time, and {op} "
                              "needs every size while tracing")
        return tuple(int(d) for d in self.shape)

    def size_estimate(self, symbolic: int) -> int:
        """Elements, counting each symbolic dimension as ``symbolic`` (for estimates)."""
        return math.prod(d if isinstance(d, int) else symbolic for d in self.shape)

    def admits(self, shape: Sequence[int]) -> bool:
        """Whether an array of ``shape`` can be a value of this type: the same rank and
        every static size (a symbolic one takes any)."""
        return len(shape) == len(self.shape) and all(
            not isinstance(d, int) or d == n for d, n in zip(self.shape, shape, strict=True))

    def elements_bound(self, cap: int) -> int:
        """Its elements, or ``cap`` when a size is known only at run time (what a receiver
        allows a message of this type)."""
        return self.size_estimate(1) if self.is_static else cap

    @property
    def symbols(self) -> frozenset[str]:
        """The symbols the shape depends on."""
        return frozenset().union(*(symbols_of(d) for d in self.shape))

    def __str__(self) -> str:
        return f"{_DTYPE_SHORT[self.dtype]}[{','.join(dim_text(d) for d in self.shape)}]"


def _is_int(d: Any) -> bool:
    try:
        return int(d) == d and not isinstance(d, str)
    except Exception:  # a symbolic expression is no int (JAX raises its own error)
        return False


def scalar(dtype: object) -> TensorType:
    """The rank-0 tensor type of ``dtype``."""
    return TensorType.of(dtype, ())


@dataclass(frozen=True)
class MPType:
    """A multi-party type: a base type plus the parties holding it (``None``: known at run time)."""

    base: BaseType
    pmask: Mask | None

    def __str__(self) -> str:
        return f"{self.base}@{self.pmask if self.pmask is not None else '?'}"

    def with_pmask(self, pmask: Mask | None) -> MPType:
        """The same base type held by ``pmask``."""
        return MPType(self.base, pmask)


ValueType = BaseType | MPType
"""Values in a party-local region carry a bare `BaseType`; values at the simp level an `MPType`."""


def numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype called ``name`` (``bfloat16`` comes from ml_dtypes)."""
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)
