"""Diffract's plugin layer: hook specs, the records hooks yield, and the manager.

A third-party pack declares ``[project.entry-points.diffract] <dist> = "<module>"``
and puts ``@hookimpl`` functions in that module; see docs/plugins.md.
"""

from diffract.plugins._manager import (
    Catalog,
    DiffractPluginManager,
    PluginRecord,
    get_catalog,
    get_plugin_manager,
    make_plugin_manager,
    set_plugin_manager,
)
from diffract.plugins.hookspec import hookimpl, hookspec
from diffract.plugins.types import (
    ExecutorSpec,
    KernelSpec,
    OpSpec,
    Restriction,
    StorageProfile,
    kernel,
)

__all__ = [
    "Catalog",
    "DiffractPluginManager",
    "ExecutorSpec",
    "KernelSpec",
    "OpSpec",
    "PluginRecord",
    "Restriction",
    "StorageProfile",
    "get_catalog",
    "get_plugin_manager",
    "hookimpl",
    "hookspec",
    "kernel",
    "make_plugin_manager",
    "set_plugin_manager",
]
