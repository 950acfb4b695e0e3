"""`ClusterSpec`: the parties (nodes) of a deployment and the devices built on them.

A node is one party with a network endpoint. A device is a named place where
computation runs, of a registered kind (`mplang.device.kinds`): a PPU (one
node, plaintext), an SPU (several nodes, secret sharing through libspu), ...
Specs come from a dict or a YAML file and are validated, each device by its
kind, with messages that name the offending entry.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import yaml

from mplang.device.kinds import get_kind, kind_names
from mplang.frontend.errors import MPLangError

DEFAULT_BASE_PORT = 61920


class ClusterSpecError(MPLangError, ValueError):
    """A cluster spec is invalid; the message names the node or device at fault."""


@dataclass(frozen=True)
class Node:
    """One party: its name and the ``host:port`` (or URL) its worker listens on."""

    name: str
    endpoint: str


@dataclass(frozen=True)
class Device:
    """A named device over member nodes. ``config`` holds kind-specific settings
    (for an SPU: ``protocol``, ``field``, ``fxp_fraction_bits``)."""

    name: str
    kind: str
    members: tuple[str, ...]
    config: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class TlsConfig:
    """Certificates for HTTPS between driver and workers: each worker serves with
    ``certfile``/``keyfile``; clients verify peers against ``cafile``."""

    certfile: str
    keyfile: str
    cafile: str | None = None


@dataclass(frozen=True)
class ClusterSpec:
    """Nodes (ranks in order), devices, and optional TLS settings."""

    nodes: tuple[Node, ...]
    devices: Mapping[str, Device]
    tls: TlsConfig | None = None

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def world_size(self) -> int:
        return len(self.nodes)

    def rank_of(self, node: str) -> int:
        for rank, n in enumerate(self.nodes):
            if n.name == node:
                return rank
        raise ClusterSpecError(f"unknown node {node!r}")

    def device(self, name: str) -> Device:
        try:
            return self.devices[name]
        except KeyError:
            known = ", ".join(sorted(self.devices)) or "none"
            raise ClusterSpecError(f"unknown device {name!r}; this cluster has: {known}") from None

    def base_urls(self) -> list[str]:
        """Each node's base URL (``https`` when TLS is configured)."""
        scheme = "https" if self.tls else "http"
        return [n.endpoint.rstrip("/") if "://" in n.endpoint else f"{scheme}://{n.endpoint}"
                for n in self.nodes]

    def client_verify(self) -> bool | str:
        """What HTTP clients verify server certificates against."""
        return self.tls.cafile or True if self.tls else True

    # -- construction
    @staticmethod
    def simple(world_size: int, *, host: str = "127.0.0.1",
               base_port: int = DEFAULT_BASE_PORT) -> ClusterSpec:
        """Nodes ``node_0..``, PPUs ``P0..`` and, for 2+ parties, SPU ``SP0`` over all
        nodes (ABY3 for exactly 3 parties, SEMI2K otherwise; FM64)."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
            raise ClusterSpecError(f"world size must be a positive int, got {world_size!r}")
        nodes = tuple(Node(f"node_{i}", f"{host}:{base_port + i}") for i in range(world_size))
        devices = {f"P{i}": Device(f"P{i}", "PPU", (n.name,)) for i, n in enumerate(nodes)}
        if world_size >= 2:
            protocol = "ABY3" if world_size == 3 else "SEMI2K"
            devices["SP0"] = Device("SP0", "SPU", tuple(n.name for n in nodes),
                                    {"protocol": protocol, "field": "FM64"})
        return ClusterSpec(nodes, devices)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> ClusterSpec:
        """Build from ``{"nodes": [{name, endpoint}], "devices": {name: {kind, members,
        config}}}`` (devices may also be a list of entries with a ``name``)."""
        if not isinstance(data, Mapping):
            raise ClusterSpecError("a cluster spec is a mapping with 'nodes' and 'devices'")
        unknown = set(data) - {"nodes", "devices", "tls"}
        if unknown:
            raise ClusterSpecError(f"unknown cluster spec keys: {sorted(unknown)}")
        raw_nodes = data.get("nodes")
        if not isinstance(raw_nodes, list) or not raw_nodes:
            raise ClusterSpecError("'nodes' must be a non-empty list")
        nodes = tuple(_node(i, n) for i, n in enumerate(raw_nodes))
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
        return ClusterSpec(nodes, devices, _tls(data.get("tls")))

    @staticmethod
    def from_yaml(path: str | os.PathLike[str]) -> ClusterSpec:
        with open(path, encoding="utf-8") as f:
            try:
                data = yaml.safe_load(f)
            except yaml.YAMLError as e:
                raise ClusterSpecError(f"{path}: invalid YAML: {e}") from None
        return ClusterSpec.from_dict(data)

    def to_dict(self) -> dict[str, Any]:
        data: dict[str, Any] = {
            "nodes": [{"name": n.name, "endpoint": n.endpoint} for n in self.nodes],
            "devices": {d.name: {"kind": d.kind, "members": list(d.members),
                                 "config": dict(d.config)} for d in self.devices.values()},
        }
        if self.tls is not None:
            data["tls"] = {"certfile": self.tls.certfile, "keyfile": self.tls.keyfile,
                           "cafile": self.tls.cafile}
        return data

    @staticmethod
    def from_endpoints(endpoints: list[str]) -> ClusterSpec:
        """Nodes ``node_i`` at ``endpoints`` with the devices of `ClusterSpec.simple`."""
        simple = ClusterSpec.simple(len(endpoints))
        nodes = tuple(Node(f"node_{i}", e) for i, e in enumerate(endpoints))
        return ClusterSpec(nodes, simple.devices)


def _tls(entry: Any) -> TlsConfig | None:
    if entry is None:
        return None
    if not isinstance(entry, Mapping) or set(entry) - {"certfile", "keyfile", "cafile"}:
        raise ClusterSpecError("'tls' must be a mapping with certfile, keyfile and cafile")
    certfile, keyfile, cafile = entry.get("certfile"), entry.get("keyfile"), entry.get("cafile")
    if not isinstance(certfile, str) or not isinstance(keyfile, str):
        raise ClusterSpecError("'tls' needs 'certfile' and 'keyfile' paths")
    if cafile is not None and not isinstance(cafile, str):
        raise ClusterSpecError("'tls.cafile' must be a path")
    return TlsConfig(certfile, keyfile, cafile)


def _node(index: int, entry: Any) -> Node:
    if not isinstance(entry, Mapping):
        raise ClusterSpecError(f"node #{index} must be a mapping with 'name' and 'endpoint'")
    unknown = set(entry) - {"name", "endpoint"}
    if unknown:
        raise ClusterSpecError(f"node #{index}: unknown keys {sorted(unknown)}; a node has "
                               "'name' and 'endpoint'")
    name, endpoint = entry.get("name"), entry.get("endpoint")
    if not isinstance(name, str) or not name:
        raise ClusterSpecError(f"node #{index} needs a non-empty string 'name'")
    if not isinstance(endpoint, str) or not endpoint:
        raise ClusterSpecError(f"node {name!r} needs a string 'endpoint' (host:port)")
    return Node(name, endpoint)


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
