"""`MPObject`: the user-facing handle of a typed multi-party value.

Two kinds exist: trace objects (a `Value` in a graph being built) and runtime
objects (values that live on the parties). Python operators on either are
forwarded to an operator table that the tensor dialect fills at import time,
so this module depends on no dialect.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mplang.edsl.errors import MPConcreteValueError, MPTraceError
from mplang.edsl.location import caller_location, locate_error
from mplang.edsl.typing import BaseType, Dim, Mask, MPType, TensorType, ValueType

OperatorImpl = Callable[..., Any]
OPERATORS: dict[str, OperatorImpl] = {}
"""Operator name (``add``, ``getitem`` …) to implementation; filled by the tensor dialect."""
_TYPE_OPERATORS: dict[tuple[str, type[BaseType]], OperatorImpl] = {}
AttributeImpl = Callable[["MPObject", str], Any]
_TYPE_ATTRIBUTES: dict[type[BaseType], AttributeImpl] = {}

USES = {
    "bool": "Python `if`/`while`/`and`/`or`/`not` needs the truth value of",
    "iter": "Python `for` and unpacking cannot iterate over",
    "int": "int() needs the value of",
    "float": "float() needs the value of",
    "index": "a Python integer (range(), an index, a size) needs the value of",
    "array": "numpy (np.asarray, np.mean, ...) needs the data of",
}
"""What each Python construct that needs a concrete value asks of an MPLang value."""


def register_type_operator(name: str, base: type[BaseType]) -> Callable[[OperatorImpl],
                                                                         OperatorImpl]:
    """Register the party-local implementation of operator ``name`` (``add``,
    ``multiply`` …) when an operand's base type is ``base`` (a ciphertext, say): a
    dialect's own meaning of ``a + b`` for its values."""
    def deco(impl: OperatorImpl) -> OperatorImpl:
        if (name, base) in _TYPE_OPERATORS:
            raise ValueError(f"operator {name!r} on {base.__name__} is already registered")
        _TYPE_OPERATORS[(name, base)] = impl
        return impl

    return deco


def type_operator(name: str, operands: tuple[Any, ...]) -> OperatorImpl | None:
    """The implementation registered for operator ``name`` on the first operand whose
    base type has one (None: the tensor meaning applies)."""
    for x in operands:
        if isinstance(x, MPObject):
            impl = _TYPE_OPERATORS.get((name, type(x.base_type)))
            if impl is not None:
                return impl
    return None


def register_type_attributes(base: type[BaseType]) -> Callable[[AttributeImpl], AttributeImpl]:
    """Register ``impl(obj, name)``: the attributes (``c.sum`` …) of a traced value whose
    base type is ``base`` (a ciphertext, say), in place of the array methods JAX gives a
    tensor; it raises for a name it does not have."""
    def deco(impl: AttributeImpl) -> AttributeImpl:
        if base in _TYPE_ATTRIBUTES:
            raise ValueError(f"attributes of {base.__name__} are already registered")
        _TYPE_ATTRIBUTES[base] = impl
        return impl

    return deco


def type_attributes(base: BaseType) -> AttributeImpl | None:
    """The attributes registered for values of ``base``'s type (None: a tensor's)."""
    return _TYPE_ATTRIBUTES.get(type(base))


def _apply(name: str, *operands: Any) -> Any:
    impl = OPERATORS.get(name)
    if impl is None:
        raise MPTraceError(f"operator {name!r} is not available: import mplang.dialects.tensor")
    return impl(*operands)


class MPObject:
    """A typed multi-party value (traced or held by the parties)."""

    __slots__ = ()
    __mplang_object__ = True
    """Marks MPLang objects for modules that must not import this one (state checks)."""

    @property
    def mptype(self) -> ValueType:
        """The value's type: an `MPType` at the simp level, a bare `BaseType` in a local region."""
        raise NotImplementedError

    @property
    def device(self) -> str | None:
        """The device this value was placed on by the device layer (None: simp level)."""
        return None

    @property
    def pmask(self) -> Mask | None:
        """The parties holding the value (None: known only at run time, or a local value)."""
        t = self.mptype
        return t.pmask if isinstance(t, MPType) else None

    @property
    def base_type(self) -> BaseType:
        """What the value is (tensor, table, share, ...), without its placement."""
        t = self.mptype
        return t.base if isinstance(t, MPType) else t

    @property
    def dtype(self) -> str:
        """The numpy dtype name of a tensor value; AttributeError for other base types."""
        base = self.base_type
        if not isinstance(base, TensorType):
            raise AttributeError(f"{base} has no dtype")
        return base.dtype

    @property
    def shape(self) -> tuple[Dim, ...]:
        """The shape of a tensor value; AttributeError for other base types."""
        base = self.base_type
        if not isinstance(base, TensorType):
            raise AttributeError(f"{base} has no shape")
        return base.shape

    @property
    def ndim(self) -> int:
        """The number of dimensions of a tensor value."""
        return len(self.shape)

    def _needs_value(self, use: str) -> Exception:
        """The error for Python needing this object's concrete value (``use`` names the
        construct: `USES`): a runtime object lives on the parties, so fetch it first."""
        remedy = ("branch on what it returns, or branch inside the program with "
                  "simp.uniform_cond" if use == "bool" else "use what it returns")
        return MPConcreteValueError(
            f"{USES[use]} {self!r}, which lives on the parties, not in this Python process; "
            f"fetch it first with mp.fetch(ctx, x) (one value per party, or a device object's "
            f"plain value) and {remedy}")

    def _concrete(self, use: str) -> Exception:
        error = self._needs_value(use)
        locate_error(error, caller_location())
        return error

    def __bool__(self) -> bool:
        raise self._concrete("bool")

    def __iter__(self) -> Any:
        raise self._concrete("iter")

    def __int__(self) -> int:
        raise self._concrete("int")

    def __float__(self) -> float:
        raise self._concrete("float")

    def __index__(self) -> int:
        raise self._concrete("index")

    def __array__(self, *args: Any, **kwargs: Any) -> Any:
        raise self._concrete("array")

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("len() of a scalar")
        if not isinstance(self.shape[0], int):
            raise TypeError(f"len() of a value of {self.shape[0]} rows, known at run time only")
        return self.shape[0]

    __hash__ = object.__hash__
    __array_ufunc__ = None  # numpy defers to our reflected operators (np.array(...) + obj)

    # Arithmetic and comparison operators, forwarded to the operator table.
    def __add__(self, o: Any) -> Any: return _apply("add", self, o)
    def __radd__(self, o: Any) -> Any: return _apply("add", o, self)
    def __sub__(self, o: Any) -> Any: return _apply("subtract", self, o)
    def __rsub__(self, o: Any) -> Any: return _apply("subtract", o, self)
    def __mul__(self, o: Any) -> Any: return _apply("multiply", self, o)
    def __rmul__(self, o: Any) -> Any: return _apply("multiply", o, self)
    def __truediv__(self, o: Any) -> Any: return _apply("divide", self, o)
    def __rtruediv__(self, o: Any) -> Any: return _apply("divide", o, self)
    def __floordiv__(self, o: Any) -> Any: return _apply("floor_divide", self, o)
    def __rfloordiv__(self, o: Any) -> Any: return _apply("floor_divide", o, self)
    def __mod__(self, o: Any) -> Any: return _apply("remainder", self, o)
    def __rmod__(self, o: Any) -> Any: return _apply("remainder", o, self)
    def __pow__(self, o: Any) -> Any: return _apply("power", self, o)
    def __rpow__(self, o: Any) -> Any: return _apply("power", o, self)
    def __matmul__(self, o: Any) -> Any: return _apply("matmul", self, o)
    def __rmatmul__(self, o: Any) -> Any: return _apply("matmul", o, self)
    def __lt__(self, o: Any) -> Any: return _apply("less", self, o)
    def __le__(self, o: Any) -> Any: return _apply("less_equal", self, o)
    def __gt__(self, o: Any) -> Any: return _apply("greater", self, o)
    def __ge__(self, o: Any) -> Any: return _apply("greater_equal", self, o)
    def __eq__(self, o: Any) -> Any: return _apply("equal", self, o)
    def __ne__(self, o: Any) -> Any: return _apply("not_equal", self, o)
    def __neg__(self) -> Any: return _apply("negative", self)
    def __getitem__(self, index: Any) -> Any: return _apply("getitem", self, index)
