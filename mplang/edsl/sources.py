"""Types of private inputs, looked up while tracing.

A party's data (files in its data root, objects its owner uploaded) never passes
through the driver; only its type does. The execution context a program is
traced for (a simulator or a driver) answers `DataSource` questions (arrays and
uploaded objects) and `InputDescriber` questions (any other registered kind of
input, e.g. a table file), each asked of the party that holds the data.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

from mplang.edsl.context import execution_context
from mplang.edsl.errors import MPLangError, MPTypeError
from mplang.edsl.location import locate_error
from mplang.edsl.tracer import Tracer
from mplang.edsl.typing import BaseType, TensorType


@runtime_checkable
class DataSource(Protocol):
    """An execution context that can tell the types of the parties' private inputs."""

    def describe_data(self, rank: int, path: str, key: str | None) -> TensorType:
        """The type of array ``path`` (member ``key`` of an ``.npz``) in party ``rank``'s
        data root."""
        ...

    def describe_object(self, rank: int, name: str) -> TensorType:
        """The type of the object party ``rank``'s owner uploaded as ``name``."""
        ...


@runtime_checkable
class InputDescriber(Protocol):
    """An execution context that can tell the type of any kind of private input a party's
    data root holds (a table file, ...)."""

    def describe_input(self, rank: int, fields: Mapping[str, Any]) -> BaseType:
        """The type of the input ``fields`` name on party ``rank``: ``fields["what"]`` is
        the kind (e.g. ``"table"``), the other fields say which (e.g. ``path``)."""
        ...


B = TypeVar("B", bound=BaseType)


def declared_type(op: str, dtype: Any, shape: Any) -> TensorType | None:
    """The type given by ``dtype=``/``shape=`` (None when neither is given)."""
    if dtype is None and shape is None:
        return None
    if dtype is None or shape is None:
        raise MPTypeError(f"{op}: pass both dtype= and shape= (or neither, to take the type "
                          "from the data)")
    try:
        return TensorType.of(dtype, shape)
    except (TypeError, ValueError) as e:
        raise MPTypeError(f"{op}: dtype={dtype!r}, shape={shape!r} is not a tensor type "
                          f"({e})") from None


def looked_up_type(op: str, what: str, tracer: Tracer, parties: Iterable[int] | None,
                   ask: Callable[[Any, int], B], *, source: type = DataSource,
                   declare: str = "pass dtype= and shape=") -> B:
    """The type of ``what`` on each of ``parties``, asked of the context ``tracer`` traces
    for (which must implement the protocol ``source``); every party must report the same
    type. ``declare`` tells the user how to give the type instead."""
    ctx = tracer.executor or execution_context()
    if not isinstance(ctx, source):
        raise MPTypeError(f"{op}: the type of {what} cannot be looked up while compiling "
                          f"without a simulator or driver to ask; {declare}, or compile with "
                          "one that has the data (`mplang ir --data-root DIR` or `--cluster "
                          "F`)")
    if parties is None:
        raise MPTypeError(f"{op}: the parties that read {what} are decided at run time, so "
                          f"its type cannot be looked up; {declare}")
    found: dict[int, B] = {}
    for rank in parties:
        try:
            found[rank] = ask(ctx, rank)
        except MPLangError as e:
            locate_error(e)
            raise
    if not found:
        raise MPTypeError(f"{op}: no party reads {what}")
    if len(set(found.values())) > 1:
        detail = ", ".join(f"party {r}: {t}" for r, t in found.items())
        raise MPTypeError(f"{op}: {what} has different types on the parties ({detail}); "
                          "every party of one pcall must load the same type")
    return next(iter(found.values()))
