"""The SPU device kind: secret-shared computation among several nodes with libspu.

Values enter by ``spu.seal`` (the owner secret-shares them among the members),
functions run by ``spu.run`` on the shares, and results leave by ``spu.reveal``
to one PPU's party. Protocols: SEMI2K (two or more members), ABY3 (exactly
three), CHEETAH (exactly two); fields FM64 and FM128.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mplang.device.cluster import ClusterSpec, ClusterSpecError, Device
from mplang.device.kinds import DeviceKind, describe, place, register_kind, register_move
from mplang.device.ppu import rank_of
from mplang.dialects import simp
from mplang.dialects.spu import (
    SUPPORTED_DTYPES,
    SecretShareType,
    SpuConfig,
    reconstruct,
    reveal,
    run,
    seal,
)
from mplang.edsl.context import ExecutionContext
from mplang.edsl.object import MPObject
from mplang.edsl.typing import Mask, MPType, TensorType
from mplang.frontend.errors import MPRuntimeError, MPTypeError

PROTOCOLS = {"SEMI2K": None, "ABY3": 3, "CHEETAH": 2}
"""Protocol name -> the exact number of members it needs (None: two or more)."""
FIELDS = ("FM64", "FM128")
_CONFIG_KEYS = frozenset(["protocol", "field", "fxp_fraction_bits"])


def _check_dtype(obj: MPObject, device: Device, what: str) -> None:
    base = obj.base_type
    if isinstance(base, TensorType) and base.dtype not in SUPPORTED_DTYPES:
        raise MPTypeError(f"{what}: SPU {device.name} cannot hold dtype {base.dtype} "
                          f"({describe(obj)}); supported: {', '.join(sorted(SUPPORTED_DTYPES))}")


class SPU(DeviceKind):
    """A secure processing unit: members hold secret shares and compute with libspu."""

    name = "SPU"
    joint = True
    security_model = ("semi-honest parties; ABY3 also needs an honest majority (two of its "
                      "three members together can rebuild every value)")

    def validate(self, device: Device, config: Mapping[str, Any]) -> None:
        n = len(device.members)
        if n < 2:
            raise ClusterSpecError(f"SPU {device.name!r} needs at least two members, got {n}")
        unknown = set(config) - _CONFIG_KEYS
        if unknown:
            raise ClusterSpecError(f"SPU {device.name!r}: unknown config keys {sorted(unknown)}")
        protocol = config.get("protocol", "SEMI2K")
        if protocol not in PROTOCOLS:
            raise ClusterSpecError(f"SPU {device.name!r}: unknown protocol {protocol!r}; "
                                   f"use one of {', '.join(PROTOCOLS)}")
        need = PROTOCOLS[protocol]
        if need is not None and n != need:
            raise ClusterSpecError(f"SPU {device.name!r}: {protocol} needs exactly {need} "
                                   f"members, got {n}")
        field_name = config.get("field", "FM64")
        if field_name not in FIELDS:
            raise ClusterSpecError(f"SPU {device.name!r}: unknown field {field_name!r}; "
                                   f"use one of {', '.join(FIELDS)}")
        bits = config.get("fxp_fraction_bits")
        if bits is not None and (isinstance(bits, bool) or not isinstance(bits, int)
                                 or not 0 < bits < 64):
            raise ClusterSpecError(f"SPU {device.name!r}: fxp_fraction_bits must be an int in "
                                   f"1..63, got {bits!r}")

    def call(self, cluster: ClusterSpec, device: Device, fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> Any:
        return run(fn, SpuConfig.of(cluster, device), *args, label=what, **kwargs)

    def adopt(self, cluster: ClusterSpec, obj: MPObject, t: MPType, device: Device,
              what: str) -> MPObject:
        config = SpuConfig.of(cluster, device)
        if isinstance(t.base, SecretShareType) and t.pmask == Mask.of(config.members):
            return place(obj, device.name)
        if isinstance(t.base, TensorType) and t.pmask is not None and len(t.pmask) == 1:
            _check_dtype(obj, device, what)
            return place(seal(obj, config), device.name)
        raise MPTypeError(f"{what}: {describe(obj)} is not on a device and cannot move to "
                          f"SPU {device.name}; place it first with mp.put")

    def constant(self, cluster: ClusterSpec, device: Device, value: Any, what: str) -> MPObject:
        config = SpuConfig.of(cluster, device)
        owner = simp.constant((config.members[0],), value)
        _check_dtype(owner, device, what)
        return place(seal(owner, config), device.name)

    def fetch(self, ctx: ExecutionContext, cluster: ClusterSpec, device: Device,
              obj: MPObject) -> Any:
        config = SpuConfig.of(cluster, device)
        base = obj.base_type
        assert isinstance(base, SecretShareType)
        per_party = ctx.fetch_object(obj)
        shares = [per_party[r] for r in config.members]
        if not all(hasattr(s, "to_libspu") for s in shares):
            raise MPRuntimeError(f"{obj!r}: not every member of {device.name} holds a share")
        value = reconstruct(config, [s.to_libspu() for s in shares], base.plaintext_type)
        return value[()] if base.plaintext_type.is_scalar else value


register_kind(SPU())


@register_move("PPU", "SPU")
def _seal(cluster: ClusterSpec, obj: MPObject, src: Device, dst: Device, what: str) -> MPObject:
    _check_dtype(obj, dst, what)
    return place(seal(obj, SpuConfig.of(cluster, dst)), dst.name)


@register_move("SPU", "PPU")
def _reveal(cluster: ClusterSpec, obj: MPObject, src: Device, dst: Device,
            what: str) -> MPObject:
    return place(reveal(obj, SpuConfig.of(cluster, src), rank_of(cluster, dst)), dst.name)
