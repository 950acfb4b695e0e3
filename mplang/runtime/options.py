"""`RunOptions`: how one execution runs, carried to every interpreter of it."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from mplang.edsl.errors import MPLangError
from mplang.runtime.console import write_line
from mplang.runtime.timeline import RunMonitor

Mode = Literal["launch", "standard"]
Reporter = Callable[[str], None]
MODES: tuple[Mode, ...] = ("launch", "standard")


@dataclass(frozen=True)
class RunOptions:
    """The options of one execution.

    - ``mode``: ``launch`` (every party runs the whole graph) or ``standard`` (the
      driver interprets it and dispatches each op); None: the context's default.
    - ``parallel``: run ops as dataflow (True) or one at a time in program order.
    - ``timeout``: seconds a wait for a message may block (None: the context's default).
    - ``progress``: called with a line per completed op (None: silent).
    - ``monitor``: hears of every op and message of the run (`RunMonitor`: progress
      display, timeline); None: nothing is observed.
    - ``whole``: the graph a party gets is the whole program body (launch mode), so its
      outputs are the program's results, which each party judges as flows to the
      driver when it accepts the program; otherwise (one op at a time) each party judges
      a fetch when it comes, and every copy of its data sent to another party as if it
      reached the driver.
    - ``name``: the program's function name, which the workers' audit logs record.
    """

    mode: Mode | None = None
    parallel: bool = True
    timeout: float | None = None
    progress: Reporter | None = None
    monitor: RunMonitor | None = None
    whole: bool = False
    name: str | None = None

    def __post_init__(self) -> None:
        if self.mode is not None and self.mode not in MODES:
            raise MPLangError(f"unknown mode {self.mode!r}; use 'launch' or 'standard'")
        if self.timeout is not None and (isinstance(self.timeout, bool)
                                         or not isinstance(self.timeout, int | float)
                                         or not self.timeout > 0):
            raise MPLangError(f"timeout must be a positive number of seconds, got "
                              f"{self.timeout!r}")

    def wire_fields(self) -> dict[str, Any]:
        """The options a remote worker needs, as JSON fields (progress and a recording
        monitor become flags)."""
        return {"parallel": self.parallel, "timeout": self.timeout,
                "progress": self.progress is not None,
                "trace": self.monitor is not None and self.monitor.record,
                "whole": self.whole, "name": self.name}


DEFAULT_OPTIONS = RunOptions()


def stderr_reporter(name: str) -> Reporter:
    """A reporter printing ``[mplang NAME +SECONDS] message`` lines to stderr, each at once
(`mplang.runtime.console`)."""
    start = time.perf_counter()

    def report(message: str) -> None:
        write_line(sys.stderr, f"[mplang {name} +{time.perf_counter() - start:.3f}s] "
                               f"{message}")

    return report


def make_options(name: str, *, mode: Mode | None = None, parallel: bool = True,
                 timeout: float | None = None,
                 progress: bool | Reporter | None = False,
                 monitor: RunMonitor | None = None) -> RunOptions:
    """`RunOptions` from `mp.evaluate`'s keyword arguments. ``parallel=False`` without a
    mode runs in standard mode; ``progress=True`` reports to stderr."""
    if mode is None and not parallel:
        mode = "standard"
    if progress is True:
        reporter: Reporter | None = stderr_reporter(name)
    elif progress is False or progress is None:
        reporter = None
    elif callable(progress):
        reporter = progress
    else:
        raise MPLangError(f"progress must be a bool or a callable, got {progress!r}")
    return RunOptions(mode, bool(parallel), timeout, reporter, monitor, name=name)
