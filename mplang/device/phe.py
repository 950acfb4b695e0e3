"""The PHE device kind: additively homomorphic encryption under one member's key.

``{"kind": "PHE", "members": [key_owner, evaluator, ...], "config": {"scheme":
"paillier", "key_bits": 2048}}``. The first member makes the key pair (once per
traced program, at first use) and alone can decrypt. A value moving onto the
device is encrypted by the party that holds it, under the owner's public key; a
function on the device (``mp.device("HE0")(fn)``: additions, plaintext
multiplications, sums and dots, written with ``phe`` ops or numpy habits: ``+``,
``-``, ``*``, ``/`` by plaintexts, ``@`` with plaintext matrices, ``c.sum(axis=k)``)
runs on the ciphertexts at the first evaluator (the owner when there is none);
``mp.put(ppu, c)`` decrypts at the owner, and only the owner's PPU may receive it.
"""

from __future__ import annotations

import functools
import weakref
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
from mplang.device.ppu import call_on_party, rank_of
from mplang.dialects import phe, simp
from mplang.edsl.attrs import ConfigField, ConfigSchema
from mplang.edsl.context import ExecutionContext
from mplang.edsl.errors import FeConfigError, MPRuntimeError, MPTypeError
from mplang.edsl.location import locate_error, raised_at
from mplang.edsl.object import MPObject
from mplang.edsl.pytree import tree_flatten
from mplang.edsl.tracer import Tracer, current_tracer
from mplang.edsl.typing import MPType, TensorType

PHE_CONFIG = ConfigSchema({
    "scheme": ConfigField(str, default="paillier", choices=phe.SCHEMES,
                          doc="paillier (sf-heu's ZPaillier) or ou (Okamoto-Uchiyama)"),
    "key_bits": ConfigField(int, default=2048, min=phe.MIN_KEY_BITS, max=phe.MAX_KEY_BITS,
                            doc="the modulus size in bits"),
})
"""A PHE device's config."""

SECURITY_MODEL = (
    "semi-honest parties, and the key owner must not collude with an evaluator: the owner "
    "(first member) decrypts anything it receives, so ciphertexts go to the evaluators, "
    "who see ciphertexts only (secure under the decisional composite residuosity "
    "assumption for Paillier, factoring-based for OU); an evaluator is trusted to compute "
    "what the program says (a deviating one can return a wrong result undetected), and the "
    "owner learns every value revealed to it")


_KEYS: weakref.WeakKeyDictionary[Tracer, dict[Any, MPObject]] = weakref.WeakKeyDictionary()
"""Per trace (region): the device key pairs made there and their copies at other parties."""


def _cached(tracer: Tracer, key: Any, make: Callable[[], MPObject]) -> MPObject:
    node: Tracer | None = tracer
    while node is not None:
        found = _KEYS.get(node, {}).get(key)
        if found is not None:
            return found
        node = node.parent
    value = make()
    _KEYS.setdefault(tracer, {})[key] = value
    return value


def _config(device: Device) -> dict[str, Any]:
    return PHE_CONFIG.validate(f"PHE {device.name!r}", device.config)


def _keys(cluster: ClusterSpec, device: Device) -> tuple[MPObject, MPObject]:
    """The device's (public, private) key pair, made by the owner on first use in a trace."""
    tracer = current_tracer(f"PHE {device.name}")
    owner = rank_of(cluster, device)
    config = _config(device)

    def make() -> MPObject:
        pk, sk = simp.pcall((owner,), lambda: phe.keygen(
            scheme=config["scheme"], key_bits=config["key_bits"]))
        _KEYS.setdefault(tracer, {})[(device.name, "sk")] = sk
        return pk

    pk = _cached(tracer, (device.name, "pk", owner), make)
    sk = _cached(tracer, (device.name, "sk"), lambda: _missing_sk(device))
    return pk, sk


def _missing_sk(device: Device) -> MPObject:
    raise MPTypeError(f"PHE {device.name}: its private key is not visible here")


def _public_key_at(cluster: ClusterSpec, device: Device, rank: int) -> MPObject:
    pk, _ = _keys(cluster, device)
    owner = rank_of(cluster, device)
    if rank == owner:
        return pk
    tracer = current_tracer(f"PHE {device.name}")
    return _cached(tracer, (device.name, "pk", rank),
                   lambda: simp.shuffle_static(pk, {rank: owner}))


def _evaluator(cluster: ClusterSpec, device: Device) -> int:
    return cluster.rank_of(device.members[1 if len(device.members) > 1 else 0])


def _key_id(cluster: ClusterSpec, device: Device) -> str:
    pk, _ = _keys(cluster, device)
    base = pk.base_type
    assert isinstance(base, phe.PublicKey)
    return base.key


def _no_jax(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn``, whose use of jax.numpy on a ciphertext fails naming the PHE ops to use (JAX
    cannot trace ciphertexts, so a PHE function is never retried as a JAX function)."""
    @functools.wraps(fn)
    def on_ciphertexts(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except TypeError as e:
            if "TraceObject" not in str(e):  # not JAX (or numpy) refusing a traced value
                raise
            error = MPTypeError(f"jax.numpy does not take PHE ciphertexts: {phe.NUMPY_HABITS}")
            locate_error(error, raised_at(e))
        raise error

    return on_ciphertexts


class PHE(DeviceKind):
    """Homomorphic encryption under the first member's key; evaluated by the others."""

    name = "PHE"
    joint = True
    runs_jax = False
    security_model = SECURITY_MODEL

    def trust(self, device: Device) -> str | None:
        if len(device.members) > 1:
            return None
        return (f"{device.members[0]} holds the key and evaluates too: it can decrypt every "
                "input placed on the device; add an evaluator member that does not collude "
                "with it")

    def validate(self, device: Device, config: Mapping[str, Any]) -> None:
        if not device.members:
            raise ClusterSpecError(f"PHE {device.name!r} needs a key owner as first member")
        try:
            PHE_CONFIG.validate(f"PHE {device.name!r}", config)
        except FeConfigError as e:
            raise ClusterSpecError(str(e)) from None

    def call(self, cluster: ClusterSpec, device: Device, fn: Callable[..., Any],
             args: tuple[Any, ...], kwargs: dict[str, Any], what: str) -> Any:
        evaluator = _evaluator(cluster, device)
        out = call_on_party(evaluator, _no_jax(fn), args, kwargs, what,
                            lambda x: self._at(x, evaluator))
        for leaf in tree_flatten(out)[0]:
            if isinstance(leaf, MPObject) and not isinstance(leaf.base_type, phe.Ciphertext):
                raise MPTypeError(f"{what}: returned {describe(leaf)}; a PHE function returns "
                                  "ciphertexts (decrypt them with mp.put to the key owner)")
        return out

    @staticmethod
    def _at(x: MPObject, rank: int) -> MPObject:
        t = x.mptype
        assert isinstance(t, MPType)
        if t.pmask is not None and rank in t.pmask:
            return x
        src = t.pmask.parties[0] if t.pmask else None
        if src is None:
            raise MPTypeError(f"{describe(x)}: its holders are known only at run time")
        return simp.shuffle_static(x, {rank: src})

    def adopt(self, cluster: ClusterSpec, obj: MPObject, t: MPType, device: Device,
              what: str) -> MPObject:
        if isinstance(t.base, phe.Ciphertext):
            if t.base.key != _key_id(cluster, device):
                raise MPTypeError(f"{what}: {describe(obj)} is not under {device.name}'s key")
            return place(obj, device.name)
        if not isinstance(t.base, TensorType) or t.pmask is None or len(t.pmask) != 1:
            raise MPTypeError(f"{what}: {describe(obj)} cannot move to PHE {device.name}: it "
                              "takes tensors held by one party; place it first with mp.put")
        holder = t.pmask.parties[0]
        pk = _public_key_at(cluster, device, holder)
        try:
            c = simp.pcall((holder,), lambda x, k: phe.encrypt(x, k), obj, pk)
        except MPTypeError as e:
            raise MPTypeError(f"{what}: {e}") from None
        return place(c, device.name)

    def constant(self, cluster: ClusterSpec, device: Device, value: Any, what: str) -> MPObject:
        """Encrypted by the key owner (the driver's constant is part of the program)."""
        owner = rank_of(cluster, device)
        x = simp.constant((owner,), value)
        t = x.mptype
        assert isinstance(t, MPType)
        return self.adopt(cluster, x, t, device, what)

    def fetch(self, ctx: ExecutionContext, cluster: ClusterSpec, device: Device,
              obj: MPObject) -> Any:
        raise MPRuntimeError(f"{device.name} holds a ciphertext; decrypt it in the program "
                             f"first: return mp.put(<the PPU of {device.members[0]}>, c)")


PHE_KIND = register_kind(PHE())


register_move("PPU", "PHE")(adopt_move(PHE_KIND))  # encrypted by the value's holder


@register_move("PHE", "PPU")
def _decrypt(cluster: ClusterSpec, obj: MPObject, src: Device, dst: Device,
             what: str) -> MPObject:
    owner = rank_of(cluster, src)
    if dst.members[0] != src.members[0]:
        raise MPTypeError(f"{what}: only {src.name}'s key owner {src.members[0]} can decrypt; "
                          f"{dst.name} is on {dst.members[0]}. Move the result to the owner's "
                          "PPU, then onwards")
    if not isinstance(obj.base_type, phe.Ciphertext):
        raise MPTypeError(f"{what}: {describe(obj)} is not a ciphertext")
    _, sk = _keys(cluster, src)
    c = PHE._at(obj, owner)
    try:
        plain = simp.pcall((owner,), phe.decrypt, c, sk)
    except MPTypeError as e:
        raise MPTypeError(f"{what}: {e}") from None
    return place(plain, dst.name)


__all__ = ["PHE", "PHE_CONFIG", "SECURITY_MODEL"]
