"""How the failure of an op on a party looks outside the party and in its log
(`mplang.worker.failures.Containment`), for tests to compare with: outside,
a generic `mp.MPRuntimeError` naming the op, its source line, the node and the party;
in the log (the ``mplang.worker`` logger), the failure's full text."""

from __future__ import annotations

import logging
import re
import traceback
from pathlib import Path

import pytest

import mplang as mp


def traced_at(test_file: str, tag: str) -> str:
    """``NAME.py:LINE`` of the one line of ``test_file`` that ends with ``# @tag``."""
    path = Path(test_file)
    lines = [i for i, text in enumerate(path.read_text().splitlines(), 1)
             if text.rstrip().endswith(f"# @{tag}")]
    assert len(lines) == 1, (tag, lines)
    return f"{path.name}:{lines[0]}"


def assert_generic(error: BaseException, op: str, at: str, rank: int,
                   node: str | None = None) -> None:
    """``error`` is exactly the generic error the failure of ``op`` (traced at ``at``) on
    party ``rank`` (node ``node``, default ``node_<rank>``) leaves the party as."""
    node = node or f"node_{rank}"
    assert type(error) is mp.MPRuntimeError, repr(error)
    assert str(error) == f"op {op} at {at} failed on {node} (party {rank}; its log has the " \
                         "details)"


def _pattern(op: str, at: str, node: str) -> str:
    return rf"execution \S+: op {re.escape(op)} at {re.escape(at)} \(run \S+\) failed on " \
           rf"{re.escape(node)}: (.*)"


def logged_failure(caplog: pytest.LogCaptureFixture, op: str, at: str, node: str) -> str:
    """The full text (``Type: message``) logged by ``mplang.worker`` of the one failure
    of ``op`` traced at ``at`` on ``node``, among the records ``caplog`` captured."""
    found = [m.group(1) for r in caplog.records
             if r.name == "mplang.worker" and r.levelno == logging.ERROR
             and (m := re.fullmatch(_pattern(op, at, node), r.getMessage(), re.DOTALL))]
    assert len(found) == 1, (op, at, node, found, caplog.text[-3000:])
    return found[0]


def logged_failure_line(log: str, op: str, at: str, node: str) -> str:
    """The first line of the full text of the one failure of ``op`` traced at ``at`` on
    ``node`` in ``log``, the text of a worker's log file."""
    found = re.findall(_pattern(op, at, node), log)
    assert len(found) == 1, (op, at, node, found, log[-3000:])
    return str(found[0])


def every_text(error: BaseException) -> str:
    """All the text a driver can get from ``error``: its message, arguments, printed
    traceback and those of every exception chained to it."""
    texts, todo, seen = [], [error], set()
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        texts += [str(e), repr(e), *map(repr, e.args), *map(repr, vars(e).values())]
        todo += [e.__cause__, e.__context__]
    return "\n".join([*texts, *traceback.format_exception(error)])
