"""One gradient step of vertical logistic regression with homomorphic encryption.

Two parties hold the columns of one dataset: P0 has features ``X0`` and the
labels ``y``; P1 has features ``X1`` (each in its own data root, read on its own
side with ``tensor.load``). They train ``sigmoid(X0 w0 + X1 w1)`` with each weight
vector kept by its feature holder. One gradient step, in the classic HE form with
the sigmoid's first-order Taylor expansion around 0, ``sigmoid(z) ~ 0.5 + z / 4``
(as in Hardy et al., 2017), so that the residuals are linear in P1's logits:

1. P1 encrypts its scaled partial logits ``X1 w1 / 4`` under P0's Paillier key and
   sends them to P0, who cannot read them (it decrypts only what step 3 makes);
2. P0 adds its own part, under encryption: ``[[d]] = [[X1 w1 / 4]] + X0 w0 / 4 +
   0.5 - y``, the encrypted residuals;
3. P0 computes ``[[X0^T d / n]]`` and decrypts its own gradient; P1 receives
   ``[[d]]``, computes ``[[X1^T d / n]]`` (``phe.dot``) and sends it to P0, which
   decrypts it and returns it to P1.

P1 never sees ``y``, ``d`` or ``X0``; P0 never sees ``X1`` or P1's logits, row by
row. Each gradient is a sum over the ``n`` rows of one party's features weighted by
the other's residuals: no aggregate by the policies' definitions (another owner's
real values weight the rows), so on workers each party reviews this program and
approves it by its digest (``approve: - {program: DIGEST}``; a refusal prints it).
P0 learns P1's gradient too. (Production protocols also hide it from P0 with a random
mask P1 adds and removes; MPLang's local tensor code has no source of randomness
the driver does not know yet, and a mask the driver knows hides nothing.)
Security: semi-honest parties; P0 holds the only key.

Run: ``python examples/phe_vertical_lr.py``
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

import mplang as mp
from mplang import phe, simp, tensor
from mplang.libs.demo import simulated

KEY_BITS = 2048
FILES = {"node_0": ("x0.npy", "y.npy"), "node_1": ("x1.npy",)}
"""The files each party keeps in its own data root."""


def data(n: int = 64, d0: int = 3, d1: int = 2, seed: int = 5) -> dict[str, np.ndarray]:
    """Each party's columns, P0's labels and the current weights (public)."""
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=(n, d0)).astype(np.float32)
    x1 = rng.normal(size=(n, d1)).astype(np.float32)
    y = (rng.random(n) < 0.5).astype(np.float32)
    return {"x0": x0, "x1": x1, "y": y, "w0": rng.normal(size=d0).astype(np.float32) * 0.1,
            "w1": rng.normal(size=d1).astype(np.float32) * 0.1}


def save_party_data(roots: dict[str, Path], d: dict[str, np.ndarray]) -> None:
    """What each party does on its own machine: keep its columns (P0: and labels) in its
    data root."""
    for node, files in FILES.items():
        roots[node].mkdir(parents=True, exist_ok=True)
        for file in files:
            np.save(roots[node] / file, d[file.removesuffix(".npy")])


def gradient_step(w0: np.ndarray, w1: np.ndarray, key_bits: int = KEY_BITS) -> Any:
    """A program: (P0's gradient at P0, P1's gradient at P1) at weights ``w0``, ``w1``."""
    @mp.function
    def program() -> Any:
        pk, sk = simp.pcall((0,), lambda: phe.keygen(scheme="paillier", key_bits=key_bits))
        x0 = simp.pcall((0,), lambda: tensor.load("x0.npy"))
        y = simp.pcall((0,), lambda: tensor.load("y.npy"))
        x1 = simp.pcall((1,), lambda: tensor.load("x1.npy"))
        n = x0.mptype.base.shape[0]

        def quarter_logits(x: Any) -> Any:  # P1's part of the residuals
            return tensor.run_jax(lambda x: x @ w1 / 4.0, x)

        z1 = simp.pcall((1,), lambda x, pk: phe.encrypt(quarter_logits(x), pk), x1,
                        simp.shuffle_static(pk, {1: 0}))

        def residuals(c: Any, x: Any, y: Any) -> Any:  # [[d]], under P0's own key
            return phe.add(c, tensor.run_jax(lambda x, y: x @ w0 / 4.0 + 0.5 - y, x, y))

        d = simp.pcall((0,), residuals, simp.shuffle_static(z1, {0: 1}), x0, y)

        def gradient(c: Any, x: Any) -> Any:  # [[X^T d / n]]
            return phe.dot(c, tensor.run_jax(lambda x: x / n, x))

        g0 = simp.pcall((0,), lambda c, x, sk: phe.decrypt(gradient(c, x), sk), d, x0, sk)
        g1 = simp.pcall((1,), gradient, simp.shuffle_static(d, {1: 0}), x1)
        opened = simp.pcall((0,), phe.decrypt, simp.shuffle_static(g1, {0: 1}), sk)
        return g0, simp.shuffle_static(opened, {1: 0})

    return program


def reference(d: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The plaintext gradients with the same Taylor residuals, in float64."""
    x0, x1, y = (d[k].astype(np.float64) for k in ("x0", "x1", "y"))
    r = 0.5 + (x0 @ d["w0"] + x1 @ d["w1"]) / 4.0 - y
    return x0.T @ r / len(y), x1.T @ r / len(y)


def main(key_bits: int = KEY_BITS) -> dict[str, Any]:
    d = data()
    # no policy judges here; on workers each party approves the program's digest (above)
    with simulated(mp.ClusterSpec.simple(2), lambda roots: save_party_data(roots, d),
                   policies="open") as sim:
        g0, g1 = mp.fetch(sim, mp.evaluate(sim, gradient_step(d["w0"], d["w1"], key_bits)))
    print("P0's gradient:", np.round(g0[0], 5))
    print("P1's gradient:", np.round(g1[1], 5))
    return {"g0": g0[0], "g1": g1[1], "reference": reference(d)}


if __name__ == "__main__":
    main()
