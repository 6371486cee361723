"""The hook specifications of Diffract (specs and markers only).

A plugin is a module with functions marked ``@hookimpl`` named like the specs below,
registered through the ``diffract`` entry-point group. Each hook yields typed, frozen
records from :mod:`diffract.plugins.types`; the plugin manager stamps each record with
the providing distribution and refuses names that two providers claim.
"""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from diffract.plugins.types import Conventions, ExecutorSpec, KernelSpec, OpSpec, StorageProfile

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT = "diffract"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def diffract_kernels() -> Iterable[KernelSpec]:
    """Kernels a plugin provides. Implemented by kernel packs.

    Yield one :class:`KernelSpec` per kernel, usually ``KernelSpec.from_function(fn)``.
    Each kernel name and each produced field must be unique across all plugins.
    """


@hookspec
def diffract_storage_profiles() -> Iterable[StorageProfile]:
    """Storage profiles a plugin provides. Implemented by storage plugins.

    Each :class:`StorageProfile` names a profile (``Session(profile=name)``) and a
    factory that builds a :class:`~diffract.core.storage.Store` from the profile's options.
    """


@hookspec
def diffract_executors() -> Iterable[ExecutorSpec]:
    """Executors a plugin provides. Implemented by executor plugins.

    Each :class:`ExecutorSpec` names an executor (``[parallel] executor = name``) and a
    factory returning a ``concurrent.futures.Executor``-shaped object that runs
    PARALLEL kernels.
    """


@hookspec
def diffract_ops() -> Iterable[OpSpec]:
    """Accelerated operations a plugin provides. Implemented by op packages (kernel-fun).

    Each :class:`OpSpec` offers one implementation of a named op with its support check
    and the reference it replaces; :func:`diffract.ops.resolve` picks per call.
    """


@hookspec
def diffract_conventions() -> Iterable[Conventions]:
    """Named configuration presets a kernel pack provides (``weightwatcher``...).

    Each :class:`Conventions` sets some kernels' configuration so that results follow
    another tool's conventions; users apply one with
    ``session.compute.configure_conventions(name)`` or ``diffract analyze --conventions``.
    """
