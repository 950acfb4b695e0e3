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
from mplang.edsl.typing import TensorType
from mplang.kernels.tensor import BACKEND as TENSOR_BACKEND
from mplang.runtime.interpreter import Call
from mplang.storage import data_root
from mplang.worker.ops import BACKEND as SIMP_BACKEND
from mplang.worker.state import SimpWorker


def _checked(call: Call, what: str, array: np.ndarray) -> np.ndarray:
    """``array`` if it has the op's declared type (its attribute ``type``)."""
    worker: SimpWorker = call.state("simp")
    expected: TensorType = call.op.attrs["type"]
    found = canonical_type(TensorType(array.dtype.name, tuple(array.shape)))
    if found != expected:
        raise MPPublicError(f"party {worker.rank}: {call.op.opcode}: {what} on {worker.node} "
                            f"is {found}, but the program expects {expected}",
                            party=worker.rank, op=call.op.opcode)
    try:
        return as_array(call.op.opcode, array)
    except MPTypeError as e:
        raise MPRuntimeError(f"party {worker.rank}: {what} on {worker.node}: {e}",
                             party=worker.rank, op=call.op.opcode) from None


@TENSOR_BACKEND.kernel(_tensor.load_p)
def _tensor_load(call: Call, *, path: str, key: str | None) -> list[Any]:
    worker: SimpWorker = call.state("simp")
    try:
        array = data_root.read(worker.data_root, path, key, worker.node)
    except MPRuntimeError as e:  # of its kind: missing data is told as it is
        raise type(e)(f"party {worker.rank}: {e}", party=worker.rank,
                      op=call.op.opcode) from None
    what = f"{path!r}" if key is None else f"{path!r}[{key!r}]"
    return [_checked(call, what, array)]


@SIMP_BACKEND.kernel(_simp.load_p)
def _simp_load(call: Call, *, party: int, name: str) -> list[Any]:
    worker: SimpWorker = call.state("simp")
    if worker.rank != party:
        return [None]
    try:
        array = worker.named.get(name)
        worker.named.record_use(name, call.interp.exec_id)
    except MPRuntimeError as e:  # of its kind: missing data is told as it is
        raise type(e)(f"party {worker.rank}: {e}", party=worker.rank,
                      op=call.op.opcode) from None
    return [_checked(call, f"object {name!r}", array)]
