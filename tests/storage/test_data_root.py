"""A party's data root and its uploaded objects: what can be read, and what is refused."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import numpy as np
import pytest

from mplang.edsl.errors import MPRuntimeError
from mplang.edsl.typing import TensorType
from mplang.storage import data_root
from mplang.storage.data_root import MissingData
from mplang.storage.named_objects import NamedObjects


@pytest.fixture
def root(tmp_path: Path) -> Path:
    base = tmp_path / "root"
    (base / "sub").mkdir(parents=True)
    np.save(base / "x.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    np.save(base / "sub" / "y.npy", np.array([True, False]))
    np.savez(base / "many.npz", a=np.arange(4, dtype=np.int64), b=np.zeros((2, 2)))
    np.savez(base / "one.npz", only=np.ones(3, dtype=np.int32))
    np.save(base / "obj.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp_path / "secret.npy").write_bytes((base / "x.npy").read_bytes())
    return base


def test_reads_npy_and_npz_members_equal_to_numpy(root: Path) -> None:
    np.testing.assert_array_equal(data_root.read(root, "x.npy", node="node_0"),
                                  np.arange(6, dtype=np.float32).reshape(2, 3))
    np.testing.assert_array_equal(data_root.read(root, "sub/y.npy"), [True, False])
    np.testing.assert_array_equal(data_root.read(root, "many.npz", "a"), np.arange(4))
    np.testing.assert_array_equal(data_root.read(root, "one.npz"), np.ones(3, np.int32))


def test_describe_reads_the_header_only(root: Path) -> None:
    assert data_root.describe(root, "x.npy") == TensorType("float32", (2, 3))
    assert data_root.describe(root, "many.npz", "b") == TensorType("float64", (2, 2))
    assert data_root.describe(root, "one.npz") == TensorType("int32", (3,))
    # a header that promises more data than the file holds is still described
    big = root / "big.npy"
    with open(big, "wb") as f:
        np.lib.format.write_array_header_1_0(
            f, {"descr": "<f8", "fortran_order": False, "shape": (10**6,)})
    assert data_root.describe(root, "big.npy") == TensorType("float64", (10**6,))


@pytest.mark.parametrize(("path", "message"), [
    ("../x.npy", "tensor.load: path '../x.npy' escapes the data root of node_0"),
    ("sub/../../secret.npy",
     "tensor.load: path 'sub/../../secret.npy' escapes the data root of node_0"),
    ("/etc/passwd.npy", "tensor.load: path '/etc/passwd.npy' is absolute; give a path "
                        "relative to the data root of node_0"),
    ("", "tensor.load: the path is empty; name a file in the data root of node_0"),
    ("x.csv", "tensor.load: path 'x.csv' must name a .npy or .npz file"),
    ("sub", "tensor.load: path 'sub' must name a .npy or .npz file"),
])
def test_paths_outside_the_root_are_refused(root: Path, path: str, message: str) -> None:
    with pytest.raises(MPRuntimeError) as info:
        data_root.resolve(root, path, "node_0")
    assert str(info.value) == message


def test_a_symlink_out_of_the_root_is_refused(root: Path, tmp_path: Path) -> None:
    os.symlink(tmp_path / "secret.npy", root / "link.npy")
    os.symlink(tmp_path, root / "outside")
    for path in ("link.npy", "outside/secret.npy"):
        with pytest.raises(MPRuntimeError) as info:
            data_root.read(root, path, node="node_0")
        assert str(info.value) == f"tensor.load: path {path!r} escapes the data root of node_0"
    # a link that stays inside the root is fine
    os.symlink(root / "x.npy", root / "alias.npy")
    assert data_root.describe(root, "alias.npy") == TensorType("float32", (2, 3))


def test_missing_files_members_and_bad_contents(root: Path) -> None:
    with pytest.raises(MissingData, match=r"^tensor.load: node_0 has no file 'nope.npy' in its "
                                          r"data root; put it there \(by default "
                                          r"\./data/node_0; mp\.Simulator\(\.\.\., "
                                          r"data_roots=\.\.\.\), `mplang run --sim N "
                                          r"--data-root DIR` or `mplang worker --data-root "
                                          r"DIR` choose another\) or fix the path$"):
        data_root.describe(root, "nope.npy", node="node_0")
    with pytest.raises(MissingData, match=r"'many.npz' has no array 'c' \(it holds a, b\)"):
        data_root.read(root, "many.npz", "c")
    with pytest.raises(MPRuntimeError, match=r"'many.npz' holds 2 arrays \(a, b\): pass key="):
        data_root.describe(root, "many.npz")
    with pytest.raises(MPRuntimeError, match=r"key='a' applies to .npz archives only"):
        data_root.read(root, "x.npy", "a")
    with pytest.raises(MPRuntimeError, match=r"holds an array of dtype object, which cannot "
                                             r"be loaded"):
        data_root.describe(root, "obj.npy")
    with pytest.raises(MPRuntimeError, match=r"holds an array of dtype object"):
        data_root.read(root, "obj.npy")
    (root / "dir.npy").mkdir()
    with pytest.raises(MPRuntimeError, match=r"path 'dir.npy' in the data root of this node "
                                             r"is not a regular file"):
        data_root.read(root, "dir.npy")
    (root / "junk.npy").write_bytes(b"not an array")
    with pytest.raises(MPRuntimeError, match=r"'junk.npy' is not a valid .npy array"):
        data_root.describe(root, "junk.npy")


def test_named_objects_store_describe_and_count_uses() -> None:
    named = NamedObjects("node_2")
    assert named.put("my.vec-1", [1, 2, 3]) == TensorType("int64", (3,))
    np.testing.assert_array_equal(named.get("my.vec-1"), [1, 2, 3])
    assert not named.get("my.vec-1").flags.writeable
    assert named.describe("my.vec-1") == TensorType("int64", (3,))
    assert named.uses("my.vec-1") == 0
    assert named.record_use("my.vec-1", "exec-a") == 1
    assert named.record_use("my.vec-1", "exec-a") == 1  # once per execution
    assert named.record_use("my.vec-1", "exec-b") == 2
    named.put("my.vec-1", np.zeros(2))  # a new upload starts counting again
    assert named.uses("my.vec-1") == 0
    with pytest.raises(MissingData) as info:
        named.get("myvec")
    assert str(info.value) == "simp.load: node_2 has no uploaded object 'myvec'"
    for bad in ("", "a/b", "x" * 129, "../etc"):
        with pytest.raises(MPRuntimeError, match="is not 1 to 128 letters"):
            named.put(bad, [1])
    with pytest.raises(MPRuntimeError, match="only numeric and bool tensors"):
        named.put("objs", np.array([object()]))


def test_named_objects_are_thread_safe() -> None:
    named = NamedObjects()
    named.put("v", [0])

    def use(i: int) -> None:
        for j in range(200):
            named.record_use("v", f"{i}-{j}")

    threads = [threading.Thread(target=use, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert named.uses("v") == 1600
