"""The op registry: every primitive registers here once, with its metadata.

Reflection (`list_ops`, `describe`) reads this registry; the deserializer and
the verifier use it to refuse op names nobody defined.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal

OpKind = Literal["compute", "communication", "control_flow", "source", "call"]
ExecutionModel = Literal["single_rank", "multi_party", "any"]


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
    side_effects: bool
    doc: str


_OPS: dict[str, OpInfo] = {}


def register_op(info: OpInfo) -> None:
    """Add ``info``; registering one name twice is an error."""
    if info.name in _OPS:
        raise ValueError(f"op {info.name!r} is already registered")
    if not info.name.startswith(info.dialect + "."):
        raise ValueError(f"op {info.name!r} must be prefixed by its dialect {info.dialect!r}")
    _OPS[info.name] = info


def get_op(name: str) -> OpInfo:
    try:
        return _OPS[name]
    except KeyError:
        raise KeyError(f"unknown op {name!r}") from None


def is_registered(name: str) -> bool:
    return name in _OPS


def list_ops(dialect: str | None = None) -> list[OpInfo]:
    """All registered ops (of one dialect if given), sorted by name."""
    return sorted(
        (i for i in _OPS.values() if dialect is None or i.dialect == dialect),
        key=lambda i: i.name,
    )


def describe(name: str) -> dict[str, object]:
    """The metadata of op ``name`` as a plain dict."""
    return asdict(get_op(name))
