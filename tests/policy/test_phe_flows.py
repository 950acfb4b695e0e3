"""PHE under the policies `mplang init` writes, in the simulator: a ciphertext of a
party's data reveals nothing where it travels, its decryption is judged like any
release, and what the evaluator computed decides the verdict (node_1 owns the data;
node_0 makes the key and decrypts; node_2 evaluates)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import phe, simp, tensor
from mplang.cluster.local import write_dev_policies
from mplang.policy.labels import raw

pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")

SPEND = np.random.default_rng(11).integers(10, 500, size=30).astype(np.int32)
"""node_1's data: 30 rows."""
FEATURES = np.random.default_rng(12).integers(0, 9, size=(30, 2)).astype(np.int32)
"""node_2's data: two features of the same 30 rows."""
ONE_HOT = np.eye(30, dtype=np.int32)[4]
DECRYPT_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                    if line.endswith("# decrypt"))


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mp.Simulator]:
    out = tmp_path_factory.mktemp("cluster")
    write_dev_policies(mp.ClusterSpec.simple(3), out)
    roots = {f"node_{i}": tmp_path_factory.mktemp(f"node_{i}") for i in range(3)}
    np.save(roots["node_1"] / "spend.npy", SPEND)
    np.save(roots["node_2"] / "features.npy", FEATURES)
    with mp.Simulator(3, data_roots={n: str(r) for n, r in roots.items()},
                      policies={n: str(out / "policies" / f"{n}.yaml") for n in roots}) as s:
        yield s


def at_node_2(evaluate: Callable[..., Any], *extra: Any) -> Callable[[], Any]:
    """A program: node_1's spend encrypted under node_0's key, ``evaluate``d by node_2
    (with ``extra`` node_2 values), decrypted by node_0."""
    def program() -> Any:
        pk, sk = simp.pcall((0,), lambda: phe.keygen(key_bits=1024))
        spend = simp.pcall((1,), lambda: tensor.load("spend.npy"))
        c = simp.pcall((1,), phe.encrypt, spend, simp.shuffle_static(pk, {1: 0}))
        args = [simp.shuffle_static(c, {2: 1}), *(e() for e in extra)]
        out = simp.pcall((2,), evaluate, *args)
        return simp.pcall((0,), phe.decrypt, simp.shuffle_static(out, {0: 2}), sk)  # decrypt

    return program


def features() -> Any:
    return simp.pcall((2,), lambda: tensor.load("features.npy"))


def test_a_sum_over_the_rows_is_decrypted(sim: mp.Simulator) -> None:
    out = mp.fetch(sim, mp.evaluate(sim, at_node_2(lambda c: phe.sum(c * 3 + 1))))
    assert int(out[0]) == int((SPEND * 3 + 1).sum())


def test_a_product_with_another_owner_s_rows_is_decrypted(sim: mp.Simulator) -> None:
    """The vertical-LR gradient: encrypted values times another party's features."""
    out = mp.fetch(sim, mp.evaluate(sim, at_node_2(lambda c, x: phe.dot(c, x), features)))
    np.testing.assert_array_equal(out[0], SPEND @ FEATURES)


def refusal(sim: mp.Simulator, program: Callable[[], Any], **kwargs: Any) -> str:
    with pytest.raises(mp.MPRefusedError) as caught:
        mp.evaluate(sim, program, **kwargs)
    message = str(caught.value)
    assert message.startswith("node_1 refuses the program: "), message
    for value in SPEND:
        assert f" {value}," not in message
    return message


ROWWISE, RAW = "row-wise (raw) values of spend.npy", "raw of spend.npy"


@pytest.mark.parametrize("evaluate, what", [
    (lambda c: c, ROWWISE),  # every row
    (lambda c: c + 7, ROWWISE),
    (lambda c: phe.dot(c, ONE_HOT), RAW),  # one row, by weights the driver chose
    (lambda c: phe.sum(c * ONE_HOT), RAW),
])
def test_the_rows_are_refused_at_decryption(sim: mp.Simulator, evaluate: Callable[..., Any],
                                            what: str) -> None:
    message = refusal(sim, at_node_2(evaluate))
    assert message.startswith(f"node_1 refuses the program: op phe.decrypt at "
                              f"test_phe_flows.py:{DECRYPT_LINE} sends the plaintext it "
                              f"decrypts, {what}, to node_0; "), message


def test_histograms_of_another_party_s_bins_are_data_dependent(sim: mp.Simulator) -> None:
    """Sums per bin of node_2's features: a bin may hold one of node_1's rows."""
    def hist(c: Any, x: Any) -> Any:
        return phe.bucket_sum(c, x, n_bins=9)

    message = refusal(sim, at_node_2(hist, features))
    assert "aggregate over a data-dependent number of rows of spend.npy, to node_0" \
        in message, message


def test_standard_mode_judges_a_ciphertext_as_its_plaintext(sim: mp.Simulator) -> None:
    """Run op by op, node_1 does not see where its ciphertext is decrypted: sending it is
    judged as sending the data."""
    message = refusal(sim, at_node_2(lambda c: phe.sum(c)), mode="standard")
    assert "the value party 1 sends, row-wise (raw) values of spend.npy" in message, message


def test_a_product_with_the_party_s_own_aligned_rows_is_an_aggregate() -> None:
    """``phe.dot(c, x)`` over p's rows: with p's own row-wise ``x`` whose contracted axis
    holds the same rows (here of two files of equal length), an aggregate; rows that do
    not line up (``x``'s rows on its other axis) are raw."""
    from mplang.policy.labels import Rows, combine, source
    from mplang.policy.phe_flows import _contracted

    x0, y = source("x0.npy", 64), source("y.npy", 64)
    d = combine(x0, y)
    assert d is not None and d.window == Rows(frozenset(["x0.npy", "y.npy"]), 0, 64)
    got = _contracted(d, x0, 0, 2)
    assert got is not None and (got.form, got.rows) == ("aggregate", 64)
    assert _contracted(d, replace(x0, axis=1), 0, 2) == raw([d, x0])
    assert _contracted(d, source("x1.npy", 32), 0, 2) == raw([d, source("x1.npy", 32)])
