"""Fetching device-placed objects: a PPU value comes back as its value, an SPU
value is revealed to the caller (its members' shares are reconstructed here)."""

from __future__ import annotations

from typing import Any

from mplang.backends.spu_impl import SpuShare, reconstruct
from mplang.device.cluster import ClusterSpec
from mplang.dialects.spu import SpuConfig
from mplang.edsl.context import ExecutionContext
from mplang.edsl.object import MPObject
from mplang.edsl.typing import SecretShareType, TensorType
from mplang.frontend.errors import MPRuntimeError


def fetch_device_object(ctx: ExecutionContext, obj: MPObject) -> Any:
    """The plain value of ``obj``, which lives on device ``obj.device``."""
    assert obj.device is not None
    cluster: ClusterSpec = ctx.cluster
    device = cluster.device(obj.device)
    per_party = ctx.fetch_object(obj)
    if device.kind == "SPU":
        config = SpuConfig.of(cluster, device)
        base = obj.base_type
        assert isinstance(base, SecretShareType)
        shares = [per_party[r] for r in config.members]
        if not all(isinstance(s, SpuShare) for s in shares):
            raise MPRuntimeError(f"{obj!r}: not every member of {device.name} holds a share")
        return _scalar(reconstruct(config, shares, base.plaintext), base.plaintext)
    return per_party[cluster.rank_of(device.members[0])]


def _scalar(value: Any, plaintext: TensorType) -> Any:
    return value[()] if plaintext.is_scalar else value
