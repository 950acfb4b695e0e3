"""Frontend: frontend ops (feops) with metadata, reflection, device routing, state,
compile caches, plugins, and the error taxonomy.

The registry API: `register`, `list_ops`, `get`, `find`, `capabilities`,
`config_schema`, `list_frontends`, `describe`, `is_feop`, `feop`.
"""

from mplang.frontend.cache import CompileCache, compile_caches, determinism_check
from mplang.frontend.errors import (
    FeCapabilityError,
    FeConfigError,
    FeDeterminismError,
    FeError,
    FeStateError,
    MPCommunicationError,
    MPLangError,
    MPRuntimeError,
    MPSerializationError,
    MPTraceError,
    MPTypeError,
    MPVerifyError,
)
from mplang.frontend.feop import (
    ConfigField,
    ConfigSchema,
    FeOpInfo,
    feop,
    get,
    is_feop,
    register,
)
from mplang.frontend.introspect import (
    capabilities,
    config_schema,
    describe,
    find,
    list_frontends,
    list_ops,
    routes,
)
from mplang.frontend.plugins import discover, load_plugin, load_plugins
from mplang.frontend.registry import OpInfo, OpTraits

__all__ = [
    "CompileCache",
    "ConfigField",
    "ConfigSchema",
    "FeCapabilityError",
    "FeConfigError",
    "FeDeterminismError",
    "FeError",
    "FeOpInfo",
    "FeStateError",
    "MPCommunicationError",
    "MPLangError",
    "MPRuntimeError",
    "MPSerializationError",
    "MPTraceError",
    "MPTypeError",
    "MPVerifyError",
    "OpInfo",
    "OpTraits",
    "capabilities",
    "compile_caches",
    "config_schema",
    "describe",
    "determinism_check",
    "discover",
    "feop",
    "find",
    "get",
    "is_feop",
    "list_frontends",
    "list_ops",
    "load_plugin",
    "load_plugins",
    "register",
    "routes",
]
