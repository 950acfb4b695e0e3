"""``mplang ops``: the frontend ops, their families, execution models and routes."""

from __future__ import annotations

import json
from typing import Any

import pytest

import mplang as mp
from mplang.cli.main import main
from mplang.frontend.introspect import list_ops


def _ops(capsys: pytest.CaptureFixture[str], *args: str) -> list[dict[str, Any]]:
    assert main(["ops", *args, "--json"]) == 0
    data: list[dict[str, Any]] = json.loads(capsys.readouterr().out)
    return data


def test_ops_lists_the_builtin_ops(capsys: pytest.CaptureFixture[str]) -> None:
    ops = {op["name"]: op for op in _ops(capsys)}
    pcall = ops["simp.pcall"]
    assert pcall["family"] == "simp" and pcall["op_kind"] == "call"
    assert pcall["execution_model"] == "multi_party"
    assert str(pcall["doc"]).startswith("Run ``fn(*args)`` locally")
    assert ops["tensor.run_jax"]["routes"] == ["PPU"]
    assert ops["spu.run"]["routes"] == ["SPU"]
    assert {"simp.shuffle_static", "spu.seal", "tensor.constant", "func.func"} <= set(ops)
    assert list(ops) == sorted(ops)
    for op in ops.values():
        assert set(op) >= {"name", "family", "op_kind", "execution_model", "routes", "doc"}


def test_family_filters(capsys: pytest.CaptureFixture[str]) -> None:
    simp_ops = _ops(capsys, "--family", "simp")
    assert {op["family"] for op in simp_ops} == {"simp"}
    assert [op["name"] for op in simp_ops] == [i.name for i in list_ops("simp")]
    assert "simp.pcall" in [op["name"] for op in simp_ops]
    assert _ops(capsys, "--family", "no-such-family") == []


def test_the_table_has_one_line_per_op(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ops", "--family", "tensor"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "FAMILY", "OP_KIND", "EXECUTION_MODEL", "ROUTES", "DOC"]
    assert [line.split()[0] for line in lines[1:]] == [i.name for i in list_ops("tensor")]
    assert lines[1].split()[:5] == ["tensor.constant", "tensor", "source", "single_rank", "PPU"]


def test_unknown_family_and_plugin_fail_clearly(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ops", "--family", "no-such-family"]) == 1
    assert "no frontend ops in family 'no-such-family'" in capsys.readouterr().err
    assert main(["ops", "--plugin", "no_such_plugin_module"]) == 2
    assert "cannot load plugin 'no_such_plugin_module'" in capsys.readouterr().err


def test_primitives_list_the_whole_contract(capsys: pytest.CaptureFixture[str]) -> None:
    prims = _ops(capsys, "--primitives")
    assert prims == mp.list_primitives()
    simp_only = _ops(capsys, "--primitives", "--dialect", "simp")
    assert {p["dialect"] for p in simp_only} == {"simp"}
    assert main(["ops", "--primitives", "--dialect", "simp"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["NAME", "KIND", "MODEL", "OPERANDS", "ATTRIBUTES", "RESULTS",
                                "KERNELS", "FLOW", "COST"]
    shuffle = next(line.split() for line in lines if line.startswith("simp.shuffle_static"))
    assert shuffle == ["simp.shuffle_static", "communication", "multi_party", "values...",
                       "routes", "outs...", "worker,driver", "_shuffle_static_flow",
                       "_shuffle_static_cost"]


def test_one_op_is_described(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ops", "simp.shuffle", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == mp.describe("simp.shuffle")
    assert main(["ops", "tensor.load"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("tensor.load: Read a private input: an array from the party's own "
                           "data root.\n")
    assert "  attribute key: str | None, default None - the member of an .npz archive\n" in text
    assert "  security on PPU: plaintext on its one party" in text
    assert main(["ops", "no.such_op"]) == 1
    assert capsys.readouterr().err == "mplang ops: no primitive or frontend op named " \
                                      "'no.such_op'\n"


def test_the_json_listing_carries_the_contract_of_same_named_primitives(
        capsys: pytest.CaptureFixture[str]) -> None:
    ops = {op["name"]: op for op in _ops(capsys)}
    shuffle = ops["simp.shuffle_static"]
    contract = mp.describe("simp.shuffle_static")
    assert {k: shuffle[k] for k in ("operands", "attributes", "kernels", "flow", "cost")} == \
        {k: contract[k] for k in ("operands", "attributes", "kernels", "flow", "cost")}
    assert "operands" not in ops["func.func"]  # emits func.call: no primitive of its name
