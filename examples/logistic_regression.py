"""Logistic regression trained on secret shares, over data split by features.

Two parties hold different columns of the same records (a "vertical" split),
here scikit-learn's breast cancer dataset (569 patients, 30 features):

* party 0 (device ``P0``) holds the first 15 feature columns;
* party 1 (device ``P1``) holds the other 15 columns and the labels.

A third party (party 2) holds no data and receives no result: it only helps
compute on secret shares, so that the SPU can run ABY3.

Each party reads its own columns (and party 1 its labels) from its own data
root with ``tensor.load``: no record passes through the driver. In this demo
one process plays every party, so it writes each party's files into temporary
data roots first; on real workers each organisation keeps them on its own
machine (``mplang worker --data-root DIR``).

The flow:

1. each party standardizes its own columns in plaintext on its PPU, with the
   mean and standard deviation of its training rows;
2. the SPU ``SP0`` (ABY3 among the three parties) trains the model by full
   batch gradient descent, written as an ordinary JAX function with
   ``jax.lax.fori_loop``; features and labels enter the SPU as secret shares;
3. each party receives only its own part of the model: ``P0`` the weights of
   its columns, ``P1`` the weights of its columns and the bias;
4. the demo scores the test rows with the revealed model. The program itself
   reveals nothing per row: per-row predictions are row-wise values of both
   parties' data, which their default policies do not let go.

Policies: the weights combine each party's rows weighted by the other's real
values, no aggregate by the definitions of ``docs/privacy.md``, so each party
approves this program by its digest (``approve: - {program: DIGEST}``; a refusal
prints the entry), or trains with the approvable ``mplang.libs.linear``. The
demo's simulator judges nothing (``policies="open"``).

The very same ``train`` function is also run in plaintext with ``jax.jit``
(same initialisation, iterations and learning rate): the SPU's fixed-point
arithmetic (and its approximation of the sigmoid) gives nearly the same
weights and the same test accuracy.

Security: ABY3 protects against semi-honest parties only (each follows the
protocol but may try to learn from what it sees) and needs an honest majority:
any two of the three parties together could rebuild every secret value, so
party 2 must collude with neither data holder. With no helper, ``main(parties=2)``
runs the same program on ``ClusterSpec.simple(2)``: CHEETAH between the two data
holders, which trusts nobody but is much slower for this workload (its secure
sigmoid dominates: about 1 s per iteration here, over 5 minutes in all, against
a few seconds for ABY3).

Run: ``python examples/logistic_regression.py``
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from sklearn.datasets import load_breast_cancer
from sklearn.model_selection import train_test_split

import mplang as mp
from mplang import tensor

P0_FEATURES = 15
"""Party 0 holds feature columns [0, 15); party 1 holds the rest and the labels."""
ITERATIONS = 300
LEARNING_RATE = 0.5
TEST_SIZE = 0.25
SEED = 0


def load_data(seed: int = SEED) -> dict[str, np.ndarray]:
    """The dataset split into train/test rows, and by columns between the parties."""
    x, y = load_breast_cancer(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(
        x.astype(np.float32), y.astype(np.float32), test_size=TEST_SIZE, random_state=seed,
        stratify=y)
    k = P0_FEATURES
    return {"x0_train": x_train[:, :k], "x0_test": x_test[:, :k],
            "x1_train": x_train[:, k:], "x1_test": x_test[:, k:],
            "y_train": y_train, "y_test": y_test}


def standardize(train: jnp.ndarray, test: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
    """Scale columns to zero mean and unit variance using the training rows' statistics."""
    mean, std = jnp.mean(train, axis=0), jnp.std(train, axis=0)
    return (train - mean) / std, (test - mean) / std


def train(x0: jnp.ndarray, x1: jnp.ndarray, y: jnp.ndarray,
          iterations: int = ITERATIONS, learning_rate: float = LEARNING_RATE,
          ) -> tuple[jnp.ndarray, jnp.ndarray, jnp.ndarray]:
    """Full-batch gradient descent on the logistic loss, from zero weights.

    Returns (weights of x0's columns, weights of x1's columns, bias).
    """
    x = jnp.concatenate([x0, x1], axis=1)
    n, d = x.shape
    step_size = learning_rate / n

    def step(_: Any, params: tuple[jnp.ndarray, jnp.ndarray]) -> Any:
        w, b = params
        error = jax.nn.sigmoid(x @ w + b) - y      # gradient of the loss w.r.t. the logits
        return w - step_size * (x.T @ error), b - step_size * jnp.sum(error)

    w, b = jax.lax.fori_loop(0, iterations, step, (jnp.zeros(d, x.dtype), jnp.zeros((), x.dtype)))
    return w[: x0.shape[1]], w[x0.shape[1]:], b


FEATURES_FILE = "features.npz"
"""Each data holder's columns (members ``train`` and ``test``), in its own data root."""
LABELS_FILE = "labels.npz"
"""Party 1's labels (members ``train`` and ``test``), in its own data root."""


def save_party_data(roots: dict[str, Path], data: dict[str, np.ndarray]) -> None:
    """What each party does on its own machine: keep its columns (and labels) in its data
    root (``roots`` maps node_0 and node_1 to their data roots)."""
    for rank in (0, 1):
        root = roots[f"node_{rank}"]
        root.mkdir(parents=True, exist_ok=True)
        np.savez(root / FEATURES_FILE, train=data[f"x{rank}_train"], test=data[f"x{rank}_test"])
    np.savez(roots["node_1"] / LABELS_FILE, train=data["y_train"], test=data["y_test"])


def load_on(device: str, file: str, member: str) -> Any:
    """Member ``member`` of ``file``, read by ``device``'s party from its data root."""
    return mp.device(device)(lambda: tensor.load(file, member))()


@mp.function
def vertical_logistic_regression(iterations: int = ITERATIONS) -> dict[str, Any]:
    """The whole protocol: P0 loads its training columns, P1 its columns and the labels;
    each gets its own part of the model."""
    def scaled(device: str) -> Any:
        columns = load_on(device, FEATURES_FILE, "train")
        return mp.device(device)(lambda x: standardize(x, x)[0])(columns)

    y_train = load_on("P1", LABELS_FILE, "train")
    w0, w1, b = mp.device("SP0")(train)(scaled("P0"), scaled("P1"), y_train, iterations)
    return {"w0": mp.put("P0", w0), "w1": mp.put("P1", w1), "b": mp.put("P1", b)}



def accuracy(data: dict[str, np.ndarray], w0: np.ndarray, w1: np.ndarray, b: float) -> float:
    """The test accuracy of a model (in this demo the one process holds the test rows;
    each organisation would score its own rows)."""
    x0_test = standardize(data["x0_train"], data["x0_test"])[1]
    x1_test = standardize(data["x1_train"], data["x1_test"])[1]
    scores = x0_test @ w0 + x1_test @ w1 + b
    return float(np.mean(np.asarray(scores > 0) == (data["y_test"] > 0.5)))


def plaintext_baseline(data: dict[str, np.ndarray]) -> dict[str, Any]:
    """The same model trained in the clear (one party holding everything), with JAX."""
    x0_train, x0_test = standardize(data["x0_train"], data["x0_test"])
    x1_train, x1_test = standardize(data["x1_train"], data["x1_test"])
    w0, w1, b = jax.jit(train)(x0_train, x1_train, data["y_train"])
    scores = x0_test @ w0 + x1_test @ w1 + b
    predicted = np.asarray(scores > 0)
    return {"w0": np.asarray(w0), "w1": np.asarray(w1), "b": float(b), "predicted": predicted,
            "accuracy": float(np.mean(predicted == (data["y_test"] > 0.5)))}


def main(seed: int = SEED, parties: int = 3) -> dict[str, Any]:
    """Train on the SPU and in plaintext; returns both models and their test accuracies.

    ``parties`` 3: P0, P1, a helper P2 and the ABY3 SPU "SP0" of ``ClusterSpec.simple(3)``;
    2: P0, P1 and the CHEETAH SPU "SP0" of ``ClusterSpec.simple(2)`` (slow: see above).
    """
    data = load_data(seed)
    start = time.perf_counter()
    cluster = mp.ClusterSpec.simple(parties)
    with tempfile.TemporaryDirectory(prefix="logistic-regression-") as folder:
        roots = {node.name: Path(folder) / node.name for node in cluster.nodes}
        save_party_data(roots, data)  # on each party's own machine
        sim = mp.Simulator(cluster, data_roots=roots, policies="open")  # see "Policies" above
        try:
            out = mp.evaluate(sim, vertical_logistic_regression)
            spu = {"w0": mp.fetch(sim, out["w0"]), "w1": mp.fetch(sim, out["w1"]),
                   "b": float(mp.fetch(sim, out["b"])),
                   "devices": {k: mp.get_dev_attr(v) for k, v in out.items()}}
            spu["accuracy"] = accuracy(data, spu["w0"], spu["w1"], spu["b"])
        finally:
            sim.close()
    spu_seconds = time.perf_counter() - start
    return {"spu": spu, "plaintext": plaintext_baseline(data), "spu_seconds": spu_seconds,
            "iterations": ITERATIONS, "learning_rate": LEARNING_RATE, "parties": parties,
            "protocol": cluster.device("SP0").config["protocol"],
            "n_train": len(data["y_train"]), "n_test": len(data["y_test"])}


if __name__ == "__main__":
    result = main()
    spu, plain = result["spu"], result["plaintext"]
    gap = np.max(np.abs(np.concatenate([spu["w0"], spu["w1"]])
                        - np.concatenate([plain["w0"], plain["w1"]])))
    print(f"{result['n_train']} training rows, {result['n_test']} test rows, "
          f"{result['iterations']} iterations, learning rate {result['learning_rate']}")
    print(f"SPU (secret-shared) test accuracy: {spu['accuracy']:.4f}  ({result['protocol']} "
          f"among {result['parties']} parties ran in {result['spu_seconds']:.1f} s)")
    print(f"plaintext           test accuracy: {plain['accuracy']:.4f}")
    print(f"largest weight difference SPU vs plaintext: {gap:.4f}")
