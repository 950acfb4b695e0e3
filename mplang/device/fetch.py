"""Fetching device-placed objects: each device kind says what ``fetch`` returns."""

from __future__ import annotations

from typing import Any

from mplang.device.cluster import ClusterSpec
from mplang.device.kinds import get_kind
from mplang.edsl.context import ExecutionContext
from mplang.edsl.object import MPObject


def fetch_device_object(ctx: ExecutionContext, obj: MPObject) -> Any:
    """The plain value of ``obj``, which lives on device ``obj.device``."""
    assert obj.device is not None
    cluster: ClusterSpec = ctx.cluster
    device = cluster.device(obj.device)
    return get_kind(device.kind).fetch(ctx, cluster, device, obj)
