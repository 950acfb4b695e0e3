"""PHE under the policies `mplang init` writes, in the simulator: a ciphertext of a
party's data reveals nothing where it travels, its decryption is judged like any
release, and what the evaluator computed decides the verdict (node_1 owns the data;
node_0 makes the key and decrypts; node_2 evaluates). An aggregate of node_1's rows
weights each row by a 0/1 selection only: another owner's real values, or weights
laundered through an aggregate, make the decryption raw, and a reviewed program that
needs them runs once node_1 approves its digest."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import phe, simp, tensor
from mplang.cluster.commitments import program_digest
from mplang.cluster.local import write_dev_policies
from mplang.flows.labels import Flow, Label, aggregated, raw, source
from mplang.flows.phe_flows import _contracted, _elementwise, bucket_sum_flow
from tests.examples.test_examples import load

pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")

SPEND = np.random.default_rng(11).integers(10, 500, size=30).astype(np.int32)
"""node_1's data: 30 rows."""
FEATURES = np.random.default_rng(12).integers(0, 9, size=(30, 2)).astype(np.int32)
"""node_2's data: two features of the same 30 rows."""
ONE_HOT = np.eye(30, dtype=np.int32)[4]
DECRYPT_LINE = next(i for i, line in enumerate(Path(__file__).read_text().splitlines(), 1)
                    if line.endswith("# decrypt"))


def simulator(base: Path, approve: str = "", nodes: tuple[int, ...] = (1, 2)) -> mp.Simulator:
    """node_1's and node_2's data under ``base``, every node with the init policy, those of
    ``nodes`` approving the program of digest ``approve`` if given."""
    paths = write_dev_policies(mp.ClusterSpec.simple(3), base)
    for i in nodes if approve else ():
        paths[i].write_text(paths[i].read_text().replace(
            "approve: []", f"approve:\n  - program: {approve}\n"))
    roots = {f"node_{i}": base / f"node_{i}" for i in range(3)}
    for root in roots.values():
        root.mkdir()
    np.save(roots["node_1"] / "spend.npy", SPEND)
    np.save(roots["node_2"] / "features.npy", FEATURES)
    return mp.Simulator(3, data_roots={n: str(r) for n, r in roots.items()},
                        policies={n: str(path) for n, path in zip(roots, paths, strict=True)})


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mp.Simulator]:
    with simulator(tmp_path_factory.mktemp("cluster")) as s:
        yield s


def at_node_2(evaluate: Callable[..., Any], *extra: Any,
              own: Callable[[Any], Any] = lambda x: x) -> Callable[[], Any]:
    """A program: node_1's spend (``own``: what node_1 makes of it) encrypted under node_0's
    key, ``evaluate``d by node_2 (with ``extra`` values), decrypted by node_0."""
    def program() -> Any:
        pk, sk = simp.pcall((0,), lambda: phe.keygen(key_bits=1024))
        spend = simp.pcall((1,), lambda: own(tensor.load("spend.npy")))
        c = simp.pcall((1,), phe.encrypt, spend, simp.shuffle_static(pk, {1: 0}))
        args = [simp.shuffle_static(c, {2: 1}), *(e() for e in extra)]
        out = simp.pcall((2,), evaluate, *args)
        return simp.pcall((0,), phe.decrypt, simp.shuffle_static(out, {0: 2}), sk)  # decrypt

    return program


def features() -> Any:
    return simp.pcall((2,), lambda: tensor.load("features.npy"))


def on(rank: int, file: str, fn: Callable[[Any], Any]) -> Callable[[], Any]:
    """``fn`` of party ``rank``'s ``file``, computed there and sent to node_2."""
    def value() -> Any:
        v = simp.pcall((rank,), lambda: tensor.run_jax(fn, tensor.load(file)))
        return v if rank == 2 else simp.shuffle_static(v, {2: rank})

    return value


FEATURE_0 = on(2, "features.npy", lambda x: x[:, 0])
"""node_2's real values, one per row of node_1's."""


def test_a_sum_over_the_rows_is_decrypted(sim: mp.Simulator) -> None:
    out = mp.fetch(sim, mp.evaluate(sim, at_node_2(lambda c: phe.sum(c * 3 + 1))))
    assert int(out[0]) == int((SPEND * 3 + 1).sum())


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


def test_a_product_with_another_owner_s_rows_runs_once_approved(sim: mp.Simulator,
                                                                tmp_path: Path) -> None:
    """The vertical-LR gradient, spend times node_2's features: each owner's real values
    weight the other's rows unequally, so it is no aggregate; node_1 refuses it, naming
    the entry that approves this program (`mplang check`'s digest), and so does node_2
    until it approves the program too."""
    program = at_node_2(lambda c, x: phe.dot(c, x), features)
    digest = program_digest(mp.compile(program, world_size=3).graph, 3)
    message = refusal(sim, program)
    assert message.startswith(f"node_1 refuses the program: op phe.decrypt at test_phe_flows"
                              f".py:{DECRYPT_LINE} sends the plaintext it decrypts, {RAW}, to "
                              f"node_0; approve this program alone with approve: - {{program: "
                              f"{digest}}} "), message
    with simulator(tmp_path / "one", digest, nodes=(1,)) as one, \
            pytest.raises(mp.MPRefusedError, match=r"^node_2 refuses the program: op phe\.decrypt"
                          r" .* raw of features\.npy, to node_0; approve this program alone "):
        mp.evaluate(one, program)
    with simulator(tmp_path / "both", digest) as approving:
        out = mp.fetch(approving, mp.evaluate(approving, program))
    np.testing.assert_array_equal(out[0], SPEND @ FEATURES)


LAUNDERED = {n: on(n, f, lambda x: jnp.asarray(ONE_HOT) * (jnp.sum(x) * 0 + 1))
             for n, f in ((1, "spend.npy"), (2, "features.npy"))}
"""The driver's one-hot, laundered through node_1's own or node_2's aggregate (30 rows)."""


def mask(spend: Any) -> Any:
    """node_1's own comparison result: which of its rows spend more than 100."""
    return tensor.run_jax(lambda x: (x > 100).astype(jnp.int32), spend)


GATED = "aggregate over a data-dependent number of rows of spend.npy"


@pytest.mark.parametrize("evaluate, weight, own, what", [
    (lambda c, w: phe.sum(c * w), LAUNDERED[1], None, RAW),  # row 4, by weights the driver
    (lambda c, w: phe.dot(c, w), LAUNDERED[1], None, RAW),  # chose
    (lambda c, w: phe.sum(c * w), LAUNDERED[2], None, RAW),
    (lambda c, w: phe.dot(c, w), LAUNDERED[2], None, RAW),
    (lambda c, w: phe.sum(c * w), FEATURE_0, None, RAW),  # another owner's real values
    (lambda c, w: phe.sum(c + w), FEATURE_0, None, RAW),
    (lambda c, w: phe.dot(c, w), FEATURE_0, None, RAW),
    (lambda c, w: phe.dot(c, w), on(2, "features.npy", lambda x: (x[:, 0] > 4).astype(
        jnp.int32)), None, GATED),  # another owner's selection of node_1's rows
    (lambda c, w: phe.sum(c * w), FEATURE_0, mask, RAW),  # node_1's mask weighted by node_2's
    (lambda c, w: phe.dot(c, w), features, mask, RAW),  # values: they would show the mask
])
def test_weights_other_than_a_selection_make_no_aggregate(
        sim: mp.Simulator, evaluate: Callable[..., Any], weight: Callable[[], Any],
        own: Callable[[Any], Any] | None, what: str) -> None:
    message = refusal(sim, at_node_2(evaluate, weight, own=own or (lambda x: x)))
    assert message.startswith(f"node_1 refuses the program: op phe.decrypt at "
                              f"test_phe_flows.py:{DECRYPT_LINE} sends the plaintext it "
                              f"decrypts, {what}, to node_0; "), message


X = source("x.npy", 64)
X_MASK, X_SUM = replace(X, mask=True), aggregated(X, whole=True)
REAL, SELECTION = Flow("foreign"), Flow("foreign", mask=True)


@pytest.mark.parametrize("rows, weight, want", [
    (X, X, "aggregate"), (X, SELECTION, "gated"), (X_MASK, REAL, "raw"),
    (X, REAL, "raw"), (X, None, "raw"), (X, X_SUM, "raw"), (X_MASK, None, "raw"),
    (X_MASK, X_SUM, "raw")])
def test_a_weighted_sum_of_the_rows_is_an_aggregate_by_definition(
        rows: Flow, weight: Label, want: str) -> None:
    """Σ_i w_i·x_i over p's rows x_i, by ``phe.dot`` either way round or by ``phe.sum`` of
    a product: an aggregate where w_i is p's own row-local value, gated where w is another
    owner's 0/1 selection, raw for any other weight that differs by row (another owner's
    real values, even on p's 0/1 selection, the driver's, p's aggregates)."""
    def kind(label: Label) -> str:
        assert label is not None
        return "gated" if label.gated else label.form

    products = [_elementwise(rows, weight, False, False), _elementwise(weight, rows, False, False)]
    sums = [aggregated(p) if p is not None and p.form == "rowwise" else p for p in products]
    assert [kind(s) for s in [*sums, _contracted(rows, weight, 0, 1),
                              _contracted(weight, rows, 0, 1)]] == [want] * 4


def test_a_party_s_bins_selecting_another_owner_s_values_are_raw() -> None:
    """SecureBoost's histograms of the passive party's bins over the active party's
    gradients weight the passive party's bins by the gradients (which would show the
    bins): raw; the active party's gradients selected by the other's bins are gated."""
    out, = bucket_sum_flow(None, None, [REAL, X], True)  # type: ignore[arg-type]
    assert out is not None and out.form == "raw"
    out, = bucket_sum_flow(None, None, [X, REAL], True)  # type: ignore[arg-type]
    assert out is not None and (out.form, out.gated, out.rows) == ("aggregate", True, None)


def test_the_secure_sum_example_passes_the_init_policies(tmp_path: Path) -> None:
    """Each shop's column totals, encrypted, added by the evaluator, decrypted by P0."""
    example = load("phe_secure_aggregation")
    cluster = example.cluster(1024)
    paths = write_dev_policies(cluster, tmp_path)
    roots = {node.name: tmp_path / node.name for node in cluster.nodes}
    example.save_sales(roots, example.make_sales())
    with mp.Simulator(cluster, data_roots=roots,
                      policies={n: str(p) for n, p in zip(roots, paths, strict=True)}) as s:
        total = mp.fetch(s, mp.evaluate(s, example.aggregate))
    want = np.concatenate(example.make_sales()).astype(np.float64).sum(axis=0)
    np.testing.assert_allclose(total, want, rtol=1e-6)


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
    from mplang.flows.labels import Rows, combine, source
    from mplang.flows.phe_flows import _contracted

    x0, y = source("x0.npy", 64), source("y.npy", 64)
    d = combine(x0, y)
    assert d is not None and d.window == Rows(frozenset(["x0.npy", "y.npy"]), 0, 64)
    got = _contracted(d, x0, 0, 2)
    assert got is not None and (got.form, got.rows) == ("aggregate", 64)
    assert _contracted(d, replace(x0, axis=1), 0, 2) == raw([d, x0])
    assert _contracted(d, source("x1.npy", 32), 0, 2) == raw([d, source("x1.npy", 32)])
