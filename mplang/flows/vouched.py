"""Library functions whose small groups a secure device suppresses, or that add noise
for a differentially private release, and its members vouch for.

How many of a party's rows a group holds can depend on data (a group-by over
another party's keys): the flow analysis then sees an aggregate over a
data-dependent number of rows, which no ``min_rows`` rule accepts. A library
function that sets every group of fewer than ``min_rows`` rows to zero inside the
secure device registers itself with `suppressing`. A device op running it names the
function and its static arguments (attributes ``library`` and ``library_args``).
Each member lowers the registered function itself for the op's input types (the
device's ``derive``); only if that gives exactly the StableHLO the op carries (which
the worker checks compiles to what runs) does the device's flow rule count the
outputs' data-dependent aggregates as over groups of at least ``min_rows`` rows.

A function that releases its result with noise calibrated to a privacy loss
``epsilon`` registers itself with `releasing`; vouched for the same way, the device's
flow rule labels its outputs as a ``dp`` release of that epsilon
(`mplang.flows.dp_flows`). A driver that names a smaller epsilon than the noise the
op adds gets StableHLO that differs from the members' own, and no vouching.

A function whose release its owners approve by name (a policy's ``approve:
- {library: mplang.libs.linear.train_vertical_lr, to: [...]}``) registers itself with
`approvable`, naming the public function it serves; vouched for the same way, its
outputs are labelled ``approved`` (`mplang.flows.labels.approved`), whatever its
inputs: an approval trusts the function with any inputs and static arguments.
"""

from __future__ import annotations

import functools
import importlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from mplang.edsl.graph import Operation
from mplang.edsl.typing import TensorType

F = TypeVar("F", bound=Callable[..., Any])
Derive = Callable[[Callable[..., Any], tuple[TensorType, ...]], str]
"""``derive(fn, input types)``: the StableHLO text a device lowers ``fn`` to."""
LIBRARY_PACKAGE = "mplang.libs."
"""The only package whose modules a name in a received program may import."""


@dataclass(frozen=True)
class Suppressing:
    """A registered function: ``fn(*static, *shares)`` (``static``: ints and floats);
    the int ``static[min_rows_arg]`` is the fewest rows a group it releases holds."""

    fn: Callable[..., Any]
    min_rows_arg: int
    partition: bool = False
    """Its groups cover every row and none is suppressed (no group is that small)."""
    release: str = ""
    """The public function it serves: a party whose own rows choose the groups of
    another's values (it holds the keys, the bins) releases those values' sums over its
    groups, no aggregate of its rows; they are ``approved`` outputs of this function."""


@dataclass(frozen=True)
class Releasing:
    """A registered function: ``fn(*static, *entropy, *data)`` returns its result with
    noise of privacy loss ``static[epsilon_arg]``, drawn from ``entropy``: one input of
    uniform random words per member of the device, in member order, ``static[members_arg]``
    of them."""

    fn: Callable[..., Any]
    epsilon_arg: int
    members_arg: int
    mechanism: str


@dataclass(frozen=True)
class Approvable:
    """A registered function whose outputs are the release of public library function
    ``release`` (``mplang.libs.linear.train_vertical_lr``), which owners approve by name."""

    fn: Callable[..., Any]
    release: str


Entry = Suppressing | Releasing | Approvable
_REGISTRY: dict[str, Entry] = {}
_NAMES: dict[Callable[..., Any], str] = {}


def suppressing(min_rows_arg: int, release: str, partition: bool = False
                ) -> Callable[[F], F]:
    """Register a function of ``mplang.libs`` that suppresses, inside the secure device,
    every group of fewer than its static argument ``min_rows_arg`` rows (``partition``:
    that forms no such group, and its groups cover every row), serving the public
    function ``release`` of the same module."""
    return lambda fn: _register(fn, Suppressing(fn, min_rows_arg, partition,
                                                f"{fn.__module__}.{release}"))


def releasing(epsilon_arg: int, members_arg: int, mechanism: str) -> Callable[[F], F]:
    """Register a function of ``mplang.libs`` that adds noise of privacy loss (its static
    argument) ``epsilon_arg`` inside the secure device, from one input of random words per
    member (`Releasing`); ``mechanism`` names its noise for readers."""
    return lambda fn: _register(fn, Releasing(fn, epsilon_arg, members_arg, mechanism))


def approvable(release: str) -> Callable[[F], F]:
    """Register a device function of ``mplang.libs`` whose outputs are the release of the
    public function ``release`` of the same module (its name there)."""
    return lambda fn: _register(fn, Approvable(fn, f"{fn.__module__}.{release}"))


def _register(fn: F, entry: Entry) -> F:
    name = f"{fn.__module__}.{fn.__qualname__}"
    if not name.startswith(LIBRARY_PACKAGE):
        raise ValueError(f"{name}: only functions of {LIBRARY_PACKAGE[:-1]} register here")
    _REGISTRY[name] = entry
    _NAMES[fn] = name
    return fn


def library_attrs(fn: Callable[..., Any]) -> dict[str, Any]:
    """The device op's attributes naming ``fn`` when it is a registered function with its
    static arguments bound (`bind`); empty otherwise."""
    name = _NAMES.get(getattr(fn, "__wrapped__", None))  # type: ignore[arg-type]
    static = getattr(fn, "static_args", None)
    if name is None or not _plain_args(static):
        return {}
    return {"library": name, "library_args": static}


def _lookup(name: str) -> Entry | None:
    if name not in _REGISTRY and name.startswith(LIBRARY_PACKAGE):
        try:
            importlib.import_module(name.rpartition(".")[0])
        except ImportError:
            return None
    return _REGISTRY.get(name)


@functools.lru_cache(maxsize=512)
def bind(fn: Callable[..., Any], *static: Any) -> Callable[..., Any]:
    """``fn`` with its leading arguments fixed to the (hashable) ``static`` ones: one
    function object per (fn, static), so devices' compile caches hit, and every
    argument left is a device value (as a TEE requires)."""
    @functools.wraps(fn)
    def bound(*args: Any) -> Any:
        return fn(*static, *args)

    bound.static_args = static  # type: ignore[attr-defined]  # read by `library_attrs`
    return bound


@functools.lru_cache(maxsize=256)
def _derived(name: str, static: tuple[int | float, ...], in_types: tuple[TensorType, ...],
             derive: Derive) -> str | None:
    """The StableHLO text this member lowers registered ``name`` to, for ``in_types``."""
    entry = _lookup(name)
    if entry is None:
        return None
    try:
        return derive(bind(entry.fn, *static), in_types)
    except Exception:  # a malformed static argument: nothing is vouched for
        return None


def vouched(op: Operation, stablehlo: str, derive: Derive,
            in_types: tuple[TensorType, ...] | None = None) -> Entry | None:
    """The registered function that device op ``op`` names, if its StableHLO
    ``stablehlo`` is what this member derives for its inputs' types (``in_types``, default
    the op's attribute); None otherwise."""
    name, static = op.attrs.get("library", ""), op.attrs.get("library_args", ())
    if not name or not _plain_args(static):
        return None
    entry = _lookup(name)
    if entry is None or not _valid(entry, static):
        return None
    types = tuple(op.attrs["in_types"]) if in_types is None else in_types
    if _derived(name, static, types, derive) != stablehlo:
        return None
    return entry


def _valid(entry: Entry, static: tuple[int | float, ...]) -> bool:
    """Whether ``static`` gives ``entry`` a valid bound: ``min_rows`` an int >= 1, or
    ``epsilon`` a number > 0 (an approved function takes any)."""
    if isinstance(entry, Approvable):
        return True
    if isinstance(entry, Releasing):
        if not 0 <= max(entry.epsilon_arg, entry.members_arg) < len(static):
            return False
        epsilon = static[entry.epsilon_arg]
        return type(epsilon) in (int, float) and 0 < epsilon < float("inf") and \
            type(static[entry.members_arg]) is int
    if not 0 <= entry.min_rows_arg < len(static):
        return False
    rows = static[entry.min_rows_arg]
    return type(rows) is int and rows >= 1


def min_rows_of(op: Operation, entry: Suppressing) -> int:
    """The ``min_rows`` that `vouched` ``entry`` enforces in device op ``op``."""
    rows: int = op.attrs["library_args"][entry.min_rows_arg]
    return rows


def _plain_args(static: Any) -> bool:
    """Whether ``static`` is a tuple of ints and floats (the static arguments a program
    may name)."""
    return isinstance(static, tuple) and all(type(s) in (int, float) for s in static)
