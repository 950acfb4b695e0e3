"""n-party PSI that reveals the n-way intersection only: ``psi.join_n`` with ``"aby3"``.

Every holder hashes its (distinct) keys to 62 - b bits and appends its position among
the holders in b more bits (``2**b >= 2n``), so the n tagged hashes are distinct. Each
holder secret-shares them among the first three holders, which run ABY3 (libspu;
semi-honest, honest majority: no two of the three may collude). On the shares:

1. a sort of all the tagged hashes (libspu's quicksort over a secret shuffle, whose
   keys are distinct);
2. a key is held by all n exactly where the hashes ``n - 1`` places apart differ by
   less than n (the same hash, from holders 0 to n - 1; different hashes differ by at
   least ``2**b - n + 1 > n``);
3. a stable sort by that bit alone (libspu's radix sort) gathers those runs' first
   tagged hashes in one block, in hash order; the rest become -1.

That vector is revealed to every holder: a block of the n-way keys' hashes and a block
of -1s. Nothing
in it depends on where the other keys were, or on who else held them. Each holder
keeps its rows whose hash is revealed, ordered by key. Hashes that collide among one
holder's keys stop the join (about ``m**2 / 2**(63 - b)`` for m keys).
"""

from __future__ import annotations

import functools
import hashlib
import struct
from typing import TYPE_CHECKING, Any

import numpy as np

from mplang.dialects.spu import SpuConfig, compiled, input_name, io_for, output_name, runtime_config
from mplang.edsl.errors import MPRuntimeError
from mplang.kernels.psi.join import sorted_rows
from mplang.kernels.psi.session import Session
from mplang.kernels.spu.run import (
    SpuShare,
    decode_share,
    encode_share,
    load_executable,
    share_data_bytes,
    share_shape,
)

if TYPE_CHECKING:
    import pyarrow as pa

COMPUTE = 3
"""How many holders (the first ones) compute on the shares: ABY3's three parties."""
SHARE_BYTES = 16
"""The bytes of one value's ABY3 share on a 64-bit ring: two ring elements."""
_LEN = struct.Struct("<I")


def party_bits(n: int) -> int:
    """The b low bits that tell n holders apart, with ``2**b >= 2n``."""
    return (2 * n - 1).bit_length()


def tagged_hashes(keys: pa.Array, side: int, n: int) -> np.ndarray:
    """This holder's encoded ``keys`` (distinct) as int64 hashes of ``62 - b`` bits
    shifted left by b, plus ``side``; MPRuntimeError if two of them collide."""
    import pyarrow as pa

    bits = party_bits(n)
    if pa.types.is_integer(keys.type) or pa.types.is_floating(keys.type):
        values = np.asarray(keys.to_numpy(zero_copy_only=False))
        if values.dtype.kind == "f":  # every NaN matches every NaN
            values = np.where(np.isnan(values), np.nan, values)
        items: Any = (v.tobytes() for v in values)
    else:
        items = (k.encode() for k in keys.to_pylist())
    digests = b"".join(hashlib.blake2b(k, digest_size=8, person=b"mplang.psi.n").digest()
                       for k in items)
    hashes = np.frombuffer(digests, "<u8") >> np.uint64(2 + bits)
    if len(np.unique(hashes)) != len(hashes):
        raise MPRuntimeError("two of this party's keys have the same hash; the 'aby3' "
                             "protocol cannot tell them apart (use another protocol)")
    return ((hashes.astype(np.int64) << bits) | side).astype(np.int64)


def pack_share(share: SpuShare) -> bytes:
    """A share as one message: each chunk after its length."""
    return b"".join(_LEN.pack(len(c)) + c for c in encode_share(share))


def unpack_share(data: bytes, rows: int, sender: int) -> SpuShare:
    """The share of `pack_share`'s ``data`` from party ``sender``: it must be a share of
    ``rows`` values."""
    parts: list[memoryview] = []
    view, pos = memoryview(data), 0
    try:
        while pos < len(view):
            (size,) = _LEN.unpack_from(view, pos)
            if pos + _LEN.size + size > len(view):
                raise ValueError("a chunk runs past the end")
            parts.append(view[pos + _LEN.size: pos + _LEN.size + size])
            pos += _LEN.size + size
        share = decode_share(parts)
        shape, size = share_shape(share), share_data_bytes(share)
    except (ValueError, struct.error) as e:
        raise MPRuntimeError(f"party {sender} sent a malformed share: {e}") from None
    if shape != (rows,):
        raise MPRuntimeError(f"party {sender} sent a share of shape {shape}; expected "
                             f"({rows},)")
    if size != SHARE_BYTES * rows:
        raise MPRuntimeError(f"party {sender} sent a share whose data is not "
                             f"{SHARE_BYTES} bytes for each of its {rows} values")
    return share


def _runs(n: int) -> tuple[Any, Any]:
    """The two secure steps: tagged hashes -> (not-shared bit, hash) in hash order; and
    the stable sort by that bit, with -1 for the hashes not shared by all."""
    import jax
    import jax.numpy as jnp

    def find(*parts: Any) -> tuple[Any, Any]:
        s = jnp.sort(jnp.concatenate(parts))
        first = s[: s.shape[0] - n + 1]
        return (s[n - 1:] - first) >= n, first

    def compact(apart: Any, first: Any) -> Any:
        apart, first = jax.lax.sort((apart, first), num_keys=1, is_stable=True)
        apart = apart.astype(first.dtype)
        return first * (1 - apart) - apart  # -1 where apart

    return find, compact


@functools.lru_cache(maxsize=32)
def executables(sizes: tuple[int, ...]) -> tuple[Any, Any]:
    """libspu's executables of both steps for tables of ``sizes`` rows (at least one
    each), compiled on first use."""
    import jax

    find, compact = _runs(len(sizes))
    total = sum(sizes) - len(sizes) + 1
    i64 = [jax.ShapeDtypeStruct((m,), np.int64) for m in sizes]
    pair = [jax.ShapeDtypeStruct((total,), np.bool_), jax.ShapeDtypeStruct((total,), np.int64)]
    return (load_executable(compiled(find, i64, "psi.join_n.find")),
            load_executable(compiled(compact, pair, "psi.join_n.compact")))


def device(compute: tuple[int, ...]) -> SpuConfig:
    """The ABY3 device of the computing holders."""
    return SpuConfig("psi.join_n", compute, "ABY3", "FM64")


def _run(link: Any, method: str, executable: Any, inputs: list[Any], outputs: int
         ) -> list[Any]:
    import spu
    import spu.libspu as libspu

    config = runtime_config("ABY3", "FM64", 0)
    config.sort_method = getattr(libspu.RuntimeConfig.SortMethod, method)
    runtime = spu.Runtime(link, config)
    for i, share in enumerate(inputs):
        runtime.set_var(input_name(i), share)
    runtime.run(executable)
    return [runtime.get_var(output_name(i)) for i in range(outputs)]


def compute(link: Any, shares: list[SpuShare], sizes: tuple[int, ...]) -> SpuShare:
    """A computing holder's share of the revealed vector, from its shares of every
    holder's tagged hashes (in holder order)."""
    find, compact = executables(sizes)
    apart, first = _run(link, "SORT_QUICK", find, [s.to_libspu() for s in shares], 2)
    (out,) = _run(link, "SORT_RADIX", compact, [apart, first], 1)
    return SpuShare(out)


def plan(members: tuple[int, ...], rank: int) -> list[tuple[int, str]]:
    """The messages ``rank`` sends after its hello: its shares to the other computing
    holders, and (a computing holder) its share of the result to every other holder."""
    computing = members[:COMPUTE]
    out = [(c, "share") for c in computing if c != rank]
    if rank in computing:
        out += [(h, "out") for h in members if h != rank]
    return out


def shared_index(session: Session, members: tuple[int, ...], rank: int, keys: pa.Array,
                 counts: list[int], link: Any) -> np.ndarray:
    """This holder's row numbers whose key every holder has, by key (``counts``: every
    holder's row count, each at least 1; ``link()``: the computing holders' link)."""
    n, side = len(members), members.index(rank)
    computing = members[:COMPUTE]
    config = device(computing)
    mine = tagged_hashes(keys, side, n)
    held: SpuShare | None = None
    for c, share in zip(computing, io_for(config).make_shares(mine, _secret()), strict=True):
        if c == rank:
            held = SpuShare(share)
        else:
            session.send(c, "share", pack_share(SpuShare(share)))
    outs: dict[int, SpuShare] = {}
    if held is not None:
        inputs = [held if h == rank else unpack_share(session.recv(h, "share"), counts[i], h)
                  for i, h in enumerate(members)]
        outs[rank] = compute(link(), inputs, tuple(counts))
        for h in members:
            if h != rank:
                session.send(h, "out", pack_share(outs[rank]))
    total = sum(counts) - n + 1
    for c in computing:
        if c not in outs:
            outs[c] = unpack_share(session.recv(c, "out"), total, c)
    revealed = np.asarray(io_for(config).reconstruct(
        [outs[c].to_libspu() for c in computing])).astype(np.int64)
    return _rows(revealed, mine, party_bits(n), keys)


def _secret() -> Any:
    import spu.libspu as libspu

    return libspu.Visibility.VIS_SECRET


def _rows(revealed: np.ndarray, mine: np.ndarray, bits: int, keys: pa.Array) -> np.ndarray:
    """This holder's rows whose hash ``revealed`` holds (its values other than -1), by
    key."""
    kept = revealed >= 0
    shared = revealed[kept]
    if np.any(revealed[~kept] != -1) or np.count_nonzero(np.diff(kept)) > 1 \
            or np.any(shared & ((1 << bits) - 1)) or np.any(np.diff(shared) <= 0):
        raise MPRuntimeError("the revealed intersection is malformed")
    index = np.flatnonzero(np.isin(mine >> bits, shared >> bits))
    if len(index) != len(shared):
        raise MPRuntimeError(f"the revealed intersection has {len(shared)} keys, of which "
                             f"this party holds {len(index)}")
    return sorted_rows(index, keys)[0] if len(index) else index
