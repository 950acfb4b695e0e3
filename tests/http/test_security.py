"""Worker endpoints refuse what they must: unauthenticated, forged, replayed,
stale, malformed, oversized and impersonating requests, and pickles.

Most checks run against a worker app built in-process (`WorkerServer` +
`create_app`, driven by Starlette's `TestClient`) so its mailbox can be
inspected; the essential ones are repeated over the network against the shared
worker processes. After every refused request the worker still serves: its
health check answers and a program still runs.
"""

from __future__ import annotations

import json
import os
import pickle
import shlex
import struct
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

import mplang as mp
from mplang import simp
from mplang.backends.simp_worker.http import WorkerServer, create_app
from mplang.backends.wire import decode_value, encode_value_bytes
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.serde import MAGIC as PROGRAM_MAGIC
from mplang.edsl.serde import encode_graph_bundle
from mplang.edsl.typing import Mask, MPType, TensorType
from mplang.frontend import registry

with warnings.catch_warnings():  # Starlette's notice about its httpx-based client
    warnings.filterwarnings("ignore", message=".*starlette.testclient.* is deprecated")
    from fastapi.testclient import TestClient




from tests.http import support

SECRET = support.SECRET
ENDPOINTS = support.ENDPOINTS

# ---------------------------------------------------------------- fixtures and helpers


def _server(max_body: int) -> Iterator[tuple[TestClient, WorkerServer]]:
    spec = support.make_spec(support.free_ports(3))  # peers are never contacted here
    server = WorkerServer(spec, "node_0", SECRET, timeout=5.0, max_body=max_body)
    with TestClient(create_app(server), raise_server_exceptions=False) as client:
        yield client, server


@pytest.fixture
def worker() -> Iterator[tuple[TestClient, WorkerServer]]:
    """An in-process worker for node_0 (rank 0) with a 1 MiB body limit."""
    yield from _server(1 << 20)


@pytest.fixture
def small_worker() -> Iterator[tuple[TestClient, WorkerServer]]:
    """An in-process worker for node_0 with ``max_body=1024``."""
    yield from _server(1024)


def signed_post(client: Any, path: str, body: bytes, *, sender: str = "driver",
                secret: bytes = SECRET, base: str = "", timestamp: float | None = None) -> Any:
    headers, content = support.signed(secret, sender, path, body, timestamp=timestamp)
    return client.post(base + path, content=content, headers=headers)


def run_and_fetch(client: Any, graph: Graph, base: str = "") -> Any:
    """Run a party-0-only graph on the worker and fetch its single output."""
    response = signed_post(client, "/run", support.run_body(graph), base=base)
    assert response.status_code == 200, response.text
    (uri,) = response.json()["outputs"]
    fetched = signed_post(client, "/fetch", support.frame({"uri": uri}), base=base)
    assert fetched.status_code == 200, fetched.text
    return decode_value(fetched.content)


def assert_still_serving(client: Any, base: str = "", graph: Graph | None = None,
                         expected: int = 6) -> None:
    health = client.get(base + "/health")
    assert health.status_code == 200 and health.json()["status"] == "ok"
    value = run_and_fetch(client, graph if graph is not None else support.local_graph(5), base)
    assert int(np.asarray(value)) == expected


def one_op_graph(opcode: str) -> Graph:
    out = Value("x", MPType(TensorType("int32", ()), Mask.of([0])))
    return Graph([], [Operation(opcode, (), (out,), {"parties": Mask.of([0]), "value": 1})],
                 [out])


def edit_program(bundle: bytes, edit: Any) -> bytes:
    """``bundle`` with its JSON document changed by ``edit(doc)``."""
    size = struct.unpack_from("<Q", bundle, 8)[0]
    doc = json.loads(bundle[16:16 + size])
    edit(doc)
    text = json.dumps(doc).encode()
    return bundle[:8] + struct.pack("<Q", len(text)) + text + bundle[16 + size:]


def program_frame(program: bytes, inputs: list[Any] | None = None) -> bytes:
    return support.frame({"exec": uuid.uuid4().hex, "scope": "", "inputs": inputs or [],
                          "progress": False}, program)


# ---------------------------------------------------------------- authentication


def test_health_answers_without_credentials(worker: tuple[TestClient, WorkerServer]) -> None:
    client, _ = worker
    response = client.get("/health")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "node": "node_0", "rank": 0}


@pytest.mark.parametrize("path", ENDPOINTS)
def test_unsigned_requests_get_401(worker: tuple[TestClient, WorkerServer], path: str) -> None:
    client, server = worker
    body = support.valid_body(path)
    assert client.post(path, content=body).status_code == 401
    # authentication comes before parsing: garbage without credentials is also a 401
    assert client.post(path, content=os.urandom(300)).status_code == 401
    # a request missing any one of the headers is refused
    full, content = support.signed(SECRET, "driver", path, body)
    for missing in [h for h in full if h.startswith("x-mplang-")]:
        headers = {k: v for k, v in full.items() if k != missing}
        response = client.post(path, content=content, headers=headers)
        assert response.status_code == 401, missing
    assert server.mailbox.pending() == 0
    assert_still_serving(client)


@pytest.mark.parametrize("path", ENDPOINTS)
def test_wrong_secret_gets_401(worker: tuple[TestClient, WorkerServer], path: str) -> None:
    client, server = worker
    body = support.valid_body(path)
    sender = "node_1" if path == "/msg" else "driver"
    response = signed_post(client, path, body, sender=sender, secret=support.WRONG_SECRET)
    assert response.status_code == 401
    assert server.mailbox.pending() == 0


def test_tampered_requests_get_401(worker: tuple[TestClient, WorkerServer]) -> None:
    client, _ = worker
    body = support.run_body(support.local_graph(5))
    headers, content = support.signed(SECRET, "driver", "/run", body)
    # the body changed after signing (same length, one byte flipped)
    flipped = bytearray(content)
    flipped[len(flipped) // 2] ^= 0x01
    assert client.post("/run", content=bytes(flipped), headers=headers).status_code == 401
    # the body's tag cut off
    headers, content = support.signed(SECRET, "driver", "/run", body)
    assert client.post("/run", content=content[:-32], headers=headers).status_code == 401
    # a signature for one endpoint used on another
    headers, content = support.signed(SECRET, "driver", "/run", body)
    assert client.post("/delete", content=content, headers=headers).status_code == 401
    # another sender name on a valid signature
    headers, content = support.signed(SECRET, "driver", "/run", body)
    forged = {**headers, "x-mplang-sender": "node_2"}
    assert client.post("/run", content=content, headers=forged).status_code == 401
    # a changed timestamp on a valid signature
    headers, content = support.signed(SECRET, "driver", "/run", body)
    moved = {**headers, "x-mplang-timestamp": f"{time.time() + 1:.6f}"}
    assert client.post("/run", content=content, headers=moved).status_code == 401
    assert_still_serving(client)


@pytest.mark.parametrize("path", ENDPOINTS)
def test_replayed_request_gets_403(worker: tuple[TestClient, WorkerServer], path: str) -> None:
    client, _ = worker
    body = support.valid_body(path)
    sender = "node_1" if path == "/msg" else "driver"
    headers, content = support.signed(SECRET, sender, path, body)
    first = client.post(path, content=content, headers=headers)
    assert first.status_code in (200, 404), first.text  # /fetch of an unknown object: 404
    second = client.post(path, content=content, headers=headers)
    assert second.status_code == 403
    assert "replay" in second.json()["error"]


@pytest.mark.parametrize("timestamp", ["hour_old", "hour_ahead"])
def test_stale_timestamp_gets_401(worker: tuple[TestClient, WorkerServer],
                                  timestamp: str) -> None:
    client, _ = worker
    ts = {"hour_old": time.time() - 3600, "hour_ahead": time.time() + 3600}[timestamp]
    response = signed_post(client, "/run", support.run_body(support.local_graph()),
                           timestamp=ts)
    assert response.status_code == 401
    assert_still_serving(client)


# ---------------------------------------------------------------- malformed bodies


def _malformed_bodies() -> dict[str, tuple[str, bytes | Any]]:
    """name -> (endpoint, body or a function building it)."""
    program = encode_graph_bundle(support.local_graph(5), {})
    value_7 = encode_value_bytes(7)

    def rename_op(doc: dict[str, Any]) -> None:
        doc["graph"]["ops"][0]["op"] = "simp.not_a_real_op"

    def drop_field(doc: dict[str, Any]) -> None:
        del doc["graph"]["ops"][0]["attrs"]

    def undefined_input(doc: dict[str, Any]) -> None:
        doc["graph"]["ops"][-1]["in"] = ["nowhere"]

    bad_json = struct.pack("<4sI", b"MPV1", 9) + b"{not json"
    return {
        "run_random_bytes": ("/run", os.urandom(500)),
        "fetch_random_bytes": ("/fetch", os.urandom(500)),
        "delete_random_bytes": ("/delete", os.urandom(500)),
        "abort_random_bytes": ("/abort", os.urandom(500)),
        "msg_random_bytes": ("/msg", os.urandom(500)),
        "empty_body": ("/run", b""),
        "bad_json_header": ("/run", bad_json + program),
        "msg_bad_json_header": ("/msg", bad_json),
        "header_not_an_object": ("/run", support.frame([1, 2, 3]) + program),  # type: ignore
        "header_length_past_end": ("/run", struct.pack("<4sI", b"MPV1", 10_000) + b"{}"),
        "run_missing_exec": ("/run", support.frame({"scope": "", "inputs": []}, program)),
        "run_inputs_not_a_list": ("/run", support.frame({"exec": "e", "scope": "",
                                                         "inputs": "all"}, program)),
        "run_wrong_input_count": ("/run", program_frame(program, [None, None])),
        "program_random_bytes": ("/run", program_frame(os.urandom(400))),
        "program_truncated": ("/run", program_frame(program[:len(program) // 2])),
        "program_bad_json": ("/run", program_frame(PROGRAM_MAGIC + struct.pack("<Q", 5)
                                                    + b"{oops")),
        "unknown_op_name": ("/run", program_frame(edit_program(program, rename_op))),
        "unknown_op_in_graph": ("/run", program_frame(encode_graph_bundle(
            one_op_graph("simp.definitely_unknown"), {}))),
        "op_missing_fields": ("/run", program_frame(edit_program(program, drop_field))),
        "undefined_value": ("/run", program_frame(edit_program(program, undefined_input))),
        "fetch_uri_not_a_string": ("/fetch", support.frame({"uri": ["a", "b"]})),
        "delete_uris_not_a_list": ("/delete", support.frame({"uris": 17})),
        "abort_missing_reason": ("/abort", support.frame({"exec": "e"})),
        "msg_src_out_of_range": ("/msg", support.frame({"src": 9, "exec": "e", "key": "k"},
                                                       value_7)),
        "msg_src_not_an_int": ("/msg", support.frame({"src": "1", "exec": "e", "key": "k"},
                                                     value_7)),
        "msg_value_random_bytes": ("/msg", support.frame({"src": 1, "exec": "e", "key": "k"},
                                                         os.urandom(64))),
        "msg_value_unknown_kind": ("/msg", support.frame(
            {"src": 1, "exec": "e", "key": "k"}, support.frame({"kind": "object"}, b"xx"))),
        "msg_array_size_mismatch": ("/msg", support.frame(
            {"src": 1, "exec": "e", "key": "k"},
            support.frame({"kind": "array", "dtype": "float32", "shape": [1000]}, b"1234"))),
        "msg_array_bad_dtype": ("/msg", support.frame(
            {"src": 1, "exec": "e", "key": "k"},
            support.frame({"kind": "array", "dtype": "object", "shape": [1]}, b"12345678"))),
    }


MALFORMED = _malformed_bodies()


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_body_gets_400_and_worker_keeps_serving(
        worker: tuple[TestClient, WorkerServer], name: str) -> None:
    client, server = worker
    path, body = MALFORMED[name]
    sender = "node_1" if path == "/msg" else "driver"
    response = signed_post(client, path, body, sender=sender)
    assert response.status_code == 400, (response.status_code, response.text)
    assert response.json()["error"]
    assert server.mailbox.pending() == 0
    assert_still_serving(client)


def test_program_whose_op_has_no_kernel_gets_400(worker: tuple[TestClient, WorkerServer],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """An op known to the registry (so the decoder accepts it) but without a worker kernel."""
    client, _ = worker
    name = "httptest.no_kernel"
    monkeypatch.setitem(registry._OPS, name, registry.OpInfo(
        name, "httptest", "compute", "multi_party", False, "an op no backend implements"))
    body = program_frame(encode_graph_bundle(one_op_graph(name), {}))
    response = signed_post(client, "/run", body)
    assert response.status_code == 400, response.text
    assert name in response.json()["error"]
    assert_still_serving(client)


def _with_attr(graph: Graph, opcode: str, key: str, value: Any) -> Graph:
    """``graph`` with attribute ``key`` of every ``opcode`` op (regions included) replaced."""
    ops = [op.replace(attrs={**op.attrs, **({key: value} if op.opcode == opcode else {})},
                      regions=tuple(_with_attr(r, opcode, key, value) for r in op.regions))
           for op in graph.operations]
    return Graph(graph.inputs, ops, graph.outputs)


def _bad_attribute_programs() -> dict[str, Graph]:
    graph = support.local_graph(5)
    module = next(op for op in graph.walk() if op.opcode == "tensor.run_jax").attrs["module"]
    return {
        "stablehlo_random_bytes": _with_attr(graph, "tensor.run_jax", "module",
                                             os.urandom(len(module))),
        "stablehlo_truncated": _with_attr(graph, "tensor.run_jax", "module",
                                          module[:len(module) // 2]),
        "constant_parties_not_a_mask": _with_attr(graph, "simp.constant", "parties", None),
    }


BAD_ATTRIBUTES = _bad_attribute_programs()


@pytest.mark.parametrize("name", sorted(BAD_ATTRIBUTES))
def test_program_with_malformed_op_attributes_is_refused_cleanly(
        worker: tuple[TestClient, WorkerServer], name: str) -> None:
    """A program that decodes but whose op attributes are malformed (an embedded StableHLO
    module that is not one, a party set that is not one) is bad input from the network:
    the worker names the op, keeps serving, and answers 4xx (not a 500 server error)."""
    client, _ = worker
    response = signed_post(client, "/run", support.run_body(BAD_ATTRIBUTES[name]))
    assert response.status_code >= 400
    opcode = "simp.constant" if "constant" in name else "tensor.run_jax"
    assert opcode in response.json()["error"]
    assert_still_serving(client)
    assert 400 <= response.status_code < 500, (response.status_code, response.text)


# ---------------------------------------------------------------- size limit


def test_oversized_body_gets_413(small_worker: tuple[TestClient, WorkerServer]) -> None:
    client, _ = small_worker
    big = support.frame({"uris": []}, b"\0" * 4096)
    # declared too large, signed and unsigned
    assert signed_post(client, "/delete", big).status_code == 413
    assert client.post("/run", content=big).status_code == 413
    # streamed without a content-length
    headers, content = support.signed(SECRET, "driver", "/run", big)

    def chunks() -> Iterator[bytes]:
        for i in range(0, len(content), 512):
            yield content[i:i + 512]

    response = client.post("/run", content=chunks(), headers=headers)
    assert response.status_code == 413
    # a program that fits still runs (a constant only: ~350 bytes)
    tiny = support.tiny_graph(41)
    assert len(support.run_body(tiny)) < 1024
    assert_still_serving(client, graph=tiny, expected=41)


# ---------------------------------------------------------------- impersonation


@pytest.mark.parametrize("sender", ["node_2", "node_0", "driver", "mallory"])
def test_msg_claiming_another_party_gets_403(worker: tuple[TestClient, WorkerServer],
                                             sender: str) -> None:
    client, server = worker
    body = support.frame({"src": 1, "exec": uuid.uuid4().hex, "key": "/0"},
                         encode_value_bytes(123))
    response = signed_post(client, "/msg", body, sender=sender)
    assert response.status_code == 403
    assert server.mailbox.pending() == 0
    # the real party 1 may send the same message
    assert signed_post(client, "/msg", body, sender="node_1").status_code == 200
    assert server.mailbox.pending() == 1


# ---------------------------------------------------------------- pickles are never loaded


class _Exploit:
    """Unpickling this runs ``touch <path>``."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {shlex.quote(str(self.path))}",)


@pytest.fixture
def exploit(tmp_path: Path) -> tuple[bytes, Path]:
    """A pickle whose loading creates a marker file; the control shows that it does."""
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(marker), protocol=pickle.HIGHEST_PROTOCOL)
    subprocess.run([sys.executable, "-c",
                    "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                   input=payload, check=True, timeout=60)
    assert marker.exists(), "control: unpickling the payload should create the marker"
    marker.unlink()
    return payload, marker


def _pickle_attacks(payload: bytes) -> list[tuple[str, str, bytes]]:
    """(endpoint, sender, body) carrying ``payload`` where a careless server might unpickle."""
    msg = {"src": 1, "exec": uuid.uuid4().hex, "key": "/0"}
    return [
        ("/run", "driver", payload),
        ("/run", "driver", program_frame(payload)),
        ("/run", "driver", program_frame(PROGRAM_MAGIC + struct.pack("<Q", len(payload))
                                         + payload)),
        ("/msg", "node_1", payload),
        ("/msg", "node_1", support.frame(msg, payload)),
        ("/msg", "node_1", support.frame(msg, support.frame({"kind": "pickle"}, payload))),
        ("/fetch", "driver", payload),
    ]


def _pickle_as_stablehlo(payload: bytes) -> bytes:
    """A ``/run`` body whose ``tensor.run_jax`` module (bytes the worker hands to JAX's
    deserializer when the op runs) is the pickle."""
    graph = _with_attr(support.local_graph(5), "tensor.run_jax", "module", payload)
    return support.run_body(graph)


def test_pickle_is_never_loaded_in_process(worker: tuple[TestClient, WorkerServer],
                                           exploit: tuple[bytes, Path]) -> None:
    client, server = worker
    payload, marker = exploit
    for path, sender, body in _pickle_attacks(payload):
        response = signed_post(client, path, body, sender=sender)
        assert 400 <= response.status_code < 500, (path, response.status_code)
    # refused when the op runs (status: see the malformed-attribute test)
    assert signed_post(client, "/run", _pickle_as_stablehlo(payload)).status_code >= 400
    assert server.mailbox.pending() == 0
    assert_still_serving(client)
    assert not marker.exists()


# ---------------------------------------------------------------- over the network


def test_network_worker_security(urls: list[str], http_driver: mp.Driver,
                                 exploit: tuple[bytes, Path]) -> None:
    """The worker processes: open health, 401/403/400 as above, no pickle loading."""
    payload, marker = exploit
    with httpx.Client(timeout=10) as client:
        for base in urls:
            health = client.get(base + "/health")
            assert health.status_code == 200 and health.json()["status"] == "ok"
            for path in ENDPOINTS:
                body = support.valid_body(path)
                assert client.post(base + path, content=body).status_code == 401
                assert signed_post(client, path, body, base=base,
                                   secret=support.WRONG_SECRET).status_code == 401
                assert signed_post(client, path, body, base=base,
                                   timestamp=time.time() - 600).status_code == 401
            # the exact same signed request twice
            headers, content = support.signed(SECRET, "driver", "/delete",
                                              support.frame({"uris": []}))
            first = client.post(base + "/delete", content=content, headers=headers)
            again = client.post(base + "/delete", content=content, headers=headers)
            assert (first.status_code, again.status_code) == (200, 403)
            # malformed programs and values
            for name in ("run_random_bytes", "bad_json_header", "unknown_op_name",
                         "msg_value_random_bytes", "program_truncated"):
                path, body = MALFORMED[name]
                sender = "node_1" if path == "/msg" else "driver"
                response = signed_post(client, path, body, base=base, sender=sender)
                assert response.status_code == 400, (base, name, response.text)
            # another party's messages
            msg = support.frame({"src": 1, "exec": uuid.uuid4().hex, "key": "/0"},
                                encode_value_bytes(1))
            assert signed_post(client, "/msg", msg, base=base, sender="node_2").status_code \
                == 403
            for path, sender, body in _pickle_attacks(payload):
                response = signed_post(client, path, body, base=base, sender=sender)
                assert 400 <= response.status_code < 500, (base, path, response.status_code)
            if base == urls[0]:  # party 0 runs the op of that program
                response = signed_post(client, "/run", _pickle_as_stablehlo(payload), base=base)
                assert response.status_code >= 400
    # every worker still serves a whole program
    out = mp.evaluate(http_driver, lambda: simp.shuffle_static(simp.prank() + 1, {0: 2, 2: 0}))
    assert [None if v is None else int(v) for v in mp.fetch(http_driver, out)] == [3, None, 1]
    assert not marker.exists()


def test_replay_after_a_worker_restart_gets_403(local_cluster: Any, urls: list[str],
                                                http_driver: mp.Driver) -> None:
    """A request captured before a worker restarts is still a replay afterwards (it is
    well inside the accepted clock window)."""
    headers, content = support.signed(SECRET, "driver", "/delete", support.frame({"uris": []}))
    with httpx.Client(timeout=10) as client:
        assert client.post(urls[1] + "/delete", content=content, headers=headers).status_code \
            == 200
        local_cluster.kill("node_1")
        local_cluster.start_node("node_1")
        replay = client.post(urls[1] + "/delete", content=content, headers=headers)
    out = mp.evaluate(http_driver, lambda: simp.shuffle_static(simp.prank(), {0: 1}))
    assert int(mp.fetch(http_driver, out)[0]) == 1
    assert replay.status_code == 403, (replay.status_code, replay.text)
