"""A live progress display for long evaluations, drawn with rich on standard error.

It appears once an evaluation has run for `DELAY_S` seconds (shorter ones print
nothing) and shows the ops done out of the ops expected, the op each party is
running now and the bytes the parties moved, read from the run's `RunMonitor`.
"""

from __future__ import annotations

import contextvars
import html
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any

from mplang.runtime.timeline import DRIVER, RunMonitor
from mplang.util.tables import html_table

if TYPE_CHECKING:  # rich loads on first use: importing mplang stays fast
    from rich.console import Console

DELAY_S = 1.0
"""How long an evaluation runs before its progress display appears."""
REFRESH_S = 0.25


def is_terminal(stream: IO[str] | None = None) -> bool:
    """Whether ``stream`` (default: standard error) is an interactive terminal."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


def in_notebook() -> bool:
    """Whether this process is a Jupyter kernel (IPython's ZMQ shell)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return type(shell).__name__ == "ZMQInteractiveShell"


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB"):
        if value < 1024:
            return f"{n} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GB"


class ProgressDisplay:
    """``with ProgressDisplay(monitor):`` shows the monitor's run while the block runs: on
    standard error with rich, or (``notebook``) as one output of the running notebook cell,
    updated in place."""

    def __init__(self, monitor: RunMonitor, *, delay_s: float = DELAY_S,
                 console: Console | None = None, notebook: bool = False):
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
        )

        self.monitor = monitor
        self.delay_s = delay_s
        self.console = console or Console(stderr=True)
        self._bar = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                             MofNCompleteColumn(), TextColumn("ops"), TimeElapsedColumn(),
                             console=self.console)
        self._task = self._bar.add_task(monitor.name, total=monitor.total_ops or None)
        self._stop = threading.Event()
        self._started = time.monotonic()
        self._notebook = self._in_notebook if notebook else None
        context = contextvars.copy_context()  # a kernel's output goes to the running cell
        self._thread = threading.Thread(target=context.run, args=(self._show,),
                                        name="mplang-progress", daemon=True)
        self.shown = False
        """Whether the display appeared (the run outlasted the delay)."""

    def _parties(self) -> list[tuple[str, str, str, str]]:
        """One row per party: its name, the ops it runs, the ops it did, the bytes moved."""
        monitor = self.monitor
        rows = []
        for party in sorted(monitor.states):
            state = monitor.states[party]
            running = sorted(set(state.running.values()))
            name = monitor.parties.get(party, "driver" if party == DRIVER else f"party {party}")
            rows.append((name, ", ".join(running[:3]) or "idle", f"{state.done} ops",
                         f"{_size(state.bytes_moved)} moved"))
        return rows

    def render(self) -> Any:
        """The display's current content: the bar and one line per party."""
        from rich.console import Group
        from rich.table import Table

        done = self.monitor.done
        total = max(self.monitor.total_ops, done) or None
        self._bar.update(self._task, completed=done, total=total)
        table = Table.grid(padding=(0, 2))
        for row in self._parties():
            table.add_row(*row)
        return Group(self._bar.get_renderable(), table)

    def html(self) -> str:
        """The display's current content as HTML (in a notebook)."""
        done = self.monitor.done
        total = max(self.monitor.total_ops, done)
        elapsed = time.monotonic() - self._started
        bar = (f"<b>{html.escape(self.monitor.name)}</b> <progress value='{done}' "
               f"max='{total or 1}'></progress> {done}/{total or '?'} ops, {elapsed:.1f} s")
        return f"<div>{bar}</div>" + html_table(("party", "running", "done", "moved"),
                                                self._parties())

    def _show(self) -> None:
        from rich.live import Live

        if self._stop.wait(self.delay_s):
            return
        self.shown = True
        if self._notebook is not None:
            self._notebook(self._stop)
            return
        with Live(self.render(), console=self.console, refresh_per_second=4,
                  transient=False) as live:
            while not self._stop.wait(REFRESH_S):
                live.update(self.render())
            live.update(self.render())

    def _in_notebook(self, stop: threading.Event) -> None:
        """One output of the cell, updated in place (IPython's display ids)."""
        from IPython.display import HTML, display

        handle = display(HTML(self.html()), display_id=True)
        while not stop.wait(REFRESH_S):
            handle.update(HTML(self.html()))
        handle.update(HTML(self.html()))

    def __enter__(self) -> ProgressDisplay:
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()


@contextmanager
def startup_progress(nodes: list[str], *, enabled: bool,
                     console: Console | None = None) -> Iterator[Callable[[str], None]]:
    """A bar of the workers ready out of ``nodes`` (``mplang up``); the block gets the
    callback to call with each node that gets ready. Draws nothing unless ``enabled``."""
    if not enabled:
        yield lambda node: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("[bold]starting workers"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[ready]}"), TimeElapsedColumn(),
                   console=console or Console(stderr=True), transient=False)
    ready: list[str] = []
    task = bar.add_task("workers", total=len(nodes), ready="")

    def advance(node: str) -> None:
        ready.append(node)
        bar.update(task, advance=1, ready="ready: " + ", ".join(ready))

    with bar:
        yield advance
