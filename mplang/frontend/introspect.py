"""Reflection over frontend ops: listing, lookup, capabilities and descriptions."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from mplang.edsl.attrs import ConfigSchema, plain
from mplang.edsl.primitive import Primitive, get_primitive, primitives
from mplang.frontend.feop import FeOpInfo, meta, registered
from mplang.frontend.routing import mismatch

DeviceProfile = tuple[str, bool, int]
"""A device kind as routing sees it: (kind name, joint, typical member count)."""

_DEVICE_PROFILES: dict[str, DeviceProfile] = {}
_SECURITY_MODELS: dict[str, str] = {}


def register_device_profile(kind: str, joint: bool, members: int, *,
                            security_model: str = "") -> None:
    """Let `describe` list ``kind`` among an op's routes, with the security model its
    devices offer (device kinds call this)."""
    _DEVICE_PROFILES[kind] = (kind, joint, members)
    _SECURITY_MODELS[kind] = security_model


def list_ops(family: str | None = None) -> list[FeOpInfo]:
    """Metadata of every registered frontend op (of one family if given), by name."""
    infos = [meta(op) for op in registered()]
    return [i for i in infos if family is None or i.family == family]


def list_frontends() -> list[str]:
    """The families that have registered ops."""
    return sorted({meta(op).family for op in registered()})


def find(family: str | None, predicate: Callable[[FeOpInfo], bool]) -> list[Callable[..., Any]]:
    """The ops of ``family`` (None: all) whose metadata satisfies ``predicate``."""
    return [op for op in registered()
            if (family is None or meta(op).family == family) and predicate(meta(op))]


def capabilities(op: Callable[..., Any] | str) -> dict[str, Any]:
    """The op's capability constraints (a deep copy: changing it changes no op)."""
    return copy.deepcopy(dict(meta(op).capabilities))


def config_schema(op: Callable[..., Any] | str) -> ConfigSchema | None:
    """The op's configuration schema (None: it takes no configuration)."""
    return meta(op).config_schema


def routes(op: Callable[..., Any] | str | FeOpInfo) -> list[str]:
    """The registered device kinds ``op`` may run on."""
    info = op if isinstance(op, FeOpInfo) else meta(op)
    return [kind for kind, joint, members in sorted(_DEVICE_PROFILES.values())
            if mismatch(info, kind, joint, members) is None]


PLAINTEXT_MODEL = ("plaintext across parties: each party holding a value sees it; a value "
                   "that moves travels in the clear inside mutual TLS, and its owner's "
                   "policy decides where it may go")
"""The security model of simp-level ops, which run on no device."""


def describe_primitive(prim: Primitive | str) -> dict[str, Any]:
    """A primitive's whole contract as plain data (JSON-able): its declaration (operands,
    attributes, results, regions, traits, targets), kernels per runtime, its type,
    flow and cost rules, and ``security``: the model of each device kind it targets (a
    party-local op without targets runs on a PPU; a simp-level one on no device)."""
    p = prim if isinstance(prim, Primitive) else get_primitive(prim)
    if p is None:
        raise KeyError(f"unknown primitive {prim!r}")
    out = p.describe()
    if p.targets:
        out["security"] = {kind: _SECURITY_MODELS.get(kind, "") for kind in p.targets}
    elif p.execution_model == "single_rank":
        out["security"] = {"PPU": _SECURITY_MODELS.get("PPU", "")}
    else:
        out["security"] = {"simp": PLAINTEXT_MODEL}
    return out


def list_primitives(dialect: str | None = None) -> list[dict[str, Any]]:
    """Every declared primitive's contract (`describe_primitive`), sorted by name; of one
    dialect if given."""
    return [describe_primitive(p) for p in primitives(dialect)]


def describe(op: Callable[..., Any] | str) -> dict[str, Any]:
    """Everything known about a primitive or a frontend op, as plain data.

    A frontend op (or its name) gives its metadata, the device kinds it routes to
    (``routes``) with the security model of each (``security``: who must be honest for
    such a device to keep its inputs private), an example, and the contracts of the
    primitives it emits. A primitive's name gives its contract (`describe_primitive`),
    together with the metadata of the frontend op of the same name if there is one."""
    try:
        info = meta(op)
    except KeyError:
        if not isinstance(op, str) or get_primitive(op) is None:
            raise
        return describe_primitive(op)
    prim = get_primitive(info.name)
    out = plain(asdict(info))
    out["config_schema"] = None if info.config_schema is None else info.config_schema.to_dict()
    out["routes"] = routes(info)
    out["security"] = {kind: _SECURITY_MODELS.get(kind, "") for kind in out["routes"]}
    out["primitives"] = [describe_primitive(p) for p in info.primitives
                         if get_primitive(p) is not None]
    if prim is not None:
        contract = describe_primitive(prim)
        contract["security"] = out["security"] | contract["security"]
        out.update(contract)
    elif out["primitives"] and len(info.primitives) == 1:
        first = out["primitives"][0]
        out.update(dialect=first["dialect"], kind=first["kind"], traits=first["traits"])
    return out
