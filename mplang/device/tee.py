"""The TEE device kind: one node computing in plaintext inside a (simulated) enclave.

``{"kind": "TEE", "members": [node], "config": {"attestation": "mock"}}``, and
optionally ``code`` (the hex code digest the data owners expect; default: each
owner's own MPLang code) and ``vendor_key`` (the hex Ed25519 key of the
attestation service; default: the built-in MOCK vendor).

Attestation is SIMULATED (``attestation: mock``, the only mode here): see
`mplang.dialects.tee`. For each function run on the device
(``mp.device("T0")(fn)(x, y)``):

1. the TEE makes a fresh X25519 key pair and a mock quote binding its public
   key to the measurement of its code and of ``fn`` (traced for the arguments'
   types: the computation digest);
2. each party holding an argument checks the quote against the measurement and
   vendor key it expects; a failed check fails its run there, before its data is
   sealed, so nothing leaves it;
3. it seals the argument to the TEE's key (X25519 with a fresh key, HKDF-SHA256,
   AES-256-GCM) and sends it; only the TEE can open it;
4. the TEE opens every argument and runs ``fn`` (plaintext JAX);
5. ``mp.put("P0", r)`` seals the result to a fresh key of P0's and sends it.

A value put on the device stays with its owner until a function on the device
needs it (step 2 needs the function's digest).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from mplang.device.cluster import ClusterSpec, ClusterSpecError, Device
from mplang.device.kinds import (
    DeviceKind,
    adopt_move,
    describe,
    place,
    register_kind,
    register_move,
)
from mplang.device.ppu import rank_of
from mplang.dialects import crypto, simp, tee, tensor
from mplang.edsl.context import ExecutionContext
from mplang.edsl.errors import MPRuntimeError, MPTypeError
from mplang.edsl.object import MPObject
from mplang.edsl.pytree import tree_unflatten
from mplang.edsl.tracer import TracedFunction, Tracer, current_tracer, trace_function
from mplang.edsl.typing import Mask, MPType, TensorType
from mplang.flows.engine import region_digest
from mplang.frontend.feop import is_feop

SECURITY_MODEL = (
    "the TEE's hardware and attestation vendor are trusted, and no party (the TEE's own "
    "host included) can read the enclave's memory; every party may be malicious towards "
    "the others' data, which only the attested code sees. HERE ATTESTATION IS A MOCK: the "
    "quote is signed with a published key and the TEE node reports its own measurement, "
    "so a mock quote proves nothing about the hardware or the code; the TEE node sees "
    "every input in plaintext")
_SEAL_INFO = b"mplang-tee-seal/1"
_CONFIG_KEYS = frozenset(["attestation", "code", "vendor_key"])


def _hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and \
        all(c in "0123456789abcdef" for c in value)


def _body(fn: Callable[..., Any], kwargs: dict[str, Any]) -> Callable[..., Any]:
    """What the TEE runs: a frontend op (or a function marked ``mplang_ops``, made of
    them) as written, any other function as JAX."""
    def as_mplang(*a: Any) -> Any:
        return fn(*a, **kwargs)

    def as_jax(*a: Any) -> Any:
        return tensor.run_jax(fn, *a, **kwargs)

    body = as_mplang if is_feop(fn) or getattr(fn, "mplang_ops", False) else as_jax
    body.__name__ = getattr(fn, "__name__", "fn")
    return body


def _traced(world_size: int, rank: int, body: Callable[..., Any], args: list[MPObject],
            what: str) -> TracedFunction:
    """``body`` traced alone on ``args`` at party ``rank``: the region the TEE runs."""
    traced = trace_function(Tracer(world_size, local=True, parties=Mask.of([rank])),
                            body, args)
    if traced.captured:
        raise MPTypeError(f"{what}: a TEE function takes its inputs as arguments; it "
                          "captures a value of the program, which would bypass sealing")
    return traced


def computation_digest(world_size: int, rank: int, body: Callable[..., Any],
                       args: list[MPObject]) -> str:
    """SHA-256 (hex) of ``body`` traced alone on ``args``' types at party ``rank``: the
    computation a TEE quote attests."""
    return region_digest(_traced(world_size, rank, body, args, "computation_digest").graph)


def _seal(x: MPObject, peer_pk: MPObject, aad: bytes) -> tuple[MPObject, MPObject]:
    """``x`` encrypted to ``peer_pk``'s holder: (AES-GCM ciphertext, our fresh public key)."""
    pk, sk = crypto.x25519_keygen()
    key = crypto.hkdf(crypto.x25519_shared(sk, peer_pk), info=_SEAL_INFO)
    return crypto.aes_encrypt(x, key, aad=aad), pk


def _open(c: MPObject, peer_pk: MPObject, sk: MPObject, like: TensorType,
          aad: bytes) -> MPObject:
    key = crypto.hkdf(crypto.x25519_shared(sk, peer_pk), info=_SEAL_INFO)
    return crypto.aes_decrypt(c, key, like=like, aad=aad)


class _Session:
    """One attested run on the TEE: its key pair and quote, and each owner's checked copy
    of the TEE's public key."""

    def __init__(self, cluster: ClusterSpec, device: Device, digest: str):
        self.device, self.digest = device, digest
        self.tee = rank_of(cluster, device)
        self.pk, self.sk = simp.pcall((self.tee,), crypto.x25519_keygen)
        self.quote = simp.pcall((self.tee,), lambda pk: tee.mock_quote(
            crypto.public_bytes(pk), computation=digest), self.pk)
        self.checked: dict[int, MPObject] = {}
        self.count = 0

    def tee_key_at(self, owner: int) -> MPObject:
        if owner not in self.checked:
            config = self.device.config
            quote = simp.shuffle_static(self.quote, {owner: self.tee})
            self.checked[owner] = simp.pcall((owner,), lambda q: tee.verify_quote(
                q, computation=self.digest, code=config.get("code"),
                vendor_key=config.get("vendor_key")), quote)
        return self.checked[owner]

    def bring(self, x: MPObject) -> MPObject:
        """``x`` at the TEE: sealed by its holder after checking the quote, opened there."""
        t = x.mptype
        assert isinstance(t, MPType)
        if t.pmask is not None and self.tee in t.pmask:
            return x
        if t.pmask is None or len(t.pmask) != 1 or not isinstance(t.base, TensorType):
            raise MPTypeError(f"{describe(x)} cannot enter TEE {self.device.name}: it takes "
                              "tensors held by one party")
        owner = t.pmask.parties[0]
        aad = _SEAL_INFO + bytes.fromhex(self.digest) + self.count.to_bytes(4, "little")
        self.count += 1
        c, epk = simp.pcall((owner,), lambda v, k: _seal(v, k, aad), x,
                            self.tee_key_at(owner))
        c, epk = simp.shuffle_static(c, {self.tee: owner}), \
            simp.shuffle_static(epk, {self.tee: owner})
        like = t.base
        return simp.pcall((self.tee,), lambda cc, e, s: _open(cc, e, s, like, aad), c, epk,
                          self.sk)


class TEE(DeviceKind):
    """A trusted execution environment on one node, with MOCK attestation."""

    name = "TEE"
    joint = True
    enclave = True
    security_model = SECURITY_MODEL

    def trust(self, device: Device) -> str | None:
        return (f"attestation is a MOCK: {device.members[0]} signs its own quotes with a "
                "published key, so nothing proves it runs the attested code, and it sees "
                "every input placed on the device in plaintext")

    def validate(self, device: Device, config: Mapping[str, Any]) -> None:
        if len(device.members) != 1:
            raise ClusterSpecError(f"TEE {device.name!r} needs exactly one member, "
                                   f"got {len(device.members)}")
        unknown = set(config) - _CONFIG_KEYS
        if unknown:
            raise ClusterSpecError(f"TEE {device.name!r}: unknown config keys {sorted(unknown)}")
        if config.get("attestation") != "mock":
            raise ClusterSpecError(f"TEE {device.name!r}: set 'attestation: mock'; hardware "
                                   "attestation is not available here, and the mock must be "
                                   "asked for by name")
        for key in ("code", "vendor_key"):
            if key in config and not _hex64(config[key]):
                raise ClusterSpecError(f"TEE {device.name!r}: {key} must be 64 lowercase hex "
                                       f"digits, got {config[key]!r}")

    def call(self, cluster: ClusterSpec, device: Device, fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> Any:
        rank = rank_of(cluster, device)
        body = _body(fn, kwargs)
        inputs = [a for a in args if isinstance(a, MPObject)]
        if len(inputs) != len(args):
            raise MPTypeError(f"{what}: TEE arguments must be MPLang values; pass constants "
                              "inside the function")
        tracer = current_tracer(what)
        try:
            traced = _traced(tracer.world_size, rank, body, inputs, what)
            session = _Session(cluster, device, region_digest(traced.graph))
            brought = [session.bring(x) for x in inputs]
        except MPTypeError as e:
            raise MPTypeError(f"{what}: {e}") from None
        name = getattr(body, "__name__", "fn")
        outs = simp.pcall_p.bind(brought, {"parties": Mask.of([rank]), "fn": name},
                                 [traced.graph])
        return tree_unflatten(traced.out_tree, outs)

    def adopt(self, cluster: ClusterSpec, obj: MPObject, t: MPType, device: Device,
              what: str) -> MPObject:
        """Placed, not moved: the value is sealed to the TEE when a function there needs it
        (after its holder checks the quote for that function)."""
        if not isinstance(t.base, TensorType) or t.pmask is None or \
                (len(t.pmask) != 1 and rank_of(cluster, device) not in t.pmask):
            raise MPTypeError(f"{what}: {describe(obj)} cannot move to TEE {device.name}: it "
                              "takes tensors held by one party")
        return place(obj, device.name)

    def constant(self, cluster: ClusterSpec, device: Device, value: Any, what: str) -> MPObject:
        return place(simp.constant((rank_of(cluster, device),), value), device.name)

    def fetch(self, ctx: ExecutionContext, cluster: ClusterSpec, device: Device,
              obj: MPObject) -> Any:
        raise MPRuntimeError(f"{device.name} holds a value inside the TEE; send it out in "
                             "the program first, e.g. return mp.put('P0', r)")


TEE_KIND = register_kind(TEE())


register_move("PPU", "TEE")(adopt_move(TEE_KIND))  # sealed when a function needs it


@register_move("TEE", "PPU")
def _leave(cluster: ClusterSpec, obj: MPObject, src: Device, dst: Device,
           what: str) -> MPObject:
    """The TEE seals the value to a fresh key of the receiver's; only it can open it."""
    tee_rank, to = rank_of(cluster, src), rank_of(cluster, dst)
    t = obj.mptype
    assert isinstance(t, MPType)
    if not isinstance(t.base, TensorType):
        raise MPTypeError(f"{what}: {describe(obj)} is not a tensor")
    if t.pmask == Mask.of([to]):  # never entered the TEE: it is the receiver's own
        return place(obj, dst.name)
    if t.pmask is None or tee_rank not in t.pmask:
        identity = _body(lambda v: v, {})
        digest = computation_digest(current_tracer(what).world_size, tee_rank, identity, [obj])
        obj = _Session(cluster, src, digest).bring(obj)
    if to == tee_rank:
        return place(obj, dst.name)
    like = t.base
    rpk, rsk = simp.pcall((to,), crypto.x25519_keygen)
    aad = _SEAL_INFO + b"/out"
    c, epk = simp.pcall((tee_rank,), lambda v, k: _seal(v, k, aad), obj,
                        simp.shuffle_static(rpk, {tee_rank: to}))
    c, epk = simp.shuffle_static(c, {to: tee_rank}), simp.shuffle_static(epk, {to: tee_rank})
    return place(simp.pcall((to,), lambda cc, e, s: _open(cc, e, s, like, aad), c, epk, rsk),
                 dst.name)


__all__ = ["SECURITY_MODEL", "TEE", "computation_digest"]
