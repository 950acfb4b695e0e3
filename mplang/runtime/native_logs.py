"""Where the logs of the native libraries go (the secure device's and PSI's C++ code, and
the perfetto tracing they link).

They write to the process's descriptors 1 and 2, out of Python's reach: a PSI run printed
hundreds of their lines among a program's own. So before native code first runs here
(`route`), descriptors 1 and 2 are pointed at the party's log, while Python's
``sys.stdout`` and ``sys.stderr`` (and the logging handlers that wrote to them) keep
writing where they wrote before:

- in a worker (`keep_descriptors`), the party's log is the worker's own output (``mplang
  up`` writes it to ``NODE.log``), so nothing moves;
- elsewhere (the simulator, ``mplang run --sim``, a notebook), the parties of the process
  share one log: ``MPLANG_LOG_FILE``, by default ``native-PID.log`` in ``mplang-logs``
  under the temporary directory (`log_path`).

``MPLANG_LOG=info`` or ``MPLANG_LOG=debug`` leaves the native logs on the terminal;
``debug`` also lowers the secure device's level to debug (its default is info).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
import threading
from pathlib import Path
from typing import IO, TextIO

from mplang.edsl.errors import MPLangError

LEVELS = ("info", "debug")
"""The values of ``MPLANG_LOG`` that show the native logs on the terminal."""

_lock = threading.Lock()
_state = {"routed": False, "keep": False}


def log_path() -> Path:
    """The file the native logs of this process go to (unless in a worker or shown)."""
    named = os.environ.get("MPLANG_LOG_FILE")
    if named:
        return Path(named)
    return Path(tempfile.gettempdir()) / "mplang-logs" / f"native-{os.getpid()}.log"


def level() -> str:
    """``MPLANG_LOG``: ``""`` (the native logs go to the party's log), info or debug."""
    value = os.environ.get("MPLANG_LOG", "").strip().lower()
    if value and value not in LEVELS:
        raise MPLangError(f"MPLANG_LOG={value!r} is not a log setting: use MPLANG_LOG=info or "
                          "MPLANG_LOG=debug to see the native libraries' logs on the terminal, "
                          "or leave it unset to keep them in the party's log")
    return value


def keep_descriptors() -> None:
    """This process is a worker: its descriptors 1 and 2 are the party's log already."""
    _state["keep"] = True


def routed() -> bool:
    """Whether `route` ran in this process."""
    return _state["routed"]


def route() -> None:
    """Send the native libraries' output to the party's log (once per process)."""
    with _lock:
        if _state["routed"]:
            return
        _state["routed"] = True
        if level() or _state["keep"]:
            return
        path = log_path()
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        log = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            for name, fd in (("stdout", 1), ("stderr", 2)):
                stream = getattr(sys, name)
                stream.flush()
                if stream is getattr(sys, f"__{name}__") and _writes_to(stream, fd):
                    setattr(sys, name, _rebind(stream, fd))
                    _follow(stream, getattr(sys, name))
                os.dup2(log, fd)
        finally:
            os.close(log)


def _follow(old: TextIO, new: TextIO) -> None:
    """Point the logging handlers that wrote to ``old`` at ``new``."""
    loggers = [logging.getLogger(), *(logger for logger in logging.Logger.manager.loggerDict
                                      .values() if isinstance(logger, logging.Logger))]
    for logger in loggers:
        for handler in logger.handlers:
            if isinstance(handler, logging.StreamHandler) and handler.stream is old:
                handler.setStream(new)


def _writes_to(stream: IO[str], fd: int) -> bool:
    try:
        return stream.fileno() == fd
    except (AttributeError, OSError, ValueError):
        return False


def _rebind(stream: TextIO, fd: int) -> TextIO:
    """A text stream like ``stream`` writing to a copy of descriptor ``fd``."""
    buffering = 1 if getattr(stream, "line_buffering", True) else -1
    return open(os.dup(fd), "w", buffering=buffering, encoding=stream.encoding,
                errors=stream.errors)
