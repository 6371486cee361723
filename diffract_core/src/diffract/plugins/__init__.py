"""Diffract's plugin layer: the whole public surface a plugin needs.

Hook specs and the marker (``hookimpl``), the records hooks yield (``KernelSpec``,
``StorageProfile``, ``ExecutorSpec``, ``OpSpec``, ``Conventions``, ``ModelFormat``,
``ViewRule``, ``Command``), what a storage profile implements (``Store``) and receives
(``Batch``, ``Note``, ``ParamInfo``), what a model format returns (``CheckpointReader``
listing ``TensorEntry`` records; ``read_rows`` and ``to_slices`` read a view's slice),
what a view rule returns (``View``), the executor contract (an ``ExecutorSpec`` factory
receives the session's ``Config`` and its options and returns a
``concurrent.futures.Executor``; ``InlineExecutor`` is the simplest), the built-in
``RamStore`` to build on, the plugin manager and the process's registry.
``diffract.core.*`` is internal.

A third-party pack declares ``[project.entry-points.diffract] <dist> = "<module>"``
and puts ``@hookimpl`` functions in that module; see docs/plugins.md."""

from diffract.config import Config
from diffract.core.executors import InlineExecutor, limit_threads, one_openmp_thread
from diffract.core.formats import CheckpointReader, TensorEntry
from diffract.core.models import open_source as open_model_source
from diffract.core.scope import name_pattern
from diffract.core.sources import (
    FileIdentity,
    ModelSource,
    inside,
    read_json_file,
    url_format,
    url_scheme,
)
from diffract.core.storage.base import (
    STORABLE_TYPES,
    Batch,
    Note,
    ParamInfo,
    Provenance,
    Stamp,
    Store,
    contextual_name,
    rename_in_contextual,
    split_contextual,
    storable_problem,
)
from diffract.core.storage.ram import RamStore
from diffract.core.views import View, read_rows, sliced_shape, to_slices, view_name
from diffract.errors import FieldUndefined, WeightsUnavailableError
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
    Command,
    Conventions,
    Domain,
    ExecutorSpec,
    KernelOptions,
    KernelSpec,
    ModelFormat,
    OpSpec,
    Range,
    Restriction,
    StorageProfile,
    ViewRule,
    kernel,
)

__all__ = [
    "STORABLE_TYPES", "Batch", "Catalog", "CheckpointReader", "Command", "Config",
    "Domain", "FieldUndefined", "FileIdentity", "InlineExecutor", "KernelOptions",
    "ModelFormat", "ModelSource", "Note", "ParamInfo", "Provenance", "RamStore",
    "Range", "Stamp", "Store", "TensorEntry", "View", "ViewRule",
    "WeightsUnavailableError", "contextual_name", "rename_in_contextual",
    "split_contextual", "storable_problem", "DiffractPluginManager", "ExecutorSpec",
    "KernelSpec", "OpSpec", "Conventions", "PluginRecord", "Restriction",
    "StorageProfile", "get_catalog", "get_plugin_manager", "get_registry", "hookimpl",
    "hookspec", "inside", "kernel", "limit_threads", "make_plugin_manager", "name_pattern",
    "one_openmp_thread", "open_model_source", "read_json_file", "read_rows", "reset_registry",
    "set_plugin_manager", "sliced_shape", "to_slices", "url_format", "url_scheme", "view_name",
]
