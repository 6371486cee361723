"""The hook specifications of Diffract (specs and markers only).

A plugin is a module with functions marked ``@hookimpl`` named like the specs below,
registered through the ``diffract`` entry-point group. Each hook yields typed, frozen
records from :mod:`diffract.plugins.types`; the plugin manager stamps each record with
the providing distribution and refuses names that two providers claim."""

from __future__ import annotations

from collections.abc import Iterable

import pluggy

from diffract.plugins.types import (
    Command,
    Conventions,
    ExecutorSpec,
    KernelSpec,
    ModelFormat,
    OpSpec,
    StorageProfile,
    ViewRule,
)

__all__ = ["PROJECT", "hookimpl", "hookspec"]

PROJECT = "diffract"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def diffract_kernels() -> Iterable[KernelSpec]:
    """Kernels a plugin provides. Implemented by kernel packs.

    Yield one :class:`KernelSpec` per kernel, usually ``KernelSpec.from_function(fn)``.
    Each kernel name and each produced field must be unique across all plugins."""


@hookspec
def diffract_storage_profiles() -> Iterable[StorageProfile]:
    """Storage profiles a plugin provides. Implemented by storage plugins.

    Each :class:`StorageProfile` names a profile (``Session(profile=name)``) and a
    factory that builds a :class:`~diffract.core.storage.Store` from the profile's options."""


@hookspec
def diffract_executors() -> Iterable[ExecutorSpec]:
    """Executors a plugin provides. Implemented by executor plugins.

    Each :class:`ExecutorSpec` names an executor (``[parallel] executor = name``) and a
    factory returning a ``concurrent.futures.Executor``-shaped object that runs
    PARALLEL kernels."""


@hookspec
def diffract_ops() -> Iterable[OpSpec]:
    """Accelerated operations a plugin provides. Implemented by op packages (kernel-fun).

    Each :class:`OpSpec` offers one implementation of a named op with its support check
    and the reference it replaces; :func:`diffract.ops.resolve` picks per call."""


@hookspec
def diffract_conventions() -> Iterable[Conventions]:
    """Named configuration presets a kernel pack provides (``weightwatcher``...).

    Each :class:`Conventions` sets some kernels' configuration so that results follow
    another tool's conventions; users apply one with
    ``session.compute.configure_conventions(name)`` or ``diffract analyze --conventions``."""


@hookspec
def diffract_model_formats() -> Iterable[ModelFormat]:
    """Readers of checkpoint files a plugin provides. Implemented by format plugins.

    Each :class:`ModelFormat` names a format, says which paths it recognises (suffixes,
    magic bytes, a directory layout) and opens one as a
    :class:`~diffract.plugins.CheckpointReader` that lists tensors without reading them
    and reads one, or a slice of one, on request. ``models.add(path)`` asks the formats
    in turn; the name is recorded so that a durable store reopens the model with it."""


@hookspec
def diffract_param_views() -> Iterable[ViewRule]:
    """Rules that split parameters into views (heads, experts, fused parts).

    Each :class:`ViewRule` is turned on by name (``models.add(..., views=["name"])``)
    and returns, per parameter, the :class:`~diffract.plugins.View` records that become
    parameters in their own right, read as slices of their parent."""


@hookspec
def diffract_commands() -> Iterable[Command]:
    """Subcommands of the ``diffract`` command a plugin provides.

    Each :class:`Command` gives a name, a help line, a function that adds its arguments
    to an ``argparse`` parser (called only when the command is used) and a function that
    runs it and returns the exit code. The core's own ``plugins``, ``kernels`` and
    ``catalog`` are reserved: a plugin's command of one of those names is withheld."""
