"""The API reference, ``docs/api.md``, generated from the docstrings of the public modules.

``mplang apidoc -o docs/api.md`` (or ``python -m mplang.cli.apidoc -o docs/api.md``)
rewrites the file; without ``-o`` the Markdown goes to stdout. The output depends only
on the code (no timestamps, no memory addresses, sets in sorted order), so a test can
compare it with the committed file. `missing_docstrings` lists the public names that
lack a docstring.

A module's public names are its ``__all__``; a module without one exports the
classes and functions it defines and the constants it assigns, minus names that
start with ``_``. A constant's docstring is the string literal that follows its
assignment.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import enum
import importlib
import inspect
import itertools
import pkgutil
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, TypeVar


@dataclass(frozen=True)
class PublicModule:
    """A module of the reference: the path users import it by and the module behind it."""

    name: str
    source: str
    group: str


_USER = "Writing programs"
_LIBS = "Libraries"
_TOOLS = "Analysis and optimization"
_EXTEND = "Extending MPLang"

_OTHER_MODULES: tuple[tuple[str, str], ...] = (
    ("mplang.analysis", _TOOLS),
    ("mplang.passes", _TOOLS),
    ("mplang.frontend", _EXTEND),
    ("mplang.edsl.typing", _EXTEND),
    ("mplang.edsl.primitive", _EXTEND),
    ("mplang.frontend.module", _EXTEND),
    ("mplang.runtime.backend", _EXTEND),
    ("mplang.transport.wire", _EXTEND),
    ("mplang.device.kinds", _EXTEND),
)
"""Modules documented besides the package's own exports and its libraries: the
packages of the analysis and the passes, and the modules ``docs/extending.md``
builds a plugin from."""


def public_modules() -> list[PublicModule]:
    """The modules the reference covers, in order: ``mplang``, the modules it exports
    (``mplang.simp``, ``mplang.tensor``...), each ``mplang.libs`` module that declares
    ``__all__``, then the analysis, the passes and the extension API."""
    package = importlib.import_module("mplang")
    modules = [PublicModule("mplang", "mplang", _USER)]
    for name in package.__all__:
        obj = getattr(package, name)
        if inspect.ismodule(obj):
            modules.append(PublicModule(f"mplang.{name}", obj.__name__, _USER))
    libs = importlib.import_module("mplang.libs")
    for info in sorted(pkgutil.iter_modules(libs.__path__), key=lambda i: i.name):
        lib = importlib.import_module(f"mplang.libs.{info.name}")
        if hasattr(lib, "__all__"):
            modules.append(PublicModule(lib.__name__, lib.__name__, _LIBS))
    modules += [PublicModule(name, name, group) for name, group in _OTHER_MODULES]
    return modules


@dataclass(frozen=True)
class Entry:
    """One documented object: a module's public name or a public member of a class."""

    name: str
    qualname: str
    kind: str
    signature: str | None
    doc: str | None
    members: tuple[Entry, ...] = ()
    inherited: tuple[tuple[str, tuple[str, ...]], ...] = ()
    see: str | None = None


@dataclass(frozen=True)
class ModuleDoc:
    """A module of the reference with its docstring and entries."""

    spec: PublicModule
    doc: str | None
    entries: tuple[Entry, ...]


# ---------------------------------------------------------------- collecting


def public_names(module: ModuleType) -> list[str]:
    """``module.__all__``, or the public classes, functions and constants it defines."""
    declared = getattr(module, "__all__", None)
    if declared is not None:
        return list(declared)
    assigned = _assigned_names(module.__name__)
    names = []
    for name, obj in vars(module).items():
        if name.startswith("_") or inspect.ismodule(obj) or isinstance(obj, TypeVar):
            continue
        defined_here = getattr(obj, "__module__", None) == module.__name__
        if (defined_here and (inspect.isclass(obj) or callable(obj))) or name in assigned:
            names.append(name)
    return sorted(names)


def collect(modules: Sequence[PublicModule] | None = None) -> list[ModuleDoc]:
    """The reference's content: each module's docstring and its entries, in order
    (default: `public_modules`).

    An object already listed under an earlier name becomes a cross-reference
    (``see``) to that name instead of a second copy.
    """
    if modules is None:
        modules = public_modules()
    sections = {id(importlib.import_module(spec.source)): spec.name for spec in modules}
    documented = _documented_classes(modules)
    seen: dict[int, str] = {}
    docs = []
    for spec in modules:
        module = importlib.import_module(spec.source)
        entries = []
        for name in public_names(module):
            obj = getattr(module, name)
            first = sections.get(id(obj)) if inspect.ismodule(obj) else seen.get(id(obj))
            if first is not None:
                entries.append(Entry(name, _origin(module, name, obj), _kind(obj), None, None,
                                     see=first))
                continue
            if _is_named(obj):
                seen[id(obj)] = f"{spec.name}.{name}"
            entries.append(_entry(module, name, obj, documented))
        docs.append(ModuleDoc(spec, _clean(module.__doc__), tuple(entries)))
    return docs


def _documented_classes(modules: Sequence[PublicModule]) -> dict[int, str]:
    found: dict[int, str] = {}
    for spec in modules:
        module = importlib.import_module(spec.source)
        for name in public_names(module):
            obj = getattr(module, name)
            if inspect.isclass(obj):
                found.setdefault(id(obj), f"{spec.name}.{name}")
    return found


def _is_named(obj: Any) -> bool:
    return inspect.ismodule(obj) or inspect.isclass(obj) or _is_routine(obj)


def _is_routine(obj: Any) -> bool:
    return inspect.isroutine(obj) or (callable(obj) and hasattr(obj, "__wrapped__"))


def _kind(obj: Any) -> str:
    if inspect.ismodule(obj):
        return "module"
    if inspect.isclass(obj):
        if issubclass(obj, BaseException):
            return "exception"
        return "enum" if issubclass(obj, enum.Enum) else "class"
    return "function" if _is_routine(obj) else "constant"


def _entry(module: ModuleType, name: str, obj: Any, documented: dict[int, str]) -> Entry:
    kind = _kind(obj)
    origin = _origin(module, name, obj)
    if kind == "module":
        return Entry(name, origin, kind, None, _clean(obj.__doc__))
    if kind == "constant":
        return Entry(name, origin, kind, _constant_signature(name, obj),
                     _constant_doc(module.__name__, name))
    if kind == "function":
        return Entry(name, origin, kind, _signature(name, obj), _clean(obj.__doc__))
    members, inherited = _class_members(obj, documented)
    return Entry(name, origin, kind, _class_signature(name, obj), _class_doc(obj),
                 members, inherited)


def _origin(module: ModuleType, name: str, obj: Any) -> str:
    """Where ``obj`` is defined, as ``module.qualname``: what a missing-docstring report names."""
    if inspect.ismodule(obj):
        return obj.__name__
    if _is_named(obj) and getattr(obj, "__qualname__", None):
        return f"{obj.__module__}.{obj.__qualname__}"
    return f"{_defining_module(module.__name__, name)}.{name}"


def _class_members(
    cls: type, documented: dict[int, str]
) -> tuple[tuple[Entry, ...], tuple[tuple[str, tuple[str, ...]], ...]]:
    """The public methods and properties of ``cls``, and those it inherits from documented bases.

    Bases from other packages (``object``, ``Exception``, ``Generic``...) are skipped;
    members of undocumented bases of the class's own package are listed as its own.
    """
    package = cls.__module__.partition(".")[0]
    members: dict[str, Entry] = {}
    inherited: list[tuple[str, tuple[str, ...]]] = []
    covered: set[str] = set()
    for base in cls.__mro__:
        if base.__module__.partition(".")[0] != package:
            continue
        names = [n for n in sorted(vars(base)) if _is_member(base, n) and n not in covered]
        if base is not cls and id(base) in documented:
            if names:
                inherited.append((documented[id(base)], tuple(names)))
        else:
            for name in names:
                members[name] = _member(cls, base, name)
        covered.update(names)
    return tuple(members[n] for n in sorted(members)), tuple(inherited)


def _is_member(cls: type, name: str) -> bool:
    if name.startswith("_"):
        return False
    raw = inspect.getattr_static(cls, name)
    if isinstance(cls, enum.EnumMeta) and isinstance(raw, enum.Enum):
        return False
    return isinstance(raw, property | staticmethod | classmethod) or inspect.isfunction(raw)


def _member(cls: type, owner: type, name: str) -> Entry:
    raw = vars(owner)[name]
    qualname = f"{owner.__module__}.{owner.__qualname__}.{name}"
    if isinstance(raw, property):
        returns = _annotation_text(inspect.signature(raw.fget).return_annotation if raw.fget
                                   else inspect.Signature.empty)
        signature = f"{name}: {returns}" if returns else name
        return Entry(name, qualname, "property", signature, _clean(raw.__doc__))
    kind = {staticmethod: "staticmethod", classmethod: "classmethod"}.get(type(raw), "method")
    fn = raw.__func__ if isinstance(raw, staticmethod | classmethod) else raw
    doc = _clean(inspect.getdoc(getattr(cls, name)))
    return Entry(name, qualname, kind, _signature(name, fn, drop_first=kind != "staticmethod"), doc)


def _class_doc(cls: type) -> str | None:
    doc = vars(cls).get("__doc__")
    if dataclasses.is_dataclass(cls) and doc and doc.startswith(f"{cls.__name__}("):
        return None  # the text dataclasses generate when a class has no docstring
    return _clean(doc)


def _clean(doc: str | None) -> str | None:
    return inspect.cleandoc(doc) if doc and doc.strip() else None


# ---------------------------------------------------------------- constants


@cache
def _module_ast(module_name: str) -> ast.Module | None:
    module = importlib.import_module(module_name)
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        return None
    return ast.parse(source)


def _assigned_names(module_name: str) -> set[str]:
    tree = _module_ast(module_name)
    names: set[str] = set()
    for stmt in tree.body if tree else []:
        names.update(_targets(stmt))
    return names


def _targets(stmt: ast.stmt) -> list[str]:
    """The plain names an assignment statement binds."""
    if isinstance(stmt, ast.Assign):
        targets = stmt.targets
    elif isinstance(stmt, ast.AnnAssign):
        targets = [stmt.target]
    else:
        return []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def _defining_module(module_name: str, name: str) -> str:
    """The module that assigns ``name``, following ``from X import name`` from ``module_name``."""
    tree = _module_ast(module_name)
    if tree is None or name in _assigned_names(module_name):
        return module_name
    for stmt in tree.body:
        if isinstance(stmt, ast.ImportFrom) and stmt.module and stmt.level == 0:
            for alias in stmt.names:
                if (alias.asname or alias.name) == name:
                    return _defining_module(stmt.module, alias.name)
    return module_name


def _constant_doc(module_name: str, name: str) -> str | None:
    """The string literal right after the module-level assignment of ``name``, if any."""
    tree = _module_ast(_defining_module(module_name, name))
    body = tree.body if tree else []
    for stmt, after in itertools.pairwise(body):
        literal = after.value if isinstance(after, ast.Expr) else None
        if (name in _targets(stmt) and isinstance(literal, ast.Constant)
                and isinstance(literal.value, str)):
            return _clean(literal.value)
    return None


_MAX_VALUE = 80


def _constant_signature(name: str, value: Any) -> str:
    text = _stable_repr(value)
    if len(text) > _MAX_VALUE:
        return f"{name}: {type(value).__name__}"
    return f"{name} = {text}"


# ---------------------------------------------------------------- rendering values


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")
_MODULE_PATH = re.compile(r"\b(?:[a-z_][a-z0-9_]*\.)+(?=[A-Za-z_])")
"""Dotted module paths in the text of a type form (``collections.abc.Callable`` -> ``Callable``)."""


def _stable_repr(value: Any) -> str:
    """``repr`` without memory addresses and with sets sorted, so runs agree."""
    if isinstance(value, set | frozenset):
        items = ", ".join(sorted(_stable_repr(v) for v in value))
        if not value:
            return f"{type(value).__name__}()"
        return f"{{{items}}}" if isinstance(value, set) else f"frozenset({{{items}}})"
    if isinstance(value, tuple) and type(value) is tuple:
        inner = ", ".join(_stable_repr(v) for v in value)
        return f"({inner},)" if len(value) == 1 else f"({inner})"
    if isinstance(value, list) and type(value) is list:
        return "[" + ", ".join(_stable_repr(v) for v in value) + "]"
    if isinstance(value, dict) and type(value) is dict:
        pairs = (f"{_stable_repr(k)}: {_stable_repr(v)}" for k, v in value.items())
        return "{" + ", ".join(pairs) + "}"
    if _is_routine(value) or inspect.isclass(value):
        return getattr(value, "__qualname__", None) or repr(value)
    text = _ADDRESS.sub("", repr(value))
    return _MODULE_PATH.sub("", text) if _is_type_form(value) else text


def _is_type_form(value: Any) -> bool:
    return type(value).__module__ in ("typing", "types", "collections.abc", "_collections_abc")


class _Raw:
    """Text that ``inspect.Signature`` prints as is (annotations, defaults)."""

    def __init__(self, text: str) -> None:
        self.text = text

    def __repr__(self) -> str:
        return self.text


def _annotation_text(annotation: Any) -> str:
    if annotation is inspect.Signature.empty:
        return ""
    if isinstance(annotation, str):
        return annotation
    if inspect.isclass(annotation):
        return annotation.__qualname__
    return _stable_repr(annotation)


def _signature(name: str, fn: Any, drop_first: bool = False) -> str | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return None
    params = list(sig.parameters.values())[1 if drop_first else 0:]
    return name + _render(sig, params)


def _class_signature(name: str, cls: type) -> str | None:
    if issubclass(cls, enum.Enum):
        return "\n".join(f"{name}.{m.name} = {_stable_repr(m.value)}" for m in cls)
    try:
        sig = inspect.signature(cls)
    except (TypeError, ValueError):
        return None
    return name + _render(sig, list(sig.parameters.values()))


def _render(sig: inspect.Signature, params: list[inspect.Parameter]) -> str:
    empty = inspect.Parameter.empty
    shown = [
        p.replace(
            annotation=_Raw(_annotation_text(p.annotation)) if p.annotation is not empty else empty,
            default=_Raw(_stable_repr(p.default)) if p.default is not empty else empty,
        )
        for p in params
    ]
    returns = sig.return_annotation
    return str(sig.replace(
        parameters=shown,
        return_annotation=_Raw(_annotation_text(returns)) if returns is not empty else empty,
    ))


# ---------------------------------------------------------------- markdown


def _anchors(docs: Sequence[ModuleDoc]) -> dict[str, str]:
    """The anchor of each heading, keyed by its text, as GitHub assigns them in page order.

    A heading's anchor is its text in lower case without punctuation; a repeated one
    (``mplang.Device`` after ``mplang.device``) gets ``-1``, ``-2``, ...
    """
    headings = [_TITLE]
    for module in docs:
        headings.append(module.spec.name)
        for entry in module.entries:
            if entry.see is None:
                path = f"{module.spec.name}.{entry.name}"
                headings += [path, *(f"{path}.{m.name}" for m in entry.members)]
    anchors: dict[str, str] = {}
    used: dict[str, int] = {}
    for heading in headings:
        slug = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
        count = used.get(slug, 0)
        used[slug] = count + 1
        anchors[heading] = f"{slug}-{count}" if count else slug
    return anchors


_TITLE = "API reference"


def render(docs: Sequence[ModuleDoc]) -> str:
    """The reference as Markdown: a table of contents, then one section per module."""
    anchors = _anchors(docs)
    lines = [
        f"# {_TITLE}",
        "",
        "<!-- Generated by `mplang apidoc -o docs/api.md` from the docstrings;",
        "     edit the docstrings, not this file. -->",
        "",
        "Each module lists its public names (its `__all__`, or else the classes, functions",
        "and constants it defines) with their signature and docstring; classes list their",
        "public methods and properties.",
    ]
    group = None
    for module in docs:
        if module.spec.group != group:
            group = module.spec.group
            lines += ["", f"**{group}**", ""]
        summary = _summary(module.doc)
        lines.append(f"- [`{module.spec.name}`](#{anchors[module.spec.name]})"
                     + (f": {summary}" if summary else ""))
    for module in docs:
        lines += _module_section(module, anchors)
    return "\n".join(lines) + "\n"


def _summary(doc: str | None) -> str:
    """The first paragraph of ``doc``, on one line."""
    if not doc:
        return ""
    return " ".join(doc.split("\n\n", 1)[0].split())


def _module_section(module: ModuleDoc, anchors: dict[str, str]) -> list[str]:
    spec = module.spec
    lines = ["", f"## {spec.name}", ""]
    if spec.source != spec.name:
        lines += [f"Defined in `{spec.source}`.", ""]
    if module.doc:
        lines += [module.doc, ""]
    for entry in module.entries:
        target = entry.see if entry.see is not None else f"{spec.name}.{entry.name}"
        lines.append(f"- [`{entry.name}`](#{anchors[target]}) ({entry.kind})")
    for entry in module.entries:
        if entry.see is None:
            lines += _entry_section(f"{spec.name}.{entry.name}", entry, anchors)
    return lines


def _entry_section(path: str, entry: Entry, anchors: dict[str, str]) -> list[str]:
    lines = ["", f"### {path}", "", f"*{entry.kind}*", ""]
    lines += _body(entry)
    for name, names in entry.inherited:
        listed = ", ".join(f"`{n}`" for n in names)
        lines += ["", f"Inherited from [`{name}`](#{anchors[name]}): {listed}."]
    for member in entry.members:
        lines += ["", f"#### {path}.{member.name}", "", f"*{member.kind}*", ""]
        lines += _body(member)
    return lines


def _body(entry: Entry) -> list[str]:
    lines: list[str] = []
    if entry.signature:
        lines += ["```python", entry.signature, "```", ""]
    lines.append(entry.doc if entry.doc else "*(no docstring)*")
    return lines


# ---------------------------------------------------------------- checking


def missing_docstrings(docs: Sequence[ModuleDoc]) -> list[str]:
    """``module.qualname`` of every module, public name and public class member without a docstring.

    Names are where the object is defined, so the list says which source to fix.
    """
    missing: set[str] = set()
    for module in docs:
        if not module.doc:
            missing.add(module.spec.source)
        for entry in _walk(module.entries):
            if entry.see is None and not entry.doc:
                missing.add(entry.qualname)
    return sorted(missing)


def _walk(entries: Sequence[Entry]) -> Iterator[Entry]:
    for entry in entries:
        yield entry
        yield from entry.members


def generate() -> str:
    """The Markdown of ``docs/api.md``: the reference of `public_modules`."""
    return render(collect())


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-o", "--output", type=Path, help="file to write (default: stdout)")


def add_apidoc_parser(commands: Any) -> None:
    """Add ``apidoc`` to the ``mplang`` command's subparsers."""
    _add_arguments(commands.add_parser(
        "apidoc", help="write the API reference (docs/api.md) from the docstrings"))


def run_apidoc(args: argparse.Namespace) -> int:
    """Write the reference to ``args.output`` or stdout; exit status 0."""
    text = generate()
    if args.output is None:
        sys.stdout.write(text)
    else:
        args.output.write_text(text, encoding="utf-8", newline="\n")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m mplang.cli.apidoc [-o PATH]``: the same as ``mplang apidoc``."""
    parser = argparse.ArgumentParser(prog="python -m mplang.cli.apidoc", description=__doc__)
    _add_arguments(parser)
    return run_apidoc(parser.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
