"""One gradient step of vertical logistic regression with homomorphic encryption.

Two parties hold the columns of one dataset: P0 has features ``X0`` and the
labels ``y``; P1 has features ``X1``. They train ``sigmoid(X0 w0 + X1 w1)``
with each weight vector kept by its feature holder. One gradient step, in the
classic HE form:

1. P1 sends its partial logits ``X1 w1`` to P0 (this step reveals them to P0);
2. P0 computes the residuals ``d = sigmoid(X0 w0 + X1 w1) - y``, its own
   gradient ``X0^T d / n``, and encrypts ``d`` under its Paillier key;
3. P1 multiplies the encrypted residuals by its own features (``phe.dot``),
   giving ``[[X1^T d / n]]``, adds a random mask ``r`` and sends it to P0;
4. P0 decrypts ``X1^T d / n + r`` and returns it; P1 removes ``r``.

P0 never sees ``X1`` or P1's gradient (only it masked); P1 never sees ``y``,
``d`` or ``X0``. Each party then updates its own weights. Security: semi-honest
parties; the mask (uniform in ±100, within float32's precision for the result)
hides P1's gradient from P0 only statistically; the partial logits of step 1 are
revealed to P0.

Run: ``python examples/phe_vertical_lr.py``
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import mplang as mp
from mplang import phe, simp, tensor

KEY_BITS = 2048
MASK_SCALE = 100.0
"""The random mask P1 adds to its encrypted gradient (uniform in ±MASK_SCALE)."""


def data(n: int = 64, d0: int = 3, d1: int = 2, seed: int = 5) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    x0 = rng.normal(size=(n, d0)).astype(np.float32)
    x1 = rng.normal(size=(n, d1)).astype(np.float32)
    y = (rng.random(n) < 0.5).astype(np.float32)
    return {"x0": x0, "x1": x1, "y": y, "w0": rng.normal(size=d0).astype(np.float32) * 0.1,
            "w1": rng.normal(size=d1).astype(np.float32) * 0.1}


def gradient_step(d: dict[str, np.ndarray], key_bits: int = KEY_BITS) -> Any:
    """A program: (P0's gradient at P0, P1's gradient at P1)."""
    n = d["y"].shape[0]

    @mp.function
    def program() -> Any:
        pk, sk = simp.pcall((0,), lambda: phe.keygen(scheme="paillier", key_bits=key_bits))
        x0, y, w0 = (simp.constant((0,), d[k]) for k in ("x0", "y", "w0"))
        x1, w1 = (simp.constant((1,), d[k]) for k in ("x1", "w1"))
        z1 = simp.pcall((1,), lambda x, w: tensor.run_jax(jnp.matmul, x, w), x1, w1)
        z1_at_0 = simp.shuffle_static(z1, {0: 1})

        def residuals(x, y, w, z1):
            return tensor.run_jax(lambda x, y, w, z1: jax.nn.sigmoid(x @ w + z1) - y,
                                  x, y, w, z1)

        res = simp.pcall((0,), residuals, x0, y, w0, z1_at_0)
        g0 = simp.pcall((0,), lambda x, r: tensor.run_jax(lambda x, r: x.T @ r / n, x, r),
                        x0, res)
        enc_res = simp.pcall((0,), phe.encrypt, res, pk)
        at_1 = simp.shuffle_static(enc_res, {1: 0})

        def masked_gradient(c, x):
            mask = tensor.run_jax(lambda x: jax.random.uniform(
                jax.random.key(0), (x.shape[1],), minval=-MASK_SCALE, maxval=MASK_SCALE), x)
            scaled = tensor.run_jax(lambda x: x / n, x)
            return phe.dot(c, scaled) + mask, mask  # d (n) times X1 (n, d1): X1^T d / n

        masked, mask = simp.pcall((1,), lambda c, x: masked_gradient(c, x), at_1, x1)
        opened = simp.pcall((0,), phe.decrypt, simp.shuffle_static(masked, {0: 1}), sk)
        back = simp.shuffle_static(opened, {1: 0})
        g1 = simp.pcall((1,), lambda m, r: m - r, back, mask)
        return g0, g1

    return program


def reference(d: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """The plaintext gradients, in float64."""
    x0, x1, y = (d[k].astype(np.float64) for k in ("x0", "x1", "y"))
    z = x0 @ d["w0"] + x1 @ d["w1"]
    r = 1 / (1 + np.exp(-z)) - y
    return x0.T @ r / len(y), x1.T @ r / len(y)


def main(key_bits: int = KEY_BITS) -> dict[str, Any]:
    d = data()
    sim = mp.Simulator(2)
    try:
        g0, g1 = mp.fetch(sim, mp.evaluate(sim, gradient_step(d, key_bits)))
    finally:
        sim.close()
    print("P0's gradient:", np.round(g0[0], 5))
    print("P1's gradient:", np.round(g1[1], 5))
    return {"g0": g0[0], "g1": g1[1], "reference": reference(d)}


if __name__ == "__main__":
    main()
