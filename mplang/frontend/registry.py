"""The primitive registry: every IR op registers here once, with its metadata and traits.

The deserializer and the verifier use it to refuse op names nobody defined;
passes, the scheduler and the analysis read an op's `OpTraits` instead of
keeping tables of op names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

OpKind = Literal["compute", "communication", "control_flow", "source", "call"]
"""What an op does: computes, moves data between parties, runs regions, produces
data (constants, loads), or calls a function."""
ExecutionModel = Literal["single_rank", "multi_party", "any"]
"""Where an op may appear (see `OpInfo`)."""
RegionUse = Literal["call", "branch", "loop"]
"""How an op runs its regions (see `OpTraits`)."""
Runtime = Literal["worker", "driver"]
"""A runtime that executes kernels: a party's worker or the driver."""

CostRule = Callable[[Any, Any], Any]
"""``rule(op, cost_model) -> OpCost`` (see `mplang.analysis.cost_model`)."""


@dataclass(frozen=True)
class OpTraits:
    """What passes, the scheduler and the analysis may assume about an op.

    The defaults are the safe ones, so an op that declares nothing works with
    every pass: it has effects (keeps its program order, is never removed or
    merged), may communicate, is never fused or batched, and costs one local op.

    - ``pure``: no side effects (I/O, randomness, host calls); its result depends
      on its inputs and attributes only.
    - ``communicates``: its kernel may exchange messages between parties. For an op
      with ``regions="call"``, False means: local when its regions are.
    - ``regions``: how its regions run: ``call`` (each once, in place), ``branch``
      (one of them, chosen by a uniform predicate), ``loop`` (cond and body repeated).
    - ``fusable``: two adjacent such ops of one name, with one region and the
      attributes ``parties`` (a known mask) and ``fn``, may run as one (their
      regions concatenated), as ``simp.pcall`` does.
    - ``batchable``: several such ops of one name with equal ``routes`` may move as
      one op with several inputs and outputs, as ``simp.shuffle_static`` does.
    - ``cost``: estimated seconds and rounds for the analysis (None: a local op).
    - ``runtimes``: the runtimes that must have a kernel for it.
    """

    pure: bool = False
    communicates: bool = True
    regions: RegionUse | None = None
    fusable: bool = False
    batchable: bool = False
    cost: CostRule | None = field(default=None, compare=False)
    runtimes: tuple[Runtime, ...] = ("worker",)


WORKER_AND_DRIVER: tuple[Runtime, ...] = ("worker", "driver")
"""The runtimes of a multi-party op: workers run it, the driver dispatches it."""
LOCAL_PURE = OpTraits(pure=True, communicates=False)
"""Traits of a party-local computation without side effects."""


@dataclass(frozen=True)
class OpInfo:
    """Metadata of one registered primitive.

    ``execution_model``: ``single_rank`` ops run inside one party's local region
    (``pcall`` bodies), ``multi_party`` ops at the simp level across parties,
    ``any`` at either level.
    """

    name: str
    dialect: str
    kind: OpKind
    execution_model: ExecutionModel
    doc: str
    traits: OpTraits = OpTraits()

    @property
    def side_effects(self) -> bool:
        """Whether the op has effects (not ``traits.pure``)."""
        return not self.traits.pure


_OPS: dict[str, OpInfo] = {}


def register_op(info: OpInfo) -> None:
    """Add ``info``; registering one name twice is an error."""
    if info.name in _OPS:
        raise ValueError(f"op {info.name!r} is already registered")
    if not info.name.startswith(info.dialect + "."):
        raise ValueError(f"op {info.name!r} must be prefixed by its dialect {info.dialect!r}")
    _OPS[info.name] = info


def get_op(name: str) -> OpInfo:
    """The metadata of op ``name``; KeyError if it is not registered."""
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


def is_registered(name: str) -> bool:
    """Whether an op called ``name`` is registered."""
    return name in _OPS


_UNKNOWN = OpTraits()


def traits_of(name: str) -> OpTraits:
    """The traits of op ``name``; an unregistered name gets the safe defaults."""
    info = _OPS.get(name)
    return _UNKNOWN if info is None else info.traits


def list_primitives(dialect: str | None = None) -> list[OpInfo]:
    """All registered primitives (of one dialect if given), sorted by name."""
    return sorted(
        (i for i in _OPS.values() if dialect is None or i.dialect == dialect),
        key=lambda i: i.name,
    )


def describe_primitive(name: str) -> dict[str, Any]:
    """The metadata of primitive ``name`` as a plain dict (traits included)."""
    info = get_op(name)
    t = info.traits
    return {"name": info.name, "dialect": info.dialect, "kind": info.kind,
            "execution_model": info.execution_model, "side_effects": info.side_effects,
            "doc": info.doc,
            "traits": {"pure": t.pure, "communicates": t.communicates, "regions": t.regions,
                       "fusable": t.fusable, "batchable": t.batchable,
                       "cost": None if t.cost is None else getattr(t.cost, "__name__", "rule"),
                       "runtimes": list(t.runtimes)}}
