"""``import mplang`` stays light: heavy libraries are imported where they are used (in
kernels, codecs and functions), each check run in a fresh process."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys
import tomllib
from importlib import metadata

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


def extras_modules() -> tuple[str, ...]:
    """The top-level modules of the libraries ``pyproject.toml``'s feature extras install
    (every extra but ``test`` and ``bench``): a dialect's extra brings its library here."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    wanted = {re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")
              for name, reqs in extras.items() if name not in ("test", "bench")
              for req in reqs if not req.startswith("mplang")}
    return tuple(sorted(module for module, dists in metadata.packages_distributions().items()
                        if any(d.lower().replace("_", "-") in wanted for d in dists)))


LAZY = ("pyarrow", "duckdb", "graphviz", "yaml", "importlib.metadata",
        "cryptography.hazmat.primitives.ciphers.aead", "cryptography.hazmat.primitives.kdf.hkdf",
        "cryptography.x509", "cryptography.hazmat.primitives.serialization", "spu",
        "spu.libspu", "asyncio", "uvloop", "multiprocessing", *extras_modules())
"""Modules that ``import mplang`` must not load. (Not ``ssl``: jax's profiler loads it.)"""


def test_the_extras_libraries_are_lazy() -> None:
    assert "heu" in LAZY, extras_modules()  # the phe extra's sf-heu


def lazy_loaded_after(code: str) -> list[str]:
    """The modules of `LAZY` in ``sys.modules`` after running ``code`` in a fresh process."""
    script = f"import sys\n{code}\nprint(','.join(m for m in {LAZY!r} if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                            text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stderr
    return [m for m in result.stdout.strip().split(",") if m]


def test_importing_mplang_loads_no_heavy_library() -> None:
    assert lazy_loaded_after("import mplang") == []


PROGRAM = """
import jax.numpy as jnp
def prog(a):
    x = mplang.simp.constant((0,), a)
    y = mplang.simp.pcall((0,), lambda v: mplang.tensor.run_jax(jnp.square, v), x)
    return mplang.simp.shuffle_static(y, {1: 0})
mplang.compile(prog, 3, world_size=3).to_dot()
"""
KEYGEN = """
import tempfile
from mplang.cluster.identity import keygen
with tempfile.TemporaryDirectory() as d:
    keygen("alice", d)
"""
SPU_CONFIG = "from mplang.dialects.spu import runtime_config\nruntime_config('SEMI2K', 'FM64', 0)"
SANDBOX = """
import json
from mplang.runtime.sandbox import NativePayloadChecker
checker = NativePayloadChecker(json.loads, "json")
checker.check(b"[1]", "op")
checker.close()
"""


USES = [
    ("from mplang.dialects.table_arrow import arrow_type\narrow_type('int64')", "pyarrow"),
    ("from mplang.dialects.table_sql import sql_connection\nsql_connection().close()",
     "duckdb"),
    (PROGRAM, "graphviz"),
    ("from mplang.kernels.phe import heu\nheu()", "heu"),
    ("mplang.policy.Policy.parse('drivers: [alice]')", "yaml"),
    ("mplang.frontend.plugins.discover()", "importlib.metadata"),
    ("from mplang.kernels.crypto import aes_gcm_seal\naes_gcm_seal(bytes(32), b'x', b'')",
     "cryptography.hazmat.primitives.ciphers.aead"),
    ("from mplang.kernels.crypto import hkdf_sha256\nhkdf_sha256(b'k', b'', 16)",
     "cryptography.hazmat.primitives.kdf.hkdf"),
    (KEYGEN, "cryptography.x509"),
    (KEYGEN, "cryptography.hazmat.primitives.serialization"),
    (SPU_CONFIG, "spu"),
    (SPU_CONFIG, "spu.libspu"),
    ("from mplang.transport.mux_client import MuxClients", "asyncio"),
    ("from mplang.transport.mux_client import MuxClients", "uvloop"),
    (SANDBOX, "multiprocessing"),
]
"""Code that needs a library of `LAZY`, and the library."""


@pytest.mark.parametrize(("code", "library"), USES, ids=[library for _, library in USES])
def test_the_code_that_needs_a_library_loads_it(code: str, library: str) -> None:
    """The check above can fail: using what needs a library loads it."""
    assert library in lazy_loaded_after("import mplang\nimport mplang.policy\n"
                                        "import mplang.frontend.plugins\n" + code)


def test_a_table_crosses_the_wire_when_pyarrow_is_imported_after_mplang() -> None:
    """The table codec names its class, so it applies to tables made after it registered."""
    code = ("import mplang\nimport pyarrow as pa\nfrom mplang.transport import wire\n"
            "t = pa.table({'a': [1, 2]})\ndata = wire.encode_value_bytes(t)\n"
            "assert wire.split_frame(data)[0]['kind'] == 'table.table'\n"
            "assert wire.decode_value(data).equals(t)\n"
            "assert wire.payload_bytes(t) == sum(wire.split_frame(data)[0]['sizes'])\n"
            "assert [c.cls for c in wire.value_codecs() if c.kind == 'table.table'] == "
            "[pa.Table]")
    assert "pyarrow" in lazy_loaded_after(code)


def test_a_codec_named_by_class_is_refused_twice() -> None:
    import mplang.kernels.table_wire  # noqa: F401  (it registers the table codec)
    from mplang.dialects.table import TableType
    from mplang.transport.wire import ValueCodec, register_value_codec

    with pytest.raises(ValueError, match=r"a value codec for 'table\.table' / Table exists"):
        register_value_codec(ValueCodec(TableType, "pyarrow.lib.Table", list, list))


def test_the_mock_vendor_key_is_the_public_key_of_its_seed() -> None:
    """``MOCK_VENDOR_PUBLIC_KEY`` is written out (no cryptography at import): it must stay
    the public key of ``MOCK_VENDOR_SEED``."""
    from mplang.kernels.crypto import ed25519_public
    from mplang.kernels.tee import MOCK_VENDOR_PUBLIC_KEY, MOCK_VENDOR_SEED

    assert ed25519_public(MOCK_VENDOR_SEED).hex() == MOCK_VENDOR_PUBLIC_KEY
