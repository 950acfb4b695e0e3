"""A party's data root: the folder its private inputs (``tensor.load``) come from.

A program names files by paths relative to the root. Nothing outside the root
can be read: absolute paths, ``..`` components and symbolic links that resolve
outside the root's real path are refused, and only regular ``.npy`` files and
``.npz`` archives of numeric (or bool) arrays are read, never with pickle.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path, PurePosixPath
from typing import IO, Any

import numpy as np

from mplang.edsl.typing import DTYPES, TensorType
from mplang.frontend.errors import MPRuntimeError

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


def _fail(message: str) -> MPRuntimeError:
    return MPRuntimeError(f"{OP}: {message}")


def check_relpath(relpath: Any, node: str) -> PurePosixPath:
    """``relpath`` as a relative path inside a data root, checked without touching the disk."""
    if not isinstance(relpath, str):
        raise _fail(f"the path must be a string, got {type(relpath).__name__}")
    if not relpath:
        raise _fail(f"the path is empty; name a file in the data root of {node}")
    if len(relpath) > MAX_PATH or "\x00" in relpath:
        raise _fail(f"path {relpath[:64]!r}... is not a valid file name")
    path = PurePosixPath(relpath.replace("\\", "/"))
    if path.is_absolute() or relpath.startswith(("/", "\\")):
        raise _fail(f"path {relpath!r} is absolute; give a path relative to the data root "
                    f"of {node}")
    if ".." in path.parts:
        raise _fail(f"path {relpath!r} escapes the data root of {node}")
    if path.suffix not in EXTENSIONS:
        raise _fail(f"path {relpath!r} must name a .npy or .npz file")
    return path


def resolve(root: str | os.PathLike[str], relpath: str, node: str = "this node") -> Path:
    """The real path of regular file ``relpath`` inside the data root ``root`` of ``node``.

    Raises `MPRuntimeError` naming the path and the node if the path is absolute,
    empty, has a ``..`` component, resolves (through symbolic links) outside the
    root, is missing, or is not a regular file.
    """
    path = check_relpath(relpath, node)
    base = Path(root).resolve()
    real = (base / path).resolve()
    if not real.is_relative_to(base):
        raise _fail(f"path {relpath!r} escapes the data root of {node}")
    if not real.exists():
        raise MissingData(f"{OP}: {node} has no file {relpath!r} in its data root")
    if not real.is_file():
        raise _fail(f"path {relpath!r} in the data root of {node} is not a regular file")
    return real


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
