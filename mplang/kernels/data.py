"""Worker kernels of the private-input sources: ``tensor.load`` reads the party's data
root, ``simp.load`` the objects its owner uploaded. Both check that the data has the
type the program declared."""

from __future__ import annotations

from typing import Any

import numpy as np

from mplang.dialects import simp as _simp
from mplang.dialects import tensor as _tensor
from mplang.dialects.common import as_array, canonical_type
from mplang.edsl.errors import MPPublicError, MPRuntimeError, MPTypeError
from mplang.edsl.graph import Operation
from mplang.edsl.typing import TensorType
from mplang.kernels.tensor import BACKEND as TENSOR_BACKEND
from mplang.runtime.interpreter import Interpreter
from mplang.storage import data_root
from mplang.worker.ops import BACKEND as SIMP_BACKEND
from mplang.worker.state import SimpWorker


def _worker(interp: Interpreter) -> SimpWorker:
    worker: SimpWorker = interp.states["simp"]
    return worker


def _checked(worker: SimpWorker, op: Operation, what: str, array: np.ndarray) -> np.ndarray:
    expected: TensorType = op.attrs["type"]
    found = canonical_type(TensorType(array.dtype.name, tuple(array.shape)))
    if found != expected:
        raise MPPublicError(f"party {worker.rank}: {op.opcode}: {what} on {worker.node} is "
                            f"{found}, but the program expects {expected}",
                            party=worker.rank, op=op.opcode)
    try:
        return as_array(op.opcode, array)
    except MPTypeError as e:
        raise MPRuntimeError(f"party {worker.rank}: {what} on {worker.node}: {e}",
                             party=worker.rank, op=op.opcode) from None


@TENSOR_BACKEND.kernel(_tensor.load_p)
def _tensor_load(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    worker = _worker(interp)
    path, member = op.attrs["path"], op.attrs["key"]
    try:
        array = data_root.read(worker.data_root, path, member, worker.node)
    except MPRuntimeError as e:  # of its kind: missing data is told as it is
        raise type(e)(f"party {worker.rank}: {e}", party=worker.rank, op=op.opcode) from None
    what = f"{path!r}" if member is None else f"{path!r}[{member!r}]"
    return [_checked(worker, op, what, array)]


@SIMP_BACKEND.kernel(_simp.load_p)
def _simp_load(interp: Interpreter, op: Operation, args: list[Any], key: str) -> list[Any]:
    worker = _worker(interp)
    if worker.rank != op.attrs["party"]:
        return [None]
    name = op.attrs["name"]
    try:
        array = worker.named.get(name)
        worker.named.record_use(name, interp.exec_id)
    except MPRuntimeError as e:  # of its kind: missing data is told as it is
        raise type(e)(f"party {worker.rank}: {e}", party=worker.rank, op=op.opcode) from None
    return [_checked(worker, op, f"object {name!r}", array)]
