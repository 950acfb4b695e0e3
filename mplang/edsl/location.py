"""Where the user's code traced an op: the first frame outside MPLang's own package."""

from __future__ import annotations

import os
import sys

_LIBRARY_PREFIXES: tuple[str, ...] = (
    os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep, "<frozen")
_LIBRARY_FILES: set[str] = set()
_IS_LIBRARY: dict[str, bool] = {}
"""Whether each file seen so far is library code (cleared when the marks change)."""


def mark_library(path: str) -> None:
    """Treat the file or directory ``path`` as library code: ops traced from it are
    located at their caller's line. Extensions call ``mark_library(__file__)``."""
    global _LIBRARY_PREFIXES
    full = os.path.abspath(path)
    _IS_LIBRARY.clear()
    if os.path.isdir(full):
        _LIBRARY_PREFIXES = (*_LIBRARY_PREFIXES, full + os.sep)
    else:
        _LIBRARY_FILES.add(full)


def _is_library(filename: str) -> bool:
    library = _IS_LIBRARY.get(filename)
    if library is None:
        library = _IS_LIBRARY[filename] = (filename.startswith(_LIBRARY_PREFIXES)
                                           or filename in _LIBRARY_FILES)
    return library


def user_location(skip: int = 1) -> str | None:
    """``file.py:LINE`` of the innermost caller outside MPLang's package and the files
    marked as library code (`mark_library`).

    Only the file's base name is kept, so programs traced from the same source
    are identical wherever the source lives.
    """
    frame = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        library = _IS_LIBRARY.get(filename)
        if library is None:
            library = _is_library(filename)
        if not library:
            return f"{os.path.basename(filename)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


def user_stacklevel(skip: int = 1) -> int:
    """The ``stacklevel`` that makes `warnings.warn` name the innermost caller outside
    the library code, when it is called by the function ``skip`` frames up (1: the one
    that called this)."""
    frame = sys._getframe(skip)
    level = 1
    while frame.f_back is not None and _is_library(frame.f_code.co_filename):
        frame = frame.f_back
        level += 1
    return level


def locate_error(error: BaseException) -> None:
    """Append `` (at file.py:LINE)`` (the innermost user frame on the current stack) to
    ``error``'s message, once: an error that already names a location keeps it."""
    if getattr(error, "located", False) or not error.args or not isinstance(error.args[0], str):
        return
    loc = user_location(2)
    if loc is not None and f"(at {loc})" not in error.args[0]:
        error.args = (f"{error.args[0]} (at {loc})", *error.args[1:])
    error.located = True  # type: ignore[attr-defined]
