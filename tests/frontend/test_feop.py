"""The frontend-op system: `feop` metadata, the registry API, state scopes, compile
caches and the determinism check, device routing, config schemas, and
`FeModule.simple_op` (a new op with a worker kernel, run on the simulator).

Ops defined here live in the families ``fetest`` and ``fetest_scale`` (op names
can be registered once per process, so they are created at import).
"""

from __future__ import annotations

import itertools
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import simp, tensor
from mplang.edsl.primitive import get_primitive
from mplang.edsl.typing import TensorType
from mplang.frontend import (
    CompileCache,
    ConfigField,
    ConfigSchema,
    FeCapabilityError,
    FeConfigError,
    FeDeterminismError,
    FeOpInfo,
    FeStateError,
    MPTypeError,
    capabilities,
    compile_caches,
    config_schema,
    describe,
    determinism_check,
    feop,
    find,
    get,
    is_feop,
    list_frontends,
    list_ops,
    register,
)
from mplang.frontend.cache import CacheStats
from mplang.frontend.module import FeModule
from mplang.frontend.routing import check_route
from mplang.runtime.backend import register_backend
from mplang.runtime.interpreter import Call


def is_registered(name: str) -> bool:
    return get_primitive(name) is not None


# ---------------------------------------------------------------- test ops


@feop(name="fetest.meta_op", family="fetest", op_kind="compiler",
      execution_model="single_rank", dialects=["fetest"], version="2",
      inputs=[{"kind": "Tensor"}], outputs=[{"kind": "Tensor", "dtype": "float32"}],
      side_effects=True, targets=["PPU"],
      capabilities={"stability": "experimental", "caching": {"scope": "process"}},
      example="y = meta_op(x)")
def meta_op(x: Any) -> Any:
    """Return ``x`` unchanged.

    This second paragraph is not part of the op's doc.
    """
    return x


@feop(name="fetest.proc_state", family="fetest", execution_model="in_controller",
      state_scope="process")
def proc_state_op() -> None:
    """An op with process-wide state."""


@feop(name="fetest.other_proc_state", family="fetest", execution_model="in_controller",
      state_scope="process")
def other_proc_state_op() -> None:
    """Another op with process-wide state."""


@feop(name="fetest.ctx_state", family="fetest", execution_model="in_controller",
      state_scope="ctx")
def ctx_state_op() -> None:
    """An op with per-context state."""


@feop(name="fetest.no_state", family="fetest", execution_model="in_controller")
def no_state_op() -> None:
    """An op without state."""


SCHEMA = ConfigSchema({
    "bits": ConfigField(int, required=True, min=1, max=63, doc="fraction bits"),
    "mode": ConfigField(str, default="fast", choices=("fast", "exact")),
    "scale": ConfigField((int, float), default=1.0, min=0),
})


@feop(name="fetest.configured", family="fetest", execution_model="in_controller",
      config_schema=SCHEMA)
def configured_op(x: Any, *, bits: int, mode: str, scale: float, note: str = "") -> Any:
    """Return its arguments and validated configuration."""
    return x, bits, mode, scale, note


@feop(name="fetest.needs_big_spu", family="fetest", execution_model="multi_party",
      capabilities={"requires_device": {"kind": ["SPU"], "members": ">=3"}})
def needs_big_spu_op() -> None:
    """Runs only on SPUs of three or more members."""


@feop(name="fetest.local_anywhere", family="fetest", execution_model="single_rank")
def local_anywhere_op() -> None:
    """A single-rank op without targets."""


@feop(name="fetest.joint_anywhere", family="fetest", execution_model="multi_party")
def joint_anywhere_op() -> None:
    """A multi-party op without targets."""


# ---------------------------------------------------------------- a simple op with a kernel

scale_mod = FeModule("fetest_scale")


@scale_mod.simple_op(example="y = scale(x, factor=2.0)")
def scale(x: TensorType, *, factor: float) -> TensorType:
    """Multiply a tensor by a positive constant factor."""
    if factor <= 0:
        raise ValueError(f"factor must be positive, got {factor}")
    return x


@scale_mod.simple_op()
def split_sign(x: TensorType) -> tuple[TensorType, TensorType]:
    """The positive and the negative part of a tensor."""
    return x, x


SCALE_BACKEND = register_backend("fetest_scale")


@SCALE_BACKEND.kernel(scale_mod.prims.scale)
def _scale_kernel(call: Call, x: Any, *, factor: float) -> list[Any]:
    return [np.asarray(x) * np.float32(factor)]


@SCALE_BACKEND.kernel(scale_mod.prims.split_sign)
def _split_kernel(call: Call, x: Any) -> list[Any]:
    x = np.asarray(x)
    return [np.maximum(x, 0), np.minimum(x, 0)]




def runtime_object(sim: mp.Simulator) -> mp.MPObject:
    obj = mp.evaluate(sim, lambda: simp.constant((0,), 1))
    assert isinstance(obj, mp.MPObject)
    return obj


# ---------------------------------------------------------------- feop metadata


def test_feop_attaches_its_metadata() -> None:
    info = meta_op.__feop_meta__
    assert isinstance(info, FeOpInfo)
    assert (info.name, info.family, info.op_kind, info.execution_model) == (
        "fetest.meta_op", "fetest", "compiler", "single_rank")
    assert info.dialects == ("fetest",)
    assert info.version == "2"
    assert info.inputs == ({"kind": "Tensor"},)
    assert info.outputs == ({"kind": "Tensor", "dtype": "float32"},)
    assert info.side_effects is True
    assert info.targets == ("PPU",)
    assert info.capabilities["stability"] == "experimental"
    assert info.state_scope == "none"
    assert info.config_schema is None
    assert info.doc == "Return ``x`` unchanged."  # the first paragraph only
    assert info.example == "y = meta_op(x)"
    assert meta_op(41) == 41  # still the function it decorates


def test_is_feop() -> None:
    assert is_feop(meta_op)
    assert is_feop(simp.pcall) and is_feop(tensor.run_jax) and is_feop(mp.spu.run)
    assert not is_feop(lambda: None)
    assert not is_feop(jnp.square)

    def impostor() -> None: ...

    impostor.__feop__ = True  # type: ignore[attr-defined]
    assert not is_feop(impostor)  # the flag without metadata is not enough
    impostor.__feop_meta__ = "not metadata"  # type: ignore[attr-defined]
    assert not is_feop(impostor)


# ---------------------------------------------------------------- the registry API


def test_registering_a_name_twice_raises() -> None:
    with pytest.raises(ValueError, match=r"frontend op 'fetest\.meta_op' is already registered"):
        register(meta_op)
    with pytest.raises(ValueError, match=r"'simp\.pcall' is already registered"):
        feop(name="simp.pcall", family="simp", execution_model="multi_party")(lambda: None)
    assert get("simp.pcall") is simp.pcall  # the original stays
    assert get("fetest.meta_op") is meta_op


def test_registering_a_plain_function_raises() -> None:
    with pytest.raises(TypeError, match="is not a feop"):
        register(lambda: None)


def test_get_and_list_ops() -> None:
    assert get("tensor.run_jax") is tensor.run_jax
    with pytest.raises(KeyError, match=r"unknown frontend op 'fetest\.nope'"):
        get("fetest.nope")
    names = [i.name for i in list_ops("fetest")]
    assert names == sorted(names)
    assert {"fetest.meta_op", "fetest.proc_state", "fetest.ctx_state",
            "fetest.configured"} <= set(names)
    assert all(i.family == "fetest" for i in list_ops("fetest"))
    assert [i.name for i in list_ops("spu")] == ["spu.reveal", "spu.run", "spu.seal", "spu.shares"]
    assert list_ops("fetest_no_such_family") == []
    everything = [i.name for i in list_ops()]
    assert set(names) < set(everything) and "simp.pcall" in everything


def test_list_frontends() -> None:
    families = list_frontends()
    assert families == sorted(families)
    assert {"fetest", "fetest_scale", "func", "simp", "spu", "tensor"} <= set(families)


def test_find() -> None:
    compilers = find(None, lambda i: i.op_kind == "compiler")
    assert tensor.run_jax in compilers and mp.spu.run in compilers and meta_op in compilers
    assert find("tensor", lambda i: i.op_kind == "compiler") == [tensor.run_jax]
    assert find("spu", lambda i: "PPU" in i.targets) == []
    stateful = find("fetest", lambda i: i.state_scope != "none")
    assert stateful == [ctx_state_op, other_proc_state_op, proc_state_op]  # sorted by name


def test_capabilities_are_a_copy() -> None:
    caps = capabilities("tensor.run_jax")
    assert caps == {"caching": {"scope": "process", "key_strategy": "signature"}}
    caps["caching"]["scope"] = "changed"
    caps["extra"] = True
    assert capabilities(tensor.run_jax) == {
        "caching": {"scope": "process", "key_strategy": "signature"}}
    assert capabilities("simp.pcall") == {}


def test_config_schema_lookup() -> None:
    assert config_schema("fetest.configured") is SCHEMA
    assert config_schema(configured_op) is SCHEMA
    assert config_schema("tensor.run_jax") is None


def test_describe_a_frontend_op() -> None:
    d = describe("tensor.run_jax")
    assert d["name"] == "tensor.run_jax"
    assert d["family"] == "tensor"
    assert d["op_kind"] == "compiler"
    assert d["routes"] == ["PPU"]
    assert d["example"] == "y = tensor.run_jax(jnp.square, x)"
    assert d["dialect"] == "tensor" and d["kind"] == "compiler"
    (prim,) = d["primitives"]
    assert prim["name"] == "tensor.run_jax"
    assert prim["traits"]["pure"] is True and prim["traits"]["communicates"] is False
    assert prim["traits"]["runtimes"] == ["worker"]
    assert d["traits"] == prim["traits"]
    assert describe(tensor.run_jax) == d

    spu_run = describe("spu.run")
    assert spu_run["routes"] == ["SPU"]
    assert spu_run["cost"]["name"] == "_run_cost"
    assert spu_run["traits"]["runtimes"] == ["worker", "driver"]
    assert describe("tensor.pyfunc")["traits"]["pure"] is False
    assert {"PPU", "SPU"} <= set(describe("func.func")["routes"])  # in_controller: anywhere


def test_describe_includes_the_config_schema() -> None:
    d = describe(configured_op)
    schema = d["config_schema"]
    assert schema["bits"] == {"type": ["int"], "required": True, "default": None,
                              "choices": None, "min": 1, "max": 63, "doc": "fraction bits"}
    assert schema["mode"]["choices"] == ["fast", "exact"]
    assert schema["scale"]["type"] == ["int", "float"]
    assert d["primitives"] == []  # it emits no primitive
    assert {"PPU", "SPU"} <= set(d["routes"])


def test_describe_a_primitive_that_is_no_frontend_op() -> None:
    d = describe("func.call")
    assert d["name"] == "func.call" and d["dialect"] == "func" and d["kind"] == "call"
    assert d["traits"]["regions"] == "call"
    assert "routes" not in d
    with pytest.raises(KeyError, match=r"fetest\.nothing"):
        describe("fetest.nothing")


# ---------------------------------------------------------------- state scopes


def test_process_state_is_shared(sim2: mp.Simulator) -> None:
    state = proc_state_op.__get_state__(None)
    assert state is proc_state_op.__get_state__(None)
    assert state is proc_state_op.__get_state__(sim2)  # the same in every context
    state["hits"] = state.get("hits", 0) + 1
    state.update(shape=(2, 3), name="plain")
    assert proc_state_op.__get_state__(None)["hits"] >= 1
    assert "hits" not in other_proc_state_op.__get_state__(None)  # one namespace per op
    del state["name"]
    assert "name" not in state and len(state) == len(list(state))


def test_process_state_refuses_mplang_objects(sim2: mp.Simulator) -> None:
    state = proc_state_op.__get_state__(None)
    obj = runtime_object(sim2)
    with pytest.raises(FeStateError, match=r"fetest\.proc_state: .* is or holds an MPLang object"):
        state["value"] = obj
    with pytest.raises(FeStateError, match=r"fetest\.proc_state"):
        state.setdefault("value2", obj)
    assert "value" not in state and "value2" not in state

    def prog() -> Any:
        x = simp.constant((0,), 1)
        with pytest.raises(FeStateError, match="process state holds plain data only"):
            state["traced"] = x
        return x

    mp.compile(prog, world_size=2)
    assert "traced" not in state


@pytest.mark.parametrize("wrap", [lambda o: [o], lambda o: (1, o), lambda o: {"k": o},
                                  lambda o: {"deep": [(o,)]}],
                         ids=["list", "tuple", "dict", "nested"])
def test_process_state_refuses_mplang_objects_in_containers(sim2: mp.Simulator, wrap: Any
                                                            ) -> None:
    state = proc_state_op.__get_state__(None)
    with pytest.raises(FeStateError, match=r"fetest\.proc_state"):
        state["held"] = wrap(runtime_object(sim2))
    assert "held" not in state


def test_ctx_state_needs_a_context() -> None:
    with pytest.raises(FeStateError, match=r"fetest\.ctx_state: context state needs a context"):
        ctx_state_op.__get_state__(None)
    with pytest.raises(FeStateError, match=r"fetest\.ctx_state"):
        ctx_state_op.__get_state__()


def test_ctx_state_is_per_context(sim2: mp.Simulator) -> None:
    other = mp.Simulator(2)
    try:
        mine = ctx_state_op.__get_state__(sim2)
        theirs = ctx_state_op.__get_state__(other)
        assert mine is ctx_state_op.__get_state__(sim2)
        assert mine is not theirs
        obj = runtime_object(sim2)
        mine["handle"] = obj  # context state may hold runtime objects
        assert ctx_state_op.__get_state__(sim2)["handle"] is obj
        assert "handle" not in theirs
        assert "handle" not in proc_state_op.__get_state__(None)
    finally:
        other.close()


def test_op_without_state_scope_has_no_state(sim2: mp.Simulator) -> None:
    for ctx in (None, sim2):
        with pytest.raises(FeStateError, match=r"fetest\.no_state declares no state"):
            no_state_op.__get_state__(ctx)


# ---------------------------------------------------------------- compile caches


def _counting(log: list[str], key: str) -> Any:
    def compile() -> str:
        log.append(key)
        return f"compiled {key}"

    return compile


def test_compile_cache_is_a_bounded_lru() -> None:
    cache: CompileCache[str] = CompileCache("fetest.lru", 2)
    log: list[str] = []
    assert cache.get_or_compile("a", _counting(log, "a")) == "compiled a"
    assert cache.get_or_compile("b", _counting(log, "b")) == "compiled b"
    assert cache.get_or_compile("a", _counting(log, "a")) == "compiled a"  # hit; a is newest
    assert cache.get_or_compile("c", _counting(log, "c")) == "compiled c"  # evicts b
    assert cache.keys() == ["a", "c"]
    assert log == ["a", "b", "c"]
    assert cache.stats() == CacheStats("fetest.lru", size=2, limit=2, hits=1, misses=3)
    assert cache.get_or_compile("b", _counting(log, "b")) == "compiled b"  # compiled again
    assert log == ["a", "b", "c", "b"]
    assert cache.keys() == ["c", "b"]
    assert compile_caches()["fetest.lru"] == CacheStats("fetest.lru", 2, 2, 1, 4)
    cache.clear()
    assert cache.stats() == CacheStats("fetest.lru", 0, 2, 0, 0)


def test_compile_cache_limits_and_uncached_keys() -> None:
    with pytest.raises(ValueError, match="at least one entry"):
        CompileCache("fetest.empty", 0)
    cache: CompileCache[str] = CompileCache("fetest.uncached", 4)
    log: list[str] = []
    for key in (None, None, ["unhashable"], ["unhashable"]):
        cache.get_or_compile(key, _counting(log, "x"))
    assert log == ["x"] * 4  # never cached
    assert cache.stats() == CacheStats("fetest.uncached", 0, 4, 0, 0)


def test_compile_cache_caches_falsy_and_none_results() -> None:
    cache: CompileCache[Any] = CompileCache("fetest.falsy", 4)
    calls = itertools.count()
    for key, value in (("none", None), ("empty", b""), ("zero", 0)):
        for _ in range(2):
            assert cache.get_or_compile(key, lambda v=value: (next(calls), v)[1]) == value
    assert next(calls) == 3  # each compiled once
    assert cache.stats().hits == 3 and cache.stats().misses == 3


def test_compile_cache_refuses_mplang_objects(sim2: mp.Simulator) -> None:
    cache: CompileCache[Any] = CompileCache("fetest.objects", 4)
    obj = runtime_object(sim2)
    with pytest.raises(FeStateError, match=r"compile cache 'fetest\.objects'"):
        cache.get_or_compile("k", lambda: obj)
    with pytest.raises(FeStateError, match=r"compile cache 'fetest\.objects'"):
        cache.get_or_compile("k", lambda: (b"module", [obj]))
    assert cache.keys() == []


def test_builtin_compile_caches_are_listed() -> None:
    caches = compile_caches()
    assert {"tensor.run_jax", "spu.run"} <= set(caches)
    assert caches["tensor.run_jax"].limit == 4096 and caches["spu.run"].limit == 1024
    assert all(isinstance(s, CacheStats) and s.name == n for n, s in caches.items())


def cube(x: Any) -> Any:
    return x * x * x


def cube_prog() -> Any:
    x = simp.constant((0,), np.float32(2))
    return simp.pcall((0,), lambda v: tensor.run_jax(cube, v), x)


def test_run_jax_hits_its_cache_on_a_second_trace() -> None:
    before = compile_caches()["tensor.run_jax"]
    first = mp.compile(cube_prog, world_size=2)
    middle = compile_caches()["tensor.run_jax"]
    second = mp.compile(cube_prog, world_size=2)
    after = compile_caches()["tensor.run_jax"]
    assert middle.misses == before.misses + 1
    assert after.misses == middle.misses
    assert after.hits == middle.hits + 1
    assert second.to_bytes() == first.to_bytes()


def spu_affine(a: Any) -> Any:
    return a * 2 + 1


def spu_prog() -> Any:
    x = mp.device("P0")(lambda: jnp.arange(3, dtype=jnp.int32))()
    return mp.device("SP0")(spu_affine)(x)


def test_spu_run_hits_its_cache_on_a_second_trace() -> None:
    cluster = mp.ClusterSpec.simple(2)
    before = compile_caches()["spu.run"]
    first = mp.compile(spu_prog, cluster=cluster)
    middle = compile_caches()["spu.run"]
    second = mp.compile(spu_prog, cluster=cluster)
    after = compile_caches()["spu.run"]
    assert (middle.misses, after.misses, after.hits) == (
        before.misses + 1, middle.misses, middle.hits + 1)
    assert second.to_bytes() == first.to_bytes()


# ---------------------------------------------------------------- the determinism check

COUNTER = [0]


def leaky(x: Any) -> Any:
    """Depends on hidden state: each trace bakes in a new constant."""
    COUNTER[0] += 1
    return x + COUNTER[0]


def pure_shift(x: Any) -> Any:
    return x + 3


def prog_of(fn: Any) -> Any:
    def prog() -> Any:
        x = simp.constant((0,), np.float32(1))
        return simp.pcall((0,), lambda v: tensor.run_jax(fn, v), x)

    return prog


def test_determinism_check_catches_hidden_state() -> None:
    with determinism_check(), \
            pytest.raises(FeDeterminismError, match=r"tensor\.run_jax\[leaky\]: compiling the "
                                                    r"same signature twice gave different IR"):
        mp.compile(prog_of(leaky), world_size=2)


def test_determinism_check_passes_a_pure_function() -> None:
    before = compile_caches()["tensor.run_jax"].misses
    with determinism_check():
        program = mp.compile(prog_of(pure_shift), world_size=2)
    assert compile_caches()["tensor.run_jax"].misses == before + 1
    assert "tensor.run_jax" in str(program)


def test_determinism_check_passes_a_pure_spu_function() -> None:
    def prog() -> Any:
        x = mp.device("P0")(lambda: jnp.arange(3, dtype=jnp.int32))()
        return mp.device("SP0")(lambda a: a - 7)(x)

    with determinism_check():
        mp.compile(prog, cluster=mp.ClusterSpec.simple(2))


def test_determinism_check_is_off_by_default_and_scoped() -> None:
    cache: CompileCache[int] = CompileCache("fetest.determinism", 8)
    calls = itertools.count()
    assert cache.get_or_compile("a", lambda: next(calls)) == 0  # off: compiled once
    with determinism_check():
        with pytest.raises(FeDeterminismError, match="fetest thing: compiling the same"):
            cache.get_or_compile("b", lambda: next(calls), "fetest thing")
        with determinism_check(False):
            assert cache.get_or_compile("c", lambda: next(calls)) == 3
        assert cache.get_or_compile("d", lambda: 42) == 42  # stable: passes
        with pytest.raises(FeDeterminismError):
            cache.get_or_compile("e", lambda: next(calls))
    assert cache.get_or_compile("f", lambda: next(calls)) == 6
    assert cache.keys() == ["a", "c", "d", "f"]


# ---------------------------------------------------------------- routing


def test_check_route_refuses_a_ppu_op_on_an_spu() -> None:
    with pytest.raises(FeCapabilityError,
                       match=r"tensor\.pyfunc cannot run on SPU SP0: its targets are PPU"):
        check_route(tensor.pyfunc, "SP0", "SPU", True, 3)
    with pytest.raises(FeCapabilityError, match=r"spu\.run cannot run on PPU P1"):
        check_route(mp.spu.run, "P1", "PPU", False, 1)
    with pytest.raises(TypeError):  # FeCapabilityError is a TypeError
        check_route(get("tensor.run_jax"), "SP0", "SPU", True, 2)
    assert check_route(tensor.pyfunc, "P0", "PPU", False, 1) is None
    assert check_route(mp.spu.run.__feop_meta__, "SP0", "SPU", True, 2) is None


def test_check_route_by_execution_model_and_capabilities() -> None:
    with pytest.raises(FeCapabilityError, match=r"fetest\.local_anywhere cannot run on SPU S: "
                                                r"it runs on one party's plaintext"):
        check_route(local_anywhere_op, "S", "SPU", True, 2)
    for kind, joint in (("PPU", False), ("SPU", True)):  # a simp-level op: on no device
        with pytest.raises(FeCapabilityError,
                           match=rf"fetest\.joint_anywhere cannot run on {kind} X: it runs at "
                                 r"the simp level across parties, not on a device"):
            check_route(joint_anywhere_op, "X", kind, joint, 2)
    check_route(local_anywhere_op, "P", "PPU", False, 1)
    with pytest.raises(FeCapabilityError, match=r"fetest\.needs_big_spu cannot run on SPU S2: "
                                                r"it requires a device with members >=3, "
                                                r"this one has 2"):
        check_route(needs_big_spu_op, "S2", "SPU", True, 2)
    with pytest.raises(FeCapabilityError, match=r"requires a device of kind SPU"):
        check_route(needs_big_spu_op, "T", "TEE", True, 3)
    check_route(needs_big_spu_op, "S3", "SPU", True, 3)


# ---------------------------------------------------------------- config schemas


@pytest.mark.parametrize("config, message", [
    ({"bits": "8"}, r"fetest\.configured: config field 'bits' must be int, got '8'"),
    ({"bits": True}, r"fetest\.configured: config field 'bits' must be int, got True"),
    ({"bits": 8, "scale": "x"}, r"config field 'scale' must be int or float, got 'x'"),
    ({"bits": 64}, r"fetest\.configured: config field 'bits' must lie in \[1, 63\], got 64"),
    ({"bits": 0}, r"config field 'bits' must lie in \[1, 63\], got 0"),
    ({"bits": 8, "scale": -0.5}, r"config field 'scale' must lie in \[0, None\], got -0\.5"),
    ({"bits": 8, "mode": "slow"},
     r"config field 'mode' must be one of \['fast', 'exact'\], got 'slow'"),
    ({"bits": 8, "bitz": 8}, r"fetest\.configured: unknown config field\(s\) \['bitz'\]"),
    ({}, r"fetest\.configured: config field 'bits' is required"),
    ({"mode": "fast"}, r"config field 'bits' is required"),
], ids=["type", "bool-for-int", "type-union", "above-max", "below-min", "below-min-float",
        "choice", "unknown", "missing", "missing-with-others"])
def test_config_schema_validate_refuses(config: dict[str, Any], message: str) -> None:
    with pytest.raises(FeConfigError, match=message):
        SCHEMA.validate("fetest.configured", config)
    assert issubclass(FeConfigError, ValueError)


def test_config_schema_validate_fills_defaults() -> None:
    assert SCHEMA.validate("op", {"bits": 8}) == {"bits": 8, "mode": "fast", "scale": 1.0}
    assert SCHEMA.validate("op", {"bits": 63, "mode": "exact", "scale": 2}) == {
        "bits": 63, "mode": "exact", "scale": 2}


def test_feop_with_a_schema_validates_each_call() -> None:
    assert configured_op("x", bits=8) == ("x", 8, "fast", 1.0, "")
    assert configured_op("x", bits=9, mode="exact", note="n") == ("x", 9, "exact", 1.0, "n")
    with pytest.raises(FeConfigError, match=r"fetest\.configured: config field 'bits' must lie"):
        configured_op("x", bits=99)
    with pytest.raises(FeConfigError, match=r"fetest\.configured: config field 'bits' is "
                                            r"required"):
        configured_op("x")
    assert is_feop(configured_op) and configured_op.__name__ == "configured_op"


# ---------------------------------------------------------------- FeModule.simple_op


def test_simple_op_registers_a_primitive_and_a_frontend_op() -> None:
    assert is_feop(scale) and is_registered("fetest_scale.scale")
    assert scale_mod.ops == {"fetest_scale.scale": scale, "fetest_scale.split_sign": split_sign}
    d = describe("fetest_scale.scale")
    assert d["family"] == "fetest_scale" and d["execution_model"] == "single_rank"
    assert d["doc"] == "Multiply a tensor by a positive constant factor."
    assert d["example"] == "y = scale(x, factor=2.0)"
    assert d["traits"]["pure"] is True and d["traits"]["communicates"] is False
    assert "PPU" in d["routes"] and "SPU" not in d["routes"]  # single-rank: not joint
    assert [i.name for i in list_ops("fetest_scale")] == ["fetest_scale.scale",
                                                          "fetest_scale.split_sign"]


def test_simple_op_runs_its_kernel_on_the_simulator(sim2: mp.Simulator) -> None:
    data = np.array([1.5, -2.0, 3.0], dtype=np.float32)

    def prog() -> Any:
        x = simp.constant((0, 1), data)
        y = simp.pcall(None, lambda v: scale(v, factor=2.5), x)
        pos, neg = simp.pcall((1,), split_sign, y)
        return y, pos, neg

    y, pos, neg = mp.fetch(sim2, mp.evaluate(sim2, prog))
    for got in y:
        np.testing.assert_allclose(got, data * np.float32(2.5))
    assert pos[0] is None and neg[0] is None
    np.testing.assert_allclose(pos[1], np.maximum(data * 2.5, 0))
    np.testing.assert_allclose(neg[1], np.minimum(data * 2.5, 0))
    program = mp.compile(prog, world_size=2)
    ops = [op for op in program.graph.walk() if op.opcode == "fetest_scale.scale"]
    assert len(ops) == 1 and dict(ops[0].attrs) == {"factor": 2.5}
    loaded = mp.Program.from_bytes(program.to_bytes())  # a plugin op survives serde
    np.testing.assert_allclose(mp.fetch(sim2, mp.evaluate(sim2, loaded))[0][1], data * 2.5)


def test_simple_op_refuses_variadic_signatures() -> None:
    with pytest.raises(TypeError, match=r"fetest_scale\.star: a simple op's signature must be "
                                        r"explicit \(no \*args or \*\*kwargs\)"):
        @scale_mod.simple_op()
        def star(*xs: TensorType) -> TensorType:
            return xs[0]

    with pytest.raises(TypeError, match=r"fetest_scale\.kw: .*must be explicit"):
        @scale_mod.simple_op()
        def kw(x: TensorType, **attrs: Any) -> TensorType:
            return x

    assert not is_registered("fetest_scale.star") and not is_registered("fetest_scale.kw")
    with pytest.raises(KeyError):
        get("fetest_scale.star")
    with pytest.raises(ValueError, match="identifier"):
        FeModule("not a name")


def _trace(body: Any) -> None:
    def prog() -> Any:
        x = simp.constant((0, 1), np.ones(3, np.float32))
        return simp.pcall(None, body, x)

    mp.compile(prog, world_size=2)


def test_simple_op_refuses_positional_python_values() -> None:
    with pytest.raises(MPTypeError, match=r"fetest_scale\.scale: positional argument 1 must be "
                                          r"an MPLang value, got float"):
        _trace(lambda v: scale(v, 2.5))
    with pytest.raises(MPTypeError, match=r"positional argument 0 must be an MPLang value, "
                                          r"got ndarray"):
        _trace(lambda v: scale(np.ones(3, np.float32), factor=2.0))


def test_simple_op_checks_attributes_and_its_type_rule() -> None:
    with pytest.raises(MPTypeError, match=r"fetest_scale\.scale: unknown attribute\(s\) "
                                          r"\['fator'\]; it takes \['factor'\]"):
        _trace(lambda v: scale(v, fator=2.0))
    with pytest.raises(MPTypeError, match=r"fetest_scale\.scale: factor must be positive, "
                                          r"got -1"):
        _trace(lambda v: scale(v, factor=-1))
    with pytest.raises(MPTypeError, match=r"fetest_scale\.scale: .*factor"):
        _trace(lambda v: scale(v))  # the attribute is required
    with pytest.raises(MPTypeError, match=r"fetest_scale\.scale: takes 1 operands \(x\), got 2"):
        _trace(lambda v: scale(v, v, factor=1.0))


def test_simple_op_is_party_local() -> None:
    def prog() -> Any:
        return scale(simp.constant((0,), np.float32(1)), factor=2.0)

    with pytest.raises(MPTypeError, match=r"fetest_scale\.scale is a party-local op"):
        mp.compile(prog, world_size=2)
