"""SecureBoost (mplang.libs.secureboost) next to scikit-learn's HistGradientBoostingClassifier.

``make_classification(n + n // 4, n_features=20, random_state=0)``: the first
``n`` rows train, the other ``n // 4`` test. Features 0-9 and the labels are the
active party's (P0), features 10-19 the passive party's (P1); each party reads
its own columns from its own data root. 32 quantile bins, OU 2048-bit keys by
default. Cases: (a) n = 10^4, 1 tree of depth 3; (b) n = 10^5, 5 trees of depth
5. The reference is ``HistGradientBoostingClassifier(max_iter=trees,
max_depth=depth, max_bins=32, learning_rate=..., max_leaf_nodes=None,
early_stopping=False)`` on all 20 columns, in the same run.

Seconds: ``SecureBoost.fit`` (one MPLang program: binning, key generation, every
tree; the first fit of the process, and with ``--runs N`` the best of the next ones)
and ``predict`` on the test rows, on the in-memory simulator (one process,
a thread per party) or, with ``--http``, on two worker processes over mutual TLS.

With ``--device SP0`` the trees grow on the SPU (CHEETAH between the two parties)
under the policies ``mplang init`` writes, which refuse predicting (row-level); the
accuracies then apply the trees the parties received, fetched, to the rows in the
clear here, and ``predict`` is not measured. That mode uses 16 bins (the reference
too) and the default ``min_samples_leaf`` of 20.

    .venv/bin/python benchmarks/bench_secureboost.py [--case a|b|all] [--http] [--runs N]
        [--device SP0]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from bench_http import free_ports
from sklearn.datasets import make_classification
from sklearn.ensemble import HistGradientBoostingClassifier

import mplang as mp
from mplang.cluster.local import LocalCluster, write_dev_policies
from mplang.libs import secureboost
from mplang.libs.secureboost import SecureBoost

CASES = {"a": (10_000, 1, 3), "b": (100_000, 5, 5)}
"""name: (training rows, trees, depth)."""


def write_data(root: Path, n: int) -> dict[str, np.ndarray]:
    """Each party's files in its data root; returns the plaintext data for the reference."""
    x, y = make_classification(n_samples=n + n // 4, n_features=20, random_state=0)
    x = x.astype(np.float32)
    parts = {"node_0": {"x": x[:, :10], "y": y.astype(np.float32)}, "node_1": {"x": x[:, 10:]}}
    for node, arrays in parts.items():
        (root / node).mkdir(parents=True, exist_ok=True)
        np.savez(root / node / "train.npz", **{k: v[:n] for k, v in arrays.items()})
        np.savez(root / node / "test.npz", **{k: v[n:] for k, v in arrays.items()})
    return {"x_train": x[:n], "y_train": y[:n], "x_test": x[n:], "y_test": y[n:]}


def allow_secureboost_flows(local: LocalCluster) -> None:
    """SecureBoost's reveals (histograms, routing bits, the passive party's comparison bits
    at prediction, the probabilities fetched by the driver) in each node's policy: each may
    send what it derives from its data to the other and to the driver."""
    for path in (local.spec_path.parent / "policies").glob("node_*.yaml"):
        others = sorted({"node_0", "node_1", "driver"} - {path.stem})
        text = path.read_text()
        path.write_text(text.replace("plaintext_to: []", f"plaintext_to: [{', '.join(others)}]"))


def predicted(ctx: Any, model: SecureBoost, x: np.ndarray) -> np.ndarray:
    """The classes the trees the parties received give ``x``, applied here in the clear."""
    assert model.model is not None
    parts = {k: np.asarray(mp.fetch(ctx, v)) for k, v in model.model.items()}
    right0 = secureboost._decisions(x[:, :10], parts["feature0"], parts["threshold0"])
    right1 = secureboost._decisions(x[:, 10:], parts["feature1"], parts["threshold1"])
    depth = parts["leaf"].shape[1].bit_length() - 1
    proba = secureboost._probabilities(right0, right1, parts["leaf"], parts["base"], depth)
    return (np.asarray(proba) >= 0.5).astype(np.int64)


def run_case(ctx: Any, data: dict[str, np.ndarray], trees: int, depth: int, rate: float,
             scheme: str, key_bits: int, runs: int, device: str | None) -> dict[str, float]:
    bins = 32 if device is None else 16
    model = SecureBoost(trees, depth, n_bins=bins, learning_rate=rate, scheme=scheme,
                        key_bits=key_bits, device=device)
    fits = []
    for _ in range(runs):
        start = time.perf_counter()
        model.fit(ctx, ("train.npz", "x"), ("train.npz", "x"), ("train.npz", "y"))
        fits.append(time.perf_counter() - start)
    start = time.perf_counter()
    if device is None:
        test = model.predict(ctx, ("test.npz", "x"), ("test.npz", "x"))
        predict = time.perf_counter() - start
        train = model.predict(ctx, ("train.npz", "x"), ("train.npz", "x"))
    else:
        test, predict = predicted(ctx, model, data["x_test"]), float("nan")
        train = predicted(ctx, model, data["x_train"])
    start = time.perf_counter()
    ref = HistGradientBoostingClassifier(max_iter=trees, max_depth=depth, max_bins=bins,
                                         learning_rate=rate, max_leaf_nodes=None,
                                         min_samples_leaf=20, early_stopping=False
                                         ).fit(data["x_train"],
                                                                   data["y_train"])
    ref_fit = time.perf_counter() - start
    return {"fit": fits[0], "warm": min(fits[1:], default=float("nan")), "predict": predict,
            "ref_fit": ref_fit,
            "train_acc": float(np.mean(train == data["y_train"])),
            "test_acc": float(np.mean(test == data["y_test"])),
            "ref_train_acc": ref.score(data["x_train"], data["y_train"]),
            "ref_test_acc": ref.score(data["x_test"], data["y_test"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--case", choices=[*CASES, "all"], default="all")
    parser.add_argument("--http", action="store_true",
                        help="two worker processes over mutual TLS instead of the simulator")
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--scheme", default="ou")
    parser.add_argument("--key-bits", type=int, default=2048)
    parser.add_argument("--device", default=None,
                        help="grow the trees on this SPU under the init policies")
    parser.add_argument("--runs", type=int, default=1,
                        help="fits per case in one process: the first, and the best of the "
                             "others (warm: JAX modules compiled, workers started)")
    args = parser.parse_args()
    cases = list(CASES) if args.case == "all" else [args.case]
    print(f"{'case':<5} {'rows':>7} {'trees':>5} {'depth':>5} {'fit s':>8} {'warm s':>8} "
          f"{'predict s':>9} "
          f"{'sklearn s':>9} {'train acc':>9} {'sklearn':>8} {'test acc':>8} {'sklearn':>8}")
    for name in cases:
        n, trees, depth = CASES[name]
        with tempfile.TemporaryDirectory(prefix="bench-secureboost-") as tmp:
            root = Path(tmp)
            data = write_data(root, n)
            if args.http:
                cluster = mp.ClusterSpec.simple(2)
                spec = cluster.to_dict()
                for node, port in zip(spec["nodes"], free_ports(2), strict=True):
                    node["endpoint"] = f"127.0.0.1:{port}"
                local = LocalCluster(mp.ClusterSpec.from_dict(spec), data_root=root)
                if args.device is None:
                    allow_secureboost_flows(local)
                local.start()
                ctx: Any = local.driver()
            else:
                nodes = ("node_0", "node_1")
                policies = None
                if args.device is not None:
                    write_dev_policies(mp.ClusterSpec.simple(2), root)
                    policies = {n: str(root / "policies" / f"{n}.yaml") for n in nodes}
                ctx = mp.Simulator(2, data_roots={n: root / n for n in nodes},
                                   policies=policies)
            try:
                r = run_case(ctx, data, trees, depth, args.learning_rate, args.scheme,
                             args.key_bits, args.runs, args.device)
            finally:
                ctx.close()
                if args.http:
                    local.close()
        print(f"{name:<5} {n:>7} {trees:>5} {depth:>5} {r['fit']:8.2f} {r['warm']:8.2f} "
              f"{r['predict']:9.2f} "
              f"{r['ref_fit']:9.2f} {r['train_acc']:9.4f} {r['ref_train_acc']:8.4f} "
              f"{r['test_acc']:8.4f} {r['ref_test_acc']:8.4f}", flush=True)


if __name__ == "__main__":
    main()
