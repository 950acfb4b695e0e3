"""A party's mailbox: messages under one (source, tag) are each taken once, oldest
first; an abort by this party's refusal makes a wait raise the refusal."""

from __future__ import annotations

import pytest

from mplang.edsl.errors import MPCommunicationError, MPRefusedError, MPTimeoutError
from mplang.worker.mailbox import Mailbox


def test_two_messages_under_one_tag_are_both_taken_in_order() -> None:
    box = Mailbox(0)
    box.put(1, ("e", "/0/link#__test__"), b"first", 5)
    box.put(1, ("e", "/0/link#__test__"), b"second", 6)
    assert box.pending() == 2 and box.pending_bytes() == 11
    assert box.take(1, ("e", "/0/link#__test__"), 1.0) == b"first"
    assert box.take(1, ("e", "/0/link#__test__"), 1.0) == b"second"
    assert box.pending() == 0 and box.pending_bytes() == 0
    with pytest.raises(MPTimeoutError, match=r"party 0: no message from party 1 for "
                       r"/0/link#__test__ within 0\.05 s"):
        box.take(1, ("e", "/0/link#__test__"), 0.05)


def test_an_abort_drops_every_queued_message_of_the_execution() -> None:
    box = Mailbox(0)
    for i in range(3):
        box.put(1, ("e", "/0"), i, 10)
    box.put(1, ("other", "/0"), 9, 10)
    box.abort("e", "the driver aborted it")
    assert box.pending() == 1 and box.pending_bytes() == 10
    with pytest.raises(MPCommunicationError, match=r"execution e was abandoned \(the driver "
                       r"aborted it\)"):
        box.take(1, ("e", "/0"), 1.0)


def test_a_refusal_here_is_what_a_wait_raises() -> None:
    box = Mailbox(0)
    box.abort("e", "party 0 refused party 1's message for /0: too large", refused=True)
    box.abort("e", "a later reason")  # the first stays
    with pytest.raises(MPRefusedError, match=r"^party 0 refused party 1's message for /0: "
                       r"too large$"):
        box.take(1, ("e", "/0"), 1.0)
