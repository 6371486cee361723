"""Loading plugins, stamping their records with providers, refusing conflicts.

``make_plugin_manager`` is the factory: the process default (``get_plugin_manager``)
autoloads the ``diffract`` entry-point group; an embedding tool builds its own with
``autoload=False``, registers plugins by hand and installs it with
``set_plugin_manager``. Each entry point loads in its own try/except: a broken plugin
costs a :class:`~diffract.errors.PluginWarning` naming its distribution and version,
never the host, unless strict mode (``DIFFRACT_STRICT_PLUGINS=1``) turns it into an
error. ``DIFFRACT_PLUGINS`` (an allow-list) and ``DIFFRACT_DISABLE_PLUGINS`` (a
deny-list), comma-separated distribution or entry-point names, act before import.

Two distributions that claim one name (a kernel, a field two kernels produce, a storage
profile, an executor, a conventions preset, a model format, a view rule, a command) are a
conflict: neither record is used, whatever the names sort
like, and using the name raises an error naming both and the setting that picks one:
``prefer`` (``make_plugin_manager(prefer={"stable_rank": "diffractml-kernels-spectral"})``,
``DIFFRACT_PREFER=stable_rank=diffractml-kernels-spectral`` or ``[plugins] prefer`` in a
session's configuration)."""

from __future__ import annotations

import importlib
import logging
import os
import re
import sys
from collections.abc import Callable, Iterable
from importlib.machinery import PathFinder
from types import ModuleType
from typing import Any

import attrs
import pluggy

from diffract.errors import PluginConflictError, PluginLoadError, PluginWarning, warn
from diffract.plugins import hookspec
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

__all__ = ["Catalog", "DiffractPluginManager", "PluginRecord", "make_plugin_manager"]

log = logging.getLogger(__name__)

GROUP = "diffract"
BUILTIN = "diffractml-core"

_HOOKS: tuple[tuple[str, type, str], ...] = (
    ("diffract_kernels", KernelSpec, "kernels"),
    ("diffract_storage_profiles", StorageProfile, "profiles"),
    ("diffract_executors", ExecutorSpec, "executors"),
    ("diffract_ops", OpSpec, "ops"),
    ("diffract_conventions", Conventions, "conventions"),
    ("diffract_model_formats", ModelFormat, "formats"),
    ("diffract_param_views", ViewRule, "views"),
    ("diffract_commands", Command, "commands"),
)
#: What each kind of record is called in messages.
_WHAT = {"kernels": "kernel or field", "profiles": "storage profile", "executors": "executor",
         "conventions": "conventions", "formats": "model format", "views": "view rule",
         "commands": "command"}


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _env_list(var: str) -> set[str] | None:
    raw = os.environ.get(var)
    if raw is None:
        return None
    return {_norm(x) for x in raw.split(",") if x.strip()}


def entry_points(group: str) -> list[tuple[str, str, str, str | None]]:
    """``(name, value, distribution, version)`` of the ``group`` entry points on
    ``sys.path``, the first distribution of a name winning, as ``importlib.metadata``
    finds them, whose import (20-35 ms of every start) this skips by reading the
    dist-info folders; a zip on the path or a finder of distributions is left to it."""
    if any(f is not PathFinder and hasattr(f, "find_distributions") for f in sys.meta_path) \
            or any(os.path.isfile(p) for p in sys.path if p):
        import importlib.metadata as md

        return [(e.name, e.value, e.dist.name if e.dist else e.name,
                 e.dist.version if e.dist else None) for e in md.entry_points(group=group)]
    found, seen = [], set()
    for folder in sys.path:
        try:
            listing = sorted(os.listdir(folder or "."))
        except OSError:
            continue
        for entry in listing:
            stem, _, kind = entry.rpartition(".")
            name, _, version = stem.partition("-")
            if kind not in ("dist-info", "egg-info") or _norm(name) in seen:
                continue
            seen.add(_norm(name))
            info = os.path.join(folder or ".", entry)
            inside, meta = False, None
            for line in _lines(os.path.join(info, "entry_points.txt")):
                if line.startswith("[") and line.endswith("]"):
                    inside = line[1:-1].strip() == group
                elif inside and "=" in line and line[0] not in "#;":
                    if meta is None:  # the Name and Version headers (before the first blank line)
                        head = _lines(os.path.join(info, "METADATA" if kind == "dist-info"
                                                   else "PKG-INFO"), headers=True)
                        meta = dict(h.split(":", 1) for h in head if ":" in h)
                    key, _, value = line.partition("=")
                    found.append((key.strip(), value.strip(), meta.get("Name", name).strip(),
                                  meta.get("Version", version).strip() or None))
    return found


def _lines(path: str, headers: bool = False) -> list[str]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = [line.strip() for line in f.read().splitlines()]
    except (OSError, UnicodeDecodeError):
        return []
    return lines[:lines.index("")] if headers and "" in lines else lines


def _load(value: str) -> Any:
    """What ``module:attr.sub [extras]`` names: the module, or the attribute in it."""
    module, _, attr = value.split("[", 1)[0].strip().partition(":")
    obj: Any = importlib.import_module(module.strip())
    for part in filter(None, attr.strip().split(".")):
        obj = getattr(obj, part)
    return obj


def _env_flag(var: str) -> bool:
    return os.environ.get(var, "").strip().lower() in {"1", "true", "yes", "on"}


def _env_prefer() -> dict[str, str]:
    """``DIFFRACT_PREFER=name=dist,name=dist`` as a mapping (malformed entries ignored
    with a warning)."""
    out: dict[str, str] = {}
    for entry in os.environ.get("DIFFRACT_PREFER", "").split(","):
        if not entry.strip():
            continue
        name, sep, dist = entry.partition("=")
        if sep and name.strip() and dist.strip():
            out[name.strip()] = dist.strip()
        else:
            warn(PluginWarning(f"DIFFRACT_PREFER entry {entry!r} is not name=distribution; "
                               "ignored."))
    return out


def _keys(kind: str, item: Any) -> tuple[str, ...]:
    """The names a record claims: its own, and for a kernel every field it produces."""
    if kind == "kernels":
        return tuple(dict.fromkeys((item.name, *item.produce_fields, *dict(item.aliases))))
    return (item.name,)


@attrs.define
class PluginRecord:
    """One plugin as ``diffract plugins`` shows it.

    ``status`` is ``loaded``, ``failed`` (``reason`` says why), or ``disabled`` (by the
    allow- or deny-list). ``provides`` maps a kind (kernels, profiles, executors, ops)
    to the names the plugin registered; ``refused`` lists names refused as conflicts."""

    distribution: str
    version: str | None
    entry_point: str | None
    status: str
    reason: str = ""
    provides: dict[str, list[str]] = attrs.field(factory=dict)
    refused: list[str] = attrs.field(factory=list)
    conflicts: list[str] = attrs.field(factory=list)

    @property
    def label(self) -> str:
        return f"{self.distribution} {self.version}" if self.version else self.distribution


@attrs.frozen
class Catalog:
    """Every record the plugins yielded, stamped with its provider, conflicts removed.

    ``contested`` maps a kind (kernels, profiles, executors, conventions, formats,
    views, commands) to the names withheld because plugins conflict: name -> (the
    claimed name, its providers)."""

    kernels: tuple[KernelSpec, ...]
    profiles: dict[str, StorageProfile]
    executors: dict[str, ExecutorSpec]
    ops: tuple[OpSpec, ...]
    plugins: tuple[PluginRecord, ...]
    contested: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = attrs.field(factory=dict)
    conventions: dict[str, Conventions] = attrs.field(factory=dict)
    formats: dict[str, ModelFormat] = attrs.field(factory=dict)
    views: dict[str, ViewRule] = attrs.field(factory=dict)
    commands: dict[str, Command] = attrs.field(factory=dict)

    def conflict_message(self, kind: str, name: str) -> str | None:
        """Why ``name`` of ``kind`` is withheld, with the setting that picks, or None."""
        from diffract.core.compute.registry import contested_message

        entry = self.contested.get(kind, {}).get(name)
        return contested_message(name, *entry) if entry is not None else None


class DiffractPluginManager(pluggy.PluginManager):
    """A pluggy manager that knows each plugin's distribution and load outcome."""

    def __init__(self, *, strict: bool = False, prefer: dict[str, str] | None = None) -> None:
        super().__init__(hookspec.PROJECT)
        self.add_hookspecs(hookspec)
        self.strict = strict
        self.prefer: dict[str, str] = dict(prefer or {})
        self.records: dict[str, PluginRecord] = {}
        self._catalog: Catalog | None = None
        self._warned: set[str] = set()

    def set_prefer(self, prefer: dict[str, str]) -> bool:
        """Add preferences (claimed name -> distribution); True when that changed them."""
        merged = {**self.prefer, **prefer}
        if merged == self.prefer:
            return False
        self.prefer = merged
        self._catalog = None
        return True

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
        if message not in self._warned:  # once per manager, however often it collects
            self._warned.add(message)
            warn(PluginWarning(message))

    def load_entry_points(
        self, allow: Iterable[str] | None = None, deny: Iterable[str] | None = None
    ) -> None:
        """Import every ``diffract`` entry point the allow/deny lists admit."""
        allow_set = {_norm(x) for x in allow} if allow is not None else None
        deny_set = {_norm(x) for x in deny or ()}
        seen: set[tuple[str, str]] = set()
        for ep_name, value, dist, version in sorted(
                entry_points(GROUP), key=lambda ep: (_norm(ep[2]), ep[0])):
            if (dist, ep_name) in seen or _norm(dist) == BUILTIN:
                continue
            seen.add((dist, ep_name))
            names = {_norm(dist), _norm(ep_name)}
            key = f"{dist}:{ep_name}"
            if (allow_set is not None and not names & allow_set) or names & deny_set:
                why = (
                    "not in DIFFRACT_PLUGINS"
                    if allow_set is not None and not names & allow_set
                    else "listed in DIFFRACT_DISABLE_PLUGINS"
                )
                self.records[key] = PluginRecord(dist, version, ep_name, "disabled", why)
                continue
            try:
                module = _load(value)
                self.register_plugin(
                    module, distribution=dist, version=version, entry_point=ep_name
                )
            except Exception as exc:  # noqa: BLE001 - one broken plugin must not stop the host
                why = f"{type(exc).__name__}: {exc}"
                record = PluginRecord(dist, version, ep_name, "failed", why)
                self.records[key] = record
                self._problem(
                    record,
                    f"Plugin {record.label} (entry point {ep_name!r} = {value!r}) failed to "
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
        impls: dict[str, dict[str, Callable[[], Iterable[Any]]]] = {
            hook_name: {
                i.plugin_name: i.function for i in getattr(self.hook, hook_name).get_hookimpls()
            }
            for hook_name, _, _ in _HOOKS
        }
        for name, _plugin in self.list_name_plugin():  # plugins registered with plain register()
            if name not in self.records:
                self.records[name] = PluginRecord(name, None, None, "loaded")
        offers: dict[str, list[tuple[PluginRecord, Any]]] = {kind: [] for _, _, kind in _HOOKS}
        # Built-in first, then by distribution name: a deterministic order for listings.
        order = sorted(
            self.records.items(), key=lambda kv: (kv[1].distribution != BUILTIN, kv[0])
        )
        for name, record in order:
            if record.status != "loaded":
                continue
            record.provides.clear()
            record.refused.clear()
            record.conflicts.clear()
            for hook_name, rtype, kind in _HOOKS:
                fn = impls[hook_name].get(name)
                if fn is not None:
                    answer = self._answer(record, fn, hook_name, rtype, kind)
                    offers[kind].extend((record, item) for item in answer)
        kept: dict[str, list[Any]] = {"ops": [item for _, item in offers["ops"]]}
        contested: dict[str, dict[str, tuple[str, tuple[str, ...]]]] = {}
        for record, item in offers["ops"]:
            record.provides.setdefault("ops", []).append(item.name)
        offers["commands"] = self._reserve_builtin_commands(offers["commands"])
        for kind in _WHAT:
            kept[kind], contested[kind] = self._settle(kind, offers[kind])
        named = {kind: {r.name: r for r in kept[kind]} for kind in _WHAT if kind != "kernels"}
        return Catalog(
            kernels=tuple(kept["kernels"]),
            ops=tuple(kept["ops"]),
            plugins=tuple(self.records.values()),
            contested=contested,
            **named,
        )

    def _reserve_builtin_commands(self, offers: list[tuple[PluginRecord, Any]]) -> list:
        """The core's own commands stay usable: a plugin's command of the same name is
        withheld (``diffract plugins`` must work to diagnose the conflict)."""
        builtin = {item.name for record, item in offers if record.distribution == BUILTIN}
        kept = []
        for record, item in offers:
            if record.distribution != BUILTIN and item.name in builtin:
                record.refused.append(item.name)
                self._problem(record, f"Plugin {record.label}: command {item.name!r} is one of "
                                      "diffract's own; the plugin's was withheld. Rename it.",
                              conflict=True)
                continue
            kept.append((record, item))
        return kept

    def _answer(self, record: PluginRecord, fn: Callable[[], Iterable[Any]], hook_name: str,
                rtype: type, kind: str) -> list[Any]:
        """One plugin's records from one hook, stamped with the provider; garbage skipped."""
        try:
            items = list(fn() or ())
        except Exception as exc:  # noqa: BLE001
            record.status, record.reason = "failed", f"{hook_name}: {type(exc).__name__}: {exc}"
            self._problem(
                record,
                f"Plugin {record.label}: hook {hook_name} raised {type(exc).__name__}: "
                f"{exc}; its {kind} were skipped. Upgrade or uninstall it.",
            )
            return []
        out, names = [], set()
        for item in items:
            if not isinstance(item, rtype):
                self._problem(
                    record,
                    f"Plugin {record.label}: hook {hook_name} yielded a "
                    f"{type(item).__name__}, not a {rtype.__name__}; it was skipped.",
                )
                continue
            if kind != "ops" and item.name in names:
                self._problem(
                    record,
                    f"Plugin {record.label}: hook {hook_name} yielded two records named "
                    f"{item.name!r}; the second was skipped.",
                )
                continue
            names.add(item.name)
            out.append(attrs.evolve(item, provider=record.label))
        return out

    def _preferred(self, claimed: str, providers: dict[str, PluginRecord]) -> str | None:
        """The provider label ``prefer`` picks for ``claimed``, if it names one of them."""
        wanted = self.prefer.get(claimed)
        if wanted is None:
            return None
        for label, record in providers.items():
            if _norm(wanted) in (_norm(record.distribution), _norm(label)):
                return label
        return None

    def _settle(self, kind: str, offers: list[tuple[PluginRecord, Any]]):
        """Keep the records no other distribution contests (after preferences); withhold
        the others, report each conflict once, and note what each plugin provides."""

        def claims(pool):
            table: dict[str, dict[str, PluginRecord]] = {}
            for record, item in pool:
                for key in _keys(kind, item):
                    table.setdefault(key, {})[record.label] = record
            return table

        losers: set[tuple[str, str]] = set()  # (provider label, claimed name)
        for claimed, providers in claims(offers).items():
            chosen = self._preferred(claimed, providers) if len(providers) > 1 else None
            if chosen is not None:
                losers.update((label, claimed) for label in providers if label != chosen)
        pool = [
            (r, i) for r, i in offers
            if not any((r.label, key) in losers for key in _keys(kind, i))
        ]
        survivors = {id(i) for _, i in pool}
        for r, i in offers:
            if id(i) not in survivors:
                r.refused.append(i.name)
        table = claims(pool)
        open_claims = {k: tuple(v) for k, v in table.items() if len(v) > 1}
        contested: dict[str, tuple[str, tuple[str, ...]]] = {}
        kept = []
        for record, item in pool:
            clash = next((k for k in _keys(kind, item) if k in open_claims), None)
            if clash is None:
                kept.append(item)
                record.provides.setdefault(kind, []).append(item.name)
                continue
            record.refused.append(item.name)
            contested[item.name] = (clash, open_claims[clash])
            for key in _keys(kind, item):
                if key in open_claims:
                    contested[key] = (key, open_claims[key])
        what = _WHAT[kind]
        for claimed, providers in sorted(open_claims.items()):
            for label in providers:
                table[claimed][label].conflicts.append(f"{what} {claimed!r}")
            self._problem(
                table[claimed][providers[0]],
                f"Conflicting plugins: {what} {claimed!r} is provided by "
                f"{' and '.join(providers)}; neither is used. Pick one with "
                f"[plugins] prefer = {{ {claimed} = \"<distribution>\" }} in the "
                "configuration (or DIFFRACT_PREFER), or uninstall one.",
                conflict=True)
        return kept, contested


def make_plugin_manager(
    *,
    autoload: bool = True,
    builtins: bool = True,
    allow: Iterable[str] | None = None,
    deny: Iterable[str] | None = None,
    strict: bool | None = None,
    prefer: dict[str, str] | None = None,
) -> DiffractPluginManager:
    """Build a plugin manager.

    ``autoload`` loads the ``diffract`` entry points (filtered by ``allow``/``deny``, which
    default to the ``DIFFRACT_PLUGINS``/``DIFFRACT_DISABLE_PLUGINS`` environment
    variables); ``builtins`` registers the core's own RAM profile, executors and kernels;
    ``strict`` (default: ``DIFFRACT_STRICT_PLUGINS``) raises instead of warning;
    ``prefer`` (default: ``DIFFRACT_PREFER``) maps a name two plugins claim to the
    distribution that should provide it."""
    pm = DiffractPluginManager(
        strict=_env_flag("DIFFRACT_STRICT_PLUGINS") if strict is None else strict,
        prefer=_env_prefer() if prefer is None else prefer)
    if builtins:
        from diffract import __version__
        from diffract.plugins import _builtin

        pm.register_plugin(_builtin, distribution=BUILTIN, version=__version__)
    if autoload:
        pm.load_entry_points(
            allow=allow if allow is not None else _env_list("DIFFRACT_PLUGINS"),
            deny=deny if deny is not None else _env_list("DIFFRACT_DISABLE_PLUGINS"))
    return pm
