"""``mplang init`` then ``mplang up --cluster DIR/cluster.yaml``: starts every node of
the spec with its own key, prints each node's endpoint and that the workers are
ready, serves programs over mutual TLS, and stops every worker on Ctrl-C
(SIGINT) and SIGTERM, leaving their ports free; workers whose ``mplang up`` is
killed exit on their own."""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import httpx
import pytest

import mplang as mp
from mplang import simp
from mplang.cluster.identity import format_fingerprint, load_certificate
from tests.worker import support


def _children(pid: int) -> list[int]:
    """The direct children of ``pid`` (Linux /proc)."""
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def _alive(pid: int) -> bool:
    """Whether ``pid`` exists and is not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _init(tmp_path: Path, nodes: int = 3) -> Path:
    result = subprocess.run([*support.mplang_command(), "init", "--nodes", str(nodes),
                             "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert "development on this machine only" in result.stdout
    return tmp_path / "cluster.yaml"


@pytest.mark.parametrize("stop", ["sigint_to_mplang_up", "sigint_to_process_group",
                                  "sigterm_to_mplang_up", "sigkill_to_mplang_up"])
def test_mplang_up_starts_all_nodes_and_stops_them(tmp_path: Path, stop: str) -> None:
    path = _init(tmp_path)
    spec = mp.ClusterSpec.from_yaml(path)
    ports = [int(n.endpoint.rsplit(":", 1)[1]) for n in spec.nodes]
    proc = subprocess.Popen([*support.mplang_command(), "up", "--cluster", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, cwd=tmp_path)  # ./audit, ./data there
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    workers: list[int] = []
    try:
        printed: list[str] = []
        deadline = time.monotonic() + 60
        while not any("ready" in line for line in printed):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no 'ready' line within 60 s: {printed}"
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            assert line is not None, f"mplang up exited: {printed} {proc.stderr.read()}"
            printed.append(line)
        for i, port in enumerate(ports):
            assert any(f"node_{i}: https://127.0.0.1:{port}" in line for line in printed), \
                (i, printed)

        workers = _children(proc.pid)
        assert len(workers) == 3 and all(_alive(pid) for pid in workers), workers
        with httpx.Client(timeout=5) as client:  # plain HTTP is refused
            for port in ports:
                with pytest.raises(httpx.TransportError):
                    client.get(f"http://127.0.0.1:{port}/health")
        driver = mp.Driver(path, key=tmp_path / "keys" / "driver.key")
        try:
            out = mp.evaluate(driver, lambda: simp.shuffle(simp.prank() * 3, 2 - simp.prank()))
            assert [int(v) for v in mp.fetch(driver, out)] == [6, 3, 0]
        finally:
            driver.close()

        if stop == "sigint_to_mplang_up":
            proc.send_signal(signal.SIGINT)  # only `mplang up` itself must stop its workers
        elif stop == "sigint_to_process_group":
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        elif stop == "sigterm_to_mplang_up":
            proc.send_signal(signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGKILL)  # the workers notice their parent is gone
        proc.wait(timeout=30)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr, stderr

        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if _alive(pid)], "workers outlived mplang up"
        assert support.wait_ports_free(ports) == []
    finally:  # never leave processes behind, whatever failed
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in workers:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_mplang_up_without_keys_fails_clearly(tmp_path: Path) -> None:
    path = _init(tmp_path)
    (tmp_path / "keys" / "node_1.key").unlink()
    result = subprocess.run([*support.mplang_command(), "up", "--cluster", str(path)],
                            capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert result.returncode != 0
    assert "node_1.key" in result.stderr and "Traceback" not in result.stderr, result.stderr


def test_mplang_up_with_a_busy_port_fails_and_stops_the_other_workers(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        ports = [busy.getsockname()[1], *support.free_ports(2)]
        dev = support.dev_cluster(tmp_path, support.make_spec(ports))
        result = subprocess.run([*support.mplang_command(), "up", "--cluster",
                                 str(dev.spec_path)], capture_output=True, text=True,
                                timeout=120, cwd=tmp_path)
    assert result.returncode != 0
    assert str(ports[0]) in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert support.wait_ports_free(ports[1:]) == []


def test_keygen_writes_a_private_key_and_prints_the_fingerprint(tmp_path: Path) -> None:
    result = subprocess.run([*support.mplang_command(), "keygen", "--name", "org_a", "--out",
                             str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    key, crt = tmp_path / "org_a.key", tmp_path / "org_a.crt"
    assert key.stat().st_mode & 0o777 == 0o600
    cert = load_certificate(str(crt))
    assert format_fingerprint(cert.fingerprint) in result.stdout
    again = subprocess.run([*support.mplang_command(), "keygen", "--name", "org_a", "--out",
                            str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert again.returncode != 0 and "already exists" in again.stderr
