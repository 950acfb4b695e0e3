"""Every program in ``examples/`` runs, and its results match plain Python/numpy.

Each example is imported from its file and its ``main()`` (or a helper it
exposes) is run; the results are checked against references computed here:
exactly for integers and booleans, with tolerances for the SPU's fixed point.
"""

from __future__ import annotations

import importlib.util
import runpy
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
EXAMPLE_FILES = tuple(sorted(p.stem for p in EXAMPLES.glob("*.py")
                            if 'if __name__ == "__main__":' in p.read_text()))
"""Every example that runs as a script; the others run with ``mplang run`` (`RUN_SCRIPTS`)."""
RUN_SCRIPTS = ("run_me",)
"""Examples that define ``main(ctx)`` for ``mplang run`` (tests/cli/test_cli_run.py runs them)."""


def test_every_example_runs_as_a_script_or_with_mplang_run() -> None:
    assert len(EXAMPLE_FILES) >= 9, EXAMPLE_FILES
    others = sorted(p.stem for p in EXAMPLES.glob("*.py") if p.stem not in EXAMPLE_FILES)
    assert others == sorted(RUN_SCRIPTS), others


def load(name: str) -> ModuleType:
    """Import ``examples/<name>.py`` as a module (examples are not a package)."""
    module_name = f"mplang_example_{name}"
    if module_name in sys.modules:
        return sys.modules[module_name]
    spec = importlib.util.spec_from_file_location(module_name, EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


# ---------------------------------------------------------------- millionaire


def test_millionaire_main() -> None:
    results = load("millionaire").main()
    assert {(r["parties"], r["protocol"]) for r in results} == {(2, "CHEETAH"), (3, "ABY3")}
    for r in results:
        assert r["alice_is_poorer"] is (r["alice"] < r["bob"]), r
        assert r["device"] == "P0"
        assert r["holders"] == (0,)  # revealed to party 0 only


@pytest.mark.parametrize("world_size", [2, 3])
def test_millionaire_random_wealths(world_size: int) -> None:
    rng = np.random.default_rng(world_size)
    pairs = [(int(a), int(b)) for a, b in rng.integers(-(2**31), 2**31 - 1, size=(6, 2))]
    pairs += [(5, 5), (-1, 0), (2**31 - 1, -(2**31))]
    results = load("millionaire").run(world_size, pairs)
    assert [r["alice_is_poorer"] for r in results] == [a < b for a, b in pairs]


# ---------------------------------------------------------------- mean and variance


@pytest.mark.parametrize(("field", "rtol"), [("FM64", 1e-3), ("FM128", 2e-5)])
@pytest.mark.parametrize("seed", [0, 1])
def test_secure_mean_variance(field: str, rtol: float, seed: int) -> None:
    example = load("secure_mean_variance")
    result = example.main(seed=seed, field=field)
    data = result["data"]
    assert [len(v) for v in data] == list(example.SIZES)
    assert len(set(example.SIZES)) > 1  # the parties hold vectors of different lengths
    expected = example.make_data(seed)
    for got, want in zip(data, expected, strict=True):
        np.testing.assert_array_equal(got, want)
    values = np.concatenate(expected).astype(np.float64)
    assert result["device"] == "P0"
    assert result["mean"] == pytest.approx(values.mean(), rel=rtol)
    assert result["variance"] == pytest.approx(values.var(), rel=rtol)


# ---------------------------------------------------------------- logistic regression


def numpy_logistic_regression(data: dict[str, np.ndarray], iterations: int,
                              learning_rate: float) -> tuple[np.ndarray, float]:
    """Reference: float64 numpy gradient descent, standardizing with training statistics."""
    x_train = np.hstack([data["x0_train"], data["x1_train"]]).astype(np.float64)
    x_test = np.hstack([data["x0_test"], data["x1_test"]]).astype(np.float64)
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    x_train, x_test = (x_train - mean) / std, (x_test - mean) / std
    y = data["y_train"].astype(np.float64)
    n, d = x_train.shape
    w, b = np.zeros(d), 0.0
    for _ in range(iterations):
        error = 1.0 / (1.0 + np.exp(-(x_train @ w + b))) - y
        w -= learning_rate / n * (x_train.T @ error)
        b -= learning_rate / n * error.sum()
    return np.append(w, b), x_test


@pytest.fixture(scope="module")
def logreg() -> dict[str, Any]:
    example = load("logistic_regression")
    result = example.main()
    data = example.load_data()
    params, x_test = numpy_logistic_regression(data, example.ITERATIONS, example.LEARNING_RATE)
    return {"example": example, "result": result, "data": data, "params": params,
            "x_test": x_test}


def test_logistic_regression_data_split(logreg: dict[str, Any]) -> None:
    data, example = logreg["data"], logreg["example"]
    assert data["x0_train"].shape[1] == example.P0_FEATURES
    assert data["x0_train"].shape[1] + data["x1_train"].shape[1] == 30
    assert len(data["y_train"]) + len(data["y_test"]) == 569
    devices = logreg["result"]["spu"]["devices"]
    assert devices == {"w0": "P0", "w1": "P1", "b": "P1"}
    # the helper party 2 makes ABY3 possible; it holds no data and receives no result
    assert (logreg["result"]["parties"], logreg["result"]["protocol"]) == (3, "ABY3")


def test_logistic_regression_plaintext_matches_numpy(logreg: dict[str, Any]) -> None:
    plain = logreg["result"]["plaintext"]
    got = np.concatenate([plain["w0"], plain["w1"], [plain["b"]]])
    np.testing.assert_allclose(got, logreg["params"], atol=1e-3)
    y_test = logreg["data"]["y_test"] > 0.5
    reference_accuracy = np.mean((logreg["x_test"] @ logreg["params"][:-1]
                                  + logreg["params"][-1] > 0) == y_test)
    assert plain["accuracy"] == pytest.approx(reference_accuracy, abs=1 / len(y_test) + 1e-9)
    assert plain["accuracy"] > 0.9


def test_logistic_regression_spu_close_to_plaintext(logreg: dict[str, Any]) -> None:
    spu, plain = logreg["result"]["spu"], logreg["result"]["plaintext"]
    # same model up to fixed-point error
    got = np.concatenate([spu["w0"], spu["w1"], [spu["b"]]])
    np.testing.assert_allclose(got, logreg["params"], atol=0.05)
    assert abs(spu["accuracy"] - plain["accuracy"]) <= 0.02
    # the accuracy revealed to P1 is that of the revealed model's predictions, up to the
    # rows whose score is too close to 0 for fixed point to tell its sign
    y_test = logreg["data"]["y_test"] > 0.5
    scores = logreg["x_test"] @ got[:-1] + got[-1]
    unclear = np.sum(np.abs(scores) <= 0.05)
    assert abs(spu["accuracy"] - np.mean((scores > 0) == y_test)) <= (unclear + 1e-9) / len(
        y_test)


# ---------------------------------------------------------------- PSI


@pytest.mark.parametrize(("seed", "sizes", "common", "protocol"),
                         [(0, (200, 150), 37, "rr22"), (1, (30, 80), 24, "kkrt"),
                          (2, (40, 40), 40, "ecdh")])
def test_psi(seed: int, sizes: tuple[int, int], common: int, protocol: str) -> None:
    example = load("psi")
    result = example.main(seed, sizes, common, protocol=protocol)
    customers, accounts = result["customers"], result["accounts"]
    assert (customers.num_rows, accounts.num_rows) == sizes
    merged = customers.to_pandas().merge(accounts.to_pandas(), on="id")
    assert len(merged) == common
    assert result["size_at_p0"] == result["size_at_p1"] == common
    assert result["device"] == "P0"
    assert result["by_band"].shape == (len(example.BANDS), 2)
    np.testing.assert_allclose(result["by_band"], psi_by_band(merged), rtol=1e-3, atol=1e-2)


def psi_by_band(merged: Any) -> np.ndarray:
    """The shared customers' mean age and balance under 50 and over, in pandas; a band of
    fewer than 10 customers is 0 (suppressed)."""
    out = np.zeros((2, 2))
    for band, rows in merged.groupby(merged["age"] >= 50):
        if len(rows) >= 10:
            out[int(band)] = [rows["age"].mean(), rows["balance"].mean()]
    return out


# ---------------------------------------------------------------- PHE and TEE


def test_phe_secure_aggregation() -> None:
    pytest.importorskip("heu")
    result = load("phe_secure_aggregation").main(key_bits=1024, rows=(12, 30, 20))
    assert [len(s) for s in result["sales"]] == [12, 30, 20]
    want = np.concatenate(result["sales"]).astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(result["sum"], want, rtol=1e-6)


def test_phe_vertical_lr_gradient_matches_numpy() -> None:
    pytest.importorskip("heu")
    result = load("phe_vertical_lr").main(key_bits=1024)
    g0, g1 = result["reference"]
    np.testing.assert_allclose(result["g0"], g0, atol=1e-5)
    np.testing.assert_allclose(result["g1"], g1, atol=1e-4)  # float32 around the ±100 mask


def test_tee_two_party() -> None:
    result = load("tee_two_party").main()
    assert len(result["alice"]) == len(result["bob"]) >= 10  # an aggregate over 10 rows
    total = float(result["alice"].sum() + result["bob"].sum())
    assert result["total"] == (total, total)
    np.testing.assert_array_equal(result["more"], result["alice"] > result["bob"])


def test_secure_mean_on_three_devices() -> None:
    pytest.importorskip("heu")
    rows = load("secure_mean_devices").main(n=200, key_bits=1024)
    rng = np.random.default_rng(11)
    want = float(np.concatenate([rng.normal(loc=i, size=200).astype(np.float32)
                                 for i in range(3)]).astype(np.float64).mean())
    assert [(r["device"], r["kind"]) for r in rows] == [("SP0", "SPU"), ("HE0", "PHE"),
                                                        ("T0", "TEE")]
    for row in rows:
        assert row["mean"] == pytest.approx(want, abs=2e-3 if row["kind"] == "SPU" else 1e-5)
        assert row["seconds"] > 0 and row["model"]
    assert "MOCK" in rows[2]["model"] and "must not collude" in rows[1]["model"]


# ---------------------------------------------------------------- the users' flow


def test_joint_customers_matches_pandas_and_sklearn() -> None:
    from sklearn.linear_model import LogisticRegression

    result = load("joint_customers").main(n=300, shared=200)
    merged = result["bank"].merge(result["shop"], on="id")
    assert result["rows"] == len(merged) == 200
    want = merged.groupby("defaulted")["spend"].mean()
    np.testing.assert_allclose(result["means"], [want[0], want[1]], atol=2e-3)
    shop = merged[["spend", "visits"]].to_numpy()
    x = np.hstack([merged[["income", "debt"]].to_numpy(),
                   (shop - shop.mean(0)) / (shop.std(0) + 1e-6)])
    y = merged["defaulted"].to_numpy()
    reference = LogisticRegression().fit(x, y).score(x, y)
    assert result["accuracy"] >= reference - 0.05, (result["accuracy"], reference)
    w0, w1 = result["weights"]
    assert w0.shape == (3,) and w1.shape == (2,)  # the bank's part carries the intercept


# ---------------------------------------------------------------- as scripts


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_example_runs_as_script(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / f"{name}.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.strip()
    if name == "psi":
        assert "intersection size (learned by P0 and P1): 37" in out
        for band in load("psi").BANDS:
            assert f"shared customers {band}: average age " in out
