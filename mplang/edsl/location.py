"""Where the user's code traced an op: the first frame outside MPLang's own package."""

from __future__ import annotations

import os
import sys
import sysconfig
from types import FrameType

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
            base = _BASENAMES.get(filename)
            if base is None:
                base = _BASENAMES[filename] = os.path.basename(filename)
            return f"{base}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return None


_BASENAMES: dict[str, str] = {}
"""Each user file's base name (looked up per traced op)."""


_INSTALLED: tuple[str, ...] = tuple(sorted(
    {os.path.join(sysconfig.get_paths()[key], "") for key in ("stdlib", "purelib", "platlib")}))
"""Where the standard library and installed packages (NumPy, JAX, ...) live: not user code."""


def is_user_file(filename: str) -> bool:
    """Whether ``filename`` holds user code: not MPLang's, not a file marked as library
    code, not the standard library's and not an installed package's (the numerical
    libraries that trace a user's function)."""
    return not (_is_library(filename) or filename.startswith(_INSTALLED))


def _is_user_code(frame: FrameType) -> bool:
    return is_user_file(frame.f_code.co_filename)


def caller_location() -> str | None:
    """``file.py:LINE`` of the innermost caller in user code (`_is_user_code`): where a
    Python construct (``if x``, ``np.mean(x)``) asked an MPLang value for its data."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if _is_user_code(frame):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back
    return None


def raised_at(error: BaseException) -> str | None:
    """``file.py:LINE`` of the innermost frame of ``error``'s traceback in user code
    (`_is_user_code`): the line of a user's function that a tracing compiler rejected."""
    found = None
    tb = error.__traceback__
    while tb is not None:
        if _is_user_code(tb.tb_frame):
            found = f"{os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno}"
        tb = tb.tb_next
    return found


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


def locate_error(error: BaseException, loc: str | None = None) -> None:
    """Append `` (at file.py:LINE)`` (``loc``, by default the innermost user frame on the
    current stack) to ``error``'s message, once: an error that already names a location
    keeps it."""
    if getattr(error, "located", False) or not error.args or not isinstance(error.args[0], str):
        return
    loc = loc or user_location(2)
    if loc is not None and f"(at {loc})" not in error.args[0]:
        error.args = (f"{error.args[0]} (at {loc})", *error.args[1:])
    error.located = True  # type: ignore[attr-defined]
