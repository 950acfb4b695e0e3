"""Start every node of a cluster spec as a worker process on this machine."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import TracebackType

import httpx
import yaml

from mplang.device.cluster import ClusterSpec
from mplang.frontend.errors import MPLangError
from mplang.runtime.auth import SECRET_ENV


class LocalCluster:
    """Worker processes for each node of ``cluster`` (``mplang worker`` per node).

    Used by ``mplang up`` and by tests; a context manager that stops all workers.
    """

    def __init__(self, cluster: ClusterSpec, secret: bytes, *, log_dir: str | None = None,
                 register: list[str] | None = None, plugins: list[str] | None = None):
        self.cluster = cluster
        self.register = list(register or [])
        """``module:function`` host functions every worker registers for ``tensor.pyfunc``."""
        self.plugins = list(plugins or [])
        """Plugins (entry-point or module names) every worker loads before serving."""
        self._secret = secret
        self._dir = tempfile.TemporaryDirectory(prefix="mplang-cluster-")
        self.spec_path = Path(self._dir.name) / "cluster.yaml"
        self.spec_path.write_text(yaml.safe_dump(cluster.to_dict()))
        self.log_dir = Path(log_dir or self._dir.name)
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def _spawn(self, node: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, SECRET_ENV: self._secret.decode()}
        registers = [arg for spec in self.register for arg in ("--register", spec)]
        plugins = [arg for name in self.plugins for arg in ("--plugin", name)]
        # the worker gets its own copy of the log's descriptor; this process closes its own
        with open(self.log_dir / f"{node}.log", "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "mplang.cli", "worker", "--cluster", str(self.spec_path),
                 "--node", node, *registers, *plugins], env=env, stdout=log,
                stderr=subprocess.STDOUT)

    def start(self, timeout: float = 60.0) -> None:
        """Start every worker and wait until all answer ``/health``."""
        for node in self.cluster.nodes:
            self.processes[node.name] = self._spawn(node.name)
        self.wait_healthy(timeout)

    def start_node(self, node: str, timeout: float = 60.0) -> None:
        self.processes[node] = self._spawn(node)
        self.wait_healthy(timeout, [node])

    def wait_healthy(self, timeout: float, nodes: list[str] | None = None) -> None:
        names = nodes or [n.name for n in self.cluster.nodes]
        urls = dict(zip([n.name for n in self.cluster.nodes], self.cluster.base_urls(),
                        strict=True))
        deadline = time.monotonic() + timeout
        with httpx.Client(timeout=1.0, verify=self.cluster.client_verify()) as client:
            for name in names:
                while True:
                    proc = self.processes[name]
                    if proc.poll() is not None:
                        raise MPLangError(f"worker {name} exited with code {proc.returncode}: "
                                          f"{self.log_tail(name)}")
                    try:
                        if client.get(urls[name] + "/health").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    if time.monotonic() > deadline:
                        raise MPLangError(f"worker {name} did not become healthy in {timeout} s")
                    time.sleep(0.05)

    def log_tail(self, node: str, size: int = 2000) -> str:
        path = self.log_dir / f"{node}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def kill(self, node: str) -> None:
        """SIGKILL one worker (fault injection)."""
        proc = self.processes[node]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def stop(self) -> None:
        """Stop all workers: SIGTERM, then SIGKILL after a grace period."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.terminate()
        for proc in self.processes.values():
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()

    def __enter__(self) -> LocalCluster:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
