"""`ClusterSpec`: nodes and devices from a dict or YAML, validation errors,
`ClusterSpec.simple`, the simulator's cluster, and compiling device-level programs."""

from __future__ import annotations

import copy
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest
import yaml

import mplang as mp

NODES = [{"name": "alice", "endpoint": "10.0.0.1:9001"},
         {"name": "bob", "endpoint": "10.0.0.2:9001"},
         {"name": "carol", "endpoint": "10.0.0.3:9001"}]

FULL: dict[str, Any] = {
    "nodes": NODES,
    "devices": {
        "PA": {"kind": "PPU", "members": ["alice"]},
        "PB": {"kind": "PPU", "members": ["bob"]},
        "PC": {"kind": "PPU", "members": ["carol"]},
        "S3": {"kind": "SPU", "members": ["alice", "bob", "carol"],
               "config": {"protocol": "ABY3", "field": "FM128", "fxp_fraction_bits": 20}},
        "S2": {"kind": "SPU", "members": ["carol", "alice"], "config": {"protocol": "CHEETAH"}},
    },
}


def with_devices(devices: Any, nodes: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    return {"nodes": copy.deepcopy(NODES if nodes is None else nodes), "devices": devices}


# ---------------------------------------------------------------- construction


def test_from_dict_reads_nodes_and_devices() -> None:
    spec = mp.ClusterSpec.from_dict(FULL)
    assert spec.world_size == 3
    assert [(n.name, n.endpoint) for n in spec.nodes] == [(n["name"], n["endpoint"])
                                                          for n in NODES]
    assert all(isinstance(n, mp.Node) for n in spec.nodes)
    assert set(spec.devices) == {"PA", "PB", "PC", "S3", "S2"}
    s3 = spec.device("S3")
    assert isinstance(s3, mp.Device)
    assert (s3.name, s3.kind, s3.members) == ("S3", "SPU", ("alice", "bob", "carol"))
    assert dict(s3.config) == {"protocol": "ABY3", "field": "FM128", "fxp_fraction_bits": 20}
    assert spec.device("PB").kind == "PPU" and spec.device("PB").members == ("bob",)
    # ranks follow node order
    assert [spec.rank_of(n) for n in ("alice", "bob", "carol")] == [0, 1, 2]


def test_a_kind_nobody_registered_is_refused() -> None:
    with pytest.raises(mp.ClusterSpecError,
                       match=r"device 'T': kind must be one of (.*, )?PPU, SPU(, .*)?, got 'QPU'"):
        mp.ClusterSpec.from_dict(with_devices({"T": {"kind": "QPU", "members": ["bob"]}}))


def test_devices_may_be_a_list() -> None:
    spec = mp.ClusterSpec.from_dict(with_devices([
        {"name": "P0", "kind": "PPU", "members": ["alice"]},
        {"name": "S", "kind": "SPU", "members": ["alice", "bob"]},
    ]))
    assert set(spec.devices) == {"P0", "S"}
    assert spec.device("S").members == ("alice", "bob")


def test_from_yaml(tmp_path: Any) -> None:
    path = tmp_path / "cluster.yaml"
    path.write_text(
        "nodes:\n"
        "  - {name: alice, endpoint: '10.0.0.1:9001'}\n"
        "  - {name: bob, endpoint: '10.0.0.2:9001'}\n"
        "devices:\n"
        "  P0: {kind: PPU, members: [alice]}\n"
        "  P1: {kind: PPU, members: [bob]}\n"
        "  SP: {kind: SPU, members: [alice, bob],\n"
        "       config: {protocol: SEMI2K, field: FM128, fxp_fraction_bits: 24}}\n",
        encoding="utf-8")
    spec = mp.ClusterSpec.from_yaml(path)
    assert spec.world_size == 2
    assert spec.device("SP").kind == "SPU"
    assert dict(spec.device("SP").config) == {"protocol": "SEMI2K", "field": "FM128",
                                              "fxp_fraction_bits": 24}
    assert tuple(spec.rank_of(m) for m in spec.device("P1").members) == (1,)
    assert mp.ClusterSpec.from_yaml(str(path)) == spec  # str paths too


def test_from_yaml_validates(tmp_path: Any) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(with_devices({"S": {"kind": "SPU", "members": ["alice"]}})),
                    encoding="utf-8")
    with pytest.raises(mp.ClusterSpecError, match="'S'"):
        mp.ClusterSpec.from_yaml(path)


def test_from_yaml_rejects_malformed_yaml(tmp_path: Any) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("nodes: [ {name: a\n", encoding="utf-8")
    with pytest.raises(mp.ClusterSpecError):
        mp.ClusterSpec.from_yaml(path)


def test_dict_round_trip() -> None:
    spec = mp.ClusterSpec.from_dict(FULL)
    data = spec.to_dict()
    again = mp.ClusterSpec.from_dict(data)
    assert again == spec
    assert again.to_dict() == data
    # the dict form is plain data: it survives YAML
    assert mp.ClusterSpec.from_dict(yaml.safe_load(yaml.safe_dump(data))) == spec


def test_yaml_file_round_trip(tmp_path: Any) -> None:
    spec = mp.ClusterSpec.simple(4)
    path = tmp_path / "simple4.yaml"
    path.write_text(yaml.safe_dump(spec.to_dict()), encoding="utf-8")
    assert mp.ClusterSpec.from_yaml(path) == spec


# ---------------------------------------------------------------- validation

BAD_SPECS: dict[str, tuple[dict[str, Any], list[str]]] = {
    "unknown member": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "mallory"]}}),
        ["'S'", "mallory"]),
    "SPU with one member": (
        with_devices({"S": {"kind": "SPU", "members": ["alice"]}}), ["'S'"]),
    "duplicate node names": (
        with_devices({}, [*NODES, {"name": "alice", "endpoint": "10.0.0.9:1"}]), ["alice"]),
    "duplicate device names (list form)": (
        with_devices([{"name": "P", "kind": "PPU", "members": ["alice"]},
                      {"name": "P", "kind": "PPU", "members": ["bob"]}]), ["'P'"]),
    "unknown protocol": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "bob"],
                            "config": {"protocol": "SPDZ2K-ish"}}}), ["'S'", "SPDZ2K-ish"]),
    "unknown field": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "bob"],
                            "config": {"field": "FM32"}}}), ["'S'", "FM32"]),
    "ABY3 with 2 members": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "bob"],
                            "config": {"protocol": "ABY3"}}}), ["'S'", "ABY3", "3"]),
    "CHEETAH with 3 members": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "bob", "carol"],
                            "config": {"protocol": "CHEETAH"}}}), ["'S'", "CHEETAH", "2"]),
    "PPU with 2 members": (
        with_devices({"P": {"kind": "PPU", "members": ["alice", "bob"]}}), ["'P'"]),
    "fxp_fraction_bits zero": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "bob"],
                            "config": {"fxp_fraction_bits": 0}}}), ["'S'", "fxp_fraction_bits"]),
    "fxp_fraction_bits too large": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "bob"],
                            "config": {"fxp_fraction_bits": 200}}}),
        ["'S'", "fxp_fraction_bits"]),
    "fxp_fraction_bits a string": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "bob"],
                            "config": {"fxp_fraction_bits": "18"}}}),
        ["'S'", "fxp_fraction_bits"]),
    "fxp_fraction_bits a float": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "bob"],
                            "config": {"fxp_fraction_bits": 18.5}}}),
        ["'S'", "fxp_fraction_bits"]),
    "unknown top-level key": (
        {**with_devices({}), "extra": 1}, ["extra"]),
    "unknown device key": (
        with_devices({"P": {"kind": "PPU", "members": ["alice"], "colour": "red"}}),
        ["'P'", "colour"]),
    "unknown SPU config key": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "bob"],
                            "config": {"protocl": "ABY3"}}}), ["'S'", "protocl"]),
    "unknown node key": (
        with_devices({}, [{"name": "alice", "endpoint": "h:1", "port": 3}]), ["#0"]),
    "unknown device kind": (
        with_devices({"G": {"kind": "GPU", "members": ["alice"]}}), ["'G'", "GPU"]),
    "members not a list": (
        with_devices({"P": {"kind": "PPU", "members": "alice"}}), ["'P'"]),
    "member listed twice": (
        with_devices({"S": {"kind": "SPU", "members": ["alice", "alice"]}}), ["'S'"]),
    "no nodes": ({"nodes": [], "devices": {}}, ["nodes"]),
    "node without endpoint": ({"nodes": [{"name": "alice"}], "devices": {}}, ["alice"]),
    "not a mapping": (["nodes"], []),  # type: ignore[dict-item]
}


@pytest.mark.parametrize("case", list(BAD_SPECS), ids=list(BAD_SPECS))
def test_invalid_specs_fail_clearly(case: str) -> None:
    data, fragments = BAD_SPECS[case]
    with pytest.raises(mp.ClusterSpecError) as info:
        mp.ClusterSpec.from_dict(data)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, f"{case}: {fragment!r} not in {message!r}"


def test_cluster_spec_error_is_an_mplang_error_and_a_value_error() -> None:
    assert issubclass(mp.ClusterSpecError, mp.MPLangError)
    assert issubclass(mp.ClusterSpecError, ValueError)
    with pytest.raises(ValueError):
        mp.ClusterSpec.from_dict(with_devices({"S": {"kind": "SPU", "members": ["alice"]}}))


def test_direct_construction_is_validated() -> None:
    nodes = (mp.Node("a", "h:1"), mp.Node("b", "h:2"))
    ok = mp.ClusterSpec(nodes, {"S": mp.Device("S", "SPU", ("a", "b"), {"protocol": "CHEETAH"})})
    assert tuple(ok.rank_of(m) for m in ok.device("S").members) == (0, 1)
    with pytest.raises(mp.ClusterSpecError, match="ABY3"):
        mp.ClusterSpec(nodes, {"S": mp.Device("S", "SPU", ("a", "b"), {"protocol": "ABY3"})})
    with pytest.raises(mp.ClusterSpecError, match="zed"):
        mp.ClusterSpec(nodes, {"P": mp.Device("P", "PPU", ("zed",))})


def test_unknown_device_lookup() -> None:
    spec = mp.ClusterSpec.simple(2)
    with pytest.raises(mp.ClusterSpecError, match="unknown device 'GPU0'"):
        spec.device("GPU0")


# ---------------------------------------------------------------- ClusterSpec.simple


@pytest.mark.parametrize(("n", "protocol"), [(2, "CHEETAH"), (3, "ABY3"), (4, "ABY3"),
                                             (5, "ABY3")])
def test_simple(n: int, protocol: str) -> None:
    spec = mp.ClusterSpec.simple(n)
    assert spec.world_size == n
    assert [node.name for node in spec.nodes] == [f"node_{i}" for i in range(n)]
    assert len({node.endpoint for node in spec.nodes}) == n
    assert set(spec.devices) == {f"P{i}" for i in range(n)} | {"SP0"}
    for i in range(n):
        ppu = spec.device(f"P{i}")
        assert (ppu.kind, ppu.members) == ("PPU", (f"node_{i}",))
        assert tuple(spec.rank_of(m) for m in spec.device(f"P{i}").members) == (i,)
    spu = spec.device("SP0")
    assert spu.kind == "SPU"
    # ABY3 runs on exactly 3 parties: beyond 3, the others secret-share their inputs into it
    assert spu.members == tuple(f"node_{i}" for i in range(min(n, 3)))
    assert spu.config == {"protocol": protocol, "field": "FM64"}  # no dealer: no beaver
    assert mp.ClusterSpec.from_endpoints([n.endpoint for n in spec.nodes]) == spec


def test_simple_single_party_has_no_spu() -> None:
    spec = mp.ClusterSpec.simple(1)
    assert set(spec.devices) == {"P0"}
    assert all(d.kind != "SPU" for d in spec.devices.values())


@pytest.mark.parametrize("bad", [0, -2, True, 2.0, "3"])
def test_simple_rejects_bad_world_sizes(bad: Any) -> None:
    with pytest.raises(mp.ClusterSpecError):
        mp.ClusterSpec.simple(bad)


# ---------------------------------------------------------------- simulator and compile


@pytest.mark.parametrize("n", [1, 2, 3, 4])
def test_simulator_of_n_is_simulator_of_simple_spec(n: int) -> None:
    sim = mp.Simulator(n)
    try:
        assert sim.cluster == mp.ClusterSpec.simple(n)
        assert sim.world_size == n
    finally:
        sim.close()


def test_simulator_of_n_serves_simp_and_device_levels() -> None:
    from mplang import simp

    sim = mp.Simulator(2)
    try:
        ranks = mp.evaluate(sim, lambda: simp.prank() * 10)
        assert [int(v) for v in mp.fetch(sim, ranks)] == [0, 10]
        out = mp.evaluate(sim, lambda: mp.put("P1", mp.device("SP0")(lambda a, b: a * b)(
            mp.put("P0", np.int32(6)), mp.put("P1", np.int32(7)))))
        assert int(mp.fetch(sim, out)) == 42
        assert sim.held(out)[0] is None
    finally:
        sim.close()


def test_simulator_accepts_a_spec() -> None:
    spec = mp.ClusterSpec.from_dict(FULL)
    sim = mp.Simulator(spec)
    try:
        assert sim.cluster is spec
        assert sim.world_size == 3
        out = mp.evaluate(sim, lambda: mp.device("PC")(lambda: jnp.arange(3) * 7)())
        assert mp.get_dev_attr(out) == "PC"
        np.testing.assert_array_equal(mp.fetch(sim, out), [0, 7, 14])
        assert sim.held(out)[:2] == [None, None]  # only carol (rank 2) holds it
    finally:
        sim.close()


def test_single_party_simulator_runs_a_ppu() -> None:
    sim = mp.Simulator(1)
    try:
        out = mp.evaluate(sim, lambda: mp.device("P0")(lambda: jnp.arange(4) ** 2)())
        np.testing.assert_array_equal(mp.fetch(sim, out), [0, 1, 4, 9])
    finally:
        sim.close()


def millionaire() -> Any:
    x = mp.device("P0")(lambda: jnp.int32(1_000_000))()
    y = mp.device("P1")(lambda: jnp.int32(2_000_000))()
    z = mp.device("SP0")(lambda a, b: a < b)(x, y)
    return mp.put("P0", z)


def test_compile_device_program_shows_spu_ops() -> None:
    spec = mp.ClusterSpec.simple(3)
    program = mp.compile(millionaire, cluster=spec)
    text = str(program)
    assert text.count("spu.seal") == 2
    assert text.count("spu.run") == 1
    assert text.count("spu.reveal") == 1
    assert "protocol='ABY3'" in text and "field='FM64'" in text
    assert program.world_size == 3


def test_compile_uses_the_cluster_device_config(make_spec: Any) -> None:
    spec = make_spec(2, protocol="CHEETAH", field="FM128", fxp_fraction_bits=30)

    def prog() -> Any:
        a = mp.put("P0", np.float32(1.5))
        return mp.put("P1", mp.device("S")(lambda v: v * 2)(a))

    text = str(mp.compile(prog, cluster=spec))
    assert "protocol='CHEETAH'" in text
    assert "field='FM128'" in text
    assert "fxp_fraction_bits=30" in text
    assert "device='S'" in text


def test_compile_rejects_contradicting_world_size() -> None:
    with pytest.raises(mp.MPLangError):
        mp.compile(millionaire, cluster=mp.ClusterSpec.simple(3), world_size=2)


def test_compiled_device_program_runs() -> None:
    spec = mp.ClusterSpec.simple(3)
    sim = mp.Simulator(spec)
    try:
        out = mp.evaluate(sim, mp.compile(millionaire, cluster=spec))
        assert mp.fetch(sim, out) is not None
        assert bool(mp.fetch(sim, out)) is True
        assert mp.get_dev_attr(out) == "P0"
    finally:
        sim.close()
