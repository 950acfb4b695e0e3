"""Pytrees: flatten nested tuples, lists, dicts and dataclasses into leaves and back.

Tree definitions are plain data so a compiled program can store the shape of
its inputs and outputs in its serialized form.
"""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mplang.edsl.typing import BaseType, Mask, MPType


@dataclass(frozen=True)
class TreeDef:
    """The structure of a pytree. ``kind`` is leaf, none, tuple, list, dict or dataclass.

    ``meta`` holds dict keys (sorted) or a dataclass's ``(module, qualname, fields)``.
    """

    kind: str
    children: tuple[TreeDef, ...] = ()
    meta: tuple[Any, ...] = ()
    node_type: type | None = field(default=None, compare=False, repr=False)
    """The dataclass itself when known in this process (not serialized)."""

    @property
    def num_leaves(self) -> int:
        if self.kind == "leaf":
            return 1
        return sum(c.num_leaves for c in self.children)

    def to_json(self) -> Any:
        return {"kind": self.kind, "children": [c.to_json() for c in self.children],
                "meta": list(self.meta)}

    @staticmethod
    def from_json(data: Any) -> TreeDef:
        if not isinstance(data, dict) or set(data) != {"kind", "children", "meta"}:
            raise ValueError("malformed tree definition")
        kind = data["kind"]
        if kind not in _KINDS or not isinstance(data["children"], list):
            raise ValueError(f"malformed tree definition kind {kind!r}")
        meta = data["meta"]
        if not isinstance(meta, list):
            raise ValueError("malformed tree definition meta")
        if kind == "dict" and not all(isinstance(k, (str, int, float, bool)) for k in meta):
            raise ValueError("dict keys in a tree definition must be scalars")
        if kind == "dataclass":
            names_ok = len(meta) == 3 and isinstance(meta[2], list) \
                and all(isinstance(x, str) for x in [*meta[:2], *meta[2]])
            if not names_ok:
                raise ValueError("malformed dataclass tree definition")
            meta = [meta[0], meta[1], tuple(meta[2])]
        children = tuple(TreeDef.from_json(c) for c in data["children"])
        return TreeDef(kind, children, tuple(meta))


_KINDS = {"leaf", "none", "tuple", "list", "dict", "dataclass"}
_ATOMIC_DATACLASSES = (BaseType, MPType, Mask)
"""MPLang's own value-like dataclasses are leaves, never containers."""
LEAF = TreeDef("leaf")
_NONE = TreeDef("none")
_EMPTY_TUPLE = TreeDef("tuple")
_EMPTY_DICT = TreeDef("dict")


_CONTAINER_CLASSES: dict[type, bool] = {}
"""Class -> whether its instances are dataclasses to flatten (cached: leaves are common)."""


def _is_container_dataclass(cls: type) -> bool:
    known = _CONTAINER_CLASSES.get(cls)
    if known is None:
        known = _CONTAINER_CLASSES[cls] = (
            dataclasses.is_dataclass(cls) and not issubclass(cls, (*_ATOMIC_DATACLASSES, type)))
    return known


def tree_flatten(tree: Any) -> tuple[list[Any], TreeDef]:
    """Leaves in a deterministic order (dict keys sorted) and the tree's structure."""
    leaves: list[Any] = []
    return leaves, _flatten(tree, leaves)


def _flatten(tree: Any, leaves: list[Any]) -> TreeDef:
    if tree is None:
        return _NONE
    if type(tree) is tuple:
        return TreeDef("tuple", tuple([_flatten(c, leaves) for c in tree])) if tree else \
            _EMPTY_TUPLE
    if type(tree) is list:
        return TreeDef("list", tuple([_flatten(c, leaves) for c in tree]))
    if type(tree) is dict:
        if not tree:
            return _EMPTY_DICT
        keys = sorted(tree, key=repr)
        return TreeDef("dict", tuple(_flatten(tree[k], leaves) for k in keys), tuple(keys))
    if _is_container_dataclass(type(tree)):
        names = tuple(f.name for f in dataclasses.fields(tree))
        cls = type(tree)
        children = tuple(_flatten(getattr(tree, n), leaves) for n in names)
        return TreeDef("dataclass", children, (cls.__module__, cls.__qualname__, names), cls)
    leaves.append(tree)
    return LEAF


def leaf_paths(treedef: TreeDef) -> list[str]:
    """Each leaf's path in ``treedef``'s order, written as Python would index it:
    ``[1]['w']`` (sequence index, then dict key), ``.field`` for a dataclass field,
    ``""`` for a tree that is one leaf."""
    paths: list[str] = []

    def walk(node: TreeDef, prefix: str) -> None:
        if node.kind == "leaf":
            paths.append(prefix)
        elif node.kind in ("tuple", "list"):
            for i, child in enumerate(node.children):
                walk(child, f"{prefix}[{i}]")
        elif node.kind == "dict":
            for key, child in zip(node.meta, node.children, strict=True):
                walk(child, f"{prefix}[{key!r}]")
        elif node.kind == "dataclass":
            for name, child in zip(node.meta[2], node.children, strict=True):
                walk(child, f"{prefix}.{name}")

    walk(treedef, "")
    return paths


def tree_unflatten(treedef: TreeDef, leaves: list[Any]) -> Any:
    """Rebuild a tree of ``treedef``'s shape from ``leaves``."""
    it = iter(leaves)
    result = _unflatten(treedef, it)
    if next(it, _END) is not _END:
        raise ValueError("too many leaves for tree definition")
    return result


_END = object()


def _unflatten(treedef: TreeDef, it: Any) -> Any:
    kind = treedef.kind
    if kind == "leaf":
        leaf = next(it, _END)
        if leaf is _END:
            raise ValueError("too few leaves for tree definition")
        return leaf
    if kind == "none":
        return None
    children = [_unflatten(c, it) for c in treedef.children]
    if kind == "tuple":
        return tuple(children)
    if kind == "list":
        return children
    if kind == "dict":
        return dict(zip(treedef.meta, children, strict=True))
    module, qualname, names = treedef.meta
    fields = dict(zip(names, children, strict=True))
    cls = treedef.node_type or _loaded_class(module, qualname)
    return cls(**fields) if cls is not None else fields


def _loaded_class(module: str, qualname: str) -> Callable[..., Any] | None:
    """The dataclass if its module is already imported; nothing is imported here."""
    obj: Any = sys.modules.get(module)
    for part in qualname.split("."):
        obj = getattr(obj, part, None)
    return obj if isinstance(obj, type) and dataclasses.is_dataclass(obj) else None


def tree_map(fn: Callable[[Any], Any], tree: Any) -> Any:
    leaves, treedef = tree_flatten(tree)
    return tree_unflatten(treedef, [fn(x) for x in leaves])
