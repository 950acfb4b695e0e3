"""PHE throughput through MPLang against raw sf-heu calls, and lightphe for scale.

On ``--n`` values (default 10^4) under one 2048-bit Paillier key: encrypt, add
(ciphertext + ciphertext), mul_plain (ciphertext x plaintext vector) and decrypt.
MPLang runs each step as its own program on a one-party simulator, taking the
keys and ciphertexts of the previous steps as runtime inputs; raw sf-heu runs
the same step with the same key and data through ``heu.numpy`` with its int64
integer encoder (its fastest path). The two alternate, ``--rounds`` times, and
the medians are reported. lightphe (pure Python) encrypts, adds, multiplies
and decrypts ``--light-n`` values (default 100).

    .venv/bin/python benchmarks/bench_phe.py [--n 10000] [--rounds 3] [--key-bits 2048]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import mplang as mp
from mplang import phe, simp


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def mplang_steps(sim: mp.Simulator, x: np.ndarray, w: np.ndarray, keys: Any
                 ) -> dict[str, float]:
    pk, sk = keys
    times: dict[str, float] = {}
    on0 = (0,)
    t, c = timed(lambda: mp.evaluate(sim, lambda k: simp.pcall(
        on0, lambda kk: phe.encrypt(x, kk), k), pk))
    times["encrypt"] = t
    t, d = timed(lambda: mp.evaluate(sim, lambda a: simp.pcall(on0, lambda v: v + v, a), c))
    times["add"] = t
    t, m = timed(lambda: mp.evaluate(sim, lambda a: simp.pcall(on0, lambda v: v * w, a), c))
    times["mul_plain"] = t
    t, y = timed(lambda: mp.fetch(sim, mp.evaluate(sim, lambda a, s: simp.pcall(
        on0, phe.decrypt, a, s), c, sk)))
    times["decrypt"] = t
    assert np.array_equal(y[0], x), "MPLang decrypted a different vector"
    del d, m
    return times


def raw_steps(kit: Any, x: np.ndarray, w: np.ndarray) -> dict[str, float]:
    encoder = kit.integer_encoder(scale=1)
    times: dict[str, float] = {}
    t, c = timed(lambda: kit.encryptor().encrypt(kit.array(x.astype(np.int64), encoder)))
    times["encrypt"] = t
    evaluator = kit.evaluator()
    times["add"], _ = timed(lambda: evaluator.add(c, c))
    times["mul_plain"], _ = timed(lambda: evaluator.mul(c, kit.array(w.astype(np.int64),
                                                                       encoder)))
    t, y = timed(lambda: kit.decryptor().decrypt(c).to_numpy(encoder))
    times["decrypt"] = t
    assert np.array_equal(y, x), "sf-heu decrypted a different vector"
    return times


def lightphe_steps(n: int, key_bits: int, w: np.ndarray) -> dict[str, float] | None:
    try:
        from lightphe import LightPHE
    except ImportError:
        return None
    cs = LightPHE(algorithm_name="Paillier", key_size=key_bits)
    values = list(range(1, n + 1))
    times: dict[str, float] = {}
    t, cts = timed(lambda: [cs.encrypt(v) for v in values])
    times["encrypt"] = t
    times["add"], _ = timed(lambda: [c + c for c in cts])
    factors = [int(v) for v in w[:n]]
    times["mul_plain"], _ = timed(lambda: [c * f for c, f in zip(cts, factors, strict=True)])
    t, back = timed(lambda: [cs.decrypt(c) for c in cts])
    times["decrypt"] = t
    assert back == values
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--key-bits", type=int, default=2048)
    parser.add_argument("--light-n", type=int, default=100)
    args = parser.parse_args()

    from heu import numpy as hnp
    from heu import phe as hphe

    rng = np.random.default_rng(0)
    x = rng.integers(-10**6, 10**6, size=args.n).astype(np.int32)
    w = rng.integers(-100, 100, size=args.n).astype(np.int32)
    sim = mp.Simulator(1)
    keys = mp.evaluate(sim, lambda: simp.pcall((0,), lambda: phe.keygen(
        scheme="paillier", key_bits=args.key_bits)))
    kit = hnp.setup(hphe.SchemaType.ZPaillier, args.key_bits)
    ours: dict[str, list[float]] = {}
    raw: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for name, t in raw_steps(kit, x, w).items():
            raw.setdefault(name, []).append(t)
        for name, t in mplang_steps(sim, x, w, keys).items():
            ours.setdefault(name, []).append(t)
    light = lightphe_steps(args.light_n, args.key_bits, np.abs(w) + 1)
    print(f"PHE throughput, {args.n} int32 values, Paillier {args.key_bits} bits, medians of "
          f"{args.rounds} alternating rounds (values per second)")
    print(f"{'step':<10} {'raw sf-heu':>12} {'MPLang':>12} {'ratio':>7} "
          f"{'lightphe (' + str(args.light_n) + ')':>16}")
    for name in ("encrypt", "add", "mul_plain", "decrypt"):
        r = args.n / statistics.median(raw[name])
        o = args.n / statistics.median(ours[name])
        lp = f"{args.light_n / light[name]:16.1f}" if light else f"{'not installed':>16}"
        print(f"{name:<10} {r:12.1f} {o:12.1f} {o / r:6.2f}x {lp}")
    sim.close()


if __name__ == "__main__":
    main()
