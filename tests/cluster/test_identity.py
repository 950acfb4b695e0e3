"""Party identities and the specs that list them: keys stay with their owner, specs
hold certificates only, and two copies of a spec agree exactly when their digests do."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import pytest
import yaml

import mplang as mp
from mplang.cluster.identity import (
    IdentityError,
    format_fingerprint,
    keygen,
    load_certificate,
    load_identity,
)
from mplang.cluster.local import init_cluster


def test_keygen_writes_a_private_key_and_a_certificate(tmp_path: Path) -> None:
    cert = keygen("org_a", tmp_path, days=30)
    assert (tmp_path / "org_a.key").stat().st_mode & 0o777 == 0o600
    assert load_certificate(str(tmp_path / "org_a.crt")) == cert
    assert cert.subject == "org_a" and len(cert.fingerprint) == 64
    assert (cert.not_after - cert.not_before).days in (29, 30)
    assert format_fingerprint("ab01" * 16).startswith("AB:01:AB:01")
    with pytest.raises(IdentityError, match="already exists"):
        keygen("org_a", tmp_path)
    with pytest.raises(IdentityError, match="invalid identity name"):
        keygen("../evil", tmp_path)


def test_a_key_others_can_read_is_refused(tmp_path: Path) -> None:
    keygen("org_a", tmp_path)
    (tmp_path / "org_a.key").chmod(0o644)
    with pytest.raises(IdentityError, match="chmod 600"):
        load_identity(tmp_path / "org_a.key")


def test_a_key_that_does_not_match_its_certificate_is_refused(tmp_path: Path) -> None:
    keygen("a", tmp_path)
    keygen("b", tmp_path)
    with pytest.raises(IdentityError, match="is not the key of certificate"):
        load_identity(tmp_path / "a.key", tmp_path / "b.crt")


def test_a_local_identity_never_leaves_its_process(tmp_path: Path) -> None:
    keygen("org_a", tmp_path)
    identity = load_identity(tmp_path / "org_a.key")
    with pytest.raises(TypeError, match="never leaves its owner"):
        pickle.dumps(identity)
    with pytest.raises(TypeError):
        copy.deepcopy(identity)
    assert "BEGIN" not in repr(identity)


def _spec_data(tmp_path: Path) -> dict:
    path = init_cluster(2, tmp_path)
    return yaml.safe_load(path.read_text())


def test_a_spec_never_holds_a_private_key(tmp_path: Path) -> None:
    data = _spec_data(tmp_path)
    data["nodes"][0]["key"] = "keys/node_0.key"
    with pytest.raises(mp.ClusterSpecError, match="never holds a private key"):
        mp.ClusterSpec.from_dict(data, tmp_path)


def test_two_parties_cannot_share_a_certificate(tmp_path: Path) -> None:
    data = _spec_data(tmp_path)
    data["nodes"][1]["certificate"] = data["nodes"][0]["certificate"]
    with pytest.raises(mp.ClusterSpecError, match="have the same certificate"):
        mp.ClusterSpec.from_dict(data, tmp_path)


def test_a_certificate_that_is_not_one_names_its_owner(tmp_path: Path) -> None:
    data = _spec_data(tmp_path)
    data["drivers"][0]["certificate"] = "-----BEGIN CERTIFICATE-----\nnope\n"
    with pytest.raises(mp.ClusterSpecError, match="driver 'driver': certificate"):
        mp.ClusterSpec.from_dict(data, tmp_path)


def test_spec_digests_agree_exactly_when_the_specs_do(tmp_path: Path) -> None:
    data = _spec_data(tmp_path)
    spec = mp.ClusterSpec.from_dict(data, tmp_path)
    inline = mp.ClusterSpec.from_dict(spec.to_dict())  # PEM inline instead of paths
    assert inline.digest() == spec.digest()
    keygen("other", tmp_path)
    changed = copy.deepcopy(data)
    changed["drivers"][0]["certificate"] = "other.crt"
    assert mp.ClusterSpec.from_dict(changed, tmp_path).digest() != spec.digest()
    changed = copy.deepcopy(data)
    changed["devices"]["SP0"]["config"]["field"] = "FM128"
    assert mp.ClusterSpec.from_dict(changed, tmp_path).digest() != spec.digest()


def test_init_writes_a_development_cluster_that_says_so(tmp_path: Path) -> None:
    path = init_cluster(3, tmp_path)
    text = path.read_text()
    assert "development on ONE machine" in text and "mplang keygen" in text
    spec = mp.ClusterSpec.from_yaml(path)
    assert [n.name for n in spec.nodes] == ["node_0", "node_1", "node_2"]
    assert [d.name for d in spec.drivers] == ["driver"]
    assert all(n.certificate is not None for n in spec.nodes)
    for name in ("node_0", "node_1", "node_2", "driver"):
        assert (tmp_path / "keys" / f"{name}.key").stat().st_mode & 0o777 == 0o600
    assert spec.device("SP0").config["protocol"] == "ABY3"
