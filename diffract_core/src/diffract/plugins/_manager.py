"""Loading plugins, stamping their records with providers, refusing conflicts.

``make_plugin_manager`` is the factory: the process default (``get_plugin_manager``)
autoloads the ``diffract`` entry-point group; an embedding tool builds its own with
``autoload=False``, registers plugins by hand and installs it with
``set_plugin_manager``. Each entry point loads in its own try/except: a broken plugin
costs a :class:`~diffract.errors.PluginWarning` naming its distribution and version,
never the host, unless strict mode (``DIFFRACT_STRICT_PLUGINS=1``) turns it into an
error. ``DIFFRACT_PLUGINS`` (an allow-list) and ``DIFFRACT_DISABLE_PLUGINS`` (a
deny-list), comma-separated distribution or entry-point names, act before import.
"""

from __future__ import annotations

import importlib.metadata as md
import logging
import os
import re
import threading
import warnings
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

import attrs
import pluggy

from diffract.plugins import hookspec
from diffract.plugins.types import ExecutorSpec, KernelSpec, OpSpec, StorageProfile
from diffract.errors import PluginConflictError, PluginLoadError, PluginWarning

__all__ = [
    "Catalog",
    "DiffractPluginManager",
    "PluginRecord",
    "get_catalog",
    "get_plugin_manager",
    "make_plugin_manager",
    "set_plugin_manager",
]

log = logging.getLogger(__name__)

GROUP = "diffract"
BUILTIN = "diffract-core"

_HOOKS: tuple[tuple[str, type, str], ...] = (
    ("diffract_kernels", KernelSpec, "kernels"),
    ("diffract_storage_profiles", StorageProfile, "profiles"),
    ("diffract_executors", ExecutorSpec, "executors"),
    ("diffract_ops", OpSpec, "ops"),
)


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {_norm(x) for x in raw.split(",") if x.strip()}


def _env_flag(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}


@attrs.define
class PluginRecord:
    """One plugin as ``diffract plugins`` shows it.

    ``status`` is ``loaded``, ``failed`` (``reason`` says why), or ``disabled`` (by the
    allow- or deny-list). ``provides`` maps a kind (kernels, profiles, executors, ops)
    to the names the plugin registered; ``refused`` lists names refused as conflicts.
    """

    distribution: str
    version: str | None
    entry_point: str | None
    status: str
    reason: str = ""
    provides: dict[str, list[str]] = attrs.field(factory=dict)
    refused: list[str] = attrs.field(factory=list)

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version}" if self.version else self.distribution


@attrs.frozen
class Catalog:
    """Every record the plugins yielded, stamped with its provider, conflicts removed."""

    kernels: tuple[KernelSpec, ...]
    profiles: dict[str, StorageProfile]
    executors: dict[str, ExecutorSpec]
    ops: tuple[OpSpec, ...]
    plugins: tuple[PluginRecord, ...]


class DiffractPluginManager(pluggy.PluginManager):
    """A pluggy manager that knows each plugin's distribution and load outcome."""

    def __init__(self, *, strict: bool = False) -> None:
        super().__init__(hookspec.PROJECT)
        self.add_hookspecs(hookspec)
        self.strict = strict
        self.records: dict[str, PluginRecord] = {}
        self._catalog: Catalog | None = None

    # -- registration -----------------------------------------------------------
    def register_plugin(
        self,
        plugin: ModuleType | object,
        *,
        distribution: str,
        version: str | None = None,
        entry_point: str | None = None,
    ) -> None:
        """Register a module (or object) holding hookimpls, recording who provides it."""
        name = distribution if entry_point is None else f"{distribution}:{entry_point}"
        self.register(plugin, name=name)
        self.records[name] = PluginRecord(distribution, version, entry_point, "loaded")
        self._catalog = None

    def _problem(self, record: PluginRecord, message: str, *, conflict: bool = False) -> None:
        if self.strict:
            cls = PluginConflictError if conflict else PluginLoadError
            raise cls(message, distribution=record.distribution, version=record.version)
        warnings.warn(PluginWarning(message), stacklevel=3)
        log.warning("%s", message)

    def load_entry_points(
        self, allow: Iterable[str] | None = None, deny: Iterable[str] | None = None
    ) -> None:
        """Import every ``diffract`` entry point the allow/deny lists admit."""
        allow_set = {_norm(x) for x in allow} if allow is not None else None
        deny_set = {_norm(x) for x in deny or ()}
        seen: set[tuple[str, str]] = set()
        eps = sorted(
            md.entry_points(group=GROUP),
            key=lambda ep: (_norm(ep.dist.name if ep.dist else ""), ep.name),
        )
        for ep in eps:
            dist = ep.dist.name if ep.dist is not None else ep.name
            version = ep.dist.version if ep.dist is not None else None
            if (dist, ep.name) in seen or _norm(dist) == BUILTIN:
                continue
            seen.add((dist, ep.name))
            names = {_norm(dist), _norm(ep.name)}
            key = f"{dist}:{ep.name}"
            if (allow_set is not None and not names & allow_set) or names & deny_set:
                why = "not in DIFFRACT_PLUGINS" if allow_set is not None and not names & allow_set else "listed in DIFFRACT_DISABLE_PLUGINS"
                self.records[key] = PluginRecord(dist, version, ep.name, "disabled", why)
                continue
            try:
                module = ep.load()
                self.register_plugin(module, distribution=dist, version=version, entry_point=ep.name)
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop the host
                record = PluginRecord(dist, version, ep.name, "failed", f"{type(exc).__name__}: {exc}")
                self.records[key] = record
                self._problem(
                    record,
                    f"Plugin {record.label} (entry point {ep.name!r} = {ep.value!r}) failed to "
                    f"load and was skipped: {type(exc).__name__}: {exc}. Upgrade or uninstall "
                    f"it, or set DIFFRACT_DISABLE_PLUGINS={dist}.",
                )

    # -- collection ---------------------------------------------------------------
    def catalog(self) -> Catalog:
        """Call every hook of every plugin once (cached until a plugin is registered)."""
        if self._catalog is None:
            self._catalog = self._collect()
        return self._catalog

    def _collect(self) -> Catalog:
        taken: dict[str, dict[str, str]] = {kind: {} for _, _, kind in _HOOKS}
        fields: dict[str, tuple[str, str]] = {}  # field -> (kernel, provider)
        out: dict[str, list[Any]] = {kind: [] for _, _, kind in _HOOKS}
        impls: dict[str, dict[str, Callable[[], Iterable[Any]]]] = {
            hook_name: {i.plugin_name: i.function for i in getattr(self.hook, hook_name).get_hookimpls()}
            for hook_name, _, _ in _HOOKS
        }
        for name, _plugin in self.list_name_plugin():  # plugins registered with plain register()
            if name not in self.records:
                self.records[name] = PluginRecord(name, None, None, "loaded")
        # Built-in first, then by distribution name: a deterministic winner on conflict.
        order = sorted(
            self.records.items(), key=lambda kv: (kv[1].distribution != BUILTIN, kv[0])
        )
        for name, record in order:
            if record.status != "loaded":
                continue
            record.provides.clear()
            record.refused.clear()
            for hook_name, rtype, kind in _HOOKS:
                fn = impls[hook_name].get(name)
                if fn is None:
                    continue
                try:
                    items = list(fn() or ())
                except Exception as exc:  # noqa: BLE001
                    record.status, record.reason = "failed", f"{hook_name}: {type(exc).__name__}: {exc}"
                    self._problem(
                        record,
                        f"Plugin {record.label}: hook {hook_name} raised {type(exc).__name__}: "
                        f"{exc}; its {kind} were skipped. Upgrade or uninstall it.",
                    )
                    continue
                for item in items:
                    if not isinstance(item, rtype):
                        self._problem(
                            record,
                            f"Plugin {record.label}: hook {hook_name} yielded a "
                            f"{type(item).__name__}, not a {rtype.__name__}; it was skipped.",
                        )
                        continue
                    item = attrs.evolve(item, provider=record.label)
                    if kind != "ops":
                        clash = self._clash(kind, item, taken, fields)
                        if clash:
                            record.refused.append(item.name)
                            self._problem(record, clash, conflict=True)
                            continue
                        taken[kind][item.name] = record.label
                        if kind == "kernels":
                            for f in item.produce_fields:
                                fields[f] = (item.name, record.label)
                    record.provides.setdefault(kind, []).append(item.name)
                    out[kind].append(item)
        return Catalog(
            kernels=tuple(out["kernels"]),
            profiles={p.name: p for p in out["profiles"]},
            executors={e.name: e for e in out["executors"]},
            ops=tuple(out["ops"]),
            plugins=tuple(self.records.values()),
        )

    @staticmethod
    def _clash(kind: str, item: Any, taken: dict, fields: dict) -> str | None:
        what = {"kernels": "kernel", "profiles": "storage profile", "executors": "executor"}[kind]
        if item.name in taken[kind]:
            return (
                f"Conflicting plugins: {what} {item.name!r} is provided by both "
                f"{taken[kind][item.name]} and {item.provider}; the one from {item.provider} "
                f"was refused. Uninstall one, or disable it with DIFFRACT_DISABLE_PLUGINS."
            )
        if kind == "kernels":
            for f in item.produce_fields:
                if f in fields:
                    other, prov = fields[f]
                    return (
                        f"Conflicting plugins: field {f!r} is produced by kernel {other!r} "
                        f"from {prov} and by kernel {item.name!r} from {item.provider}; the "
                        f"one from {item.provider} was refused. Uninstall one, or disable it "
                        "with DIFFRACT_DISABLE_PLUGINS."
                    )
        return None


def make_plugin_manager(
    *,
    autoload: bool = True,
    builtins: bool = True,
    allow: Iterable[str] | None = None,
    deny: Iterable[str] | None = None,
    strict: bool | None = None,
) -> DiffractPluginManager:
    """Build a plugin manager.

    ``autoload`` loads the ``diffract`` entry points (filtered by ``allow``/``deny``, which
    default to the ``DIFFRACT_PLUGINS``/``DIFFRACT_DISABLE_PLUGINS`` environment
    variables); ``builtins`` registers the core's own RAM profile, executors and kernels;
    ``strict`` (default: ``DIFFRACT_STRICT_PLUGINS``) raises instead of warning.
    """
    pm = DiffractPluginManager(strict=_env_flag("DIFFRACT_STRICT_PLUGINS") if strict is None else strict)
    if builtins:
        from diffract import __version__
        from diffract.plugins import _builtin

        pm.register_plugin(_builtin, distribution=BUILTIN, version=__version__)
    if autoload:
        pm.load_entry_points(
            allow=allow if allow is not None else _env_list("DIFFRACT_PLUGINS"),
            deny=deny if deny is not None else _env_list("DIFFRACT_DISABLE_PLUGINS"),
        )
    return pm


_DEFAULT: DiffractPluginManager | None = None
_LOCK = threading.Lock()


def get_plugin_manager() -> DiffractPluginManager:
    """The process's plugin manager, built with autoload on first use."""
    global _DEFAULT
    if _DEFAULT is None:
        with _LOCK:
            if _DEFAULT is None:
                _DEFAULT = make_plugin_manager()
    return _DEFAULT


def set_plugin_manager(pm: DiffractPluginManager | None) -> DiffractPluginManager | None:
    """Install ``pm`` as the process's manager (None: rebuild on next use); returns the
    previous one. The kernel registry is refilled from the new manager on next use."""
    global _DEFAULT
    from diffract.core.compute.registry import reset_registry

    with _LOCK:
        previous, _DEFAULT = _DEFAULT, pm
    reset_registry()
    return previous


def get_catalog() -> Catalog:
    """The catalog of the process's plugin manager."""
    return get_plugin_manager().catalog()
