"""Device routing by metadata: whether a frontend op may run on a device.

A device is described by its kind's name, whether the kind is joint (computes
on several parties' values) and its member count. An op fits when its
``targets`` name the kind or, without targets (nor a ``requires_device``
capability), when its execution model suits
the kind (``single_rank`` ops on single-party devices; ``multi_party`` ops
without targets run at the simp level, on no device), and when its
``requires_device`` capability holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from mplang.edsl.errors import FeCapabilityError
from mplang.frontend.feop import FeOpInfo, meta


def _members_ok(rule: str, count: int) -> bool:
    for op in (">=", "<=", "=", ">", "<"):
        if rule.startswith(op):
            n = int(rule[len(op):])
            return {">=": count >= n, "<=": count <= n, "=": count == n, ">": count > n,
                    "<": count < n}[op]
    raise ValueError(f"bad members rule {rule!r}")


def mismatch(info: FeOpInfo, kind: str, joint: bool, members: int) -> str | None:
    """Why ``info``'s op cannot run on such a device (None: it can)."""
    required = info.capabilities.get("requires_device") or {}
    if info.targets and kind not in info.targets:
        return f"its targets are {', '.join(info.targets)}"
    if not info.targets:
        if info.execution_model == "single_rank" and joint:
            return "it runs on one party's plaintext, and a joint device has no such party"
        if info.execution_model == "multi_party" and not required:
            return "it runs at the simp level across parties, not on a device"
    kinds = required.get("kind")
    if kinds and kind not in kinds:
        return f"it requires a device of kind {', '.join(kinds)}"
    rule = required.get("members")
    if rule and not _members_ok(str(rule), members):
        return f"it requires a device with members {rule}, this one has {members}"
    return None


def check_route(op: Callable[..., Any] | FeOpInfo, device: str, kind: str, joint: bool,
                members: int) -> None:
    """Raise `FeCapabilityError` naming op and device if ``op`` cannot run on ``device``."""
    info = op if isinstance(op, FeOpInfo) else meta(op)
    reason = mismatch(info, kind, joint, members)
    if reason is not None:
        raise FeCapabilityError(f"{info.name} cannot run on {kind} {device}: {reason}")
