"""`ClusterSpec`: the parties (nodes) of a deployment and the devices built on them.

A node is one party with a network endpoint. A device is a named place where
computation runs, of a registered kind (`mplang.device.kinds`): a PPU (one
node, plaintext), an SPU (several nodes, secret sharing through libspu), ...
Specs come from a dict or a YAML file and are validated, each device by its
kind, with messages that name the offending entry.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mplang.device.kinds import get_kind, kind_names
from mplang.edsl.errors import MPLangError

if TYPE_CHECKING:
    from mplang.cluster.identity import Certificate

DEFAULT_BASE_PORT = 61920


class ClusterSpecError(MPLangError, ValueError):
    """A cluster spec is invalid; the message names the node or device at fault."""


@dataclass(frozen=True)
class Node:
    """One party: its name, the ``host:port`` its worker listens on, and its certificate
    (needed to run workers; the simulator runs without)."""

    name: str
    endpoint: str
    certificate: Certificate | None = None


@dataclass(frozen=True)
class DriverEntry:
    """A driver allowed to submit programs, fetch, delete and abort: name and certificate."""

    name: str
    certificate: Certificate


@dataclass(frozen=True)
class Device:
    """A named device over member nodes. ``config`` holds kind-specific settings
    (for an SPU: ``protocol``, ``field``, ``fxp_fraction_bits``)."""

    name: str
    kind: str
    members: tuple[str, ...]
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ClusterSpec:
    """Nodes (ranks in order), devices, and the drivers allowed to run programs.

    A spec lists certificates only, never a private key; each party keeps its own
    copy, and peers refuse to talk when their copies differ (`digest`).
    """

    nodes: tuple[Node, ...]
    devices: Mapping[str, Device]
    drivers: tuple[DriverEntry, ...] = ()

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def world_size(self) -> int:
        """The number of nodes (parties)."""
        return len(self.nodes)

    def rank_of(self, node: str) -> int:
        """The rank of node ``node``; raises `ClusterSpecError` for an unknown name."""
        for rank, n in enumerate(self.nodes):
            if n.name == node:
                return rank
        raise ClusterSpecError(f"unknown node {node!r}")

    def device(self, name: str) -> Device:
        """The device called ``name``; raises `ClusterSpecError` naming the known ones."""
        try:
            return self.devices[name]
        except KeyError:
            known = ", ".join(sorted(self.devices)) or "none"
            hint = ("a 1-node cluster has no secure device: secret sharing needs 2 or more "
                    "parties, e.g. mp.ClusterSpec.simple(2)" if self.world_size == 1
                    else "use one of these names, or add the device under 'devices' in the "
                         "cluster spec")
            raise ClusterSpecError(f"unknown device {name!r}; this cluster has: {known}; "
                                   f"{hint}") from None

    def base_urls(self) -> list[str]:
        """Each node's base URL (always ``https``: workers speak mutual TLS only)."""
        return [n.endpoint.rstrip("/") if "://" in n.endpoint else f"https://{n.endpoint}"
                for n in self.nodes]

    def digest(self) -> str:
        """SHA-256 over the nodes, their certificates' fingerprints, the drivers and the
        devices: equal for two copies of a spec exactly when they agree on all of them."""
        canonical = {
            "nodes": [[n.name, n.endpoint, n.certificate.fingerprint if n.certificate else None]
                      for n in self.nodes],
            "drivers": sorted([d.name, d.certificate.fingerprint] for d in self.drivers),
            "devices": {name: [d.kind, list(d.members), dict(d.config)]
                        for name, d in sorted(self.devices.items())},
        }
        text = json.dumps(canonical, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def require_certificates(self) -> None:
        """Raise unless every node has a certificate and at least one driver is listed
        (what running workers needs)."""
        missing = [n.name for n in self.nodes if n.certificate is None]
        if missing:
            raise ClusterSpecError(f"nodes {', '.join(missing)} have no 'certificate': workers "
                                   "need one per node (mplang init or mplang keygen makes them)")
        if not self.drivers:
            raise ClusterSpecError("the spec lists no 'drivers': add the certificate of each "
                                   "driver allowed to run programs")

    # -- construction
    @staticmethod
    def simple(world_size: int, *, host: str = "127.0.0.1",
               base_port: int = DEFAULT_BASE_PORT) -> ClusterSpec:
        """Nodes ``node_0..``, PPUs ``P0..`` and, for 2+ parties, SPU ``SP0`` (FM64):
        CHEETAH between the 2 parties, ABY3 among 3, and for 4 or more ABY3 over
        ``node_0..node_2``, the other parties secret-sharing their inputs into it.

        No default makes one party the others' dealer. Each protocol is secure against
        semi-honest parties only; ABY3 also needs an honest majority (two of its three
        members together can rebuild every value). SEMI2K (faster, with a Beaver source
        that must be trusted) must be asked for in a spec's device config."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ClusterSpecError(f"world size must be a positive int, got {world_size!r}")
        nodes = tuple(Node(f"node_{i}", f"{host}:{base_port + i}") for i in range(world_size))
        devices = {f"P{i}": Device(f"P{i}", "PPU", (n.name,)) for i, n in enumerate(nodes)}
        if world_size >= 2:
            protocol = "CHEETAH" if world_size == 2 else "ABY3"
            devices["SP0"] = Device("SP0", "SPU", tuple(n.name for n in nodes[:3]),
                                    {"protocol": protocol, "field": "FM64"})
        return ClusterSpec(nodes, devices)

    @staticmethod
    def from_dict(data: Mapping[str, Any],
                  base_dir: str | os.PathLike[str] | None = None) -> ClusterSpec:
        """Build from ``{"nodes": [{name, endpoint, certificate}], "drivers": [{name,
        certificate}], "devices": {name: {kind, members, config}}}`` (devices may also
        be a list of entries with a ``name``). A certificate is PEM text or a path,
        relative to ``base_dir``."""
        if not isinstance(data, Mapping):
            raise ClusterSpecError("a cluster spec is a mapping with 'nodes' and 'devices'")
        unknown = set(data) - {"nodes", "devices", "drivers"}
        if unknown:
            raise ClusterSpecError(f"unknown cluster spec keys: {sorted(unknown)}")
        raw_nodes = data.get("nodes")
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise ClusterSpecError("'nodes' must be a non-empty list")
        nodes = tuple(_node(i, n, base_dir) for i, n in enumerate(raw_nodes))
        raw_devices = data.get("devices", {})
        if isinstance(raw_devices, Mapping):
            entries = [{"name": k, **(v or {})} for k, v in raw_devices.items()]
        elif isinstance(raw_devices, list):
            entries = list(raw_devices)
        else:
            raise ClusterSpecError("'devices' must be a mapping or a list")
        devices: dict[str, Device] = {}
        for entry in entries:
            device = _device(entry)
            if device.name in devices:
                raise ClusterSpecError(f"duplicate device name {device.name!r}")
            devices[device.name] = device
        return ClusterSpec(nodes, devices, _drivers(data.get("drivers", []), base_dir))

    @staticmethod
    def from_yaml(path: str | os.PathLike[str]) -> ClusterSpec:
        """Read a spec from a YAML file; relative certificate paths are relative to it.
        A missing file is a `ClusterSpecError` that says how to write one."""
        if not os.path.exists(path):
            raise ClusterSpecError(
                f"cluster spec {os.path.abspath(path)} does not exist; write one with "
                "`mplang init --nodes 3 --out dev` and pass 'dev/cluster.yaml' (or run on "
                "one machine without workers: mp.Simulator(mp.ClusterSpec.simple(3)))")
        import yaml

        with open(path, encoding="utf-8") as f:
            try:
                data = yaml.safe_load(f)
            except yaml.YAMLError as e:
                raise ClusterSpecError(f"{path}: invalid YAML: {e}") from None
        return ClusterSpec.from_dict(data, Path(path).parent)

    def to_dict(self) -> dict[str, Any]:
        """The spec as plain data (certificates inline as PEM)."""
        nodes: list[dict[str, Any]] = []
        for n in self.nodes:
            entry: dict[str, Any] = {"name": n.name, "endpoint": n.endpoint}
            if n.certificate is not None:
                entry["certificate"] = n.certificate.pem
            nodes.append(entry)
        data: dict[str, Any] = {
            "nodes": nodes,
            "devices": {d.name: {"kind": d.kind, "members": list(d.members),
                                 "config": dict(d.config)} for d in self.devices.values()},
        }
        if self.drivers:
            data["drivers"] = [{"name": d.name, "certificate": d.certificate.pem}
                               for d in self.drivers]
        return data

    @staticmethod
    def from_endpoints(endpoints: list[str]) -> ClusterSpec:
        """Nodes ``node_i`` at ``endpoints`` with the devices of `ClusterSpec.simple`."""
        simple = ClusterSpec.simple(len(endpoints))
        nodes = tuple(Node(f"node_{i}", e) for i, e in enumerate(endpoints))
        return ClusterSpec(nodes, simple.devices)


def _certificate(owner: str, entry: Mapping[str, Any],
                 base_dir: str | os.PathLike[str] | None) -> Certificate | None:
    from mplang.cluster.identity import IdentityError, load_certificate

    value = entry.get("certificate")
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise ClusterSpecError(f"{owner}: 'certificate' must be PEM text or a path")
    try:
        return load_certificate(value, base_dir, where=f"{owner}: certificate")
    except IdentityError as e:
        raise ClusterSpecError(str(e)) from None


def _drivers(entries: Any, base_dir: str | os.PathLike[str] | None) -> tuple[DriverEntry, ...]:
    if not isinstance(entries, list):
        raise ClusterSpecError("'drivers' must be a list of {name, certificate}")
    drivers = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, Mapping) or set(entry) - {"name", "certificate"}:
            raise ClusterSpecError(f"driver #{index} must be a mapping with 'name' and "
                                   "'certificate'")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise ClusterSpecError(f"driver #{index} needs a non-empty string 'name'")
        cert = _certificate(f"driver {name!r}", entry, base_dir)
        if cert is None:
            raise ClusterSpecError(f"driver {name!r} needs a 'certificate'")
        drivers.append(DriverEntry(name, cert))
    return tuple(drivers)


def _node(index: int, entry: Any, base_dir: str | os.PathLike[str] | None) -> Node:
    if not isinstance(entry, Mapping):
        raise ClusterSpecError(f"node #{index} must be a mapping with 'name' and 'endpoint'")
    unknown = set(entry) - {"name", "endpoint", "certificate"}
    if unknown:
        hint = (" (a spec never holds a private key: pass it to the worker with --key)"
                if unknown & {"key", "keyfile", "private_key"} else "")
        raise ClusterSpecError(f"node #{index}: unknown keys {sorted(unknown)}; a node has "
                               f"'name', 'endpoint' and 'certificate'{hint}")
    name, endpoint = entry.get("name"), entry.get("endpoint")
    if not isinstance(name, str) or not name:
        raise ClusterSpecError(f"node #{index} needs a non-empty string 'name'")
    if not isinstance(endpoint, str) or not endpoint:
        raise ClusterSpecError(f"node {name!r} needs a string 'endpoint' (host:port)")
    return Node(name, endpoint, _certificate(f"node {name!r}", entry, base_dir))


def _device(entry: Any) -> Device:
    if not isinstance(entry, Mapping):
        raise ClusterSpecError(f"a device entry must be a mapping, got {entry!r}")
    name = entry.get("name")
    if not isinstance(name, str) or not name:
        raise ClusterSpecError(f"a device needs a non-empty string 'name': {dict(entry)}")
    unknown = set(entry) - {"name", "kind", "members", "config"}
    if unknown:
        raise ClusterSpecError(f"device {name!r}: unknown keys {sorted(unknown)}")
    kind = entry.get("kind")
    if kind not in kind_names():
        raise ClusterSpecError(f"device {name!r}: kind must be one of "
                               f"{', '.join(kind_names())}, got {kind!r} (a kind from a "
                               "plugin needs the plugin loaded first: --plugin NAME)")
    members = entry.get("members")
    if not isinstance(members, list) or not all(isinstance(m, str) for m in members):
        raise ClusterSpecError(f"device {name!r}: 'members' must be a list of node names")
    config = entry.get("config") or {}
    if not isinstance(config, Mapping):
        raise ClusterSpecError(f"device {name!r}: 'config' must be a mapping")
    return Device(name, kind, tuple(members), dict(config))


def _validate(spec: ClusterSpec) -> None:
    names = [n.name for n in spec.nodes]
    for name in names:
        if names.count(name) > 1:
            raise ClusterSpecError(f"duplicate node name {name!r}")
    endpoints = [n.endpoint for n in spec.nodes]
    for endpoint in endpoints:
        if endpoints.count(endpoint) > 1:
            raise ClusterSpecError(f"two nodes share endpoint {endpoint!r}")
    prints = [(f"node {n.name!r}", n.certificate) for n in spec.nodes] + \
        [(f"driver {d.name!r}", d.certificate) for d in spec.drivers]
    seen: dict[str, str] = {}
    for owner, cert in prints:
        if cert is None:
            continue
        if cert.fingerprint in seen:
            raise ClusterSpecError(f"{owner} and {seen[cert.fingerprint]} have the same "
                                   "certificate: every party needs its own key pair")
        seen[cert.fingerprint] = owner
    driver_names = [d.name for d in spec.drivers]
    for name in driver_names:
        if driver_names.count(name) > 1:
            raise ClusterSpecError(f"duplicate driver name {name!r}")
    for key, device in spec.devices.items():
        if key != device.name:
            raise ClusterSpecError(f"device registered as {key!r} is named {device.name!r}")
        if device.name in names:
            raise ClusterSpecError(f"device {device.name!r} has the name of a node")
        for member in device.members:
            if member not in names:
                raise ClusterSpecError(f"device {device.name!r}: unknown member {member!r}")
        if len(set(device.members)) != len(device.members):
            raise ClusterSpecError(f"device {device.name!r}: a member is listed twice")
        try:
            kind = get_kind(device.kind)
        except MPLangError as e:
            raise ClusterSpecError(f"device {device.name!r}: {e}") from None
        kind.validate(device, device.config)
