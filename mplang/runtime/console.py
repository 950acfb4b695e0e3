"""Whole lines on the console: a run's progress lines and the program's own prints (from
any thread) never split each other's lines.

`write_line` writes one progress line at once, under the console's lock; while
`whole_lines` is active, ``sys.stdout`` keeps each thread's partial line until its
newline, then writes the line at once under the same lock.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import IO, Any

_lock = threading.Lock()


def write_line(stream: IO[str], line: str) -> None:
    """Write ``line`` and a newline to ``stream`` at once (after the program's pending
    output on standard output)."""
    with _lock:
        sys.stdout.flush()
        stream.write(line + "\n")
        stream.flush()


class LineWriter:
    """A text stream over ``target`` that writes only whole lines, each at once; a
    thread's unfinished line waits for its newline (or `finish`)."""

    def __init__(self, target: IO[str]):
        self.target = target
        self._pending: dict[int, str] = {}

    def write(self, text: str) -> int:
        ident = threading.get_ident()
        with _lock:
            head, sep, tail = (self._pending.pop(ident, "") + text).rpartition("\n")
            if sep:
                self.target.write(head + sep)
                self.target.flush()
            if tail:
                self._pending[ident] = tail
        return len(text)

    def flush(self) -> None:
        """Flush the lines written (an unfinished line stays until its newline)."""
        self.target.flush()

    def finish(self) -> None:
        """Write every thread's unfinished line as it is."""
        with _lock:
            rest, self._pending = "".join(self._pending.values()), {}
            self.target.write(rest)
            self.target.flush()

    def __getattr__(self, name: str) -> Any:  # encoding, isatty, fileno ... of the target
        return getattr(self.target, name)


@contextmanager
def whole_lines() -> Iterator[None]:
    """While the block runs, standard output writes whole lines only."""
    original = sys.stdout
    writer = LineWriter(original)
    sys.stdout = writer
    try:
        yield
    finally:
        if sys.stdout is writer:
            sys.stdout = original
        writer.finish()
