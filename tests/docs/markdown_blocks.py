"""Run a Markdown file's code blocks in order and check what they print.

The conventions of ``docs/tutorials/`` and ``README.md``:

- `````python`` blocks run in order in one namespace, in the working directory
  the caller gives, so a file one block writes is seen by the next;
- `````bash`` blocks run with ``bash -e`` in the same directory, with the running
  interpreter's ``bin`` directory first on ``PATH`` (so ``mplang`` is this
  checkout's command);
- `````bash background`` starts a server (``mplang up``): it runs in the
  background, the runner waits until it prints a line containing ``ready``,
  runs the following blocks, and stops it (SIGINT, then SIGKILL) after the last
  one;
- a block of any language with ``file=NAME`` after it (`````python file=stats.py``,
  `````yaml file=cluster.yaml``) is written to ``NAME`` in the working
  directory instead of being run;
- a `````text`` block right after a python or bash block (only blank lines
  between) is that block's exact standard output. A block that prints without
  one fails, and so does a ``text`` block anywhere else: every output a reader
  sees is checked;
- other blocks (``yaml``, ``toml``) are shown, not run.

Run from a test with `run_markdown` (in this process) or as a script in a fresh
interpreter: ``python tests/docs/markdown_blocks.py FILE.md --cwd DIR``. The
script uses the standard library only, so it runs from any directory.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import difflib
import io
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

RUNNABLE = ("python", "bash")
"""The languages whose blocks run."""
READY = "ready"
"""What a background block's output contains once its server is ready."""
FENCE = re.compile(r"^```(?P<lang>[\w-]*)(?P<tags>[^\n`]*)\n(?P<body>.*?)^```[ \t]*$",
                   re.M | re.S)
BLOCK_TIMEOUT = 300.0
"""Seconds a bash block may run (and a background server may take to be ready)."""


class MarkdownRunError(AssertionError):
    """A block failed or printed something other than the document shows."""


@dataclass(frozen=True)
class Block:
    """A fenced code block: its language, the extra words after it, its text, the line of
    its first text line in the file, and the ``text`` block shown as its output (if any)."""

    lang: str
    tags: tuple[str, ...]
    body: str
    line: int
    expected: str | None = None

    @property
    def background(self) -> bool:
        return self.lang == "bash" and "background" in self.tags

    @property
    def file(self) -> str | None:
        """The file the block is written to (``file=NAME``), if any."""
        names = [t.removeprefix("file=") for t in self.tags if t.startswith("file=")]
        return names[0] if names else None

    @property
    def runs(self) -> bool:
        return self.lang in RUNNABLE and self.file is None


@dataclass
class Outcome:
    """What one block printed and how long it took."""

    block: Block
    stdout: str
    seconds: float


@dataclass
class _Servers:
    """The processes of background blocks (each the leader of its own process group)."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT)
        for proc in self.procs:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        self.procs.clear()


def parse_blocks(text: str) -> list[Block]:
    """The fenced blocks of ``text`` that are not outputs, each with its ``text`` output.

    Raises `MarkdownRunError` for a ``text`` block that does not directly follow a
    python or bash block."""
    blocks: list[Block] = []
    last_end = -1
    for m in FENCE.finditer(text):
        lang, tags, body = m["lang"], tuple(m["tags"].split()), m["body"]
        line = text.count("\n", 0, m.start("body")) + 1
        if lang == "text":
            prev = blocks[-1] if blocks else None
            if (prev is None or not prev.runs or prev.background
                    or prev.expected is not None or text[last_end:m.start()].strip()):
                raise MarkdownRunError(f"line {line}: a text block shows output, but no python "
                                       "or bash block comes right before it")
            blocks[-1] = dataclasses.replace(prev, expected=body)
        else:
            blocks.append(Block(lang, tags, body, line))
        last_end = m.end()
    return blocks


def _where(path: Path, block: Block) -> str:
    return f"{path.name}:{block.line} ({block.lang} block)"


def _check_output(path: Path, block: Block, got: str) -> None:
    if block.expected is None:
        if got:
            raise MarkdownRunError(f"{_where(path, block)} printed\n{got}but the document shows "
                                   "no output: add a ```text block with it right after")
        return
    if got != block.expected:
        diff = "".join(difflib.unified_diff(block.expected.splitlines(True), got.splitlines(True),
                                            "shown in the document", "printed"))
        raise MarkdownRunError(f"{_where(path, block)} printed something else than the text "
                               f"block after it shows:\n{diff}")


def _bash_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def _run_python(path: Path, block: Block, namespace: dict[str, Any]) -> str:
    # padded so that tracebacks and MPLang's source lines name the Markdown file's lines
    code = compile("\n" * (block.line - 1) + block.body, str(path), "exec")
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            exec(code, namespace)
    except BaseException as e:
        e.add_note(f"in {_where(path, block)}; it printed before failing:\n{out.getvalue()}")
        raise
    return out.getvalue()


def _run_bash(path: Path, block: Block, cwd: Path) -> str:
    proc = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", block.body], cwd=cwd,
                          env=_bash_env(), capture_output=True, text=True,
                          timeout=BLOCK_TIMEOUT, check=False)
    if proc.returncode != 0:
        raise MarkdownRunError(f"{_where(path, block)} exited with code {proc.returncode}:\n"
                               f"{proc.stdout}{proc.stderr}")
    return proc.stdout


def _start_background(path: Path, block: Block, cwd: Path, servers: _Servers) -> None:
    log = cwd / f".background-{block.line}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(["bash", "-c", block.body], cwd=cwd, env=_bash_env(),
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    servers.procs.append(proc)
    deadline = time.monotonic() + BLOCK_TIMEOUT
    while READY not in log.read_text(errors="replace"):
        if proc.poll() is not None:
            raise MarkdownRunError(f"{_where(path, block)} exited with code {proc.returncode} "
                                   f"before it was ready:\n{log.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            raise MarkdownRunError(f"{_where(path, block)} was not ready within "
                                   f"{BLOCK_TIMEOUT} s:\n{log.read_text(errors='replace')}")
        time.sleep(0.05)


@contextlib.contextmanager
def _inside(cwd: Path) -> Iterator[None]:
    old = os.getcwd()
    os.chdir(cwd)
    try:
        yield
    finally:
        os.chdir(old)


def run_blocks(path: Path, blocks: Sequence[Block], cwd: Path,
               namespace: dict[str, Any] | None = None) -> list[Outcome]:
    """Run ``blocks`` (of the file ``path``) in order in ``cwd``, checking each output.

    Python blocks share ``namespace`` (default: a new one; pass a dict to see the
    blocks' variables afterwards) and run in this process; the working directory is
    ``cwd`` while they run. Returns what each runnable block printed."""
    namespace = {} if namespace is None else namespace
    namespace.setdefault("__name__", "__main__")
    servers = _Servers()
    outcomes = []
    try:
        with _inside(cwd):
            for block in blocks:
                if block.file is not None:
                    (cwd / block.file).write_text(block.body)
                if not block.runs:
                    continue
                start = time.perf_counter()
                if block.background:
                    _start_background(path, block, cwd, servers)
                    got = ""
                elif block.lang == "python":
                    got = _run_python(path, block, namespace)
                else:
                    got = _run_bash(path, block, cwd)
                if not block.background:
                    _check_output(path, block, got)
                outcomes.append(Outcome(block, got, time.perf_counter() - start))
    finally:
        servers.stop()
    return outcomes


def run_markdown(path: Path, cwd: Path) -> list[Outcome]:
    """Run every python and bash block of the Markdown file ``path`` in ``cwd``."""
    path = Path(path).resolve()
    return run_blocks(path, parse_blocks(path.read_text()), Path(cwd).resolve())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="run a Markdown file's code blocks and "
                                                 "check their printed output")
    parser.add_argument("file", type=Path)
    parser.add_argument("--cwd", type=Path, required=True, help="the blocks' working directory")
    parser.add_argument("--workers", action="store_true",
                        help="mp.Simulator starts worker processes (tests/docs/on_workers.py)")
    args = parser.parse_args(argv)
    if args.workers:
        sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
        from tests.docs.on_workers import STARTED, install

        install()
    try:
        outcomes = run_markdown(args.file, args.cwd)
    except MarkdownRunError as e:
        print(f"FAILED: {e}", file=sys.stderr)
        return 1
    for o in outcomes:
        print(f"{o.seconds:7.2f} s  {_where(args.file, o.block)}", file=sys.stderr)
    if args.workers:
        print("on workers: " + "; ".join(STARTED or ["none started"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    # Leave without interpreter teardown: jaxlib sometimes aborts (std::terminate in
    # ~PyArray_Storage) while a thread is torn down at exit, in about 1 run of 10; the
    # blocks have all been checked by now, and the teardown is not what is tested.
    os._exit(code)
