"""The mistakes a newcomer makes most, each with the exact message it gets.

Every case is a user's program, written to ``prog.py`` in a fresh folder and run
there as a script, so a message's source line is a real line of a real file: the
line marked ``# <- error`` (``{line}`` in the expected message), and for a
function that JAX rejected, the line marked ``# <- raised`` (``{raised}``). Each
message says what happened, where (that line, or the node, device or file), and
what to do instead.
"""

from __future__ import annotations

import hashlib
import re
import runpy
import shutil
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import mplang as mp
from mplang.cluster.identity import IdentityError, keygen, load_certificate
from mplang.cluster.local import free_ports, write_dev_cluster
from mplang.device.cluster import ClusterSpecError
from mplang.edsl.errors import MPConcreteValueError
from mplang.storage.data_root import MissingData
from tests.worker.support import running_cluster


@dataclass(frozen=True)
class Mistake:
    """A user's program (``source``), the exception class it raises and its message."""

    source: str
    error: type[Exception]
    message: str


MISTAKES: dict[str, Mistake] = {
    "device function called outside a program": Mistake(
        """
        import jax.numpy as jnp
        import mplang as mp

        one = mp.device("P0")(lambda: jnp.int32(1))()  # <- error
        """,
        mp.MPTraceError,
        "device('P0')(<lambda>) needs a context: it was called outside any MPLang program, so "
        "nothing traces or runs it; call it inside an @mp.function that you run with "
        "mp.evaluate(sim, fn, ...) or mp.compile(fn, ..., world_size=N), or inside `with sim:` "
        "(at prog.py:{line})"),
    "mp.function called like a Python function": Mistake(
        """
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog():
            return simp.constant((0,), 1)


        prog()  # <- error
        """,
        mp.MPTraceError,
        "prog needs a context: it was called outside any MPLang program, so nothing traces or "
        "runs it; call it inside an @mp.function that you run with mp.evaluate(sim, fn, ...) or "
        "mp.compile(fn, ..., world_size=N), or inside `with sim:` (at prog.py:{line})"),
    "Python if on a traced value": Mistake(
        """
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog():
            x = simp.constant((0, 1, 2), 3)
            if x > 2:  # <- error
                return x
            return x + 1


        mp.evaluate(mp.Simulator(3), prog)
        """,
        MPConcreteValueError,
        "Python `if`/`while`/`and`/`or`/`not` needs the truth value of "
        "TraceObject(%3: bool[]@{0,1,2}), a traced value known only when the program runs; "
        "branch with simp.uniform_cond(pred, then_fn, else_fn, *args), loop with "
        "simp.while_loop(cond_fn, body_fn, init), or select with jnp.where(pred, a, b) inside a "
        "device function (at prog.py:{line})"),
    "Python if inside a device function": Mistake(
        """
        import jax.numpy as jnp
        import mplang as mp


        def clip(a):
            if a > 2:  # <- error
                return a
            return a + 1


        @mp.function
        def prog():
            x = mp.device("P0")(lambda: jnp.int32(3))()
            return mp.device("P0")(clip)(x)


        mp.evaluate(mp.Simulator(3), prog)
        """,
        MPConcreteValueError,
        "Python `if`/`while`/`and`/`or`/`not` needs the truth value of TraceObject(%4: bool[]), "
        "a traced value of a device function or pcall body, known only when the program runs; "
        "select with jnp.where(pred, a, b) or branch with jax.lax.cond(pred, true_fn, false_fn, "
        "*args) (at prog.py:{line})"),
    "Python for over a traced value": Mistake(
        """
        import numpy as np
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog():
            x = simp.constant((0,), np.arange(3))
            total = 0
            for v in x:  # <- error
                total = total + v
            return total


        mp.evaluate(mp.Simulator(3), prog)
        """,
        MPConcreteValueError,
        "Python `for` and unpacking cannot iterate over TraceObject(%0: i32[3]@{0}), a traced "
        "value known only when the program runs; index it explicitly (x[i] for i in "
        "range(len(x))), or loop inside a device function (at prog.py:{line})"),
    "int() of a traced value": Mistake(
        """
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog():
            n = simp.constant((0,), 3)
            return [simp.constant((0,), i) for i in range(int(n))]  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        MPConcreteValueError,
        "int() needs the value of TraceObject(%0: i32[]@{0}), a traced value known only when "
        "the program runs; compute with it inside a device function or simp.pcall body (with "
        "jax.numpy), and bring results to Python with mp.fetch after mp.evaluate "
        "(at prog.py:{line})"),
    "Python if on a comparison of secret values": Mistake(
        """
        import jax.numpy as jnp
        import mplang as mp


        @mp.function
        def prog():
            x = mp.put("SP0", mp.device("P0")(lambda: jnp.float32(1.0))())
            y = mp.put("SP0", mp.device("P1")(lambda: jnp.float32(2.0))())
            if x > y:  # <- error
                return x
            return y


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTypeError,
        "operator `>` on SP0's value share<spu,f32[]>, which no party can read: Python code "
        "outside a device function cannot compute or branch on it; compute inside SP0's device "
        "function, e.g. mp.device('SP0')(lambda a, b: jnp.where(a > b, a, b))(x, y), or reveal "
        "the result to the parties first (mp.put('P0', z)) and branch there with "
        "simp.uniform_cond (at prog.py:{line})"),
    "arithmetic on a secret value outside its device function": Mistake(
        """
        import jax.numpy as jnp
        import mplang as mp


        @mp.function
        def prog():
            x = mp.put("SP0", mp.device("P0")(lambda: jnp.float32(1.0))())
            return x * 2  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTypeError,
        "operator `*` on SP0's value share<spu,f32[]>, which no party can read: Python code "
        "outside a device function cannot compute or branch on it; compute inside SP0's device "
        "function, e.g. mp.device('SP0')(lambda a, b: a * b)(x, y), or reveal the result to the "
        "parties first (mp.put('P0', z)) and branch there with simp.uniform_cond "
        "(at prog.py:{line})"),
    "table.to_tensor and jnp in one device function": Mistake(
        """
        import jax.numpy as jnp
        import pyarrow as pa
        import mplang as mp
        from mplang import table


        @mp.function
        def prog():
            t = mp.device("P0")(lambda: table.constant(pa.table({"x": [1.0, 2.0]})))()
            total = mp.device("P0")(lambda t: jnp.sum(table.to_tensor(t, ["x"])))
            return total(t)  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTypeError,
        "device 'P0' (<lambda>): simp.pcall: body '<lambda>' gave a JAX function the result of "
        "an MPLang op on its table<x:f64>[2] input (TypeError: Argument 'TraceObject(%4: "
        "f32[2,1])' of type <class 'mplang.edsl.tracer.TraceObject'> is not a valid JAX "
        "type.); one device function cannot mix the two: convert in one device function and "
        "compute with jax.numpy in the next, e.g. m = mp.device(D)(lambda t: "
        "table.to_tensor(t, columns))(t), then mp.device(D)(lambda m: jnp.sum(m))(m) "
        "(at prog.py:{line})"),
    "a certificate file passed as the driver's key": Mistake(
        """
        import mplang as mp
        from mplang.cluster.local import init_cluster

        init_cluster(3, "dev")
        drv = mp.Driver("dev/cluster.yaml", key="dev/keys/driver.crt")  # <- error
        """,
        IdentityError,
        "dev/keys/driver.crt is a certificate (of 'driver', sha256 {driver.crt}...), not a "
        "private key: pass dev/keys/driver.key (the key is the file mplang keygen wrote as "
        "NAME.key)"),
    "the cluster spec passed as the driver's key": Mistake(
        """
        import mplang as mp
        from mplang.cluster.local import init_cluster

        init_cluster(3, "dev")
        drv = mp.Driver("dev/cluster.yaml", key="dev/cluster.yaml")  # <- error
        """,
        IdentityError,
        "dev/cluster.yaml is not a PEM private key: pass the NAME.key file that mplang keygen "
        "or mplang init wrote"),
    "a key that is not the certificate's": Mistake(
        """
        import shutil
        import mplang as mp
        from mplang.cluster.local import init_cluster

        init_cluster(3, "dev")
        shutil.copy("dev/keys/node_0.key", "dev/keys/driver.key")
        drv = mp.Driver("dev/cluster.yaml", key="dev/keys/driver.key")  # <- error
        """,
        IdentityError,
        "dev/keys/driver.key is not the key of certificate driver.crt (of 'driver', sha256 "
        "{driver.crt}...): the key's public key has sha256 {node_0.key}..., the "
        "certificate's {driver.key}...; pass the key and certificate that mplang keygen wrote "
        "together"),
    "numpy function on a traced value": Mistake(
        """
        import numpy as np
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog():
            x = simp.constant((0,), np.arange(3.0))
            return simp.constant((0,), np.mean(x))  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        MPConcreteValueError,
        "numpy (np.asarray, np.mean, ...) needs the data of TraceObject(%0: f32[3]@{0}), a "
        "traced value known only when the program runs; compute with it inside a device "
        "function or simp.pcall body (with jax.numpy), and bring results to Python with "
        "mp.fetch after mp.evaluate (at prog.py:{line})"),
    "Python if on a value in eager mode": Mistake(
        """
        import mplang as mp
        from mplang import simp

        sim = mp.Simulator(3)
        with sim:
            x = simp.constant((0, 1, 2), 3)
            if x > 2:  # <- error
                print("big")
        """,
        MPConcreteValueError,
        "Python `if`/`while`/`and`/`or`/`not` needs the truth value of "
        "DriverObject(bool[]@{0,1,2}, held by [0, 1, 2]), which lives on the parties, not in "
        "this Python process; fetch it first with mp.fetch(ctx, x) (one value per party, or a "
        "device object's plain value) and branch on what it returns, or branch inside the "
        "program with simp.uniform_cond (at prog.py:{line})"),
    "float() of a value in eager mode": Mistake(
        """
        import mplang as mp
        from mplang import simp

        sim = mp.Simulator(3)
        with sim:
            x = simp.constant((0,), 2.5)
            print(float(x) * 2)  # <- error
        """,
        MPConcreteValueError,
        "float() needs the value of DriverObject(f32[]@{0}, held by [0]), which lives on the "
        "parties, not in this Python process; fetch it first with mp.fetch(ctx, x) (one value "
        "per party, or a device object's plain value) and use what it returns "
        "(at prog.py:{line})"),
    "fetch of an SPU value that was not revealed": Mistake(
        """
        import jax.numpy as jnp
        import mplang as mp


        @mp.function
        def millionaire():
            x = mp.device("P0")(lambda: jnp.int32(1_000_000))()
            y = mp.device("P1")(lambda: jnp.int32(2_000_000))()
            return mp.device("SP0")(lambda a, b: a < b)(x, y)


        sim = mp.Simulator(mp.ClusterSpec.simple(3))
        mp.fetch(sim, mp.evaluate(sim, millionaire))  # <- error
        """,
        mp.MPRuntimeError,
        "SP0 holds a secret-shared value; reveal it in the program first, e.g. return "
        "mp.put('P0', z) (at prog.py:{line})"),
    "fetch inside the traced function": Mistake(
        """
        import mplang as mp
        from mplang import simp

        sim = mp.Simulator(3)


        @mp.function
        def prog():
            x = simp.constant((0,), 1)
            print(mp.fetch(sim, x))  # <- error
            return x


        mp.evaluate(sim, prog)
        """,
        mp.MPTraceError,
        "mp.fetch got TraceObject(%0: i32[]@{0}), a traced value of a program being traced, "
        "which has no data until the program runs; return it from the function and fetch the "
        "result: mp.fetch(sim, mp.evaluate(sim, fn)) (at prog.py:{line})"),
    "party index outside the world": Mistake(
        """
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog():
            return simp.constant((5,), 1)  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTypeError,
        "simp.constant: parties {5} are outside the world of 3 parties (ranks run from 0 to 2) "
        "(at prog.py:{line})"),
    "unknown device name": Mistake(
        """
        import jax.numpy as jnp
        import mplang as mp


        @mp.function
        def prog():
            return mp.device("P7")(lambda: jnp.int32(1))()  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        ClusterSpecError,
        "unknown device 'P7'; this cluster has: P0, P1, P2, SP0; use one of these names, or "
        "add the device under 'devices' in the cluster spec (at prog.py:{line})"),
    "an SPU on a one-party cluster": Mistake(
        """
        import jax.numpy as jnp
        import mplang as mp


        @mp.function
        def prog():
            x = mp.device("P0")(lambda: jnp.int32(1))()
            return mp.device("SP0")(lambda a: a + 1)(x)  # <- error


        mp.evaluate(mp.Simulator(1), prog)
        """,
        ClusterSpecError,
        "unknown device 'SP0'; this cluster has: P0; a 1-node cluster has no secure device: "
        "secret sharing needs 2 or more parties, e.g. mp.ClusterSpec.simple(2) "
        "(at prog.py:{line})"),
    "shape mismatch inside an SPU function": Mistake(
        """
        import jax.numpy as jnp
        import mplang as mp


        def add(a, b):
            return a + b  # <- raised


        @mp.function
        def prog():
            x = mp.device("P0")(lambda: jnp.zeros(3))()
            y = mp.device("P1")(lambda: jnp.zeros(4))()
            return mp.device("SP0")(add)(x, y)  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTypeError,
        "device 'SP0' (add): could not compile the function for SPU on (f32[3], f32[4]): "
        "TypeError: add got incompatible shapes for broadcasting: (3,), (4,). (raised at "
        "prog.py:{raised}; fix the function or the shapes and dtypes of its arguments) "
        "(at prog.py:{line})"),
    "put of a pytree with a string leaf": Mistake(
        """
        import jax.numpy as jnp
        import mplang as mp


        @mp.function
        def prog():
            w = mp.device("P0")(lambda: jnp.ones(2))()
            return mp.put("P1", (w, {"w": "hello"}))  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTypeError,
        "put('P1'): leaf [1]['w']: values of dtype <U5 are not supported; use numbers "
        "(at prog.py:{line})"),
    "device function returning a string": Mistake(
        """
        import mplang as mp


        @mp.function
        def prog():
            return mp.device("P0")(lambda: "done")()  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTraceError,
        "function '<lambda>' returned a plain Python value of type str ('done'); a device "
        "function or pcall body returns numbers, arrays (numpy, jax.numpy) or tuples, lists and "
        "dicts of them (at prog.py:{line})"),
    "compile without world_size": Mistake(
        """
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog(a):
            return simp.constant((0,), a)


        program = mp.compile(prog, 3)  # <- error
        """,
        mp.MPLangError,
        "mp.compile needs the parties to compile for: pass world_size=N for a simp-level "
        "program (e.g. mp.compile(fn, *args, world_size=3)) or cluster=mp.ClusterSpec.simple(N) "
        "for one that uses devices (at prog.py:{line})"),
    "uniform_cond on a Python bool": Mistake(
        """
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog(flag):
            x = simp.constant((0, 1, 2), 1)
            return simp.uniform_cond(flag, lambda v: v + 1, lambda v: v, x)  # <- error


        mp.evaluate(mp.Simulator(3), prog, True)
        """,
        mp.MPTypeError,
        "simp.uniform_cond: the predicate is a plain Python bool (True), known while tracing; "
        "choose the branch with a Python `if`, or pass a boolean scalar MPLang value held by "
        "every party (at prog.py:{line})"),
    "uniform_cond on a predicate one party holds": Mistake(
        """
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog():
            flag = simp.constant((0,), True)
            x = simp.constant((0, 1, 2), 1)
            return simp.uniform_cond(flag, lambda v: v + 1, lambda v: v, x)  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTypeError,
        "simp.uniform_cond: the predicate (bool[]@{0}) must be held by every party {0,1,2}; "
        "make it uniform first (e.g. shuffle or reveal it to all parties) (at prog.py:{line})"),
    "while_loop state that changes type": Mistake(
        """
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog():
            x = simp.constant((0, 1, 2), 1)
            return simp.while_loop(lambda v: v < 10, lambda v: v * 1.5, x)  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTypeError,
        "simp.while_loop: the loop state changes type: state 0 is i32[]@{0,1,2} before the "
        "body and f32[]@{0,1,2} after it; make body_fn return every state value with its "
        "initial type (e.g. cast with .astype, or start from an initial value of the loop's "
        "type) (at prog.py:{line})"),
    "pcall on a party that does not hold the input": Mistake(
        """
        import mplang as mp
        from mplang import simp


        @mp.function
        def prog():
            x = simp.constant((0,), 3)
            return simp.pcall((1,), lambda v: v + 1, x)  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        mp.MPTypeError,
        "simp.pcall on parties {1}: input 0 (i32[]@{0}) is held only by {0}; parties {1} do "
        "not hold it (send it first, e.g. simp.shuffle_static(x, {1: 0})) (at prog.py:{line})"),
    "tensor.load of a file the party does not have": Mistake(
        """
        import mplang as mp
        from mplang import tensor


        @mp.function
        def prog():
            return mp.device("P0")(lambda: tensor.load("wealth.npy"))()  # <- error


        mp.evaluate(mp.Simulator(3), prog)
        """,
        MissingData,
        "tensor.load: node_0 has no file 'wealth.npy' in its data root; put it there (by "
        "default ./data/node_0; mp.Simulator(..., data_roots=...), `mplang run --sim N "
        "--data-root DIR` or `mplang worker --data-root DIR` choose another) or fix the path "
        "(at prog.py:{line})"),
    "a wrong SQL column in a device function of a table": Mistake(
        """
        from pathlib import Path

        import mplang as mp
        from mplang import table

        Path("data/node_0").mkdir(parents=True)
        Path("data/node_0/sales.csv").write_text("units,price\\n1,2.5\\n3,4.0\\n")


        @mp.function
        def prog():
            sales = mp.device("P0")(lambda: table.read_csv("sales.csv"))()
            query = mp.device("P0")(lambda t: table.sql("SELECT unit FROM t", t=t))  # <- error
            return query(sales)


        mp.evaluate(mp.Simulator(2), prog)
        """,
        mp.MPTypeError,
        "device 'P0' (<lambda>): table.sql: Binder Error: Referenced column \"unit\" not found "
        "in FROM clause! (query 'SELECT unit FROM t') (at prog.py:{line})"),
    "mp.load of a file that is not a saved program": Mistake(
        """
        from pathlib import Path

        import mplang as mp

        Path("prog.mpl").write_text("not a program")
        program = mp.load("prog.mpl")  # <- error
        """,
        mp.MPSerializationError,
        "prog.mpl: malformed program: too short (13 bytes) to be an MPLang program; load only "
        "files written by Program.save"),
    "mp.load of a program file that does not exist": Mistake(
        """
        import mplang as mp

        program = mp.load("missing.mpl")  # <- error
        """,
        mp.MPLangError,
        "mp.load: no such program file: missing.mpl (write one with "
        "mp.compile(fn, ...).save(PATH))"),
    "Driver over a cluster file that does not exist": Mistake(
        """
        import mplang as mp

        drv = mp.Driver("cluster.yaml", key="keys/driver.key")  # <- error
        """,
        ClusterSpecError,
        "cluster spec {cwd}/cluster.yaml does not exist; write one with `mplang init --nodes 3 "
        "--out dev` and pass 'dev/cluster.yaml' (or run on one machine without workers: "
        "mp.Simulator(mp.ClusterSpec.simple(3)))"),
}


def fingerprints(keys: Path) -> dict[str, str]:
    """``{"NAME.crt": the certificate's fingerprint, "NAME.key": its public key's}`` for
    the certificates in ``keys`` (none if it does not exist)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import serialization

    out = {}
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    for crt in sorted(keys.glob("*.crt")):
        cert = load_certificate(str(crt))
        public = x509.load_pem_x509_certificate(cert.pem.encode()).public_key()
        out[crt.name] = cert.fingerprint
        out[crt.with_suffix(".key").name] = hashlib.sha256(public.public_bytes(*spki)).hexdigest()
    return out


def marked_line(source: str, mark: str) -> int:
    """The number of the one line of ``source`` that carries the comment ``# <- mark``."""
    lines = [i for i, text in enumerate(source.splitlines(), 1) if text.endswith(f"# <- {mark}")]
    assert len(lines) <= 1, f"{mark} marks several lines"
    return lines[0] if lines else 0


def run_program(folder: Path, source: str) -> None:
    """Write ``source`` to ``folder/prog.py`` and run it as a script from ``folder``."""
    path = folder / "prog.py"
    path.write_text(source)
    runpy.run_path(str(path), run_name="__main__")


@pytest.fixture
def folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh working folder for one user program."""
    monkeypatch.chdir(tmp_path)
    yield tmp_path


@pytest.mark.parametrize("name", list(MISTAKES))
def test_a_mistake_gets_its_message(name: str, folder: Path) -> None:
    mistake = MISTAKES[name]
    source = textwrap.dedent(mistake.source).lstrip("\n")
    with pytest.raises(mistake.error) as info:
        run_program(folder, source)
    assert type(info.value) is mistake.error
    expected = (mistake.message.replace("{line}", str(marked_line(source, "error")))
                .replace("{raised}", str(marked_line(source, "raised")))
                .replace("{cwd}", str(Path.cwd())))
    for name, fingerprint in fingerprints(folder / "dev" / "keys").items():
        expected = expected.replace(f"{{{name}}}", fingerprint[:16])
    assert str(info.value) == expected


WORKER_DOWN = """\
import jax.numpy as jnp
import mplang as mp


@mp.function
def millionaire():
    x = mp.device("P0")(lambda: jnp.int32(1_000_000))()
    y = mp.device("P1")(lambda: jnp.int32(2_000_000))()
    return mp.put("P0", mp.device("SP0")(lambda a, b: a < b)(x, y))


drv = mp.Driver("dev/cluster.yaml", key="dev/keys/driver.key")
print(mp.fetch(drv, mp.evaluate(drv, millionaire)))
"""


def test_a_worker_that_is_not_running_is_named_at_once(folder: Path) -> None:
    """The driver's first request finds nothing listening: the message names the node and
    its address and says how to start the worker, without waiting for a timeout."""
    spec = mp.ClusterSpec.from_endpoints([f"127.0.0.1:{p}" for p in free_ports(3)])
    write_dev_cluster(spec, folder / "dev")
    start = time.monotonic()
    with pytest.raises(mp.MPRuntimeError) as info:
        run_program(folder, WORKER_DOWN)
    assert time.monotonic() - start < 20  # the driver's request timeout is 30 s
    message = str(info.value)
    found = re.match(r"party (\d) ", message)
    assert found is not None, message
    rank = int(found.group(1))  # the parties are asked at once: any of them may answer first
    node = f"node_{rank}"
    assert info.value.party == rank
    assert message == (
        f"party {rank} ({node} at https://{spec.nodes[rank].endpoint}) is not reachable, so it "
        "cannot run a program of 6 ops (ConnectionRefusedError: [Errno 111] Connection "
        "refused); is its worker running? Start the cluster's workers with `mplang up "
        "--cluster cluster.yaml`, or this node's with `mplang worker --cluster cluster.yaml "
        f"--node {node} --key keys/{node}.key` (in op func.call at /0)")


def other_keys(source: Path, dest: Path, names: list[str]) -> None:
    """``dest``: a copy of the development cluster ``source`` with new keys for ``names``."""
    shutil.copytree(source, dest)
    for name in names:
        for path in (dest / "keys").glob(f"{name}.*"):
            path.unlink()
        keygen(name, dest / "keys")


def failing_rank(message: str) -> int:
    found = re.match(r"party (\d) ", message)
    assert found is not None, message
    return int(found.group(1))


def test_a_spec_with_other_workers_certificates_names_both_fingerprints(folder: Path) -> None:
    """The workers run, with other keys than the driver's spec pins: the message says so
    with both fingerprints, instead of asking whether the worker runs."""
    spec = mp.ClusterSpec.from_endpoints([f"127.0.0.1:{p}" for p in free_ports(3)])
    running = write_dev_cluster(spec, folder / "run")
    other_keys(folder / "run", folder / "dev", [n.name for n in spec.nodes])
    with running_cluster(running), pytest.raises(mp.MPCommunicationError) as info:
        run_program(folder, WORKER_DOWN)
    message = str(info.value)
    rank = failing_rank(message)
    node = f"node_{rank}"
    presented = fingerprints(folder / "run" / "keys")[f"{node}.crt"][:16]
    pinned = fingerprints(folder / "dev" / "keys")[f"{node}.crt"][:16]
    assert presented != pinned
    assert message == (
        f"party {rank} ({node} at https://{spec.nodes[rank].endpoint}) is running, but not "
        "with the certificate the cluster spec pins, so it cannot run a program of 6 ops "
        f"(it presented sha256 {presented}..., but the cluster spec pins sha256 {pinned}... "
        f"for {node}); give the spec the certificate its worker uses (the NODE.crt beside that "
        "worker's key), or restart the worker with the key of the pinned certificate "
        "(in op func.call at /0)")


def test_a_driver_the_workers_do_not_know_is_told_which_certificate(folder: Path) -> None:
    """The workers' spec lists another driver certificate: they close the connection, and
    the message names this driver's certificate."""
    spec = mp.ClusterSpec.from_endpoints([f"127.0.0.1:{p}" for p in free_ports(3)])
    running = write_dev_cluster(spec, folder / "run")
    other_keys(folder / "run", folder / "dev", ["driver"])
    with running_cluster(running), pytest.raises(mp.MPCommunicationError) as info:
        run_program(folder, WORKER_DOWN)
    message = str(info.value)
    rank = failing_rank(message)
    node = f"node_{rank}"
    mine = fingerprints(folder / "dev" / "keys")["driver.crt"][:16]
    assert message == (
        f"party {rank} ({node} at https://{spec.nodes[rank].endpoint}) failed while running "
        "a program of 6 ops: the connection was lost or refused (TransportError: "
        f"{node} closed the connection before any answer: it does not accept this party's "
        f"certificate (sha256 {mine}...), or it stopped; the cluster spec its worker runs with "
        "must list that certificate (`mplang status` compares the specs)) (in op func.call "
        "at /0)")
