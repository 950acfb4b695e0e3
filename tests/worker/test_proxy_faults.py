"""A TCP proxy of our own (``tests/worker/tcp_proxy.py``) stands in front of node_1: every
connection to it, from the driver and from its peers, passes through the proxy, and
mutual TLS still holds end to end. With 50 ms of latency each way runs complete with the
right values; a stall or a cut mid-run ends the run within its timeout + 2 s with an
`mp.MPCommunicationError` naming party 1 (a stall shorter than the timeout only delays
it, a cut may also be survived), nothing hangs, and once the proxy forwards again the
next run succeeds."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import simp
from tests.worker import chaos, support, tcp_proxy
from tests.worker.tcp_proxy import TcpProxy

TIMEOUT = 3.0
LATENCY_S = 0.05


@pytest.fixture(scope="module")
def proxied() -> Iterator[tuple[mp.Driver, TcpProxy]]:
    with tcp_proxy.proxied_cluster(rank=1) as (cluster, proxy), \
            support.connected_driver(cluster) as driver:
        yield driver, proxy


@pytest.fixture
def driver(proxied: tuple[mp.Driver, TcpProxy]) -> Iterator[mp.Driver]:
    """The driver, with the proxy forwarding promptly again after each test."""
    driver, proxy = proxied
    yield driver
    proxy.latency_s = 0.0
    proxy.resume()


@pytest.fixture
def proxy(proxied: tuple[mp.Driver, TcpProxy]) -> TcpProxy:
    return proxied[1]


def _on_party_1() -> Any:
    return simp.pcall((1,), lambda v: v + 1, simp.constant((1,), np.int32(41)))


def test_runs_complete_under_latency(driver: mp.Driver, proxy: TcpProxy) -> None:
    """50 ms each way: the driver's round trip to node_1 takes two of them, and SPU, PSI
    and PHE programs across node_1 give the right values within their timeout."""
    assert mp.fetch(driver, mp.evaluate(driver, _on_party_1))[1] == 42
    proxy.latency_s = LATENCY_S
    started = time.monotonic()
    assert mp.fetch(driver, mp.evaluate(driver, _on_party_1))[1] == 42
    assert time.monotonic() - started >= 2 * LATENCY_S
    for workload in (chaos.spu_workload(rounds=5, size=100), chaos.psi_workload(rows=10_000),
                     chaos.phe_workload(size=200)):
        chaos.timed(driver, workload, 10 * TIMEOUT)


def _assert_named_in_time(ended: tuple[BaseException | None, float] | None) -> None:
    assert ended is not None, "the run ended before the proxy's fault"
    error, to_error = ended
    assert isinstance(error, mp.MPCommunicationError), repr(error)
    assert chaos.blamed(error) == 1 and "party 1" in str(error), error
    assert to_error <= TIMEOUT + chaos.GRACE_S, (to_error, error)


SLOW_SPU = chaos.spu_workload(rounds=120, size=100)
"""A second or two of ABY3 rounds: a stall or cut half a second in lands inside the op
(or, on a loaded machine, in the requests that start it)."""


def test_a_stall_past_the_timeout_names_the_party_behind_it(driver: mp.Driver,
                                                            proxy: TcpProxy) -> None:
    """node_1's peers stop hearing from it (it waits for their messages, held in the
    proxy): the run fails at the timeout naming party 1; the held bytes are delivered
    afterwards, to an execution that is gone, and the next run succeeds."""
    chaos.timed(driver, SLOW_SPU, None)
    _assert_named_in_time(chaos.struck(driver, SLOW_SPU, 0.5, TIMEOUT, proxy.stall,
                                       proxy.resume))
    chaos.timed(driver, SLOW_SPU, None)


def test_a_stall_forever_ends_and_a_fresh_connection_serves(driver: mp.Driver,
                                                            proxy: TcpProxy) -> None:
    """The stalled connections are never resumed but reset; new ones serve the next run."""
    def heal() -> None:
        proxy.cut()
        proxy.resume()

    _assert_named_in_time(chaos.struck(driver, SLOW_SPU, 0.5, TIMEOUT, proxy.stall, heal))
    chaos.timed(driver, SLOW_SPU, None)


def test_a_short_stall_only_delays_the_run(driver: mp.Driver, proxy: TcpProxy) -> None:
    """Held for a quarter of the timeout inside the op, the bytes then flow again."""
    def stall_briefly() -> None:
        proxy.stall()
        threading.Timer(TIMEOUT / 4, proxy.resume).start()

    chaos.timed(driver, SLOW_SPU, None)
    ended = chaos.struck(driver, SLOW_SPU, 0.5, TIMEOUT, stall_briefly, lambda: None)
    assert ended is not None and ended[0] is None, ended


def test_a_cut_mid_run_fails_named_or_completes(driver: mp.Driver, proxy: TcpProxy) -> None:
    """Every connection to node_1 is reset inside the op: the run either fails within the
    timeout + 2 s naming party 1, or (reconnecting) completes; the next run succeeds."""
    chaos.timed(driver, SLOW_SPU, None)
    ended = chaos.struck(driver, SLOW_SPU, 0.5, TIMEOUT, proxy.cut, lambda: None)
    assert ended is not None
    if ended[0] is not None:
        _assert_named_in_time(ended)
    chaos.timed(driver, SLOW_SPU, None)
