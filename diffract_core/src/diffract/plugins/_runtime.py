"""The process's plugin manager and kernel registry: one owner for both singletons.

The registry is filled from the manager's catalog on first use; installing another
manager (:func:`set_plugin_manager`) drops the registry so that the next use refills it
from the new catalog. Neither :mod:`~diffract.plugins._manager` nor
:mod:`~diffract.core.compute.registry` knows about the other's singleton."""

from __future__ import annotations

import threading
from collections.abc import Mapping

from diffract.core.compute.registry import KernelRegistry
from diffract.plugins._manager import Catalog, DiffractPluginManager, make_plugin_manager

__all__ = [
    "apply_preferences",
    "get_catalog",
    "get_plugin_manager",
    "get_registry",
    "reset_registry",
    "set_plugin_manager",
]

_LOCK = threading.RLock()
_MANAGER: DiffractPluginManager | None = None
_REGISTRY: KernelRegistry | None = None


def get_plugin_manager() -> DiffractPluginManager:
    """The process's plugin manager, built with autoload on first use."""
    global _MANAGER
    if _MANAGER is None:
        with _LOCK:
            if _MANAGER is None:
                _MANAGER = make_plugin_manager()
    return _MANAGER


def set_plugin_manager(pm: DiffractPluginManager | None) -> DiffractPluginManager | None:
    """Install ``pm`` as the process's manager (None: rebuild on next use); returns the
    previous one. The kernel registry is refilled from the new manager on next use."""
    global _MANAGER, _REGISTRY
    with _LOCK:
        previous, _MANAGER = _MANAGER, pm
        _REGISTRY = None
    return previous


def get_catalog() -> Catalog:
    """The catalog of the process's plugin manager."""
    return get_plugin_manager().catalog()


def _fill(registry: KernelRegistry, catalog: Catalog) -> None:
    """Register the catalog's kernels the registry lacks; mark contested names."""
    for spec in catalog.kernels:
        if spec.name not in registry:
            registry.register(spec)
    for name, (claimed, providers) in catalog.contested.get("kernels", {}).items():
        registry.contest(name, claimed, providers)


def get_registry() -> KernelRegistry:
    """The process-global kernel registry, filled from the plugin catalog on first use."""
    global _REGISTRY
    if _REGISTRY is None:
        with _LOCK:
            if _REGISTRY is None:
                registry = KernelRegistry()
                _fill(registry, get_catalog())
                _REGISTRY = registry
    return _REGISTRY


def reset_registry() -> None:
    """Drop the registry; the next use refills it from the current plugin catalog."""
    global _REGISTRY
    with _LOCK:
        _REGISTRY = None


def apply_preferences(prefer: Mapping[str, str]) -> None:
    """Pick providers for contested names (``[plugins] prefer``), process-wide: the
    catalog is collected again and the kernels it now admits join the registry."""
    with _LOCK:
        if get_plugin_manager().set_prefer(dict(prefer)) and _REGISTRY is not None:
            _fill(_REGISTRY, get_catalog())
