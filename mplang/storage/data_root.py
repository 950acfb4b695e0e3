"""A party's data root: the folder its private inputs (``tensor.load``,
``table.read_csv``) come from and its table outputs (``table.write_csv``) go to.

A program names files by paths relative to the root. Nothing outside the root
can be read or written: absolute paths, ``..`` components and symbolic links that
resolve outside the root's real path are refused. Arrays are read from regular
``.npy`` files and ``.npz`` archives of numeric (or bool) arrays, never with
pickle; other kinds of input register a describer (`register_describer`) that
tells their type from the file, for the driver to trace a program reading them.
"""

from __future__ import annotations

import contextlib
import os
import zipfile
from collections.abc import Callable, Mapping
from pathlib import Path, PurePosixPath
from typing import IO, Any

import numpy as np

from mplang.edsl.errors import MPRuntimeError, MPSerializationError
from mplang.edsl.typing import DTYPES, BaseType, TensorType

OP = "tensor.load"
EXTENSIONS = (".npy", ".npz")
MAX_PATH = 4096


def default_root(node: str) -> Path:
    """The data root of ``node`` when none is given: ``./data/<node>`` (relative to the
    working directory of the process that reads it)."""
    return Path("data") / node


class MissingData(MPRuntimeError):
    """The data a program names is not there: no such file in the party's data root, no
    such array in an archive, or no uploaded object of that name."""


class BadPath(MPRuntimeError):
    """A path the program names is not one this party reads or writes: not a relative
    path of the right kind, outside the data root, or not a regular file (or folder)."""


def _fail(message: str, op: str = OP) -> MPRuntimeError:
    return MPRuntimeError(f"{op}: {message}")


def _bad(message: str, op: str) -> BadPath:
    return BadPath(f"{op}: {message}")


def check_relpath(relpath: Any, node: str, *, op: str = OP,
                  extensions: tuple[str, ...] = EXTENSIONS) -> PurePosixPath:
    """``relpath`` as a relative path inside a data root naming a file with one of
    ``extensions``, checked without touching the disk (`BadPath` naming ``op``)."""
    if not isinstance(relpath, str):
        raise _bad(f"the path must be a string, got {type(relpath).__name__}", op)
    if not relpath:
        raise _bad(f"the path is empty; name a file in the data root of {node}", op)
    if len(relpath) > MAX_PATH or "\x00" in relpath:
        raise _bad(f"path {relpath[:64]!r}... is not a valid file name", op)
    path = PurePosixPath(relpath.replace("\\", "/"))
    if path.is_absolute() or relpath.startswith(("/", "\\")):
        raise _bad(f"path {relpath!r} is absolute; give a path relative to the data root "
                   f"of {node}", op)
    if ".." in path.parts:
        raise _bad(f"path {relpath!r} escapes the data root of {node}", op)
    if path.suffix not in extensions:
        raise _bad(f"path {relpath!r} must name a {' or '.join(extensions)} file", op)
    return path


def resolve(root: str | os.PathLike[str], relpath: str, node: str = "this node", *,
            op: str = OP, extensions: tuple[str, ...] = EXTENSIONS) -> Path:
    """The real path of regular file ``relpath`` inside the data root ``root`` of ``node``.

    Raises `BadPath` naming ``op``, the path and the node if the path is absolute,
    empty, has a ``..`` component or another extension than ``extensions``, resolves
    (through symbolic links) outside the root or is not a regular file; `MissingData`
    if it is missing.
    """
    path = check_relpath(relpath, node, op=op, extensions=extensions)
    base = Path(root).resolve()
    real = (base / path).resolve()
    if not real.is_relative_to(base):
        raise _bad(f"path {relpath!r} escapes the data root of {node}", op)
    if not real.exists():
        raise MissingData(f"{op}: {node} has no file {relpath!r} in its data root; put it "
                          f"there (by default ./data/{node}; mp.Simulator(..., data_roots=...),"
                          " `mplang run --sim N --data-root DIR` or `mplang worker --data-root "
                          "DIR` choose another) or fix the path")
    if not real.is_file():
        raise _bad(f"path {relpath!r} in the data root of {node} is not a regular file", op)
    return real


def resolve_for_write(root: str | os.PathLike[str], relpath: str, node: str = "this node",
                      *, op: str, extensions: tuple[str, ...]) -> Path:
    """The path inside data root ``root`` that a program may write ``relpath`` to.

    Missing parent folders are made inside the root, one at a time, each checked to
    stay inside it. Refused (`BadPath` naming ``op``, the path and the node): what
    `check_relpath` refuses, a parent that resolves outside the root or is not a
    folder, and a target that is a symbolic link leading out of the root or exists as
    something other than a regular file; a root that does not exist too. The
    caller replaces the target (a link inside the root is replaced, not followed).
    """
    path = check_relpath(relpath, node, op=op, extensions=extensions)
    base = Path(root).resolve()
    if not base.is_dir():
        raise _fail(f"the data root of {node} ({root}) does not exist; make it before "
                    "writing to it", op)
    folder = base
    for part in path.parts[:-1]:
        step = folder / part
        if not step.exists() and not step.is_symlink():
            with contextlib.suppress(FileExistsError):  # a concurrent writer's: checked below
                step.mkdir()
        real = step.resolve()
        if not real.is_relative_to(base):
            raise _bad(f"path {relpath!r} escapes the data root of {node}", op)
        if not real.is_dir():
            raise _bad(f"path {relpath!r}: {part!r} in the data root of {node} is not a "
                       "folder", op)
        folder = real
    target = folder / path.name
    if target.is_symlink() and not target.resolve().is_relative_to(base):
        raise _bad(f"path {relpath!r} escapes the data root of {node}", op)
    if target.exists() and not target.is_symlink() and not target.is_file():
        raise _bad(f"path {relpath!r} in the data root of {node} is not a regular file", op)
    return target


def _dtype_name(dtype: np.dtype[Any], relpath: str) -> str:
    if dtype.hasobject or dtype.name not in DTYPES:
        raise _fail(f"{relpath!r} holds an array of dtype {dtype}, which cannot be loaded "
                    "(numeric and bool dtypes only)")
    return dtype.name


def _member(archive: zipfile.ZipFile, relpath: str, key: str | None) -> str:
    names = sorted(n[:-4] for n in archive.namelist() if n.endswith(".npy"))
    if key is None:
        if len(names) != 1:
            raise _fail(f"{relpath!r} holds {len(names)} arrays ({', '.join(names)}): pass "
                        "key= to choose one")
        return names[0] + ".npy"
    if key not in names:
        raise MissingData(f"{OP}: {relpath!r} has no array {key!r} (it holds "
                          f"{', '.join(names) or 'none'})")
    return key + ".npy"


def _check_key(relpath: str, key: str | None) -> None:
    if key is not None and not relpath.endswith(".npz"):
        raise _fail(f"key={key!r} applies to .npz archives only, not {relpath!r}")


def _header(f: IO[bytes], relpath: str) -> TensorType:
    try:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, _, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, _, dtype = np.lib.format.read_array_header_2_0(f)
    except (ValueError, OSError) as e:
        raise _fail(f"{relpath!r} is not a valid .npy array: {e}") from None
    return TensorType(_dtype_name(dtype, relpath), tuple(shape))


def _inspect(real: Path, relpath: str, key: str | None, node: str
             ) -> tuple[TensorType, str | None]:
    """The type of the array at resolved path ``real`` (from its header only) and, for an
    ``.npz``, the archive member that holds it."""
    try:
        if real.suffix == ".npy":
            with open(real, "rb") as f:
                return _header(f, relpath), None
        with zipfile.ZipFile(real) as archive:
            member = _member(archive, relpath, key)
            with archive.open(member) as stream:
                return _header(stream, relpath), member
    except (zipfile.BadZipFile, OSError) as e:
        raise _fail(f"{relpath!r} in the data root of {node} cannot be read: {e}") from None


def describe(root: str | os.PathLike[str], relpath: str, key: str | None = None,
             node: str = "this node") -> TensorType:
    """The type (dtype, shape) of array ``relpath`` (member ``key`` of an ``.npz``) in the
    data root, read from the file's header only."""
    _check_key(relpath, key)
    return _inspect(resolve(root, relpath, node), relpath, key, node)[0]


def read(root: str | os.PathLike[str], relpath: str, key: str | None = None,
         node: str = "this node") -> np.ndarray:
    """The array ``relpath`` (member ``key`` of an ``.npz``) in the data root, loaded
    without pickle once its header passed the checks of `describe`."""
    _check_key(relpath, key)
    real = resolve(root, relpath, node)
    _, member = _inspect(real, relpath, key, node)
    try:
        if member is None:
            array = np.load(real, allow_pickle=False)
        else:
            with np.load(real, allow_pickle=False) as archive_arrays:
                array = archive_arrays[member[:-4]]
    except (ValueError, zipfile.BadZipFile, OSError) as e:
        raise _fail(f"{relpath!r} in the data root of {node} cannot be read: {e}") from None
    _dtype_name(array.dtype, relpath)
    return np.asarray(array)


Describer = Callable[[Path, Mapping[str, Any], str], BaseType]
"""``describe(root, fields, node)``: the type of the input ``fields`` name in data root
``root`` of ``node``, from the file (never its data sent anywhere). Raises
`MPSerializationError` for malformed ``fields``, `MissingData` or `MPRuntimeError`."""

_DESCRIBERS: dict[str, Describer] = {}


def register_describer(what: str, describer: Describer) -> Describer:
    """Let drivers ask for the type of inputs of kind ``what`` (``{"what": what, ...}``);
    one describer per kind, and ``file`` and ``object`` are the built-in ones."""
    if what in ("file", "object") or what in _DESCRIBERS:
        raise ValueError(f"a describer of {what!r} inputs is already registered")
    _DESCRIBERS[what] = describer
    return describer


def describer_kinds() -> list[str]:
    """The registered kinds of input (besides ``file`` and ``object``)."""
    return sorted(_DESCRIBERS)


def describe_input(root: str | os.PathLike[str], fields: Mapping[str, Any],
                   node: str = "this node") -> BaseType:
    """The type of the input ``fields`` name (``fields["what"]``: a registered kind) in
    data root ``root`` of ``node``."""
    what = fields.get("what")
    describer = _DESCRIBERS.get(what) if isinstance(what, str) else None
    if describer is None:
        kinds = ", ".join(repr(k) for k in ["file", "object", *describer_kinds()])
        raise MPSerializationError(f"field 'what' must be one of {kinds}, got {what!r}")
    return describer(Path(root), fields, node)
