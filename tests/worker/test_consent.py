"""The signed accept over real mutual TLS: committed programs, the votes the parties send
each other, refusals.

Three workers run in this process (`support.ThreadWorker`); a driver either is an
`mp.Driver` (whose requests are recorded) or speaks raw requests to act as a
driver that sends different programs to different parties.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.cluster.commitments import (
    commit,
    decode_vote,
    encode_openings,
    encode_vote,
    vote_message,
)
from mplang.cluster.identity import load_identity
from mplang.edsl.errors import MPRefusedError
from mplang.edsl.graph import Graph
from mplang.edsl.serde import encode_graph_bundle
from mplang.worker.consent import PROGRAM_BYTES
from tests.worker import support

SECRET0 = np.array([3.14159, -2.71828, 1.41421], dtype=np.float32)


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> support.DevCluster:
    return support.dev_cluster(tmp_path_factory.mktemp("consent"),
                               support.make_spec(support.free_ports(3)))


@pytest.fixture(scope="module")
def workers(dev: support.DevCluster) -> Iterator[list[support.ThreadWorker]]:
    with support.thread_workers(dev, 3) as started:
        yield started


@pytest.fixture
def driver(dev: support.DevCluster, workers: Any) -> Iterator[mp.Driver]:
    drv = mp.Driver(dev.spec_path, key=dev.keys / "driver.key", timeout=10.0)
    try:
        yield drv
    finally:
        drv.close()


def secret_sum() -> Any:
    """Party 0's constant goes to party 1, which adds its own constant; party 2 holds one
    of its own."""
    x = simp.constant((0,), SECRET0)
    y = simp.shuffle_static(x, {1: 0})
    z = simp.constant((2,), 5)
    return simp.pcall((1,), lambda a: a + tensor.constant(np.ones(3, np.float32)), y), z


def record(driver: mp.Driver, monkeypatch: pytest.MonkeyPatch) -> dict[int, list[bytes]]:
    """The bodies the driver posts to each party, from now on."""
    seen: dict[int, list[bytes]] = {0: [], 1: [], 2: []}
    post = driver._clients.post

    def recording(rank: int, path: str, parts: Any, **kwargs: Any) -> httpx.Response:
        seen[rank].append(b"".join(bytes(p) for p in parts))
        return post(rank, path, parts, **kwargs)

    monkeypatch.setattr(driver._clients, "post", recording)
    return seen


def test_a_party_never_receives_another_partys_constant(driver: mp.Driver,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    seen = record(driver, monkeypatch)
    out, five = mp.evaluate(driver, secret_sum)
    np.testing.assert_array_equal(mp.fetch(driver, out)[1], SECRET0 + 1)
    assert int(mp.fetch(driver, five)[2]) == 5
    assert any(SECRET0.tobytes() in body for body in seen[0])
    assert seen[1] and seen[2]
    assert not any(SECRET0.tobytes() in body for body in [*seen[1], *seen[2]])


def run_body(graph: Graph, rank: int, exec_id: str, parties: list[int] | None = None
             ) -> bytes:
    """A ``/run`` body of ``graph`` (``parties``, default 0..2) for worker ``rank``, as a
    driver sends it: the committed program and that party's openings."""
    committed = commit(graph, 3)
    data = encode_graph_bundle(committed.graph, {})
    return support.frame({"exec": exec_id, "scope": "", "inputs": [],
                          "parties": parties or [0, 1, 2],
                          PROGRAM_BYTES: len(data), "progress": False},
                         data, encode_openings(committed.openings[rank]))


def run_everywhere(dev: support.DevCluster, graphs: list[Graph], exec_id: str,
                   parties: list[list[int]] | None = None) -> list[httpx.Response]:
    """Each worker ``rank``'s answer to ``/run`` of ``graphs[rank]`` (run by
    ``parties[rank]``, default all three), sent at once."""
    def one(rank: int) -> httpx.Response:
        with dev.client("driver", rank) as client:
            return client.post("/run", content=run_body(
                graphs[rank], rank, exec_id, parties[rank] if parties else None))

    with ThreadPoolExecutor(3) as pool:
        return list(pool.map(one, range(3)))


def test_every_party_votes_for_one_execution_digest(
        dev: support.DevCluster, workers: list[support.ThreadWorker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    graph = mp.compile(secret_sum, world_size=3).graph
    exec_id = uuid.uuid4().hex
    expected = hashlib.sha256(encode_graph_bundle(commit(graph, 3).graph, {})).hexdigest()
    received: list[tuple[int, int, str, str, str]] = []
    for w in workers:
        put = w.server.votes.put
        monkeypatch.setattr(w.server.votes, "put", lambda sender, e, scope, vote, _r=w.server
                            .rank, _put=put: (received.append((_r, sender, e, scope, vote)),
                                              _put(sender, e, scope, vote))[1])
    responses = run_everywhere(dev, [graph] * 3, exec_id)
    assert [r.status_code for r in responses] == [200, 200, 200]
    assert sorted((to, sender) for to, sender, *_ in received) == [
        (to, sender) for to in range(3) for sender in range(3) if sender != to]
    message = vote_message(exec_id, "", expected, dev.spec.digest(), [0, 1, 2])
    for _, sender, exec_seen, scope, vote in received:
        assert (exec_seen, scope) == (exec_id, "")
        signature = decode_vote(vote)
        certificate = dev.spec.nodes[sender].certificate
        assert signature is not None and certificate is not None
        assert certificate.verify(signature, message)
        assert not certificate.verify(signature, message + b"x")


def test_different_programs_for_different_parties_are_refused_before_any_op_runs(
        dev: support.DevCluster, workers: list[support.ThreadWorker]) -> None:
    honest = mp.compile(secret_sum, world_size=3).graph
    other = mp.compile(lambda: secret_sum(), world_size=3).graph  # other nonces
    exec_id = uuid.uuid4().hex
    stored = [len(w.server.worker.store) for w in workers]
    responses = run_everywhere(dev, [honest, other, honest], exec_id)
    for rank, response in enumerate(responses):
        assert response.status_code == 409
        party = 1 if rank != 1 else 0
        assert f"party {rank}: the vote of party {party} for execution {exec_id} is not a " \
               "signature over this program" in response.json()["error"]
    assert [len(w.server.worker.store) for w in workers] == stored
    assert all(w.server.mailbox.pending() == 0 for w in workers)
    assert all(w.server.executions.running() == 0 for w in workers)


def test_different_lists_of_parties_are_refused_before_any_op_runs(
        dev: support.DevCluster, workers: list[support.ThreadWorker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver tells party 2 that only parties 0 and 2 take part: the votes sign the
    parties too, so parties 0 and 2 refuse each other's votes, and party 1, to which
    party 2 never votes, gives up waiting for it. No party runs."""
    monkeypatch.setattr(workers[1].server, "timeout", 1.0)
    graph = mp.compile(secret_sum, world_size=3).graph
    exec_id = uuid.uuid4().hex
    first, second, third = run_everywhere(dev, [graph] * 3, exec_id,
                                          [[0, 1, 2], [0, 1, 2], [0, 2]])
    for rank, response, party in ((0, first, 2), (2, third, 0)):
        assert response.status_code == 409, response.text
        assert response.json()["error"].startswith(
            f"party {rank}: the vote of party {party} for execution {exec_id} is not a "
            "signature over this program")
        assert response.json()["error"].endswith(
            "the parties were given different programs or parties, or the vote was forged")
    assert second.status_code == 500 and second.json()["kind"] == "MPTimeoutError"
    assert second.json()["error"].startswith(f"party 1: no vote of party 2 for execution "
                                             f"{exec_id} came in time")
    assert all(w.server.executions.running() == 0 for w in workers)


def test_a_vote_is_its_senders_and_must_sign_the_program(
        dev: support.DevCluster, workers: list[support.ThreadWorker]) -> None:
    """Listed peers cannot vote for each other: a vote counts for the certificate that
    sent it, so node_2 passing on node_1's valid vote is refused as node_2's."""
    graph = mp.compile(secret_sum, world_size=3).graph
    run = support.start_waiting_run(dev, workers[0], graph)
    node_1 = load_identity(dev.keys / "node_1.key")
    valid = encode_vote(node_1.sign(vote_message(run.exec_id, "", run.digest,
                                                 dev.spec.digest(), [0, 1, 2]))).encode()
    support.send_vote(dev, "node_1", 0, run.exec_id, valid)
    support.send_vote(dev, "node_2", 0, run.exec_id, valid)
    answer = run.answer.result(timeout=30)
    assert answer.status_code == 409
    assert answer.json()["error"].startswith(
        f"party 0: the vote of party 2 for execution {run.exec_id} is not a signature "
        "over this program")

    run = support.start_waiting_run(dev, workers[0], graph)
    support.send_vote(dev, "node_1", 0, run.exec_id, b"AAAA")
    support.send_vote(dev, "node_2", 0, run.exec_id, b"!!")
    answer = run.answer.result(timeout=30)
    assert answer.status_code == 409
    assert answer.json()["error"].startswith(
        f"party 0: the vote of party 1 for execution {run.exec_id} is not a signature")
    assert all(w.server.executions.running() == 0 for w in workers)


def test_a_tampered_opening_is_refused_with_400(dev: support.DevCluster, workers: Any) -> None:
    graph = mp.compile(secret_sum, world_size=3).graph
    committed = commit(graph, 3)
    data = encode_graph_bundle(committed.graph, {})
    (path, (value, nonce)), = committed.openings[0].items()
    body = support.frame({"exec": uuid.uuid4().hex, "scope": "", "inputs": [],
                          "parties": [0, 1, 2], PROGRAM_BYTES: len(data)},
                         data, encode_openings({path: (value * 2, nonce)}))
    with dev.client("driver", 0) as client:
        response = client.post("/run", content=body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert "op #0 simp.constant (traced at test_consent.py:" in error
    assert "attribute 'value': the opening does not match its commitment" in error
    assert workers[0].server.executions.running() == 0


def test_a_party_refusing_the_program_means_nothing_runs_anywhere(
        driver: mp.Driver, workers: list[support.ThreadWorker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    ran: list[int] = []
    for w in workers:
        original = w.server.execute
        monkeypatch.setattr(w.server, "execute", lambda p, d, _r=w.server.rank, _o=original:
                            (ran.append(_r), _o(p, d))[1])
    monkeypatch.setattr(workers[2].server.worker, "vet", lambda *a: "this driver may not")
    with pytest.raises(MPRefusedError, match="node_2 refuses the program: this driver "
                                             "may not"):
        mp.evaluate(driver, secret_sum)
    assert ran == []
    deadline = time.monotonic() + 10
    while any(w.server.executions.running() for w in workers):
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_driver_constant_on_spu_reaches_each_member_as_its_share_only(
        driver: mp.Driver, monkeypatch: pytest.MonkeyPatch) -> None:
    value = np.array([1234567, -7654321, 42], dtype=np.int32)
    seen = record(driver, monkeypatch)

    def prog() -> Any:
        s = mp.put("SP0", value)
        return mp.put("P2", mp.device("SP0")(lambda a: a * 3 - 1)(s))

    np.testing.assert_array_equal(mp.fetch(driver, mp.evaluate(driver, prog)), value * 3 - 1)
    assert all(seen[r] for r in range(3))
    assert not any(value.tobytes() in body for r in range(3) for body in seen[r])


def test_no_worker_hands_a_secret_share_to_a_driver(dev: support.DevCluster,
                                                    driver: mp.Driver) -> None:
    """A driver that skips `mp.fetch`'s refusal and asks each member for its share of an
    SPU value directly gets 403 from every member: shares leave only inside the protocol."""
    shared = mp.evaluate(driver, lambda: mp.put("SP0", mp.put("P0", SECRET0)))
    uris = shared.var.uris
    assert all(uri is not None for uri in uris)
    for rank, uri in enumerate(uris):
        with dev.client("driver", rank) as client:
            answer = client.post("/fetch", content=support.frame({"uri": uri}))
        assert answer.status_code == 403, answer.text
        assert answer.json()["error"] == (
            f"party {rank}: object {uri} is a secret share, which leaves this party only "
            "inside its protocol; reveal the value in the program instead, e.g. return "
            "mp.put('P0', z)")
    revealed = mp.fetch(driver, mp.evaluate(driver, lambda s: mp.put("P1", s), shared))
    np.testing.assert_allclose(revealed, SECRET0, atol=1e-4)


def test_a_party_told_it_runs_alone_sends_nothing(
        dev: support.DevCluster, workers: list[support.ThreadWorker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver tells party 0 alone to run a program that sends party 0's constant to
    party 1. Party 0 waits for no vote, so it must not send to a party that never
    accepted the program: its op fails and the constant never leaves it."""
    heads: list[Any] = []
    admit = workers[1].server.inbox.admit
    monkeypatch.setattr(workers[1].server.inbox, "admit",
                        lambda *a: (heads.append(a), admit(*a))[1])
    graph = mp.compile(secret_sum, world_size=3).graph
    exec_id = uuid.uuid4().hex
    with dev.client("driver", 0) as client:
        response = client.post("/run", content=run_body(graph, 0, exec_id, [0]))
    assert response.status_code == 500, response.text
    error = response.json()["error"]
    assert f"execution {exec_id}: op /1 sends to party 1, which is not one of the parties " \
           "the driver named for this run ([0], who alone accepted its program); nothing " \
           "was sent" in error, error
    assert heads == []
    assert all(w.server.executions.running() == 0 for w in workers)
