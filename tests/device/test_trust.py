"""Whom an SPU makes users trust: the secure defaults (CHEETAH for 2 parties, ABY3
for 3 and over 3 of more) trust no dealer and warn about nothing; SEMI2K names its
Beaver source in the config, states who must be trusted, and warns once per process
(`mp.InsecureDeviceWarning`) when it is used. Each SPU's security model per protocol."""

from __future__ import annotations

import re
import warnings
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import spu.libspu as libspu

import mplang as mp
from mplang.device import kinds
from mplang.device.kinds import get_kind
from mplang.dialects.spu import SpuConfig, runtime_config_for
from tests.op_failures import assert_generic, logged_failure, traced_at

SM2_PUBLIC_KEY = """-----BEGIN PUBLIC KEY-----
MFkwEwYHKoZIzj0CAQYIKoEcz1UBgi0DQgAE7vv5wT3Fv2twn7y7xn6Fc970OLqk
BWKQ3GyhWAAQKiKNRGUznj35SL6G6eq/rcrQKpX0j+IdANuPBTa79Lsfaw==
-----END PUBLIC KEY-----
"""
"""An SM2 public key (openssl genpkey -algorithm SM2), as a Beaver service would publish."""

TFP_TRUST = ("n0 generates the Beaver triples (SEMI2K, beaver TrustedFirstParty) and can see "
             "every value opened in a multiplication; to trust no party, use CHEETAH "
             "(2 members) or ABY3 (3 members)")


def spec(n: int, config: dict[str, Any] | None) -> mp.ClusterSpec:
    """Nodes n0.., PPUs P0.. and SPU "S" over every node with ``config``."""
    devices: dict[str, Any] = {f"P{i}": {"kind": "PPU", "members": [f"n{i}"]} for i in range(n)}
    devices["S"] = {"kind": "SPU", "members": [f"n{i}" for i in range(n)], "config": config}
    return mp.ClusterSpec.from_dict({
        "nodes": [{"name": f"n{i}", "endpoint": f"127.0.0.1:{7300 + i}"} for i in range(n)],
        "devices": devices})


def ttp(**fields: Any) -> dict[str, Any]:
    return {"server_host": "127.0.0.1:9449", "server_public_key": SM2_PUBLIC_KEY, **fields}


@pytest.fixture
def fresh_warnings() -> Iterator[list[warnings.WarningMessage]]:
    """Every warning raised in the test, with the once-per-process memory cleared
    before and after (so other tests see their first warning too)."""
    kinds._WARNED.clear()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield caught
    kinds._WARNED.clear()


def insecure(caught: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in caught if issubclass(w.category, mp.InsecureDeviceWarning)]


def mul_program() -> Any:
    x = mp.put("P0", np.float32([1.5, -2.0]))
    y = mp.put("P1", np.float32([4.0, 0.5]))
    return mp.put("P0", mp.device("S")(lambda a, b: a * b)(x, y))  # @mul


# ---------------------------------------------------------------- the warning


def test_insecure_device_warning_is_exported() -> None:
    assert issubclass(mp.InsecureDeviceWarning, UserWarning)
    assert "InsecureDeviceWarning" in mp.__all__


def test_semi2k_warns_exactly_once_per_process_naming_whom_to_trust(
        fresh_warnings: list[warnings.WarningMessage]) -> None:
    cluster = spec(2, {"protocol": "SEMI2K"})
    device = cluster.device("S")
    assert get_kind("SPU").trust(device) == TFP_TRUST
    sim = mp.Simulator(cluster)
    try:
        program = mp.compile(mul_program, cluster=cluster)           # the first trace warns
        np.testing.assert_allclose(mp.fetch(sim, mp.evaluate(sim, program)), [6.0, -1.0])
        mp.compile(mul_program, cluster=cluster)                     # traced again: no more
        with sim:
            mp.device("S")(lambda a: a + 1)(mp.put("P1", np.float32(1)))  # eager: no more
    finally:
        sim.close()
    assert insecure(fresh_warnings) == [f"SPU 'S': {TFP_TRUST}"]
    (warning,) = [w for w in fresh_warnings if issubclass(w.category, mp.InsecureDeviceWarning)]
    assert warning.filename == __file__  # points at the user's line, not into mplang


def test_the_warning_can_be_made_an_error(fresh_warnings: list[warnings.WarningMessage]) -> None:
    warnings.simplefilter("error", mp.InsecureDeviceWarning)
    with pytest.raises(mp.InsecureDeviceWarning, match="n0 generates the Beaver triples"):
        mp.compile(mul_program, cluster=spec(2, {"protocol": "SEMI2K"}))


@pytest.mark.parametrize("n", [2, 3, 4])
def test_default_clusters_trust_no_dealer_and_warn_nothing(
        n: int, fresh_warnings: list[warnings.WarningMessage]) -> None:
    cluster = mp.ClusterSpec.simple(n)
    assert get_kind("SPU").trust(cluster.device("SP0")) is None
    sim = mp.Simulator(cluster)
    try:
        out = mp.evaluate(sim, lambda: mp.put(f"P{n - 1}", mp.device("SP0")(
            lambda a, b: a * b)(mp.put("P0", np.int32(6)), mp.put(f"P{n - 1}", np.int32(7)))))
        assert int(mp.fetch(sim, out)) == 42
    finally:
        sim.close()
    assert insecure(fresh_warnings) == []


@pytest.mark.parametrize(("n", "protocol"), [(2, "CHEETAH"), (3, "ABY3")])
def test_explicit_secure_protocols_warn_nothing(
        n: int, protocol: str, fresh_warnings: list[warnings.WarningMessage]) -> None:
    mp.compile(mul_program, cluster=spec(n, {"protocol": protocol}))
    assert insecure(fresh_warnings) == []


# ---------------------------------------------------------------- defaults and config


@pytest.mark.parametrize(("n", "protocol"), [(2, "CHEETAH"), (3, "ABY3")])
def test_an_spu_without_protocol_gets_the_secure_default(n: int, protocol: str) -> None:
    cluster = spec(n, None)
    config = SpuConfig.of(cluster, cluster.device("S"))
    assert (config.protocol, config.beaver) == (protocol, "")
    assert (config.attrs()["beaver"], config.attrs()["ttp"]) == ("", None)


def test_four_members_must_name_a_protocol() -> None:
    with pytest.raises(mp.ClusterSpecError, match="4 members and no protocol"):
        spec(4, None)
    cluster = spec(4, {"protocol": "SEMI2K"})  # SEMI2K on 4: the first member deals
    assert get_kind("SPU").trust(cluster.device("S")).startswith("n0 generates")


def test_semi2k_defaults_to_and_records_its_beaver_source(
        fresh_warnings: list[warnings.WarningMessage]) -> None:
    cluster = spec(2, {"protocol": "SEMI2K"})
    config = SpuConfig.of(cluster, cluster.device("S"))
    assert config.beaver == "TrustedFirstParty"
    assert config.attrs()["beaver"] == "TrustedFirstParty"
    assert SpuConfig.from_attrs(config.attrs()) == config
    text = str(mp.compile(mul_program, cluster=cluster))
    assert "beaver='TrustedFirstParty'" in text
    unnamed = {**config.attrs(), "beaver": ""}  # SEMI2K naming no Beaver source
    assert SpuConfig.from_attrs(unnamed).beaver == "TrustedFirstParty"
    lib = runtime_config_for(config)
    assert lib.beaver_type == libspu.RuntimeConfig.BeaverType.TrustedFirstParty


BAD_CONFIGS = {
    "beaver on CHEETAH": (2, {"protocol": "CHEETAH", "beaver": "TrustedFirstParty"},
                          "SEMI2K only"),
    "beaver on a default": (3, {"beaver": "TrustedFirstParty"}, "SEMI2K only"),
    "MultiParty": (2, {"protocol": "SEMI2K", "beaver": "MultiParty"}, "not available"),
    "unknown beaver": (2, {"protocol": "SEMI2K", "beaver": "Dealer"}, "unknown beaver"),
    "ttp without TTP": (2, {"protocol": "SEMI2K", "ttp": ttp()}, "TrustedThirdParty"),
    "TTP without ttp": (2, {"protocol": "SEMI2K", "beaver": "TrustedThirdParty"}, "'ttp'"),
    "ttp unknown key": (2, {"protocol": "SEMI2K", "beaver": "TrustedThirdParty",
                            "ttp": ttp(ssl_config={})}, "ssl_config"),
    "ttp no host": (2, {"protocol": "SEMI2K", "beaver": "TrustedThirdParty",
                        "ttp": ttp(server_host="")}, "server_host"),
    "ttp key not PEM": (2, {"protocol": "SEMI2K", "beaver": "TrustedThirdParty",
                            "ttp": ttp(server_public_key="/etc/key.pem")}, "PEM"),
    "ttp schema": (2, {"protocol": "SEMI2K", "beaver": "TrustedThirdParty",
                       "ttp": ttp(asym_crypto_schema="RSA")}, "asym_crypto_schema"),
    "ttp adjust rank": (2, {"protocol": "SEMI2K", "beaver": "TrustedThirdParty",
                            "ttp": ttp(adjust_rank=2)}, "adjust_rank"),
    "ttp transport": (2, {"protocol": "SEMI2K", "beaver": "TrustedThirdParty",
                          "ttp": ttp(transport_protocol="grpc")}, "transport_protocol"),
}


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_beaver_config_is_validated(case: str) -> None:
    n, config, fragment = BAD_CONFIGS[case]
    with pytest.raises(mp.ClusterSpecError, match="'S'") as err:
        spec(n, config)
    assert fragment in str(err.value)


def test_trusted_third_party_config_reaches_libspu(
        fresh_warnings: list[warnings.WarningMessage]) -> None:
    cluster = spec(2, {"protocol": "SEMI2K", "beaver": "TrustedThirdParty",
                       "ttp": ttp(adjust_rank=1, transport_protocol="h2")})
    device = cluster.device("S")
    statement = get_kind("SPU").trust(device)
    assert statement is not None and "127.0.0.1:9449" in statement and "n0, n1" in statement
    config = SpuConfig.of(cluster, device)
    assert config.attrs()["ttp"] == ttp(adjust_rank=1, transport_protocol="h2",
                                        asym_crypto_schema="SM2")
    assert SpuConfig.from_attrs(config.attrs()) == config
    lib = runtime_config_for(config)
    assert lib.beaver_type == libspu.RuntimeConfig.BeaverType.TrustedThirdParty
    assert (lib.protocol, lib.field) == (libspu.ProtocolKind.SEMI2K, libspu.FieldType.FM64)
    raw = lib.SerializeToString()
    assert b"127.0.0.1:9449" in raw and SM2_PUBLIC_KEY.encode() in raw and b"h2" in raw
    mp.compile(mul_program, cluster=cluster)
    assert insecure(fresh_warnings) == [f"SPU 'S': {statement}"]


def test_trusted_third_party_is_asked_for_the_triples(
        fresh_warnings: list[warnings.WarningMessage], caplog: pytest.LogCaptureFixture) -> None:
    """With no Beaver service listening, libspu's SEMI2K calls the configured one (its
    adjust RPC fails to connect): the config reaches the runtime. A real service is not
    run here (libspu's Python package ships none). libspu's error stays in n0's log."""
    cluster = spec(2, {"protocol": "SEMI2K", "beaver": "TrustedThirdParty",
                       "ttp": ttp(server_host="127.0.0.1:1")})
    sim = mp.Simulator(cluster, timeout=2)
    try:
        with pytest.raises(mp.MPRuntimeError) as info:
            mp.fetch(sim, mp.evaluate(sim, mul_program))
    finally:
        sim.close()
    at = traced_at(__file__, "mul")
    assert_generic(info.value, "spu.run", at, 0, node="n0")
    assert re.search(r"RpcCall failed.*127\.0\.0\.1:1",
                     logged_failure(caplog, "spu.run", at, "n0"))


# ---------------------------------------------------------------- security models


@pytest.mark.parametrize(("n", "config", "fragments"), [
    (2, {"protocol": "CHEETAH"}, ["semi-honest", "no dealer"]),
    (3, {"protocol": "ABY3"}, ["semi-honest", "honest majority", "any two together"]),
    (2, {"protocol": "SEMI2K"}, ["semi-honest", "trusted Beaver source"]),
])
def test_security_model_is_stated_per_protocol(n: int, config: dict[str, Any],
                                               fragments: list[str]) -> None:
    model = get_kind("SPU").security_model_of(spec(n, config).device("S"))
    for fragment in fragments:
        assert fragment in model, (fragment, model)


def test_describe_states_each_routes_security_model() -> None:
    d = mp.describe("spu.run")
    assert d["routes"] == ["SPU"]
    assert "semi-honest" in d["security"]["SPU"] and "honest majority" in d["security"]["SPU"]
    assert "sees everything" in mp.describe("tensor.run_jax")["security"]["PPU"]


def test_security_doc_specs_are_valid() -> None:
    """The cluster specs of ``docs/security.md`` load, and state what the doc says."""
    import re
    from pathlib import Path

    import yaml

    doc = (Path(__file__).resolve().parents[2] / "docs" / "security.md").read_text()
    blocks = re.findall(r"^( *)```yaml\n(.*?)^\1```$", doc, re.S | re.M)
    assert len(blocks) == 2
    beavers = []
    for indent, body in blocks:
        body = "\n".join(line[len(indent):] for line in body.splitlines())
        device = mp.ClusterSpec.from_dict(yaml.safe_load(body)).device("SP0")
        beavers.append(device.config["beaver"])
        assert get_kind("SPU").trust(device) is not None
    assert beavers == ["TrustedFirstParty", "TrustedThirdParty"]
    assert TFP_TRUST.replace("n0", "node_0").split(";")[0] in " ".join(doc.split())
