"""The kernel registry: kernels by name, the producer of each field, configuration.

There is one registry per process (documented behaviour of the compute API): kernels
registered and configuration set through one session apply to every session in the
process until the interpreter exits. The process's registry and plugin manager are both
owned by :mod:`diffract.plugins._runtime`, which fills the registry on first use from
the plugin catalog (every ``diffract_kernels`` hook); ``@session.compute.kernel``
decorators add to it. Names two plugins claim are *contested*: neither kernel is
registered, and using the name raises :class:`KernelConflictError` naming both
providers and the setting that picks one."""

from __future__ import annotations

import logging
import threading
from typing import Any

from diffract.core.compute.spec import SOURCE_FIELDS, KernelSpec
from diffract.errors import (
    InvalidConfigValueError,
    KernelConflictError,
    UnknownConfigKeyError,
    UnknownKernelError,
)

__all__ = ["SESSION_PROVIDER", "KernelRegistry", "contested_message"]

log = logging.getLogger(__name__)

#: Provider recorded for kernels registered with ``@session.compute.kernel``.
SESSION_PROVIDER = "<session>"


class KernelRegistry:
    """Kernels by name, the producer of each field, and per-kernel configuration."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._specs: dict[str, KernelSpec] = {}
        self._producers: dict[str, str] = {}
        self._aliases: dict[str, str] = {}  # alias -> the field it names
        self._config: dict[str, dict[str, Any]] = {}
        # kernel or field name -> (the name two plugins claim, their providers)
        self._contested: dict[str, tuple[str, tuple[str, ...]]] = {}

    # -- registration ---------------------------------------------------------
    def register(self, spec: KernelSpec) -> None:
        """Add a kernel. A session kernel may replace an earlier session kernel of the
        same name (redefinition in a notebook); any other clash raises
        :class:`KernelConflictError` naming both providers."""
        with self._lock:
            old = self._specs.get(spec.name)
            replacing = old is not None and {old.provider, spec.provider} == {SESSION_PROVIDER}
            if old is not None and not replacing:
                raise KernelConflictError(
                    f"Kernel {spec.name!r} from {spec.provider} clashes with the kernel of "
                    f"that name from {old.provider}. Register it under another name "
                    "(name=...) or uninstall one of the providers.",
                    kernel=spec.name)
            clashes = sorted(
                f"{f!r} (already produced by {self._producers[f]!r} from "
                f"{self._specs[self._producers[f]].provider})"
                for f in spec.produce_fields
                if f in self._producers and self._producers[f] != spec.name
            )
            if clashes:
                raise KernelConflictError(
                    f"Kernel {spec.name!r} from {spec.provider} produces fields another kernel "
                    f"already produces: {', '.join(clashes)}. Rename its produce_fields.",
                    kernel=spec.name)
            owner = self._producers.get
            taken = sorted(
                f"{n!r}" for n in (*spec.produce_fields, *dict(spec.aliases))
                if (n in self._aliases and owner(self._aliases[n]) != spec.name)
                or (n in dict(spec.aliases) and n in self._producers)
            )
            if taken:
                raise KernelConflictError(
                    f"Kernel {spec.name!r} from {spec.provider}: {', '.join(taken)} already "
                    "name(s) another kernel's field (as a field or an alias). Rename them.",
                    kernel=spec.name)
            if replacing:
                log.info("replacing session kernel %r", spec.name)
                self._drop(spec.name)
            self._specs[spec.name] = spec
            for f in spec.produce_fields:
                self._producers[f] = spec.name
            self._aliases.update(spec.aliases)
            stale = set(self._config.get(spec.name, ())) - set(spec.config_defaults)
            for key in stale:
                del self._config[spec.name][key]

    def _drop(self, name: str) -> None:
        spec = self._specs.pop(name)
        for f in spec.produce_fields:
            if self._producers.get(f) == name:
                del self._producers[f]
        for alias, field in spec.aliases:
            if self._aliases.get(alias) == field:
                del self._aliases[alias]

    def contest(self, name: str, claimed: str, providers: tuple[str, ...]) -> None:
        """Mark kernel or field ``name`` as withheld because several plugins claim
        ``claimed`` (the same name, or a field both kernels produce)."""
        with self._lock:
            self._contested[name] = (claimed, tuple(providers))

    def conflict(self, name: str) -> KernelConflictError | None:
        """The error to raise for a contested kernel or field name, or None."""
        entry = self._contested.get(name)
        if entry is None or name in self._specs or name in self._producers:
            return None
        claimed, providers = entry
        return KernelConflictError(
            contested_message(name, claimed, providers), kernel=name, providers=providers
        )

    # -- lookup ---------------------------------------------------------------
    def get(self, name: str) -> KernelSpec:
        try:
            return self._specs[name]
        except KeyError:
            conflict = self.conflict(name)
            if conflict is not None:
                raise conflict from None
            raise UnknownKernelError(name, self._specs) from None

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def kernels(self) -> list[KernelSpec]:
        """Every kernel, sorted by name."""
        return [self._specs[n] for n in sorted(self._specs)]

    def producer(self, field: str) -> KernelSpec | None:
        """The kernel producing ``field``, or None (source fields have no producer)."""
        name = self._producers.get(field)
        return self._specs[name] if name is not None else None

    def fields(self) -> list[str]:
        """Every field some kernel produces, plus the source fields, sorted."""
        return sorted(set(self._producers) | SOURCE_FIELDS)

    def aliases(self) -> dict[str, str]:
        """Every field alias, sorted: alias -> the field it names."""
        return dict(sorted(self._aliases.items()))

    def canonical(self, name: str) -> str:
        """The field ``name`` stands for: the field an alias names, else ``name``."""
        return self._aliases.get(name, name)

    def consumers(self, field: str) -> list[KernelSpec]:
        """Kernels that require ``field``."""
        return [s for s in self.kernels() if field in s.require_fields]

    # -- configuration ----------------------------------------------------------
    def check_config(self, name: str, values: dict[str, Any], *, source: str = "") -> None:
        """Raise when ``values`` do not configure kernel ``name``: unknown keywords
        (:class:`UnknownConfigKeyError`) or values outside their domain
        (:class:`InvalidConfigValueError`, every problem listed)."""
        spec = self.get(name)
        unknown = set(values) - set(spec.config_defaults)
        if unknown:
            raise UnknownConfigKeyError(name, unknown, spec.config_defaults)
        problems = spec.config_problems(values)
        if problems:
            raise InvalidConfigValueError(name, problems, source=source)

    def configure(self, name: str, **kwargs: Any) -> None:
        """Set configuration keywords of a kernel (process-global, kept until exit).

        Every value is checked against its keyword's domain first; on any problem
        nothing changes."""
        with self._lock:
            self.check_config(name, kwargs)
            self._config.setdefault(name, {}).update(kwargs)

    def reset_configuration(self, name: str | None = None) -> None:
        """Forget configuration set with :meth:`configure` (all kernels when ``name`` is None)."""
        with self._lock:
            if name is None:
                self._config.clear()
            else:
                self.get(name)
                self._config.pop(name, None)

    def effective_config(self, name: str) -> dict[str, Any]:
        """Defaults overlaid with what :meth:`configure` set."""
        spec = self.get(name)
        return {**spec.config_defaults, **self._config.get(name, {})}


def contested_message(name: str, claimed: str, providers: tuple[str, ...]) -> str:
    """Why a name plugins contest is unusable, and the settings that pick a provider."""
    dist = providers[0].split(" ")[0]
    why = "" if name == claimed else f"{name!r} is withheld: "
    return (
        f"{why}{claimed!r} is provided by {' and '.join(providers)}, so neither is "
        f"registered. Pick one in the configuration ([plugins] prefer = "
        f"{{ {claimed} = \"{dist}\" }}), with DIFFRACT_PREFER={claimed}={dist}, or with "
        f"make_plugin_manager(prefer={{{claimed!r}: {dist!r}}}); or uninstall one of them."
    )
