"""Frontend: frontend ops (feops) with metadata, reflection, device routing, state,
compile caches and plugins (the error taxonomy and op declarations live in `mplang.edsl`).

The registry API: `register`, `list_ops`, `get`, `find`, `capabilities`,
`config_schema`, `list_frontends`, `describe`, `is_feop`, `feop`.
"""

from mplang.edsl.attrs import Attr, ConfigField, ConfigSchema
from mplang.edsl.errors import (
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
from mplang.edsl.traits import OpTraits
from mplang.frontend.cache import CompileCache, compile_caches, determinism_check
from mplang.frontend.feop import (
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

__all__ = [
    "Attr",
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
