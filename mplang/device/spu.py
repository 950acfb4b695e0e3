"""The SPU device kind: secret-shared computation among several nodes with libspu.

Values enter by ``spu.seal`` (the owner, a member or not, secret-shares them
among the members), functions run by ``spu.run`` on the shares, and results
leave by ``spu.reveal`` to one PPU's party. Protocols: CHEETAH (exactly two
members; the default for two), ABY3 (exactly three; the default for three) and
SEMI2K (two or more, with a Beaver source that must be trusted: named by the
config, warned about when used); fields FM64 and FM128. Every protocol is
secure against semi-honest members only (`SECURITY_MODELS`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mplang.device.cluster import ClusterSpec, ClusterSpecError, Device
from mplang.device.kinds import DeviceKind, describe, get_kind, place, register_kind, register_move
from mplang.device.ppu import rank_of
from mplang.dialects.common import as_array
from mplang.dialects.spu import (
    BEAVERS,
    DEFAULT_BEAVER,
    DEFAULT_FRACTION_BITS,
    PROTOCOLS,
    SUPPORTED_DTYPES,
    TTP_DEFAULTS,
    SecretShareType,
    SpuConfig,
    default_protocol,
    reveal,
    run,
    seal,
    share_constant,
)
from mplang.edsl.context import ExecutionContext
from mplang.edsl.errors import MPRuntimeError, MPTypeError
from mplang.edsl.object import MPObject
from mplang.edsl.typing import Mask, MPType, TensorType

FIELDS = ("FM64", "FM128")
"""The rings an SPU device may use."""
TTP_FIELDS = ("server_host", "server_public_key", "asym_crypto_schema", "adjust_rank",
              "transport_protocol")
"""The ``ttp`` config keys: libspu's ``TTPBeaverConfig`` fields (its ``ssl_config`` is not
exposed)."""
TTP_SCHEMAS = ("SM2",)
TTP_TRANSPORTS = ("http", "h2")
_CONFIG_KEYS = frozenset(["protocol", "field", "fxp_fraction_bits", "beaver", "ttp"])

SEMI_HONEST = ("semi-honest members only: privacy holds while every member follows the "
               "protocol (a member who deviates from it may learn or corrupt values)")
SECURITY_MODELS = {
    "CHEETAH": f"{SEMI_HONEST}; no dealer or third party: each member's inputs stay "
               "private against the other member (multiplications by homomorphic "
               "encryption, comparisons by oblivious transfer)",
    "ABY3": f"{SEMI_HONEST}, and an honest majority: no two of the three members may "
            "collude (any two together can rebuild every value)",
    "SEMI2K": f"{SEMI_HONEST}, and a trusted Beaver source: whoever makes the "
              "multiplication triples (the first member with TrustedFirstParty, the "
              "service with TrustedThirdParty) can see every value opened in a multiplication",
}
"""Who must be honest for an SPU of each protocol to keep its inputs private."""


def _protocol(device: Device) -> str | None:
    return device.config.get("protocol") or default_protocol(len(device.members))


def _check_dtype(obj: MPObject, device: Device, what: str) -> None:
    base = obj.base_type
    if isinstance(base, TensorType) and base.dtype not in SUPPORTED_DTYPES:
        raise MPTypeError(f"{what}: SPU {device.name} cannot hold dtype {base.dtype} "
                          f"({describe(obj)}); supported: {', '.join(sorted(SUPPORTED_DTYPES))}")


def _validate_beaver(device: Device, config: Mapping[str, Any], protocol: str) -> None:
    """SEMI2K's Beaver source and, for a trusted third party, libspu's TTPBeaverConfig."""
    where = f"SPU {device.name!r}"
    beaver = config.get("beaver")
    ttp = config.get("ttp")
    if protocol != "SEMI2K":
        if beaver is not None or ttp is not None:
            raise ClusterSpecError(f"{where}: 'beaver' and 'ttp' apply to SEMI2K only; "
                                   f"{protocol} has no Beaver source")
        return
    beaver = DEFAULT_BEAVER if beaver is None else beaver
    if beaver == "MultiParty":
        raise ClusterSpecError(f"{where}: SEMI2K's MultiParty Beaver source is not "
                               f"available in this libspu; use one of {', '.join(BEAVERS)}, "
                               "or CHEETAH (2 members) / ABY3 (3 members)")
    if beaver not in BEAVERS:
        raise ClusterSpecError(f"{where}: unknown beaver {beaver!r}; use one of "
                               f"{', '.join(BEAVERS)}")
    if beaver != "TrustedThirdParty":
        if ttp is not None:
            raise ClusterSpecError(f"{where}: 'ttp' needs 'beaver: TrustedThirdParty'")
        return
    if not isinstance(ttp, Mapping):
        raise ClusterSpecError(f"{where}: beaver TrustedThirdParty needs a 'ttp' mapping "
                               f"with {', '.join(TTP_FIELDS[:2])} (and optionally "
                               f"{', '.join(TTP_FIELDS[2:])})")
    unknown = set(ttp) - set(TTP_FIELDS)
    if unknown:
        raise ClusterSpecError(f"{where}: unknown ttp keys {sorted(unknown)}; libspu's "
                               f"TTPBeaverConfig takes {', '.join(TTP_FIELDS)}")
    host = ttp.get("server_host")
    if not isinstance(host, str) or not host or any(c.isspace() for c in host):
        raise ClusterSpecError(f"{where}: ttp.server_host must be the Beaver service's "
                               f"host:port, got {host!r}")
    key = ttp.get("server_public_key")
    if not isinstance(key, str) or "-----BEGIN PUBLIC KEY-----" not in key:
        raise ClusterSpecError(f"{where}: ttp.server_public_key must be the service's public "
                               "key as PEM text (-----BEGIN PUBLIC KEY----- ...)")
    schema = ttp.get("asym_crypto_schema", TTP_DEFAULTS["asym_crypto_schema"])
    if schema not in TTP_SCHEMAS:
        raise ClusterSpecError(f"{where}: ttp.asym_crypto_schema must be one of "
                               f"{', '.join(TTP_SCHEMAS)}, got {schema!r}")
    rank = ttp.get("adjust_rank", TTP_DEFAULTS["adjust_rank"])
    n = len(device.members)
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < n:
        raise ClusterSpecError(f"{where}: ttp.adjust_rank (the member, by position, that "
                               f"calls the service's adjust RPC) must be an int in "
                               f"0..{n - 1}, got {rank!r}")
    transport = ttp.get("transport_protocol", TTP_DEFAULTS["transport_protocol"])
    if transport not in TTP_TRANSPORTS:
        raise ClusterSpecError(f"{where}: ttp.transport_protocol must be one of "
                               f"{', '.join(TTP_TRANSPORTS)}, got {transport!r}")


class SPU(DeviceKind):
    """A secure processing unit: members hold secret shares and compute with libspu."""

    name = "SPU"
    joint = True
    security_model = ("semi-honest members only, per protocol: CHEETAH (2 members) needs "
                      "no dealer; ABY3 (3 members) also needs an honest majority (two of its "
                      "three members together can rebuild every value); SEMI2K also trusts "
                      "its Beaver source (who makes the triples sees every value opened in "
                      "a multiplication)")

    def security_model_of(self, device: Device) -> str:
        protocol = _protocol(device)
        return SECURITY_MODELS.get(protocol or "", self.security_model)

    def trust(self, device: Device) -> str | None:
        if _protocol(device) != "SEMI2K":
            return None
        hint = "to trust no party, use CHEETAH (2 members) or ABY3 (3 members)"
        if device.config.get("beaver", DEFAULT_BEAVER) == "TrustedThirdParty":
            host = dict(device.config.get("ttp") or {}).get("server_host", "?")
            return (f"the Beaver service at {host} generates the triples (SEMI2K, beaver "
                    "TrustedThirdParty); together with any member it can see every value "
                    f"opened in a multiplication, so it must not collude with "
                    f"{', '.join(device.members)}; {hint}")
        return (f"{device.members[0]} generates the Beaver triples (SEMI2K, beaver "
                "TrustedFirstParty) and can see every value opened in a multiplication; "
                f"{hint}")

    def fixed_point(self, device: Device) -> tuple[int, int] | None:
        field = device.config.get("field", "FM64")
        return int(field[2:]), device.config.get("fxp_fraction_bits") or \
            DEFAULT_FRACTION_BITS[field]

    def validate(self, device: Device, config: Mapping[str, Any]) -> None:
        n = len(device.members)
        if n < 2:
            raise ClusterSpecError(f"SPU {device.name!r} needs at least two members, got {n}")
        unknown = set(config) - _CONFIG_KEYS
        if unknown:
            raise ClusterSpecError(f"SPU {device.name!r}: unknown config keys {sorted(unknown)}")
        protocol = config.get("protocol") or default_protocol(n)
        if protocol is None:
            raise ClusterSpecError(
                f"SPU {device.name!r} has {n} members and no protocol: name one (ABY3 runs "
                "on exactly 3 members, CHEETAH on 2; SEMI2K on any number, with a Beaver "
                "source that must be trusted: 'beaver: TrustedFirstParty' or "
                "'TrustedThirdParty')")
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
        _validate_beaver(device, config, protocol)

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
        """The driver secret-shares ``value`` now, one share per member, each private to
        its member: no party receives the plaintext."""
        config = SpuConfig.of(cluster, device)
        arr = as_array(what, value)
        if arr.dtype.name not in SUPPORTED_DTYPES:
            raise MPTypeError(f"{what}: SPU {device.name} cannot hold dtype {arr.dtype}; "
                              f"supported: {', '.join(sorted(SUPPORTED_DTYPES))}")
        return place(share_constant(arr, config), device.name)

    def fetch(self, ctx: ExecutionContext, cluster: ClusterSpec, device: Device,
              obj: MPObject) -> Any:
        """Refused: a secret-shared value reaches the driver only through a reveal that
        the program states (which every member can see and check before running)."""
        raise MPRuntimeError(f"{device.name} holds a secret-shared value; reveal it in the "
                             f"program first, e.g. return mp.put('{_first_ppu(cluster)}', z)")


def _first_ppu(cluster: ClusterSpec) -> str:
    return next((d.name for d in cluster.devices.values() if not get_kind(d.kind).joint), "P0")


register_kind(SPU())


@register_move("PPU", "SPU")
def _seal(cluster: ClusterSpec, obj: MPObject, src: Device, dst: Device, what: str) -> MPObject:
    """``src``'s party secret-shares the value among ``dst``'s members (whether or not it
    is one of them: a non-member sends every member its share and keeps none)."""
    _check_dtype(obj, dst, what)
    return place(seal(obj, SpuConfig.of(cluster, dst)), dst.name)


@register_move("SPU", "PPU")
def _reveal(cluster: ClusterSpec, obj: MPObject, src: Device, dst: Device,
            what: str) -> MPObject:
    return place(reveal(obj, SpuConfig.of(cluster, src), rank_of(cluster, dst)), dst.name)
