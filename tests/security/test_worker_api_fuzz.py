"""The worker API under schemathesis: the OpenAPI document covers every route, and ~250
generated cases against a real worker process over mutual TLS break no rule (no 5xx
but a failed /run's, the right refusal for a forged identity or spec digest, answers
conforming to the document, no crash, the cluster still runs programs).

The full campaign (2,000 cases and more) is ``benchmarks/fuzz_worker_api.py``; the
harness is `tests.security.worker_api_fuzz`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import schemathesis
from fastapi.routing import APIRoute

from mplang.worker.http import create_app
from mplang.worker.openapi import WORKER_API, worker_api
from mplang.worker.server import WorkerServer
from tests.security import worker_api_fuzz
from tests.worker import support

CI_CASES = 450
"""Cases per CI run: enough that, with ten operations, the campaign reaches runs, fetches
and deletes (their 200s are asserted) with room to spare."""


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> support.DevCluster:
    return support.dev_cluster(tmp_path_factory.mktemp("api"),
                               support.make_spec(support.free_ports(3)))


def test_document_lists_every_route(dev: support.DevCluster) -> None:
    server = WorkerServer(dev.spec, "node_0", dev.identity("node_0"),
                          audit_log=dev.spec_path.parent / "audit" / "node_0.jsonl")
    try:
        app = create_app(server)
        routes = {(route.path, method.lower()) for route in app.routes
                  if isinstance(route, APIRoute) for method in route.methods or ()}
    finally:
        server.close()
    documented = {(path, method) for path, item in WORKER_API["paths"].items()
                  for method in item}
    assert routes, "create_app served no route"
    assert routes == documented, (routes - documented, documented - routes)


def test_document_loads_in_schemathesis() -> None:
    schema = schemathesis.openapi.from_dict(worker_api())
    assert {op.label for op in worker_api_fuzz.operations(schema)} == {
        "GET /health", "POST /run", "POST /fetch", "POST /delete",
        "POST /abort", "POST /close", "POST /msg", "POST /upload", "POST /budget",
        "POST /describe"}


def test_generated_cases_break_no_rule(tmp_path: Path) -> None:
    with worker_api_fuzz.campaign(tmp_path) as (fuzz, driver):
        stats = fuzz.run(CI_CASES, seed=0)
        problems = fuzz.aftermath(driver)
    report = "\n".join(f.describe() for f in stats.new_findings[:10])
    assert not stats.new_findings, f"{len(stats.new_findings)} findings:\n{report}"
    assert not problems, "\n".join(problems)
    assert stats.cases == CI_CASES
    # the campaign reached past the refusals: programs ran, messages and objects moved
    reached = {key.rsplit(" ", 1)[0] for key, n in stats.by_status.items()
               if key.endswith(" 200") and n}
    assert {"/health", "/run", "/delete"} <= reached, stats.summary()


@pytest.fixture
def worker(dev: support.DevCluster) -> Iterator[support.ThreadWorker]:
    thread_worker = support.ThreadWorker(dev, "node_0")
    thread_worker.start()
    try:
        yield thread_worker
    finally:
        thread_worker.stop()


@pytest.mark.parametrize(("path", "header"), [
    ("/run", {"exec": 5, "scope": "", "inputs": [], "parties": [0]}),
    ("/run", {"exec": 5.5, "scope": ""}),
    ("/abort", {"exec": ["e"], "reason": "r"}),
])
def test_non_string_exec_id_is_refused(dev: support.DevCluster, worker: support.ThreadWorker,
                                       path: str, header: dict[str, object]) -> None:
    payload = b"x" if path == "/run" else b""
    with dev.client("driver", 0) as client:
        answer = client.post(path, content=support.frame(header, payload))
    assert answer.status_code == 400, answer.text
