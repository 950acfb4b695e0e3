"""Worker side of the ``simp`` dialect (seed 000): state, kernels, in-memory mesh."""

from mplang.backends import func_impl, spu_impl, tensor_impl
from mplang.backends.simp_worker import ops
from mplang.backends.simp_worker.state import Communicator, SimpWorker
from mplang.runtime.interpreter import KernelTable

WORKER_KERNELS = KernelTable.merge(
    [tensor_impl.KERNELS, func_impl.KERNELS, ops.KERNELS, spu_impl.KERNELS])
"""Every kernel a worker runs; an op outside this table is refused."""

__all__ = ["WORKER_KERNELS", "Communicator", "SimpWorker"]
