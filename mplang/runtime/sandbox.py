"""Native payloads checked in a helper process before this process parses them.

Some op attributes are bytes that C++ code parses without verifying them (a
StableHLO module, say): a malformed one received from another party can abort
or corrupt the process that parses it. A `NativePayloadChecker` hands each
distinct payload first to a long-lived helper process (started with ``spawn``,
restarted if it dies) that runs the same parsing; only payloads the helper
accepted are ever parsed here. Parsing identical bytes is deterministic, so
what survived the helper is safe in this process too.
"""

from __future__ import annotations

import hashlib
import resource
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from mplang.edsl.errors import MPLangError, MPSerializationError
from mplang.util.lru import LRUCache

if TYPE_CHECKING:
    from multiprocessing.connection import Connection
    from multiprocessing.process import BaseProcess

MAX_MESSAGE = 500
"""Characters of a helper's error message kept in the refusal."""
STARTUP_TIMEOUT = 300.0
"""Seconds a new helper may take to import its check (not counted in a check's timeout)."""


def _serve(conn: Connection, check: Callable[[bytes], None], memory_limit: int | None) -> None:
    """The helper's loop: limit its address space, say it is ready, then answer each
    payload with "+" (accepted), "-" and the error, or "!" and the error when it ran out
    of memory (then it exits: native state after a failed allocation is not trusted)."""
    if memory_limit is not None:
        resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
    conn.send_bytes(b"ready")
    while True:
        try:
            payload = conn.recv_bytes()
        except EOFError:
            return
        try:
            check(payload)
            answer = "+"
        except MPLangError as e:
            answer = f"-{e}"
        except Exception as e:
            answer = f"{'!' if isinstance(e, MemoryError) else '-'}{type(e).__name__}: {e}"
        conn.send_bytes(answer[:MAX_MESSAGE].encode())
        if answer.startswith("!"):
            return


_MAIN_LOCK = threading.Lock()


@contextmanager
def _main_hidden() -> Iterator[None]:
    """Start helpers without the user's script: ``spawn`` runs ``__main__`` again in the
    child (found by its ``__file__`` or ``__spec__``), which for a script without an ``if
    __name__ == "__main__":`` guard would run the user's program there. The helper needs
    only its check's module."""
    main = sys.modules.get("__main__")
    with _MAIN_LOCK:
        saved: dict[str, Any] = {k: main.__dict__.pop(k) for k in ("__file__", "__spec__")
                                 if main is not None and k in main.__dict__}
        if main is not None:
            main.__spec__ = None
        try:
            yield
        finally:
            if main is not None:
                del main.__spec__
                main.__dict__.update(saved)


def _exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"signal {-code}, {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit status {code}"


class NativePayloadChecker:
    """Runs ``check(payload)`` in a helper process; `check` refuses payloads it rejected,
    crashed on, or did not finish within ``timeout`` seconds.

    ``check`` must be a module-level function (the helper imports it by name) that
    raises on a bad payload. The helper's address space is limited to
    ``memory_limit`` bytes (None: no limit), so a payload that makes the parser
    allocate without bound fails there instead of drawing the OOM killer. Verdicts
    are cached by SHA-256 digest (the last ``cache_size`` payloads; timeouts are not
    cached). Thread-safe: one helper serves this process, one payload at a time.
    """

    def __init__(self, check: Callable[[bytes], None], what: str, *, timeout: float = 120.0,
                 memory_limit: int | None = 8 << 30, cache_size: int = 4096):
        self._check = check
        self.memory_limit = memory_limit
        self.what = what
        """What the payloads are, for messages (``run_jax module``)."""
        self.timeout = timeout
        self._verdicts = LRUCache(cache_size)
        self._lock = threading.Lock()
        self._helper: tuple[BaseProcess, Connection] | None = None

    def check(self, payload: bytes, where: str) -> None:
        """Return if the helper accepted ``payload``; raise `MPSerializationError` starting
        with ``where`` (the op) otherwise."""
        digest = hashlib.sha256(payload).digest()
        with self._lock:
            verdict: str | None = self._verdicts.lookup(digest)
            if verdict is None:
                verdict, final = self._ask(payload)
                if final:
                    self._verdicts.store(digest, verdict)
        if verdict:
            raise MPSerializationError(f"{where}: {self.what} rejected: {verdict}")

    def _ask(self, payload: bytes) -> tuple[str, bool]:
        """(verdict, whether it may be cached) from the helper, restarting it if it died."""
        if self._helper is None and (failure := self._start()):
            return failure, False
        assert self._helper is not None
        _, conn = self._helper
        try:
            conn.send_bytes(payload)
            if conn.poll(self.timeout):
                answer = conn.recv_bytes().decode()
                if answer.startswith("!"):
                    self._stop()
                return ("" if answer == "+" else answer[1:] or "rejected"), True
        except (EOFError, OSError):
            return (f"the native payload crashed its verifier "
                    f"({_exit_reason(self._stop())})", True)
        self._stop()
        return f"its verifier did not finish within {self.timeout:g} s", False

    def _start(self) -> str | None:
        """Start a helper; None once it is ready, else why it is not."""
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        ours, theirs = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(theirs, self._check, self.memory_limit),
                           daemon=True,
                           name=f"mplang-check-{self.what.replace(' ', '-')}")
        with _main_hidden():
            proc.start()
        theirs.close()
        self._helper = (proc, ours)
        try:
            if ours.poll(STARTUP_TIMEOUT) and ours.recv_bytes() == b"ready":
                return None
        except (EOFError, OSError):
            pass
        return f"its verifier did not start ({_exit_reason(self._stop())})"

    def _stop(self) -> int | None:
        """End the helper (if still running); its exit code."""
        assert self._helper is not None
        proc, conn = self._helper
        self._helper = None
        conn.close()
        proc.kill()
        proc.join()
        return proc.exitcode

    def close(self) -> None:
        """Stop the helper (a later check starts a new one)."""
        with self._lock:
            if self._helper is not None:
                self._stop()
