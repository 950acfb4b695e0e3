"""Clusters on one machine: development specs with a key per party, and worker processes.

`write_dev_cluster` writes a spec, a key pair for every node and for a
driver named ``driver``, and every node's policy (``policies/NODE.yaml``) into
one folder. That folder holds every party's key:
it is for development on one machine only. In a real deployment each
organisation runs ``mplang keygen`` on its own machine and shares only its
certificate and fingerprint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import yaml

from mplang.cluster.identity import keygen
from mplang.device.cluster import ClusterSpec, Node
from mplang.edsl.errors import MPLangError

READY = "ready at"
"""What a worker's one ready line contains (``mplang worker node_0 ready at ...``)."""
DRIVER = "driver"

DEV_HEADER = """\
# MPLang cluster spec written by `mplang init`, for development on ONE machine:
# keys/ holds the private key of every party. In a real deployment each
# organisation runs `mplang keygen --name NAME --out DIR` on its own machine,
# keeps NAME.key there, and sends only NAME.crt (and its fingerprint) to the
# others, who list it here. This spec lists certificates only, never keys.
"""


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """``n`` distinct ports on ``host`` that were free a moment ago."""
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(n):
            s = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            s.bind((host, 0))
            ports.append(s.getsockname()[1])
        return ports


def write_dev_cluster(spec: ClusterSpec, out_dir: str | os.PathLike[str], *,
                      drivers: tuple[str, ...] = (DRIVER,)) -> Path:
    """Write ``out_dir/cluster.yaml`` (``spec`` with certificates) and ``out_dir/keys/``:
    a key and certificate for every node and every driver. Returns the spec's path."""
    out = Path(out_dir)
    keys = out / "keys"
    for name in [n.name for n in spec.nodes] + list(drivers):
        keygen(name, keys)
    data: dict[str, Any] = {
        "nodes": [{"name": n.name, "endpoint": n.endpoint,
                   "certificate": f"keys/{n.name}.crt"} for n in spec.nodes],
        "drivers": [{"name": d, "certificate": f"keys/{d}.crt"} for d in drivers],
        "devices": {d.name: {"kind": d.kind, "members": list(d.members),
                             **({"config": dict(d.config)} if d.config else {})}
                    for d in spec.devices.values()},
    }
    path = out / "cluster.yaml"
    path.write_text(DEV_HEADER + _security_notes(spec) + yaml.safe_dump(data, sort_keys=False))
    ClusterSpec.from_yaml(path)  # what was written loads back
    write_dev_policies(spec, out, drivers)
    return path


DEV_POLICY = """\
# What {node} accepts and what may leave it (written by `mplang init` for
# development; see docs/privacy.md). Each organisation writes its own policy
# and passes it to its worker with --policy (default: this file).
drivers: [{drivers}]          # the drivers {node} takes programs from
plaintext_to: []          # no party and no driver receives {node}'s data in plaintext
protocols: [{protocols}]  # secure-device protocols accepted{protocol_note}
# PSI protocols it joins with: those that reveal only their result (docs/psi.md)
psi_protocols: [rr22, kkrt, ecdh, ecdh_cardinality, aby3]
programs: []              # digests of programs allowed to reveal anything (mplang check)
# releases {node} approves by name: library functions ({{library: mplang.libs.linear,
# to: [node_0]}}) or a reviewed program ({{program: DIGEST}}); refusals print the entry
approve: []
max_uses: {{}}              # uploaded object -> how many executions may use it
writes: []                # files programs may write in {node}'s data root (none; e.g. out/*.csv)
declassify:               # what may be revealed of values computed from {node}'s data
  # sums, means, counts, variances, model updates over >= 10 distinct rows of its data
  - {{to: ["*"], when: aggregate, min_rows: 10}}
  # comparisons between values of different owners (the millionaire's answer)
  - {{to: ["*"], when: compare}}
  # which of a PSI partner's keys {node}'s tables hold (each join shows its receivers
  # the keys they share, docs/psi.md): list the partners, e.g. to: [node_1]
  - {{to: [], when: intersection}}
"""
"""The development policy of every node: the bundled examples satisfy it."""


def dev_policy(spec: ClusterSpec, node: str, drivers: tuple[str, ...] = (DRIVER,)) -> str:
    """The text of ``node``'s development policy (`DEV_POLICY`): it accepts the protocols
    the spec's devices ask for."""
    from mplang.policy.policy import DEFAULT_PROTOCOLS

    asked = {str(d.config["protocol"]) for d in spec.devices.values() if "protocol" in d.config}
    extra = sorted(asked - set(DEFAULT_PROTOCOLS))
    note = (f" ({', '.join(extra)}: the spec asks for it, and it makes one party the others' "
            "dealer)") if extra else " (none of them makes one party the others' dealer)"
    return DEV_POLICY.format(node=node, drivers=", ".join(drivers),
                             protocols=", ".join([*DEFAULT_PROTOCOLS, *extra]),
                             protocol_note=note)


def init_policies(spec: ClusterSpec, *, approve: Sequence[str] = (),
                  intersection: Sequence[str] = ()) -> dict[str, Any]:
    """Every node's `dev_policy` as a `mplang.policy.policy.Policy`, with the ``approve``
    entries (YAML flow mappings, ``{library: mplang.libs.linear, to: [node_0]}``) and the
    receivers of its ``intersection`` rule (``["*"]``: every PSI partner) that a program's
    docs show (none: the policies as written): what the simulator judges by."""
    from mplang.policy.policy import Policy

    entries = "".join(f"  - {e}\n" for e in approve)
    partners = ", ".join(f'"{n}"' for n in intersection)
    extra = ", with the program's approvals" if approve or intersection else ""
    return {node.name: Policy.parse(
        dev_policy(spec, node.name).replace("approve: []\n", f"approve:\n{entries}" if entries
                                            else "approve: []\n")
        .replace("{to: [], when: intersection}", f"{{to: [{partners}], when: intersection}}"),
        f"the policy `mplang init` writes for {node.name}{extra}") for node in spec.nodes}


def write_dev_policies(spec: ClusterSpec, out_dir: str | os.PathLike[str],
                       drivers: tuple[str, ...] = (DRIVER,)) -> list[Path]:
    """Write ``out_dir/policies/NODE.yaml`` (`dev_policy`) for every node of ``spec``."""
    from mplang.policy.policy import Policy

    folder = Path(out_dir) / "policies"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for node in spec.nodes:
        path = folder / f"{node.name}.yaml"
        path.write_text(dev_policy(spec, node.name, drivers))
        Policy.load(path)  # what was written loads back
        paths.append(path)
    return paths


def _security_notes(spec: ClusterSpec) -> str:
    from mplang.device.kinds import get_kind

    lines = []
    for device in spec.devices.values():
        model = getattr(get_kind(device.kind), "security_model", None)
        text = model(device) if callable(model) else model
        if text:
            lines.append(f"# {device.name} ({device.kind}): {text}")
    return ("#\n" + "\n".join(lines) + "\n") if lines else ""


def init_cluster(world_size: int, out_dir: str | os.PathLike[str],
                 host: str = "127.0.0.1") -> Path:
    """``mplang init``: `ClusterSpec.simple`'s devices on free loopback ports, with keys."""
    simple = ClusterSpec.simple(world_size)
    nodes = tuple(Node(n.name, f"{host}:{port}")
                  for n, port in zip(simple.nodes, free_ports(world_size, host), strict=True))
    return write_dev_cluster(ClusterSpec(nodes, simple.devices), out_dir)


class LocalCluster:
    """Worker processes for each node of a spec (``mplang worker`` per node), on this machine.

    ``cluster`` is a spec file (keys from ``keys`` or ``keys/`` next to it) or a
    `ClusterSpec`; one without certificates gets new development keys in a
    temporary folder. Used by ``mplang up`` and by tests; a context manager
    that stops all workers.
    """

    def __init__(self, cluster: ClusterSpec | str | os.PathLike[str], *,
                 keys: str | os.PathLike[str] | None = None, log_dir: str | None = None,
                 register: list[str] | None = None, plugins: list[str] | None = None,
                 worker_args: list[str] | None = None,
                 audit_dir: str | os.PathLike[str] | None = None,
                 data_root: str | os.PathLike[str] | None = None,
                 listen: dict[str, str] | None = None,
                 state_dir: str | os.PathLike[str] | None = None):
        self.register = list(register or [])
        """``module:function`` host functions every worker registers for ``tensor.pyfunc``."""
        self.plugins = list(plugins or [])
        """Plugins (entry-point or module names) every worker loads before serving."""
        self.worker_args = list(worker_args or [])
        """More ``mplang worker`` options for every worker (limits, timeouts)."""
        self.listen = dict(listen or {})
        """Where a node's worker listens when a proxy stands at its spec endpoint."""
        self._dir = tempfile.TemporaryDirectory(prefix="mplang-cluster-")
        if isinstance(cluster, ClusterSpec):
            if all(n.certificate is None for n in cluster.nodes):
                self.spec_path = write_dev_cluster(cluster, self._dir.name)
                keys = Path(self._dir.name) / "keys"
            else:
                if keys is None:
                    raise MPLangError("a spec with certificates needs the folder of its keys")
                self.spec_path = Path(self._dir.name) / "cluster.yaml"
                self.spec_path.write_text(yaml.safe_dump(cluster.to_dict()))
        else:
            self.spec_path = Path(cluster).resolve()
        self.keys_dir = Path(keys) if keys is not None else self.spec_path.parent / "keys"
        self.cluster = ClusterSpec.from_yaml(self.spec_path)
        self.log_dir = Path(log_dir or self._dir.name)
        self.audit_dir = Path(audit_dir or Path(self._dir.name) / "audit").resolve()
        """Each worker's audit log is ``audit_dir/NODE.jsonl`` (default: in the temporary
        folder, removed by `close`)."""
        self.data_root = None if data_root is None else Path(data_root).resolve()
        """Each worker reads its files from ``data_root/NODE`` (None: its default)."""
        self.state_dir = Path(state_dir or Path(self._dir.name) / "state").resolve()
        """Each worker keeps its privacy budget ledger in ``state_dir/NODE`` (default: in
        the temporary folder, removed by `close`)."""
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    @property
    def driver_key(self) -> Path:
        """The key of the driver named ``driver`` (development clusters have one)."""
        return self.keys_dir / f"{DRIVER}.key"

    def driver(self, **options: Any) -> Any:
        """A `mp.Driver` for these workers with `driver_key`."""
        from mplang.driver.http import Driver

        return Driver(self.spec_path, key=self.driver_key, **options)

    def _spawn(self, node: str) -> subprocess.Popen[bytes]:
        registers = [arg for spec in self.register for arg in ("--register", spec)]
        plugins = [arg for name in self.plugins for arg in ("--plugin", name)]
        data = [] if self.data_root is None else ["--data-root", str(self.data_root / node)]
        listen = ["--listen", self.listen[node]] if node in self.listen else []
        log_path = self.log_dir / f"{node}.log"
        log_path.write_bytes(b"")
        # the worker gets its own copy of the log's descriptor; this process closes its own
        with open(log_path, "ab") as log:
            return subprocess.Popen(
                [sys.executable, "-m", "mplang.cli", "worker", "--cluster", str(self.spec_path),
                 "--node", node, "--key", str(self.keys_dir / f"{node}.key"),
                 "--audit-log", str(self.audit_dir / f"{node}.jsonl"),
                 "--state-dir", str(self.state_dir / node),
                 "--exit-with-parent", *registers, *plugins, *data, *listen,
                 *self.worker_args],
                stdout=log, stderr=subprocess.STDOUT)

    def start(self, timeout: float = 60.0,
              on_ready: Callable[[str], None] | None = None) -> None:
        """Start every worker and wait until each says it is ready (``on_ready(node)``
        hears of each as it gets ready)."""
        for node in self.cluster.nodes:
            self.processes[node.name] = self._spawn(node.name)
        self.wait_ready(timeout, on_ready=on_ready)

    def start_node(self, node: str, timeout: float = 60.0) -> None:
        """Start ``node``'s worker (again, after `kill`) and wait until it is ready."""
        self.processes[node] = self._spawn(node)
        self.wait_ready(timeout, [node])

    def wait_ready(self, timeout: float, nodes: list[str] | None = None,
                   on_ready: Callable[[str], None] | None = None) -> None:
        """Wait until each of ``nodes`` (default: all) logged its ready line."""
        deadline = time.monotonic() + timeout
        for name in nodes or [n.name for n in self.cluster.nodes]:
            while READY not in self.log_tail(name, 1 << 16):
                proc = self.processes[name]
                if proc.poll() is not None:
                    raise MPLangError(f"worker {name} exited with code {proc.returncode}: "
                                      f"{self.log_tail(name)}")
                if time.monotonic() > deadline:
                    raise MPLangError(f"worker {name} was not ready within {timeout} s: "
                                      f"{self.log_tail(name)}")
                time.sleep(0.05)
            if on_ready is not None:
                on_ready(name)

    def log_tail(self, node: str, size: int = 2000) -> str:
        path = self.log_dir / f"{node}.log"
        return path.read_text(errors="replace")[-size:] if path.exists() else ""

    def kill(self, node: str) -> None:
        """SIGKILL one worker (fault injection)."""
        proc = self.processes[node]
        proc.send_signal(signal.SIGKILL)
        proc.wait()

    def freeze(self, node: str) -> None:
        """SIGSTOP one worker (fault injection): it keeps its connections but answers
        nothing until `thaw`."""
        self.processes[node].send_signal(signal.SIGSTOP)

    def thaw(self, node: str) -> None:
        """SIGCONT a worker that `freeze` stopped."""
        self.processes[node].send_signal(signal.SIGCONT)

    def stop(self, grace: float = 3.0) -> None:
        """Stop all workers: SIGTERM, then SIGKILL after ``grace`` seconds (a worker keeps
        nothing on disk, so nothing is lost)."""
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + grace
        for proc in self.processes.values():
            try:
                proc.wait(timeout=max(0.0, deadline - time.monotonic()))
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
