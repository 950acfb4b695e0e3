"""MPLang: one program, traced into a typed graph, run across parties who keep their data private.

The public API is listed in ``__all__``.
"""

from mplang import builtin, simp
from mplang.analysis import analyze
from mplang.api import compile, evaluate, fetch
from mplang.device.api import device, get_dev_attr, put
from mplang.device.cluster import ClusterSpec, ClusterSpecError, Device, Node
from mplang.device.kinds import InsecureDeviceWarning
from mplang.dialects import crypto, func, phe, spu, table, tensor
from mplang.driver.http import Driver
from mplang.driver.mem import Simulator
from mplang.edsl.context import active_execution_context as current_context
from mplang.edsl.errors import (
    MPCommunicationError,
    MPLangError,
    MPPublicError,
    MPRefusedError,
    MPRuntimeError,
    MPSerializationError,
    MPTimeoutError,
    MPTraceError,
    MPTypeError,
    MPVerifyError,
)
from mplang.edsl.function import function
from mplang.edsl.object import MPObject
from mplang.edsl.program import Program, load
from mplang.edsl.typing import Mask, MPType, TensorType
from mplang.frontend.introspect import describe, list_ops, list_primitives
from mplang.frontend.module import FeModule
from mplang.passes import optimize

builtin.load()

__all__ = [
    "ClusterSpec",
    "ClusterSpecError",
    "Device",
    "Driver",
    "FeModule",
    "InsecureDeviceWarning",
    "MPCommunicationError",
    "MPLangError",
    "MPObject",
    "MPPublicError",
    "MPRefusedError",
    "MPRuntimeError",
    "MPSerializationError",
    "MPTimeoutError",
    "MPTraceError",
    "MPType",
    "MPTypeError",
    "MPVerifyError",
    "Mask",
    "Node",
    "Program",
    "Simulator",
    "TensorType",
    "analyze",
    "compile",
    "crypto",
    "current_context",
    "describe",
    "device",
    "evaluate",
    "fetch",
    "func",
    "function",
    "get_dev_attr",
    "list_ops",
    "list_primitives",
    "load",
    "optimize",
    "phe",
    "put",
    "simp",
    "spu",
    "table",
    "tensor",
]
