"""A TEE under the policies `mplang init` writes, in the simulator (node_0 and node_1 own
the data, node_2 hosts the enclave T0, attestation SIMULATED): a party's data sealed to
an enclave whose quote it checked stays p's inside the attested computation; what
leaves the enclave is judged at the receiver; anything else the host does with the
opened data is plaintext at the host."""

from __future__ import annotations

import re
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import jax.numpy as jnp
import numpy as np
import pytest

import mplang as mp
from mplang import crypto, simp, tensor
from mplang.cluster.local import write_dev_policies
from mplang.device.tee import computation_digest
from mplang.dialects import tee

SPEC = mp.ClusterSpec.from_dict({
    "nodes": [{"name": f"node_{i}", "endpoint": f"127.0.0.1:{61970 + i}"} for i in range(3)],
    "devices": {**{f"P{i}": {"kind": "PPU", "members": [f"node_{i}"]} for i in range(3)},
                "T0": {"kind": "TEE", "members": ["node_2"], "config": {"attestation": "mock"}}}})
DATA = [np.arange(20, dtype=np.float32) * (i + 1) + 0.5 for i in range(2)]


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[mp.Simulator]:
    out = tmp_path_factory.mktemp("cluster")
    write_dev_policies(SPEC, out)
    roots = {f"node_{i}": tmp_path_factory.mktemp(f"node_{i}") for i in range(3)}
    for i in range(2):
        np.save(roots[f"node_{i}"] / "x.npy", DATA[i])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)
        with mp.Simulator(SPEC, data_roots={n: str(r) for n, r in roots.items()},
                          policies={n: str(out / "policies" / f"{n}.yaml")
                                    for n in roots}) as s:
            yield s


def load(i: int) -> Any:
    return mp.device(f"P{i}")(lambda: tensor.load("x.npy"))()


def on_t0(fn: Callable[..., Any]) -> Callable[[], Any]:
    return lambda: mp.put("P0", mp.device("T0")(fn)(load(0), load(1)))


def refusal(sim: mp.Simulator, program: Callable[[], Any], **kwargs: Any) -> str:
    with pytest.raises(mp.MPRefusedError) as caught, warnings.catch_warnings():
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)
        mp.evaluate(sim, program, **kwargs)
    message = str(caught.value)
    assert message.startswith(("node_0 refuses the program: ",
                               "node_1 refuses the program: ")), message
    return message


def test_sums_inside_the_enclave_are_released(sim: mp.Simulator) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", mp.InsecureDeviceWarning)
        got = mp.fetch(sim, mp.evaluate(sim, on_t0(lambda a, b: jnp.sum(a) + jnp.mean(b))))
    assert float(got) == pytest.approx(float(DATA[0].sum() + DATA[1].mean()), rel=1e-6)


def test_rows_leaving_the_enclave_are_refused_at_the_receiver(sim: mp.Simulator) -> None:
    message = refusal(sim, lambda: mp.put("P0", mp.device("T0")(lambda b: b * 2)(load(1))))
    assert message.startswith("node_1 refuses the program: op crypto.aes_decrypt at "
                              "test_tee_flows.py:"), message
    assert "sends the plaintext it decrypts, row-wise (raw) values of x.npy, to node_0" \
        in message, message


def test_the_host_cannot_use_opened_data_outside_the_attested_computation(
        sim: mp.Simulator) -> None:
    """The driver has node_1 check a quote for a sum, then has the TEE's host take one
    row of what the enclave opened: node_1 sees a region that is not the attested one."""
    def total(x: Any) -> Any:
        return jnp.sum(x)

    def program() -> Any:
        x = load(1)
        digest = computation_digest(3, 2, lambda v: tensor.run_jax(total, v), [x])
        pk, sk = simp.pcall((2,), crypto.x25519_keygen)
        quote = simp.pcall((2,), lambda k: tee.mock_quote(crypto.public_bytes(k),
                                                          computation=digest), pk)
        checked = simp.pcall((1,), lambda q: tee.verify_quote(q, computation=digest),
                             simp.shuffle_static(quote, {1: 2}))

        def seal(v: Any, k: Any) -> Any:
            epk, esk = crypto.x25519_keygen()
            key = crypto.hkdf(crypto.x25519_shared(esk, k), info=b"t")
            return crypto.aes_encrypt(v, key), epk

        c, epk = simp.pcall((1,), seal, x, checked)
        c, epk = simp.shuffle_static(c, {2: 1}), simp.shuffle_static(epk, {2: 1})
        opened = simp.pcall((2,), lambda cc, e, s: crypto.aes_decrypt(
            cc, crypto.hkdf(crypto.x25519_shared(s, e), info=b"t"), like=DATA[1]), c, epk, sk)
        return simp.pcall((2,), lambda v: v[3], opened)  # the host's own region

    message = refusal(sim, program)
    assert "sends data an attested enclave opened, used outside its attested computation, " \
        "row-wise (raw) values of x.npy, to node_2" in message, message


def test_standard_mode_judges_sealed_data_as_its_plaintext(sim: mp.Simulator) -> None:
    message = refusal(sim, on_t0(lambda a, b: jnp.sum(a) + jnp.sum(b)), mode="standard")
    # parties 0 and 1 both send their rows: whichever refuses first is named
    assert re.search(r"sends the value party [01] sends, row-wise \(raw\) values of x\.npy, "
                     "to node_2", message), message
