"""Diffract's plugin layer: the whole public surface a plugin needs.

Hook specs and the marker (``hookimpl``), the records hooks yield (``KernelSpec``,
``StorageProfile``, ``ExecutorSpec``, ``OpSpec``), what a storage profile implements
(``Store``) and receives (``Batch``, ``Note``, ``ParamInfo``), the plugin manager and
the process's registry. ``diffract.core.*`` is internal.

A third-party pack declares ``[project.entry-points.diffract] <dist> = "<module>"``
and puts ``@hookimpl`` functions in that module; see docs/plugins.md.
"""

from diffract.core.storage.base import (
    STORABLE_TYPES,
    Batch,
    Note,
    ParamInfo,
    Store,
    contextual_name,
    split_contextual,
    storable_problem,
)
from diffract.errors import FieldUndefined
from diffract.plugins._manager import (
    Catalog,
    DiffractPluginManager,
    PluginRecord,
    make_plugin_manager,
)
from diffract.plugins._runtime import (
    get_catalog,
    get_plugin_manager,
    get_registry,
    reset_registry,
    set_plugin_manager,
)
from diffract.plugins.hookspec import hookimpl, hookspec
from diffract.plugins.types import (
    Domain,
    ExecutorSpec,
    KernelOptions,
    KernelSpec,
    OpSpec,
    Range,
    Restriction,
    StorageProfile,
    kernel,
)

__all__ = [
    "STORABLE_TYPES",
    "Batch",
    "Catalog",
    "Domain",
    "FieldUndefined",
    "KernelOptions",
    "Note",
    "ParamInfo",
    "Range",
    "Store",
    "contextual_name",
    "split_contextual",
    "storable_problem",
    "DiffractPluginManager",
    "ExecutorSpec",
    "KernelSpec",
    "OpSpec",
    "PluginRecord",
    "Restriction",
    "StorageProfile",
    "get_catalog",
    "get_plugin_manager",
    "get_registry",
    "hookimpl",
    "hookspec",
    "kernel",
    "make_plugin_manager",
    "reset_registry",
    "set_plugin_manager",
]
