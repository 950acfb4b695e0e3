"""``mplang up --cluster cluster.yaml``: starts every node of the spec, prints each
node's endpoint and that the workers are healthy, serves programs, and stops
every worker on Ctrl-C (SIGINT), leaving their ports free."""

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
import yaml

import mplang as mp
from mplang import simp
from tests.http import support


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


@pytest.mark.parametrize("ctrl_c", ["sigint_to_mplang_up", "sigint_to_process_group"])
def test_mplang_up_starts_all_nodes_and_ctrl_c_stops_them(tmp_path: Path, ctrl_c: str) -> None:
    ports = support.free_ports(3)
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(support.spec_dict(ports)))
    proc = subprocess.Popen([*support.mplang_command(), "up", "--cluster", str(path)],
                            env=support.worker_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
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
        while not any("healthy" in line for line in printed):
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no 'healthy' line within 60 s: {printed}"
            try:
                line = lines.get(timeout=remaining)
            except queue.Empty:
                continue
            assert line is not None, f"mplang up exited: {printed} {proc.stderr.read()}"
            printed.append(line)
        for i, port in enumerate(ports):
            assert any(f"node_{i}" in line and f"127.0.0.1:{port}" in line for line in printed), \
                (i, printed)

        workers = _children(proc.pid)
        assert len(workers) == 3 and all(_alive(pid) for pid in workers), workers
        with httpx.Client(timeout=5) as client:
            for port in ports:
                assert client.get(f"http://127.0.0.1:{port}/health").status_code == 200
        driver = mp.Driver(path, secret=support.SECRET)
        try:
            out = mp.evaluate(driver, lambda: simp.shuffle(simp.prank() * 3, 2 - simp.prank()))
            assert [int(v) for v in mp.fetch(driver, out)] == [6, 3, 0]
        finally:
            driver.close()

        if ctrl_c == "sigint_to_mplang_up":
            proc.send_signal(signal.SIGINT)  # only `mplang up` itself must stop its workers
        else:
            os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does
        proc.wait(timeout=30)
        assert proc.stderr is not None
        stderr = proc.stderr.read()
        assert "Traceback" not in stderr, stderr

        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not [pid for pid in workers if _alive(pid)], "workers outlived mplang up"
        assert support.wait_ports_free(ports) == []
        with httpx.Client(timeout=2) as client:
            for port in ports:
                with pytest.raises(httpx.ConnectError):
                    client.get(f"http://127.0.0.1:{port}/health")
    finally:  # never leave processes behind, whatever failed
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        for pid in workers:
            if _alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_mplang_up_without_a_secret_fails_clearly(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(yaml.safe_dump(support.spec_dict(support.free_ports(3))))
    env = {k: v for k, v in os.environ.items() if k != "MPLANG_CLUSTER_SECRET"}
    result = subprocess.run([*support.mplang_command(), "up", "--cluster", str(path)], env=env,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "MPLANG_CLUSTER_SECRET" in result.stderr and "Traceback" not in result.stderr


def test_mplang_up_with_a_busy_port_fails_and_stops_the_other_workers(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        ports = [busy.getsockname()[1], *support.free_ports(2)]
        path = tmp_path / "cluster.yaml"
        path.write_text(yaml.safe_dump(support.spec_dict(ports)))
        result = subprocess.run([*support.mplang_command(), "up", "--cluster", str(path)],
                                env=support.worker_env(), capture_output=True, text=True,
                                timeout=120)
    assert result.returncode != 0
    assert str(ports[0]) in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert support.wait_ports_free(ports[1:]) == []
