"""Size bounds of received messages (`declared_bytes`, what a worker admits for a value
of a type) against real values of every device kind: libspu shares of every protocol,
field and dtype, sf-heu ciphertexts of every scheme, and plaintext tensors. A bound
below a real value made a worker refuse an honest peer's message."""

from __future__ import annotations

import numpy as np
import pytest

from mplang.dialects.spu import SecretShareType, SpuConfig, io_for
from mplang.edsl.typing import TensorType
from mplang.kernels.spu.run import SpuShare
from mplang.transport.wire import encode_value
from mplang.worker.executions import declared_bytes

SHAPE = (1000,)
DTYPES = ["bool", "int8", "int16", "int32", "int64", "float32", "float64"]
PROTOCOLS = [("SEMI2K", 2), ("SEMI2K", 3), ("CHEETAH", 2), ("ABY3", 3)]


def _wire_size(value: object) -> int:
    return sum(memoryview(p).nbytes for p in encode_value(value))


@pytest.mark.parametrize("protocol, parties", PROTOCOLS)
@pytest.mark.parametrize("field", ["FM32", "FM64", "FM128"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_a_share_never_exceeds_its_type_s_bound(protocol: str, parties: int, field: str,
                                                dtype: str) -> None:
    import spu.libspu as libspu

    if field == "FM32" and dtype in ("int64", "float64"):
        pytest.skip("libspu does not share 64-bit values in a 32-bit ring")
    config = SpuConfig("SP0", tuple(range(parties)), protocol, field)
    value = np.ones(SHAPE, dtype=dtype)
    shares = io_for(config).make_shares(value, libspu.Visibility.VIS_SECRET)
    bound = declared_bytes(SecretShareType("spu", TensorType(dtype, SHAPE)))
    sizes = [_wire_size(SpuShare(s)) for s in shares]
    assert max(sizes) <= bound, (sizes, bound)


@pytest.mark.parametrize("scheme", ["paillier", "ou"])
@pytest.mark.parametrize("key_bits", [1024, 2048, 4096])
def test_a_ciphertext_and_its_key_never_exceed_their_types_bounds(scheme: str,
                                                                  key_bits: int) -> None:
    pytest.importorskip("heu", reason="the phe extra (sf-heu) is not installed")
    from mplang.dialects.phe import Ciphertext, PublicKey
    from mplang.kernels import phe as phe_impl

    phe, hnp = phe_impl.heu()
    kit = hnp.setup(getattr(phe.SchemaType, {"paillier": "ZPaillier", "ou": "OU"}[scheme]),
                    key_bits)
    public = phe_impl.PhePublicKey(scheme, key_bits, kit.public_key().serialize(), kit)
    ctype = Ciphertext("float32", (100,), "k0", 1 << 24)
    x = np.linspace(-1e6, 1e6, 100).astype(np.float32)
    plain = phe_impl.encode(kit, "test", x, ctype.shape, ctype.scale)
    c = phe_impl.PheCiphertext(kit.encryptor().encrypt(plain), public)
    assert _wire_size(c) <= declared_bytes(ctype)
    assert _wire_size(public) <= declared_bytes(PublicKey(scheme, key_bits, "k0"))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_tensor_never_exceeds_its_type_s_bound(dtype: str) -> None:
    value = np.ones(SHAPE, dtype=dtype)
    assert _wire_size(value) <= declared_bytes(TensorType(dtype, SHAPE)) + 4096
