"""The StableHLO of ``spu.run``: recorded at compile time, compiled by libspu into the
executable, vetted by workers and by the simulator for received programs
(`check_payloads`), followed by the flow analysis."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang.dialects import simp, tensor
from mplang.dialects.spu import executable_of
from mplang.edsl.errors import MPSerializationError
from mplang.edsl.graph import Graph, Operation
from mplang.edsl.primitive import check_types
from mplang.flows.engine import analyze
from mplang.runtime.backend import check_payloads

CLUSTER = mp.ClusterSpec.simple(2)


def spu_graph(fn: Any, n: int = 4) -> Graph:
    """A program running ``fn`` on SP0 over an int32 vector of each party (length ``n``)."""
    def prog() -> Any:
        x = mp.put("P0", np.arange(n, dtype=np.int32))
        y = mp.put("P1", np.ones(n, dtype=np.int32))
        return mp.put("P0", mp.device("SP0")(fn)(x, y))

    return mp.compile(prog, cluster=CLUSTER).graph


def run_op(graph: Graph) -> Operation:
    (op,) = [op for op in graph.walk() if op.opcode == "spu.run"]
    return op


def with_run_attrs(graph: Graph, **attrs: Any) -> Graph:
    """``graph`` with attributes of its ``spu.run`` replaced."""
    ops = [op.replace(attrs={**op.attrs, **attrs}) if op.opcode == "spu.run" else op
           for op in graph.operations]
    return Graph(graph.inputs, ops, graph.outputs)


def refused(graph: Graph, pattern: str) -> None:
    check_types(graph, 2)  # the declaration and type rules accept it: only the check refuses
    with pytest.raises(MPSerializationError, match=pattern):
        check_payloads(graph)


def add(a: Any, b: Any) -> Any:
    return a + b


def less(a: Any, b: Any) -> Any:
    return a < b


def test_the_executable_is_what_libspu_compiles_the_recorded_stablehlo_to() -> None:
    op = run_op(spu_graph(add))
    text = op.attrs["stablehlo"].decode()
    assert "func.func @main(%arg0: tensor<4xi32>, %arg1: tensor<4xi32>) -> tensor<4xi32>" \
        in text and "stablehlo.add %arg0, %arg1" in text
    assert executable_of(text, 2, 1, op.attrs["fn"]) == op.attrs["executable"]


def test_a_compiled_program_passes_the_check() -> None:
    check_payloads(spu_graph(add))


def test_an_executable_of_another_function_is_refused() -> None:
    other = run_op(spu_graph(jnp.multiply)).attrs["executable"]
    refused(with_run_attrs(spu_graph(add), executable=other),
            r"^spu\.run\[add\]: spu\.run StableHLO rejected: the executable is not what "
            r"libspu compiles its StableHLO to \(graph\.ops\[4\]\.attrs\.executable, traced "
            r"at test_spu_payloads\.py:\d+\)$")


def test_a_stablehlo_of_another_function_is_refused() -> None:
    """A benign StableHLO beside a leaking executable would mislead the flow analysis."""
    other = run_op(spu_graph(jnp.multiply)).attrs["stablehlo"]
    refused(with_run_attrs(spu_graph(add), stablehlo=other),
            "the executable is not what libspu compiles its StableHLO to")


@pytest.mark.parametrize(("text", "error"), [
    (b"module { garbage", "ValueError: unparsable StableHLO"),
    (b"\xff\xfe", "UnicodeDecodeError"),
])
def test_unparsable_stablehlo_is_refused(text: bytes, error: str) -> None:
    refused(with_run_attrs(spu_graph(add), stablehlo=text),
            rf"^spu\.run\[add\]: spu\.run StableHLO rejected: {error}")


def test_a_custom_call_a_received_module_may_not_use_is_refused() -> None:
    text = run_op(spu_graph(add)).attrs["stablehlo"].replace(
        b"stablehlo.add %arg0, %arg1 : tensor<4xi32>",
        b"stablehlo.custom_call @lapack_sgetrf(%arg0, %arg1) : (tensor<4xi32>, "
        b"tensor<4xi32>) -> tensor<4xi32>")
    refused(with_run_attrs(spu_graph(add), stablehlo=text),
            "uses custom call 'lapack_sgetrf', which a received module may not")


def test_stablehlo_of_other_types_than_the_op_declares_is_refused() -> None:
    small = run_op(spu_graph(add, n=3))
    graph = with_run_attrs(spu_graph(add), stablehlo=small.attrs["stablehlo"],
                           executable=small.attrs["executable"])
    refused(graph, r"^spu\.run\[add\]: its StableHLO takes and gives \[\[\('int32', \(3,\)\), "
                   r"\('int32', \(3,\)\)\], \[\('int32', \(3,\)\)\]\], but the op declares "
                   r"\[\[\('int32', \(4,\)\), \('int32', \(4,\)\)\], \[\('int32', \(4,\)\)\]\] "
                   r"\(graph\.ops\[4\]\.attrs\.stablehlo, traced at test_spu_payloads\.py:\d+\)$")


def test_the_flow_rule_reads_the_stablehlo_that_the_check_binds_to_the_executable() -> None:
    def prog(fn: Any) -> Any:
        def load(party: int) -> Any:
            return simp.pcall((party,), lambda: tensor.load("x.npy", dtype="float32",
                                                            shape=(4,)))

        return lambda: mp.put("P0", mp.device("SP0")(fn)(load(0), load(1)))

    def revealed(graph: Graph) -> list[str]:
        """The form of party 1's data the reveal gives party 0."""
        analysis, _ = analyze(graph, 2, 1)
        return [s.label.form for s in analysis.sends if s.op.opcode == "spu.reveal"]

    def doubled(a: Any, b: Any) -> Any:  # party 1's rows, each doubled (a unused)
        return b * 2.0

    def first_less(a: Any, b: Any) -> Any:  # one of party 1's values against party 0's
        return a[:1] < b[:1]

    added, compared = (mp.compile(prog(fn), cluster=CLUSTER).graph
                       for fn in (doubled, first_less))
    assert (revealed(added), revealed(compared)) == (["rowwise"], ["compare"])
    swapped = with_run_attrs(added, stablehlo=run_op(compared).attrs["stablehlo"])
    assert revealed(swapped) == ["compare"]  # what the analysis would believe, so workers
    refused(swapped, "the executable is not what libspu compiles its StableHLO to")


def test_a_loaded_program_whose_executable_is_not_its_stablehlos_is_refused_on_the_simulator(
        tmp_path: Path) -> None:
    """The simulator vets a received program as a worker does, before any op runs."""
    def prog() -> Any:
        x = mp.put("P0", np.arange(4, dtype=np.int32))
        y = mp.put("P1", np.ones(4, dtype=np.int32))
        return mp.put("P0", mp.device("SP0")(add)(x, y))

    program = mp.compile(prog, cluster=CLUSTER)
    other = run_op(spu_graph(jnp.multiply)).attrs["executable"]
    lying = mp.Program(with_run_attrs(program.graph, executable=other), program.out_tree,
                       program.world_size, program.name, program.out_devices)
    lying.save(tmp_path / "lying.mpl")
    sim = mp.Simulator(CLUSTER)
    loaded = mp.load(tmp_path / "lying.mpl")
    assert loaded.received and not program.received
    loc = run_op(program.graph).loc
    assert loc is not None and loc.startswith("test_spu_payloads.py:")
    with pytest.raises(MPSerializationError) as refusal:
        mp.evaluate(sim, loaded)
    assert str(refusal.value) == (
        "spu.run[add]: spu.run StableHLO rejected: the executable is not what libspu compiles "
        f"its StableHLO to (graph.ops[4].attrs.executable, traced at {loc})")
    assert sim.runs == 0  # refused before any op ran
    for received in (mp.Program.from_bytes(program.to_bytes()),
                     mp.Program.from_text(program.to_text())):
        assert mp.fetch(sim, mp.evaluate(sim, received)).tolist() == [1, 2, 3, 4]
