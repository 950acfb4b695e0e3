"""The declarations of the phe primitives: operands, attributes, targets, cost and flow."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import mplang as mp
from mplang import phe, simp, tensor
from mplang.analysis.cost_model import local_cost
from mplang.dialects.phe import bucket_sum_p
from mplang.edsl.errors import MPTypeError, MPVerifyError
from mplang.edsl.primitive import check_types, primitives
from mplang.flows import phe_flows
from mplang.flows.engine import analyze
from tests.kernels.phe.conftest import KEY_BITS

PHE_OPS = ["phe.add", "phe.bucket_sum", "phe.decrypt", "phe.dot", "phe.encrypt", "phe.keygen",
           "phe.mul_plain", "phe.sub", "phe.sum"]


def test_every_phe_primitive_is_declared_for_the_ppu() -> None:
    prims = primitives("phe")
    assert [p.name for p in prims] == PHE_OPS
    for p in prims:
        assert p.targets == ("PPU",)
        assert p.rule("cost") is local_cost
        assert getattr(phe_flows, p.rule("local_flow").__name__) is p.rule("local_flow")
    assert [p.name for p in prims if p.side_effects] == ["phe.encrypt", "phe.keygen"]
    keygen = primitives("phe")[PHE_OPS.index("phe.keygen")].describe()
    assert {a["name"]: (a["default"], a["choices"], a["min"], a["max"])
            for a in keygen["attributes"]} == {
        "scheme": ("paillier", ["paillier", "ou"], None, None),
        "key_bits": (2048, None, 1024, 8192), "key": (None, None, None, None)}


def _compile_body(body: Any, world_size: int = 1) -> mp.Program:
    @mp.function
    def prog() -> Any:
        pk, _ = simp.pcall((0,), lambda: phe.keygen(key_bits=KEY_BITS))
        return simp.pcall((0,), body, pk)

    return mp.compile(prog, world_size=world_size)


def _compile_keygen(**kwargs: Any) -> None:
    mp.compile(lambda: simp.pcall((0,), lambda: phe.keygen(**kwargs)), world_size=1)


def test_keygen_attributes_are_checked_from_the_declaration() -> None:
    with pytest.raises(MPTypeError, match=r"phe\.keygen: attribute 'scheme' must be one of "
                       r"\['paillier', 'ou'\], got 'rsa'"):
        _compile_keygen(scheme="rsa")
    with pytest.raises(MPTypeError, match=r"phe\.keygen: attribute 'key_bits' must lie in "
                       r"\[1024, 8192\], got 512"):
        _compile_keygen(key_bits=512)
    with pytest.raises(MPTypeError, match=r"phe\.keygen: attribute 'key_bits' must be int, "
                       r"got 1024\.0"):
        _compile_keygen(key_bits=1024.0)


@pytest.mark.parametrize(("body", "message"), [
    (lambda k: phe.encrypt(np.ones(3, np.int32), tensor.constant(np.ones(3, np.int32))),
     r"phe\.encrypt: operand pk must be a PHE public key, got i32\[3\]"),
    (lambda k: phe.encrypt(np.ones(3, bool), k),
     r"phe\.encrypt: cast booleans to an integer dtype before encrypting"),
    (lambda k: phe.encrypt(np.ones(3, np.int32), k, scale=4),
     r"phe\.encrypt: integer tensors are encrypted at scale 1, got scale=4"),
    (lambda k: phe.add(phe.encrypt(np.ones(3, np.int32), k), k),
     r"phe\.add: operand b must be a PHE ciphertext or a plaintext tensor of .*, got "
     r"phe\.pk<paillier1024,k0>"),
    (lambda k: phe.mul_plain(phe.encrypt(np.ones(3, np.float32), k), np.float32(2),
                             scale=1.5),  # type: ignore[arg-type]
     r"phe\.mul_plain: attribute 'scale' must be int or None, got 1\.5"),
    (lambda k: phe.sum(phe.encrypt(np.ones(3, np.int32), k), axis=1),
     r"phe\.sum: axis 1 is out of range for phe\.ct<int32\[3\],k0>"),
    (lambda k: bucket_sum_p.bind([phe.encrypt(np.ones(2, np.int32), k),
                                  tensor.constant(np.zeros((2, 1), np.int8)),
                                  tensor.constant(np.zeros(2, np.int8)),
                                  tensor.constant(np.zeros(2, np.int8))], {"n_bins": 2})[0],
     r"phe\.bucket_sum: takes at most one group-id vector, got 2"),
])
def test_type_errors_name_the_op_and_operand(body: Any, message: str) -> None:
    with pytest.raises(MPTypeError, match=message):
        _compile_body(body)


def test_defaults_are_stored_and_a_graph_without_them_is_refused() -> None:
    program = _compile_body(lambda k: phe.bucket_sum(phe.encrypt(np.ones(2, np.int32), k),
                                                     np.zeros((2, 1), np.int8), n_bins=2))
    check_types(program.graph, 1)
    (body,) = [g for op in program.graph.operations for g in op.regions
               if any(o.opcode == "phe.bucket_sum" for o in g.operations)]
    i, op = next((i, o) for i, o in enumerate(body.operations) if o.opcode == "phe.bucket_sum")
    assert dict(op.attrs) == {"n_bins": 2, "n_groups": 1}
    body.operations[i] = op.replace(attrs={"n_bins": 2})
    with pytest.raises(MPVerifyError, match=r"phe\.bucket_sum.*: attributes do not match the "
                       r"declaration \(missing \['n_groups'\], unknown \[\]\)"):
        check_types(program.graph, 1)


def test_a_ciphertext_carries_its_plaintext_s_label_sealed() -> None:
    """A sum over the rows stays an aggregate under encryption; sent to party 1 it is no
    flow in a whole program (party 1 cannot decrypt it), but it is in a part of one."""
    def body(k: Any) -> Any:
        x = tensor.load("x.npy", dtype="int32", shape=(3,))
        return phe.sum(phe.encrypt(x, k))

    @mp.function
    def prog() -> Any:
        pk, _ = simp.pcall((0,), lambda: phe.keygen(key_bits=KEY_BITS))
        return simp.shuffle_static(simp.pcall((0,), body, pk), {1: 0})

    graph = mp.compile(prog, world_size=2).graph
    analysis, (out,) = analyze(graph, 2, 0)
    assert list(out) == [1] and (out[1].form, out[1].rows, out[1].sealed) == \
        ("aggregate", 3, True)
    assert analysis.sends == []
    part, _ = analyze(graph, 2, 0, whole=False)
    (send,) = part.sends
    assert send.receiver == 1 and send.op.opcode == "simp.shuffle_static"
    assert send.label.form == "aggregate"
