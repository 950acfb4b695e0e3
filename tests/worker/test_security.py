"""Workers between parties that do not trust each other: identities come from the TLS
handshake, roles from the spec, and a worker refuses what no running execution of its
own driver expects.

Three workers run in this process over real mutual TLS (`support.ThreadWorker`), so
their mailboxes, stores and executions can be inspected. Clients present the
certificate of a node, of a listed driver (``driver``, ``driver2``), of ``mallory``
(valid, but in no spec), or an expired or unpinned one. After every refused request
the worker still serves: its health check answers and a program still runs.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import pickle
import re
import shlex
import socket
import ssl
import struct
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

import mplang as mp
from mplang import simp
from mplang.cluster.identity import keygen
from mplang.edsl import registry as primitive_registry
from mplang.edsl.attrs import ConfigField as Attr
from mplang.edsl.graph import Graph, Operation, Value
from mplang.edsl.primitive import Primitive, Result, Signature
from mplang.edsl.serde import MAGIC as PROGRAM_MAGIC
from mplang.edsl.serde import encode_graph_bundle
from mplang.edsl.typing import Mask, MPType, TensorType
from mplang.transport.limits import WorkerLimits
from mplang.transport.wire import decode_value, encode_value_bytes
from tests.worker import support

# ---------------------------------------------------------------- fixtures and helpers


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> support.DevCluster:
    return support.dev_cluster(tmp_path_factory.mktemp("security"),
                               support.make_spec(support.free_ports(3)))


@pytest.fixture(scope="module")
def workers(dev: support.DevCluster) -> Iterator[list[support.ThreadWorker]]:
    """node_0..node_2 in this process; node_0 has a 64 MiB body limit."""
    with support.thread_workers(dev, 3, limits={0: WorkerLimits(max_body_bytes=64 << 20)}
                                ) as started:
        yield started


@pytest.fixture
def as_driver(dev: support.DevCluster, workers: Any) -> Iterator[httpx.Client]:
    with dev.client("driver", 0) as client:
        yield client


def post(client: httpx.Client, path: str, body: bytes, **kwargs: Any) -> httpx.Response:
    return client.post(path, content=body, **kwargs)


def run_and_fetch(client: httpx.Client, graph: Graph) -> Any:
    """Run a party-0-only graph on worker 0 and fetch its single output."""
    response = post(client, "/run", support.run_body(graph))
    assert response.status_code == 200, response.text
    (uri,) = response.json()["outputs"]
    fetched = post(client, "/fetch", support.frame({"uri": uri}))
    assert fetched.status_code == 200, fetched.text
    return decode_value(fetched.content)


def assert_still_serving(dev: support.DevCluster, workers: list[support.ThreadWorker]) -> None:
    with dev.client("driver", 0) as client:
        health = client.get("/health")
        assert health.status_code == 200 and health.json()["node"] == "node_0"
        assert int(np.asarray(run_and_fetch(client, support.local_graph(5)))) == 6
    for w in workers:
        assert w.server.mailbox.pending() == 0


def receive_graph() -> Graph:
    """Party 0 receives an int32 scalar from party 1 (what a peer message can be for)."""
    return mp.compile(lambda: simp.shuffle_static(simp.constant((1,), 7), {0: 1}),
                      world_size=3).graph


def waiting_on_0(dev: support.DevCluster, workers: list[support.ThreadWorker],
                 graph: Graph) -> tuple[str, str]:
    """A run of ``graph`` (parties 0..2) started on worker 0 alone, waiting there for the
    others' votes: (exec id, program digest)."""
    run = support.start_waiting_run(dev, workers[0], graph)
    return run.exec_id, run.digest


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


def one_op_graph(opcode: str) -> Graph:
    out = Value("x", MPType(TensorType("int32", ()), Mask.of([0])))
    return Graph([], [Operation(opcode, (), (out,), {"parties": Mask.of([0]), "value": 1})],
                 [out])


def expired_identity(folder: Path, name: str = "old") -> tuple[Path, Path]:
    """A key and a certificate that expired yesterday."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(days=30))
            .not_valid_after(now - dt.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    key_path, cert_path = folder / f"{name}.key", folder / f"{name}.crt"
    key_path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                           serialization.PrivateFormat.PKCS8,
                                           serialization.NoEncryption()))
    key_path.chmod(0o600)
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


def raw_tls_client(dev: support.DevCluster, cert: Path, key: Path, rank: int = 0
                   ) -> httpx.Client:
    """A client presenting any certificate (no checks on our side), pinned to the worker."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.load_verify_locations(cadata=dev.spec.nodes[rank].certificate.pem)  # type: ignore
    ctx.load_cert_chain(cert, key)
    return httpx.Client(verify=ctx, base_url=dev.spec.base_urls()[rank], timeout=10)


# ---------------------------------------------------------------- transport and identity


def test_plain_http_is_refused(dev: support.DevCluster, workers: Any) -> None:
    url = dev.spec.base_urls()[0].replace("https://", "http://")
    with httpx.Client(timeout=5) as client, pytest.raises(httpx.TransportError):
        client.get(url + "/health")
    assert_still_serving(dev, workers)


def test_unlisted_certificate_fails_the_handshake(dev: support.DevCluster,
                                                  workers: Any) -> None:
    """``mallory`` has a valid certificate that the spec does not list."""
    with dev.client(support.STRANGER, 0) as client, pytest.raises(httpx.TransportError):
        client.get("/health")
    assert_still_serving(dev, workers)


def test_self_signed_unpinned_and_expired_certificates_fail(dev: support.DevCluster,
                                                            workers: Any,
                                                            tmp_path: Path) -> None:
    keygen("intruder", tmp_path)
    key, cert = expired_identity(tmp_path)
    for cert_path, key_path in [(tmp_path / "intruder.crt", tmp_path / "intruder.key"),
                                (cert, key)]:
        with raw_tls_client(dev, cert_path, key_path) as client, \
                pytest.raises(httpx.TransportError):
            client.get("/health")
    assert_still_serving(dev, workers)


def test_a_listed_but_expired_certificate_fails(dev: support.DevCluster, workers: Any,
                                                tmp_path: Path) -> None:
    key, cert = expired_identity(tmp_path, "old_driver")
    support.rewrite_spec(dev, lambda d: d["drivers"].append(
        {"name": "old_driver", "certificate": str(cert)}))
    try:
        assert all(w.server.reload_if_changed() for w in workers)
        with raw_tls_client(dev, cert, key) as client, pytest.raises(httpx.TransportError):
            client.get("/health")
        with pytest.raises(mp.MPLangError, match="not valid now"):
            mp.Driver(dev.spec_path, key=key)
    finally:
        support.rewrite_spec(dev, lambda d: d["drivers"].pop())
        for w in workers:
            w.server.reload_if_changed()
    assert_still_serving(dev, workers)


def test_a_client_pinned_to_one_worker_refuses_another(dev: support.DevCluster,
                                                       workers: Any) -> None:
    """A driver that expects node_1's certificate does not accept node_0's."""
    with dev.client("driver", 0, pin=1) as client, pytest.raises(httpx.TransportError):
        client.get("/health")


def test_spec_digest_mismatch_is_refused(dev: support.DevCluster, workers: Any) -> None:
    with dev.client("driver", 0) as client:
        response = post(client, "/run", support.run_body(support.local_graph()),
                        headers={"x-mplang-spec": "0" * 64})
        assert response.status_code == 409
        assert "cluster spec mismatch" in response.json()["error"]



def test_a_driver_with_another_spec_gets_a_refusal_naming_the_party(
        dev: support.DevCluster, workers: Any) -> None:
    """A driver whose spec differs (here by one device) is refused by the first party it
    asks: `mp.MPRefusedError` with that party, the status, and what to check."""
    edited = yaml.safe_load(dev.spec_path.read_text())
    edited["devices"]["P9"] = {"kind": "PPU", "members": ["node_1"]}
    other = dev.spec_path.with_name("other_cluster.yaml")  # beside the certificates
    other.write_text(yaml.safe_dump(edited))
    refused = support.driver_refusal(other, dev.keys / "driver.key")
    assert (refused.party, refused.status) == (0, 409)
    assert re.fullmatch(r"party 0 \(node_0 at https://127\.0\.0\.1:\d+\) refused op "
                        r"simp\.constant: 409 cluster spec mismatch: node_0 has spec "
                        r"[0-9a-f]{16}\.\.\., driver 'driver' sent [0-9a-f]{16}\.\.\.: both "
                        r"must load the same spec", str(refused))

# ---------------------------------------------------------------- roles


@pytest.mark.parametrize("path", support.DRIVER_ENDPOINTS)
@pytest.mark.parametrize("who", ["node_1", "node_2"])
def test_a_node_certificate_cannot_act_as_a_driver(dev: support.DevCluster, workers: Any,
                                                   path: str, who: str) -> None:
    with dev.client(who, 0) as client:
        response = post(client, path, support.valid_body(path))
    assert response.status_code == 403, response.text
    assert response.json()["error"] == (f"node {who!r} may not use {path} (only a driver "
                                        "may)")
    assert_still_serving(dev, workers)


def test_a_driver_cannot_send_peer_messages(dev: support.DevCluster, workers: Any) -> None:
    with dev.client("driver", 0) as client:
        response = post(client, "/msg", encode_value_bytes(1), headers=support.msg_headers())
    assert response.status_code == 403
    assert "only a node may" in response.json()["error"]


def test_the_sender_is_the_certificate_not_a_claim(dev: support.DevCluster,
                                                   workers: list[support.ThreadWorker],
                                                   as_driver: httpx.Client) -> None:
    """node_2 sending what only party 1 should send lands as party 2's message (or is
    refused): no header or body field can make it party 1's."""
    exec_id, digest = waiting_on_0(dev, workers, receive_graph())
    with dev.client("node_2", 0) as client:
        headers = {**support.msg_headers(exec_id, "/1", digest), "x-mplang-src": "1"}
        response = post(client, "/msg", encode_value_bytes(np.int32(666)), headers=headers)
    assert response.status_code == 200
    box = workers[0].server.mailbox
    with pytest.raises(mp.MPCommunicationError):
        box.take(1, (exec_id, "/1"), timeout=0.05)  # nothing arrived from party 1
    assert int(box.take(2, (exec_id, "/1"), timeout=1)) == 666
    post(as_driver, "/abort", support.frame({"exec": exec_id, "reason": "test"}))


# ---------------------------------------------------------------- objects and executions


def test_objects_belong_to_the_driver_that_made_them(dev: support.DevCluster,
                                                     workers: list[support.ThreadWorker],
                                                     as_driver: httpx.Client) -> None:
    response = post(as_driver, "/run", support.run_body(support.local_graph(41)))
    (uri,) = response.json()["outputs"]
    assert uri.startswith("mem://node_0/") and len(uri.rsplit("/", 1)[1]) == 32
    with dev.client("driver2", 0) as other:
        assert post(other, "/fetch", support.frame({"uri": uri})).status_code == 404
        deleted = post(other, "/delete", support.frame({"uris": [uri]}))
        assert deleted.status_code == 200 and deleted.json() == {"deleted": 0}
        # another driver's inputs cannot be used either
        run = post(other, "/run", support.run_body(support.local_graph(), inputs=[uri]))
        assert run.status_code == 400 or "not in the store" in run.text
    assert uri in workers[0].server.worker.store
    assert int(np.asarray(decode_value(
        post(as_driver, "/fetch", support.frame({"uri": uri})).content))) == 42
    assert post(as_driver, "/delete", support.frame({"uris": [uri]})).json() == {"deleted": 1}


def test_another_driver_cannot_abort_an_execution(dev: support.DevCluster, workers: Any,
                                                  as_driver: httpx.Client) -> None:
    exec_id, _ = waiting_on_0(dev, workers, receive_graph())
    with dev.client("driver2", 0) as other:
        response = post(other, "/abort", support.frame({"exec": exec_id, "reason": "x"}))
        assert response.status_code == 403
        again = post(other, "/run", support.run_body(receive_graph(), exec_id=exec_id,
                                                     parties=[0, 1, 2]))
        assert again.status_code in (403, 409)
    post(as_driver, "/abort", support.frame({"exec": exec_id, "reason": "test"}))


def test_an_execution_id_cannot_be_reused(as_driver: httpx.Client) -> None:
    body = support.run_body(support.local_graph(), exec_id="reused-id-1")
    assert post(as_driver, "/run", body).status_code == 200
    again = post(as_driver, "/run", body)
    assert again.status_code == 409 and "already used" in again.json()["error"]


def test_messages_nobody_expects_are_refused_at_once(dev: support.DevCluster,
                                                     workers: list[support.ThreadWorker],
                                                     as_driver: httpx.Client) -> None:
    with dev.client("node_1", 0) as client:
        unknown = post(client, "/msg", encode_value_bytes(1), headers=support.msg_headers())
        assert unknown.status_code == 409 and "not running here" in unknown.json()["error"]
        exec_id, digest = waiting_on_0(dev, workers, receive_graph())
        other_program = post(client, "/msg", encode_value_bytes(np.int32(1)),
                             headers=support.msg_headers(exec_id, "/1", "f" * 64))
        assert other_program.status_code == 409
        wrong_op = post(client, "/msg", encode_value_bytes(np.int32(1)),
                        headers=support.msg_headers(exec_id, "/0", digest))
        assert wrong_op.status_code == 403 and "sends no messages" in wrong_op.json()["error"]
        too_big = post(client, "/msg", encode_value_bytes(np.zeros(1 << 18, np.int32)),
                       headers=support.msg_headers(exec_id, "/1", digest))
        assert too_big.status_code == 413 and "types allow" in too_big.json()["error"]
        post(as_driver, "/abort", support.frame({"exec": exec_id, "reason": "test"}))
        late = post(client, "/msg", encode_value_bytes(np.int32(1)),
                    headers=support.msg_headers(exec_id, "/1", digest))
        assert late.status_code == 410
    assert workers[0].server.mailbox.pending_bytes() == 0
    assert_still_serving(dev, workers)


def test_a_flood_of_large_unexpected_messages_leaves_nothing_behind(
        dev: support.DevCluster, workers: list[support.ThreadWorker]) -> None:
    """12 messages of 64 MiB for executions that do not exist: each refused before its
    body is read; nothing is kept."""
    big = b"\0" * (64 << 20)
    with dev.client("node_1", 0) as client:
        for _ in range(12):
            try:
                response = post(client, "/msg", big, headers=support.msg_headers())
            except httpx.TransportError:  # refused while the body was still being sent
                continue
            assert response.status_code == 409
    assert workers[0].server.mailbox.pending_bytes() == 0
    assert_still_serving(dev, workers)


def test_bodies_over_the_limit_get_413(dev: support.DevCluster, workers: Any,
                                       as_driver: httpx.Client) -> None:
    """Worker 0 takes bodies of at most 64 MiB: a declared gigabyte is refused unread."""
    spec = dev.spec
    cert = spec.nodes[0].certificate
    assert cert is not None
    host, port = spec.nodes[0].endpoint.split(":")
    ctx = dev.identity("driver").client_context(cert)
    with socket.create_connection((host, int(port)), timeout=10) as raw, \
            ctx.wrap_socket(raw) as tls:
        tls.sendall(f"POST /run HTTP/1.1\r\nhost: {host}\r\ncontent-length: {1 << 30}\r\n"
                    f"x-mplang-spec: {spec.digest()}\r\n\r\n".encode() + b"\0" * 4096)
        answer_bytes = b""
        while b"}" not in answer_bytes:
            chunk = tls.recv(4096)
            if not chunk:
                break
            answer_bytes += chunk
    answer = answer_bytes.decode(errors="replace")
    assert answer.startswith("HTTP/1.1 413"), answer
    assert "exceeds the limit of 67108864" in answer

    def chunks() -> Iterator[bytes]:
        yield b"\0" * 1024

    no_length = as_driver.post("/run", content=chunks())  # chunked: no content-length
    assert no_length.status_code == 411
    assert_still_serving(dev, workers)


def test_a_program_declaring_a_huge_tensor_is_refused_before_it_runs(
        as_driver: httpx.Client) -> None:
    huge = MPType(TensorType("float32", (10**12,)), Mask.of([0]))
    x, y, v = Value("x", huge), Value("y", huge), Value("v", huge.base)
    body = Graph([v], [], [v])
    graph = Graph([x], [Operation("simp.pcall", (x,), (y,),
                                  {"parties": Mask.of([0]), "fn": "identity"}, (body,))], [y])
    response = post(as_driver, "/run", support.run_body(graph, inputs=["mem://node_0/0"]))
    assert response.status_code == 413
    assert "op simp.pcall declares a value f32[1000000000000]" in response.json()["error"]


# ---------------------------------------------------------------- revocation and rotation


def test_revoking_a_driver_and_rotating_a_node_key_take_effect_on_reload(
        dev: support.DevCluster, workers: list[support.ThreadWorker], tmp_path: Path) -> None:
    with dev.client("driver2", 0) as client:
        assert client.get("/health").status_code == 200
    original = dev.spec_path.read_text()
    try:
        support.rewrite_spec(dev, lambda d: d["drivers"].pop())  # drop driver2
        assert workers[0].server.reload_if_changed()
        assert support.handshake_refused(dev, "driver2", 0)  # TLS trusts it no more
        # node_2 gets a new key: the others accept the new certificate, refuse the old one
        keygen("node_2", tmp_path)
        support.rewrite_spec(dev, lambda d: d["nodes"][2].update(
            certificate=str(tmp_path / "node_2.crt")))
        assert workers[0].server.reload_if_changed()
        new_node_2 = support.DevCluster(dev.spec_path, tmp_path)
        with new_node_2.client("node_2", 0) as client:
            response = post(client, "/msg", encode_value_bytes(1),
                            headers=support.msg_headers())
            assert response.status_code == 409  # known, but nothing expects this message
        assert support.handshake_refused(dev, "node_2", 0)  # the old certificate
    finally:
        dev.spec_path.write_text(original)
        for w in workers:
            w.server.reload_if_changed()
    assert_still_serving(dev, workers)


def test_a_reload_that_changes_nodes_is_refused(dev: support.DevCluster,
                                                workers: list[support.ThreadWorker]) -> None:
    original = dev.spec_path.read_text()
    try:
        support.rewrite_spec(dev, lambda d: d["nodes"][1].update(endpoint="127.0.0.1:1"))
        assert not workers[0].server.reload_if_changed()
        with dev.client("driver", 0) as client:  # it sends the new spec's digest
            response = post(client, "/run", support.valid_body("/run"))
        assert response.status_code == 409
        assert "node_0 did not reload" in response.json()["error"]
        assert "the nodes change to node_0 at 127.0.0.1:" in response.json()["error"]
        assert "node_1 at 127.0.0.1:1, node_2 at" in response.json()["error"]
    finally:
        dev.spec_path.write_text(original)
        workers[0].server.reload_if_changed()
    assert_still_serving(dev, workers)


# ---------------------------------------------------------------- malformed bodies


def _malformed_bodies() -> dict[str, tuple[str, bytes]]:
    """name -> (endpoint, body); every one must get a 400."""
    program = encode_graph_bundle(support.local_graph(5), {})

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
        "empty_body": ("/run", b""),
        "bad_json_header": ("/run", bad_json + program),
        "header_not_an_object": ("/run", support.frame([1, 2, 3]) + program),  # type: ignore
        "header_length_past_end": ("/run", struct.pack("<4sI", b"MPV1", 10_000) + b"{}"),
        "run_missing_exec": ("/run", support.frame({"scope": "", "inputs": []}, program)),
        "run_bad_exec_id": ("/run", support.frame({"exec": "../x y", "scope": "",
                                                   "inputs": []}, program)),
        "run_inputs_not_a_list": ("/run", support.frame({"exec": "e", "scope": "",
                                                         "inputs": "all"}, program)),
        "run_wrong_input_count": ("/run", program_frame(program, [None, None])),
        "run_parties_without_self": ("/run", support.frame(
            {"exec": "p1", "scope": "", "inputs": [], "parties": [1, 2]}, program)),
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
    }


MALFORMED = _malformed_bodies()


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_malformed_body_gets_400_and_worker_keeps_serving(
        dev: support.DevCluster, workers: Any, as_driver: httpx.Client, name: str) -> None:
    path, body = MALFORMED[name]
    response = post(as_driver, path, body)
    assert response.status_code == 400, (response.status_code, response.text)
    assert response.json()["error"]
    assert_still_serving(dev, workers)


MALFORMED_VALUES = {
    "random_bytes": os.urandom(64),
    "unknown_kind": support.frame({"kind": "object"}, b"xx"),
    "array_size_mismatch": support.frame({"kind": "array", "dtype": "int32", "shape": [10]},
                                         b"1234"),
    "array_bad_dtype": support.frame({"kind": "array", "dtype": "object", "shape": [1]},
                                     b"12345678"),
    "phe_key_garbage": support.frame({"kind": "phe.public_key", "sizes": [24, 9]},
                                     b"PHEP" + bytes(16) + (2048).to_bytes(4, "little")
                                     + b"\x93garbage"),
    "phe_ciphertext_garbage": support.frame({"kind": "phe.ciphertext", "sizes": [3, 4]},
                                            b"abcdefg"),
    "phe_private_key": support.frame({"kind": "phe.private_key", "sizes": [4]}, b"sk!!"),
}


@pytest.mark.parametrize("name", sorted(MALFORMED_VALUES))
def test_malformed_message_values_get_400(dev: support.DevCluster, workers: Any,
                                          as_driver: httpx.Client, name: str) -> None:
    exec_id, digest = waiting_on_0(dev, workers, receive_graph())
    with dev.client("node_1", 0) as client:
        response = post(client, "/msg", MALFORMED_VALUES[name],
                        headers=support.msg_headers(exec_id, "/1", digest))
    assert response.status_code == 400, response.text
    post(as_driver, "/abort", support.frame({"exec": exec_id, "reason": "test"}))
    assert_still_serving(dev, workers)


def test_program_whose_op_has_no_kernel_gets_400(as_driver: httpx.Client,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A declared op (so the decoder and the type check accept it) without a worker kernel."""
    name = "httptest.no_kernel"
    prim = Primitive(name, kind="source", execution_model="multi_party",
                     attrs={"parties": Attr(Mask, required=True),
                            "value": Attr(int, required=True)},
                     results=[Result("out")], doc="an op no backend implements")
    try:
        @prim.def_type_rule
        def _one_int(sig: Signature) -> list[MPType]:
            return [MPType(TensorType("int32", ()), sig.parties)]

        response = post(as_driver, "/run", program_frame(
            encode_graph_bundle(one_op_graph(name), {})))
        assert response.status_code == 400, response.text
        assert name in response.json()["error"]
    finally:
        del primitive_registry.PRIMITIVES[name]


def _with_attr(graph: Graph, opcode: str, key: str, value: Any) -> Graph:
    """``graph`` with attribute ``key`` of every ``opcode`` op (regions included) replaced."""
    ops = [op.replace(attrs={**op.attrs, **({key: value} if op.opcode == opcode else {})},
                      regions=tuple(_with_attr(r, opcode, key, value) for r in op.regions))
           for op in graph.operations]
    return Graph(graph.inputs, ops, graph.outputs)


def test_malformed_op_attributes_are_refused_cleanly(dev: support.DevCluster, workers: Any,
                                                     as_driver: httpx.Client) -> None:
    """A program that decodes but whose op attributes are malformed is bad input from the
    network: the worker names the op, answers 4xx and keeps serving."""
    graph = support.local_graph(5)
    module = next(op for op in graph.walk() if op.opcode == "tensor.run_jax").attrs["module"]
    cases = {"tensor.run_jax": [_with_attr(graph, "tensor.run_jax", "module",
                                           os.urandom(len(module))),
                                _with_attr(graph, "tensor.run_jax", "module",
                                           module[:len(module) // 2])],
             "simp.constant": [_with_attr(graph, "simp.constant", "parties", None)]}
    for opcode, graphs in cases.items():
        for bad in graphs:
            response = post(as_driver, "/run", support.run_body(bad))
            assert 400 <= response.status_code < 500, (response.status_code, response.text)
            assert opcode in response.json()["error"]
    assert_still_serving(dev, workers)


# ---------------------------------------------------------------- pickles are never loaded


class _Exploit:
    """Unpickling this runs ``touch <path>``."""

    def __init__(self, path: Path):
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return os.system, (f"touch {shlex.quote(str(self.path))}",)


def test_pickle_is_never_loaded(dev: support.DevCluster, workers: Any,
                                as_driver: httpx.Client, tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = pickle.dumps(_Exploit(marker), protocol=pickle.HIGHEST_PROTOCOL)
    subprocess.run([sys.executable, "-c",
                    "import pickle, sys; pickle.loads(sys.stdin.buffer.read())"],
                   input=payload, check=True, timeout=60)
    assert marker.exists(), "control: unpickling the payload should create the marker"
    marker.unlink()
    for path, body in [("/run", payload), ("/run", program_frame(payload)),
                       ("/run", program_frame(PROGRAM_MAGIC + struct.pack("<Q", len(payload))
                                              + payload)),
                       ("/fetch", payload),
                       ("/run", support.run_body(_with_attr(support.local_graph(5),
                                                            "tensor.run_jax", "module",
                                                            payload)))]:
        response = post(as_driver, path, body)
        assert 400 <= response.status_code < 500, (path, response.status_code)
    exec_id, digest = waiting_on_0(dev, workers, receive_graph())
    with dev.client("node_1", 0) as client:
        for body in [payload, support.frame({"kind": "pickle"}, payload)]:
            response = post(client, "/msg", body,
                             headers=support.msg_headers(exec_id, "/1", digest))
            assert response.status_code == 400
    post(as_driver, "/abort", support.frame({"exec": exec_id, "reason": "test"}))
    assert not marker.exists()
    assert_still_serving(dev, workers)


# ---------------------------------------------------------------- a whole program still runs


def test_programs_across_the_three_workers_still_run(dev: support.DevCluster,
                                                     workers: Any) -> None:
    driver = mp.Driver(dev.spec_path, key=dev.keys / "driver.key", timeout=10.0)
    try:
        out = mp.evaluate(driver, lambda: simp.shuffle_static(simp.prank() + 1, {0: 2, 2: 0}))
        assert [None if v is None else int(v) for v in mp.fetch(driver, out)] == [3, None, 1]
        x = np.arange(6, dtype=np.int32)
        z = mp.evaluate(driver, lambda: mp.put("P2", mp.device("SP0")(lambda a, b: a * b)(
            mp.put("P0", x), mp.put("P1", x + 1))))
        np.testing.assert_array_equal(mp.fetch(driver, z), x * (x + 1))
    finally:
        driver.close()
    for w in workers:
        assert w.server.mailbox.pending() == 0
        assert w.server.executions.running() == 0


def test_votes_are_awaited_for_the_vote_limit_not_the_workers_timeout(
        dev: support.DevCluster, workers: list[support.ThreadWorker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A party frozen before it votes is named after ``vote_seconds`` (30 by default),
    however long the worker's timeout for other waits."""
    server = workers[0].server
    assert WorkerLimits().vote_seconds == 30.0
    monkeypatch.setattr(server, "timeout", 600.0)
    monkeypatch.setattr(server, "limits", dataclasses.replace(server.limits, vote_seconds=0.5))
    run = support.start_waiting_run(dev, workers[0], receive_graph())
    answer = run.answer.result(timeout=30)
    assert answer.status_code == 500 and answer.json()["kind"] == "MPTimeoutError"
    assert answer.json()["error"] == (
        f"party 0: no vote of party 1 for execution {run.exec_id} came in time: party 1 "
        "was not asked to run it, or did not accept it within 0.5 s")
    assert server.executions.running() == 0


def test_a_run_whose_votes_never_come_leaves_nothing_behind(
        dev: support.DevCluster, workers: list[support.ThreadWorker],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A driver that starts a run on one party and then disappears: the run ends when the
    other parties' votes do not come within the worker's timeout, naming the first party
    it waited for, and the message a peer already sent for it is dropped with it."""
    server = workers[0].server
    monkeypatch.setattr(server, "timeout", 0.5)
    run = support.start_waiting_run(dev, workers[0], receive_graph())
    with dev.client("node_1", 0) as client:
        sent = post(client, "/msg", encode_value_bytes(np.int32(5)),
                    headers=support.msg_headers(run.exec_id, "/1", run.digest))
    assert sent.status_code == 200
    answer = run.answer.result(timeout=30)
    assert answer.status_code == 500 and answer.json()["kind"] == "MPTimeoutError"
    assert answer.json()["error"] == (
        f"party 0: no vote of party 1 for execution {run.exec_id} came in time: party 1 "
        "was not asked to run it, or did not accept it within 0.5 s")
    assert answer.json()["peer"] == 1
    assert server.mailbox.pending() == 0 and server.executions.running() == 0
    with dev.client("node_1", 0) as client:
        late = post(client, "/msg", encode_value_bytes(np.int32(5)),
                    headers=support.msg_headers(run.exec_id, "/1", run.digest))
    assert late.status_code == 410
