"""The votes the parties of a run send each other: the vote box's own rules, and a
listed peer that floods a real worker with votes over ``mplang/1``."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.cluster.identity import load_identity
from mplang.edsl.errors import MPCommunicationError, MPTimeoutError
from mplang.transport.mux_client import MuxClients
from mplang.worker.messages import H_EXEC, H_KEY
from mplang.worker.votes import PER_PEER, VoteBox
from tests.worker import support


def _never(party: int) -> str:
    return f"party {party} never voted"


def test_an_early_vote_waits_for_its_run_and_each_sender_has_one_slot() -> None:
    box = VoteBox(0)
    box.put(1, "e", "", "first")
    box.put(1, "e", "", "second")  # a sender's second vote for the same run is ignored
    box.put(2, "e", "/s", "other scope")
    later = threading.Timer(0.05, box.put, (2, "e", "", "late"))
    later.start()
    assert box.take("e", "", {1, 2}, time.monotonic() + 5, _never) == \
        {"1": "first", "2": "late"}
    assert box.held(1) == 0 and box.held(2) == 1  # the other scope's vote stays


def test_a_missing_vote_times_out_naming_its_party() -> None:
    box = VoteBox(0)
    box.put(2, "e", "", "v")
    with pytest.raises(MPTimeoutError) as caught:
        box.take("e", "", {1, 2}, time.monotonic() + 0.05, _never)
    assert str(caught.value) == ("party 0: no vote of party 1 for execution e came in time: "
                                 "party 1 never voted")
    assert (caught.value.party, caught.value.peer) == (0, 1)


def test_an_abort_ends_the_wait_now_and_later() -> None:
    box = VoteBox(0)
    threading.Timer(0.05, box.abort, ("e", "the driver gave up")).start()
    started = time.monotonic()
    with pytest.raises(MPCommunicationError, match=r"^party 0: execution e was abandoned "
                       r"\(the driver gave up\) while waiting for the vote of party 1$"):
        box.take("e", "", {1}, time.monotonic() + 10, _never)
    assert time.monotonic() - started < 5
    with pytest.raises(MPCommunicationError, match="abandoned"):
        box.take("e", "/later", {1}, time.monotonic() + 10, _never)


def test_a_peer_holds_at_most_its_quota_of_unclaimed_votes() -> None:
    box = VoteBox(0)
    for i in range(PER_PEER + 10):
        box.put(1, f"e{i}", "", "v")
    box.put(2, "mine", "", "honest")
    assert box.held(1) == PER_PEER and box.held(2) == 1
    with pytest.raises(MPTimeoutError):  # the oldest went first
        box.take("e0", "", {1}, time.monotonic(), _never)
    assert box.take(f"e{PER_PEER + 9}", "", {1}, time.monotonic(), _never) == {"1": "v"}
    assert box.take("mine", "", {2}, time.monotonic(), _never) == {"2": "honest"}


# ---------------------------------------------------------------- a real worker


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> support.DevCluster:
    return support.dev_cluster(tmp_path_factory.mktemp("votes"),
                               support.make_spec(support.free_ports(3)))


@pytest.fixture(scope="module")
def workers(dev: support.DevCluster) -> Iterator[list[support.ThreadWorker]]:
    with support.thread_workers(dev, 3) as started:
        yield started


def _shuffle() -> Any:
    return simp.shuffle_static(simp.constant((1,), np.int32(7)), {0: 1})


def test_a_peer_flooding_votes_costs_its_quota_and_honest_runs_go_on(
        dev: support.DevCluster, workers: list[support.ThreadWorker]) -> None:
    """node_1 sends 3,000 votes for executions that do not exist: node_0 keeps at most
    its quota of them, answers none, and a real run across the parties still works."""
    clients = MuxClients(dev.spec, load_identity(dev.keys / "node_1.key"), 10.0)
    try:
        for _ in range(3 * PER_PEER):
            clients.send(0, "/vote", [b"QUFBQQ=="], {H_EXEC: uuid.uuid4().hex, H_KEY: ""})
        clients.post(0, "/health", [])  # every vote went before it, on one connection
    finally:
        clients.close()
    assert workers[0].server.votes.held(1) == PER_PEER
    driver = mp.Driver(dev.spec_path, key=dev.keys / "driver.key", timeout=10.0)
    try:
        assert int(mp.fetch(driver, mp.evaluate(driver, _shuffle))[0]) == 7
    finally:
        driver.close()


def test_a_vote_for_an_aborted_execution_is_refused_and_its_sender_stops(
        dev: support.DevCluster, workers: list[support.ThreadWorker]) -> None:
    """A run waiting for votes on node_1 whose execution node_0 has aborted: node_0
    refuses node_1's vote (410), and node_1 abandons the run at once rather than waiting
    for its timeout."""
    graph = mp.compile(_shuffle, world_size=3).graph
    exec_id = uuid.uuid4().hex
    with dev.client("driver", 0) as client:
        assert client.post("/abort", content=support.frame(
            {"exec": exec_id, "reason": "cancelled"})).status_code == 200
    started = time.monotonic()
    with dev.client("driver", 1) as client:
        answer = client.post("/run", content=support.run_body(graph, exec_id=exec_id,
                                                               parties=[0, 1, 2]))
    assert time.monotonic() - started < 5  # not the worker's 10-second timeout
    assert answer.status_code == 500 and answer.json()["kind"] == "MPCommunicationError"
    assert answer.json()["error"].startswith(
        f"party 1: execution {exec_id} was abandoned (party 0 refused it: 410 execution "
        f"{exec_id} was aborted)")
