"""Sizes known only at run time: symbols in types (``f32[?n0,2]``), shared where the
program makes sizes equal, compiled per run's sizes locally (JAX) and on the SPU."""

from __future__ import annotations

import re
import warnings
from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, table, tensor
from mplang.dialects.table import to_tensor_p
from mplang.edsl.typing import TensorType
from mplang.libs import psi
from tests.simulators import simulated

CLUSTER = mp.ClusterSpec.simple(2)
IDS_A, IDS_B = np.arange(0, 40), np.arange(10, 60)
SHARED = np.arange(10, 40)


sim = simulated(CLUSTER, policies="open")  # sizes' mechanics: no policy judges


def _tables(ids_b: np.ndarray = IDS_B) -> tuple[Any, Any]:
    a = mp.device("P0")(lambda: table.constant({"id": IDS_A, "age": IDS_A * 1.0}))()
    b = mp.device("P1")(lambda: table.constant({"id": ids_b, "income": ids_b * 2.0}))()
    return a, b


def test_symbolic_dimensions_print_parse_and_serialize() -> None:
    t = TensorType("float32", ("n0", 2, "2*n0 + 1"))
    assert str(t) == "f32[?n0,2,?2*n0+1]"
    assert t.shape == ("n0", 2, "2*n0+1") and t.symbols == {"n0"} and not t.is_static
    with pytest.raises(mp.MPTypeError, match=r"^tensor shape must be non-negative ints or "
                                             r"symbols, got \('n;0',\)$"):
        TensorType("float32", ("n;0",))
    with pytest.raises(mp.MPTypeError, match=r"^spu\.x: f32\[\?n0,2,\?2\*n0\+1\] has a size "
                                             r"known only at run time"):
        t.static_shape("spu.x")

    @mp.function
    def prog() -> Any:
        return mp.device("P0")(lambda: table.to_tensor(
            table.sql("SELECT age FROM t WHERE age > 3", t=table.constant({"age": IDS_A})),
            ["age"]))()

    program = mp.compile(prog, cluster=CLUSTER)
    assert re.search(r"-> \(i32\[\?n\d+,1\]@\{0\}\)", program.to_text())
    for copy in (mp.Program.from_text(program.to_text()),
                 mp.Program.from_bytes(program.to_bytes())):
        assert copy.graph.outputs[0].type == program.graph.outputs[0].type


def test_one_table_keeps_one_row_symbol_and_jax_derives_sizes(sim: mp.Simulator) -> None:
    def body() -> Any:
        t = table.sql("SELECT id, age FROM t WHERE id >= 35", t=table.constant(
            {"id": IDS_A, "age": IDS_A * 1.0}))
        x, ids = table.to_tensor(t, ["age"]), table.to_tensor(t, ["id"])
        return tensor.run_jax(lambda a, b: (jnp.concatenate([a[:, 0], a[:, 0]]),
                                            a[:, 0] * b[:, 0], jnp.sum(a)), x, ids)

    traced = mp.compile(lambda: simp.pcall((0,), body), cluster=CLUSTER)
    types = [str(v.type) for v in traced.graph.outputs]
    assert types == ["f32[?2*n0]@{0}", "f32[?n0]@{0}", "f32[]@{0}"]
    doubled, product, total = mp.fetch(sim, mp.evaluate(sim, traced))
    kept = np.arange(35, 40, dtype=np.float32)
    np.testing.assert_array_equal(doubled[0], np.concatenate([kept, kept]))
    np.testing.assert_array_equal(product[0], kept * kept)
    assert total[0] == kept.sum()


def test_psi_join_sql_free_flow_into_the_spu_in_one_program(sim: mp.Simulator) -> None:
    """The users' flow: PSI join, tensors of both sides (one row symbol), statistics on
    the SPU, reveal; no ``rows=``, one program."""
    @mp.function
    def prog() -> Any:
        ja, jb = psi.join(*_tables(), "id")
        xa = mp.device("P0")(lambda t: table.to_tensor(t, ["age"]))(ja)
        xb = mp.device("P1")(lambda t: table.to_tensor(t, ["income"]))(jb)
        stats = mp.device("SP0")(lambda x, y: (jnp.mean(x), jnp.sum(x * y), x * 2))(xa, xb)
        return tuple(mp.put("P0", s) for s in stats)

    program = mp.compile(prog, cluster=CLUSTER)
    join = next(op for op in program.graph.operations if op.opcode == "psi.join")
    assert [str(v.type) for v in join.outputs] == ["table<id:i64,age:f64>[?n0]@{0}",
                                                   "table<id:i64,income:f64>[?n0]@{1}"]
    assert str(program.graph.outputs[2].type) == "f32[?n0,1]@{0}"
    mean, dot, doubled = mp.fetch(sim, mp.evaluate(sim, program))
    assert abs(float(mean) - SHARED.mean()) < 1e-3
    assert abs(float(dot) - float((SHARED * SHARED * 2.0).sum())) < 1.0
    np.testing.assert_allclose(np.sort(doubled[:, 0]), SHARED * 2.0, atol=1e-3)
    # a received copy is vetted (its symbolic StableHLO too) and runs the same
    again = mp.fetch(sim, mp.evaluate(sim, mp.Program.from_bytes(program.to_bytes())))
    assert abs(float(again[0]) - SHARED.mean()) < 1e-3


def test_sql_that_keeps_the_joined_rows_keeps_their_symbol(sim: mp.Simulator) -> None:
    """Read, join, SQL, tensors: a projection of the joined rows (computed columns, a
    window) keeps the join's symbol and order; a filter has a row count of its own."""
    def derived(t: Any) -> Any:
        return table.sql("SELECT age * 2 AS twice, CASE WHEN age > 20 THEN 1 ELSE 0 END AS "
                         "old, count(*) OVER () AS n FROM j", j=t)

    @mp.function
    def prog() -> Any:
        ja, jb = psi.join(*_tables(), "id")
        xa = mp.device("P0")(lambda t: table.to_tensor(derived(t), ["twice", "old", "n"]))(ja)
        older = mp.device("P0")(lambda t: table.sql("SELECT age FROM j WHERE age > 20", j=t))(ja)
        xb = mp.device("P1")(lambda t: table.to_tensor(t, ["income"]))(jb)
        dot = mp.device("SP0")(lambda x, y: jnp.sum(x[:, 0] * y[:, 0]))(xa, xb)
        return mp.put("P0", dot), xa, older

    program = mp.compile(prog, cluster=CLUSTER)
    types = [str(v.type) for v in program.graph.outputs]
    assert types[1:] == ["f32[?n0,3]@{0}", "table<age:f64>@{0}"]
    dot, xa, _ = mp.fetch(sim, mp.evaluate(sim, program))
    assert float(dot) == pytest.approx(float((SHARED * 2.0 * SHARED * 2.0).sum()), rel=1e-3)
    np.testing.assert_array_equal(xa[:, 0], SHARED * 2.0)
    np.testing.assert_array_equal(xa[:, 2], [len(SHARED)] * len(SHARED))


def test_different_symbols_do_not_meet_while_tracing() -> None:
    """Two row counts known only at run time (a join's and a filter's) are two symbols:
    an op that needs them equal is refused when traced."""
    def prog() -> Any:
        ja, _ = psi.join(*_tables(), "id")
        x = mp.device("P0")(lambda t: table.to_tensor(t, ["age"]))(ja)
        y = mp.device("P0")(lambda: table.to_tensor(table.sql(
            "SELECT age FROM t WHERE age > 3", t=table.constant({"age": IDS_A * 1.0}))))()
        return mp.device("P0")(lambda a, b: a + b)(x, y)

    with pytest.raises(mp.MPTypeError, match=r"JAX could not trace the function on "
                                             r"\(f32\[\?n0,1\], f32\[\?n\d+,1\]\): TypeError: "
                                             r"add got incompatible shapes for broadcasting"):
        mp.compile(prog, cluster=CLUSTER)


def _same_symbol(rows_a: int, rows_b: int) -> Any:
    """Two tables of ``rows_a`` and ``rows_b`` rows claimed to have one row symbol (as a
    forged program could), into a local op and an SPU op."""
    def prog() -> Any:
        def tensor_of(n: int) -> Any:
            t = table.sql("SELECT age FROM t WHERE age < " + str(n),
                          t=table.constant({"age": IDS_A * 1.0}))
            return to_tensor_p.bind([t], {"columns": ("age",), "rows": "n9"})[0]

        x = mp.device("P0")(lambda: tensor_of(rows_a))()
        y = mp.device("P1")(lambda: tensor_of(rows_b))()
        return mp.put("P0", mp.device("SP0")(lambda a, b: jnp.sum(a * b))(x, y))

    return prog


def test_a_symbol_with_two_sizes_at_run_time_names_the_op_and_symbol(
        sim: mp.Simulator) -> None:
    with pytest.raises(mp.MPRuntimeError) as failed:
        mp.evaluate(sim, _same_symbol(5, 7))
    assert re.fullmatch(r"spu\.run\[<lambda>\]: \?n9 has one size in input 0 and another in "
                        r"input 1 \(dimension 0\): values the program made of the same rows "
                        r"must keep the same rows \(at /0/4, traced at "
                        r"test_symbolic_sizes\.py:\d+\)", str(failed.value))
    total = mp.fetch(sim, mp.evaluate(sim, _same_symbol(5, 5)))
    assert float(np.ravel(total)[0]) == pytest.approx(float(
        (np.arange(5.0) ** 2).sum()), abs=1e-3)


def test_run_time_size_errors_are_public_and_name_the_symbol() -> None:
    """The kernels' check: the symbol and the inputs, never the sizes (row counts)."""
    from mplang.kernels.symbolic_sizes import bind_sizes

    types = [TensorType("float32", ("n9", 1)), TensorType("float32", ("n9",))]
    assert bind_sizes("spu.run[f]", types, [(5, 1), (5,)]) == {"n9": 5}
    with pytest.raises(mp.MPRuntimeError) as differ:
        bind_sizes("spu.run[f]", types, [(5, 1), (7,)])
    assert str(differ.value) == (
        "spu.run[f]: ?n9 has one size in input 0 and another in input 1 (dimension 0): "
        "values the program made of the same rows must keep the same rows")
    assert isinstance(differ.value, mp.MPPublicError)
    with pytest.raises(mp.MPPublicError, match=r"^spu\.run\[f\]: \?n9 is empty in input 0; "):
        bind_sizes("spu.run[f]", types, [(0, 1), (0,)])
    with pytest.raises(mp.MPPublicError, match=r"input 0 does not have the shape "
                                               r"f32\[\?n9,1\] \(dimension 1\)"):
        bind_sizes("spu.run[f]", types, [(5, 2), (5,)])


def test_an_empty_join_is_refused_by_name_where_its_rows_meet_a_secure_device(
        sim: mp.Simulator) -> None:
    @mp.function
    def prog() -> Any:
        ja, jb = psi.join(*_tables(np.arange(100, 110)), "id")
        xa = mp.device("P0")(lambda t: table.to_tensor(t, ["age"]))(ja)
        xb = mp.device("P1")(lambda t: table.to_tensor(t, ["income"]))(jb)
        return mp.put("P0", mp.device("SP0")(lambda x, y: jnp.sum(x) + jnp.sum(y))(xa, xb))

    with pytest.raises(mp.MPRuntimeError) as failed:
        mp.evaluate(sim, prog)
    assert re.fullmatch(r"spu\.run\[<lambda>\]: \?n0 is empty in input 0; sizes known only at "
                        r"run time must be at least 1 \(an empty join or filter result cannot "
                        r"flow into tensors\) \(at /0/\d+, traced at "
                        r"test_symbolic_sizes\.py:\d+\)", str(failed.value))


def test_rows_still_asserts_a_count(sim: mp.Simulator) -> None:
    @mp.function
    def prog(n: int) -> Any:
        ja, _ = psi.join(*_tables(), "id")
        return mp.device("P0")(lambda t: table.to_tensor(t, ["age"], rows=n))(ja)

    assert str(mp.compile(prog, 30, cluster=CLUSTER).graph.outputs[0].type) == "f32[30,1]@{0}"
    assert mp.fetch(sim, mp.evaluate(sim, prog, 30)).shape == (30, 1)
    with pytest.raises(mp.MPRuntimeError, match=r"^op table\.to_tensor at test_symbolic_sizes"
                                                r"\.py:\d+ failed on node_0"):
        mp.evaluate(sim, prog, 31)


def _verdicts(tmp_path: Path, prog: Any) -> list[Any]:
    """Each node's verdict on ``prog`` (reading ``a.csv`` on node_0, ``b.csv`` on node_1)
    under the policies ``mplang init`` writes, their ``intersection`` rules listing every
    PSI partner."""
    from mplang.cluster.local import init_cluster, init_policies
    from mplang.policy.check import check

    spec = init_cluster(3, tmp_path / "dev")
    cluster = mp.ClusterSpec.from_yaml(spec)
    roots = {n.name: tmp_path / n.name for n in cluster.nodes}
    for root in roots.values():
        root.mkdir()
    (roots["node_0"] / "a.csv").write_text(
        "id,age\n" + "".join(f"{i},{i % 70}\n" for i in IDS_A))
    (roots["node_1"] / "b.csv").write_text(
        "id,income\n" + "".join(f"{i},{i * 2.0}\n" for i in IDS_B))
    with mp.Simulator(cluster, data_roots=roots) as sim:
        program = mp.compile(prog, cluster=cluster)
        del sim
    names = [n.name for n in cluster.nodes]
    policies = init_policies(cluster, intersection=["*"])
    return [check(program.graph, 3, rank, policies[names[rank]], names=names)
            for rank in range(3)]


def test_the_row_count_reaching_a_secure_device_is_judged(tmp_path: Path) -> None:
    """The members of a secure device learn a symbolic row count: a joined count is a
    comparison (what the join told the holders), which the init policies allow; the
    count of a filter over a party's rows counts a mask over a data-dependent number of
    rows, refused."""
    def joined() -> Any:
        a = mp.device("P0")(lambda: table.read_csv("a.csv"))()
        b = mp.device("P1")(lambda: table.read_csv("b.csv"))()
        ja, jb = psi.join(a, b, "id")
        xa = mp.device("P0")(lambda t: table.to_tensor(t, ["age"]))(ja)
        xb = mp.device("P1")(lambda t: table.to_tensor(t, ["income"]))(jb)
        return mp.put("P0", mp.device("SP0")(lambda x, y: jnp.sum(x) + jnp.sum(y))(xa, xb))

    verdicts = _verdicts(tmp_path / "joined", joined)
    assert all(v.accepted for v in verdicts), [v.reasons for v in verdicts]
    counted = [f for f in verdicts[0].flows if f.startswith("compare of a.csv -> node_2 (the "
                                                            "row count of the shares")]
    assert len(counted) == 2  # both sides' shares: node_1's rows are the ones node_0's kept
    assert all(f.endswith('allowed: rule {to: ["*"], when: compare}') for f in counted)

    def filtered() -> Any:
        older = mp.device("P0")(lambda: table.to_tensor(table.sql(
            "SELECT age FROM t WHERE age > 60", t=table.read_csv("a.csv"))))()
        return mp.put("P0", mp.device("SP0")(lambda x: jnp.sum(x))(older))

    verdict = _verdicts(tmp_path / "filtered", filtered)[0]
    assert not verdict.accepted
    assert any(r.startswith("op spu.seal at test_symbolic_sizes.py:") and
               "sends the row count of the shares it receives, aggregate over a data-dependent "
               "number of rows of a.csv" in r and "to node_1" in r
               for r in verdict.reasons), verdict.reasons


def test_a_tee_function_takes_joined_rows_of_any_count() -> None:
    """The TEE's sealed transfers carry sizes known at run time (a ciphertext of
    ``u8[?4*n0+28]`` bytes), and its JAX function is shape polymorphic."""
    spec = mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61930 + i}"}
                  for i in range(3)],
        "devices": {"P0": {"kind": "PPU", "members": ["node_0"]},
                    "P1": {"kind": "PPU", "members": ["node_1"]},
                    "T0": {"kind": "TEE", "members": ["node_2"],
                           "config": {"attestation": "mock"}}}})

    @mp.function
    def prog() -> Any:
        ja, jb = psi.join(*_tables(), "id")
        xa = mp.device("P0")(lambda t: table.to_tensor(t, ["age"]))(ja)
        xb = mp.device("P1")(lambda t: table.to_tensor(t, ["income"]))(jb)
        total, more = mp.device("T0")(lambda x, y: (jnp.sum(x) + jnp.sum(y), x > y))(xa, xb)
        return mp.put("P0", total), mp.put("P0", more)

    with warnings.catch_warnings(), mp.Simulator(spec) as sim:
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)  # the mock quote
        program = mp.compile(prog, cluster=spec)
        sealed = [str(v.type) for op in program.graph.walk() for v in op.outputs
                  if op.opcode == "crypto.aes_encrypt"]
        assert "u8[?4*n0+28]" in sealed
        total, more = mp.fetch(sim, mp.evaluate(sim, program))
    assert float(total) == float(SHARED.sum() + (SHARED * 2.0).sum())
    np.testing.assert_array_equal(more[:, 0], SHARED > SHARED * 2.0)


def test_a_phe_device_adds_joined_columns_of_any_count() -> None:
    """Ciphertexts of a size known only at run time (``phe.ct<float32[?n0,1],...>``): the
    evaluator adds the two joined columns, the key owner decrypts their rows."""
    spec = mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61920 + i}"}
                  for i in range(3)],
        "devices": {**{f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]} for i in range(3)},
                    "HE0": {"kind": "PHE", "members": ["node_0", "node_1"],
                            "config": {"scheme": "paillier", "key_bits": 1024}}}})

    @mp.function
    def prog() -> Any:
        ja, jb = psi.join(*_tables(), "id")
        xa = mp.device("P0")(lambda t: table.to_tensor(t, ["age"]))(ja)
        xb = mp.device("P1")(lambda t: table.to_tensor(t, ["income"]))(jb)
        both = mp.device("HE0")(lambda a, b: a + b * 2.0)(mp.put("HE0", xa), mp.put("HE0", xb))
        return mp.put("P0", both)

    with mp.Simulator(spec) as sim:
        program = mp.compile(prog, cluster=spec)
        assert any("float32[?n0,1]" in str(v.type) for op in program.graph.walk()
                   for v in op.outputs if op.opcode == "phe.encrypt")
        both = mp.fetch(sim, mp.evaluate(sim, program))
    np.testing.assert_allclose(both[:, 0], SHARED + SHARED * 4.0, rtol=1e-5)


def test_the_results_of_an_n_party_join_share_one_row_symbol() -> None:
    cluster = mp.ClusterSpec.simple(3)
    ids = [np.arange(0, 60), np.arange(10, 70), np.arange(5, 50)]
    common = np.arange(10, 50)

    @mp.function
    def prog() -> Any:
        tables = [mp.device(f"P{i}")(lambda i=i: table.constant(
            {"id": ids[i], f"v{i}": ids[i] * float(i + 1)}))() for i in range(3)]
        joined = psi.join_n(tables, "id")
        xs = [mp.device(f"P{i}")(lambda t, i=i: table.to_tensor(t, [f"v{i}"]))(j)
              for i, j in enumerate(joined)]
        return mp.put("P0", mp.device("SP0")(lambda a, b, c: jnp.sum(a * b - c))(*xs)), *xs

    program = mp.compile(prog, cluster=cluster)
    assert [str(v.type) for v in program.graph.outputs[1:]] == [
        "f32[?n0,1]@{0}", "f32[?n0,1]@{1}", "f32[?n0,1]@{2}"]
    with mp.Simulator(cluster) as sim:
        total, *_ = mp.fetch(sim, mp.evaluate(sim, program))
    want = float((common * common * 2.0 - common * 3.0).sum())
    assert float(total) == pytest.approx(want, rel=1e-3)
