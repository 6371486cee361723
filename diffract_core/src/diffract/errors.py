"""The exception and warning hierarchy of Diffract.

Every error raised on purpose by Diffract derives from :class:`DiffractError` and keeps
the offending object as an attribute (``kernel``, ``field``, ``model_id``,
``distribution`` ...). Messages say which object, what is wrong and what to do.

Hierarchy::

    DiffractError
    ├── ConfigError                 bad configuration file or key
    ├── KernelError                 .kernel
    │   ├── KernelDefinitionError   a function that cannot be a kernel
    │   ├── KernelConflictError     two kernels claim one name or one field
    │   ├── UnknownKernelError      configure_kernel on a name nobody registered
    │   ├── UnknownConfigKeyError   configure_kernel with a keyword the kernel lacks
    │   └── KernelOutputError       a kernel returned the wrong number or type of outputs
    ├── FieldError                  .field
    │   ├── UnknownFieldError       a field no kernel produces
    │   ├── MissingProducerError    a kernel requires a field no kernel produces
    │   └── DependencyCycleError    kernels that require each other's outputs
    ├── ScopeValidationError        a pairwise kernel applied to a scope that is not a pair
    ├── ModelError                  .model_id
    │   ├── DuplicateModelError
    │   ├── EmptyModelError         a model with no parameters
    │   ├── UnknownModelError
    │   └── ModelSourceError        something models.add cannot read
    ├── StorageError
    │   └── UnknownProfileError
    ├── UnknownExecutorError
    ├── PluginError                 .distribution, .version
    │   ├── PluginLoadError         (strict mode) a plugin failed to import or answer a hook
    │   └── PluginConflictError     (strict mode) two plugins provide one name
    └── ApplyError                  some units failed; .report holds everything

Warnings derive from :class:`DiffractWarning`.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable
from typing import Any

__all__ = [
    "ApplyError",
    "ConfigError",
    "DependencyCycleError",
    "DiffractError",
    "DiffractWarning",
    "DuplicateModelError",
    "EmptyModelError",
    "FieldError",
    "FieldUndefined",
    "KernelConflictError",
    "KernelDefinitionError",
    "KernelError",
    "KernelOutputError",
    "MissingProducerError",
    "ModelError",
    "ModelSourceError",
    "PartialOutputWarning",
    "PluginConflictError",
    "PluginError",
    "PluginLoadError",
    "PluginWarning",
    "ScopeValidationError",
    "StorageError",
    "UnknownConfigKeyError",
    "UnknownExecutorError",
    "UnknownFieldError",
    "UnknownKernelError",
    "UnknownModelError",
    "UnknownProfileError",
    "did_you_mean",
]


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest known word, or an empty string."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _listing(names: Iterable[str], limit: int = 40) -> str:
    names = sorted(names)
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return (shown + more) if names else "(none)"


class DiffractError(Exception):
    """Base class of every error Diffract raises on purpose."""


class ConfigError(DiffractError):
    """A configuration file or key is invalid."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class KernelError(DiffractError):
    """Something is wrong with one kernel; ``.kernel`` names it."""

    def __init__(self, message: str, *, kernel: str) -> None:
        super().__init__(message)
        self.kernel = kernel


class KernelDefinitionError(KernelError):
    """A function cannot be registered as a kernel (bad signature, bad metadata)."""


class KernelConflictError(KernelError):
    """Two kernels claim the same name or produce the same field."""


class UnknownKernelError(KernelError):
    """A kernel name nobody registered."""

    def __init__(self, kernel: str, known: Iterable[str]) -> None:
        known = list(known)
        super().__init__(
            f"Unknown kernel {kernel!r}.{did_you_mean(kernel, known)} "
            f"Known kernels: {_listing(known)}. "
            "List them with session.compute.list_available_kernels().",
            kernel=kernel,
        )


class UnknownConfigKeyError(KernelError):
    """configure_kernel was given keywords the kernel does not accept."""

    def __init__(self, kernel: str, keys: Iterable[str], known: Iterable[str]) -> None:
        keys, known = sorted(keys), sorted(known)
        hints = "".join(did_you_mean(k, known) for k in keys)
        accepted = _listing(known) if known else "none: it takes no configuration"
        super().__init__(
            f"Kernel {kernel!r} has no configuration keyword "
            f"{', '.join(repr(k) for k in keys)}.{hints} It accepts: {accepted}.",
            kernel=kernel,
        )
        self.keys = tuple(keys)


class KernelOutputError(KernelError):
    """A kernel returned a value that cannot be mapped onto its produce_fields."""

    def __init__(self, message: str, *, kernel: str, unit: str) -> None:
        super().__init__(message, kernel=kernel)
        self.unit = unit


class FieldError(DiffractError):
    """Something is wrong with one field; ``.field`` names it."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class UnknownFieldError(FieldError):
    """A field that no registered kernel produces."""

    def __init__(self, field: str, known: Iterable[str], *, action: str = "requested") -> None:
        known = list(known)
        super().__init__(
            f"Unknown field {field!r} {action}.{did_you_mean(field, known)} "
            f"Known fields: {_listing(known)}. Install the kernel pack that produces it, "
            "or register a kernel with @session.compute.kernel().",
            field=field,
        )


class MissingProducerError(FieldError):
    """A kernel requires an input field that no kernel produces."""

    def __init__(self, field: str, consumer: str, known: Iterable[str]) -> None:
        super().__init__(
            f"Kernel {consumer!r} requires field {field!r}, which no registered kernel "
            f"produces.{did_you_mean(field, known)} Install the kernel pack that produces "
            f"{field!r} or register a kernel for it.",
            field=field,
        )
        self.consumer = consumer


class DependencyCycleError(FieldError):
    """Kernels whose required fields form a cycle."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__(
            "Kernels depend on each other in a cycle: "
            + " -> ".join(repr(f) for f in cycle)
            + ". Break the cycle by changing one kernel's require_fields.",
            field=cycle[0],
        )
        self.cycle = tuple(cycle)


class ScopeValidationError(DiffractError):
    """A binary cross-model kernel was applied to a scope that is not exactly two models.

    Attributes: ``field`` (what was requested), ``kernel`` (the pairwise kernel that
    cannot run), ``dependency`` (the pairwise field it came from, or None when the
    requested field's own kernel is the pairwise one), ``scope`` (model ids in scope).
    """

    def __init__(
        self, message: str, *, field: str, kernel: str, dependency: str | None, scope: list[str]
    ) -> None:
        super().__init__(message)
        self.field = field
        self.kernel = kernel
        self.dependency = dependency
        self.scope = tuple(scope)


class ModelError(DiffractError):
    """Something is wrong with one model; ``.model_id`` names it."""

    def __init__(self, message: str, *, model_id: str | None) -> None:
        super().__init__(message)
        self.model_id = model_id


class DuplicateModelError(ModelError):
    """models.add was given a model_id that is already in the session."""


class EmptyModelError(ModelError):
    """models.add was given a model with no parameters."""


class UnknownModelError(ModelError):
    """A model id that is not in the session."""


class ModelSourceError(ModelError):
    """models.add was given something it cannot read as a model."""


class StorageError(DiffractError):
    """A storage profile failed or was misused."""


class UnknownProfileError(StorageError):
    """Session(profile=...) names a profile no plugin provides."""

    def __init__(self, profile: str, known: Iterable[str]) -> None:
        known = list(known)
        super().__init__(
            f"Unknown storage profile {profile!r}.{did_you_mean(profile, known)} "
            f"Available profiles: {_listing(known)}. Install the plugin that provides it "
            "(see `diffract plugins`)."
        )
        self.profile = profile


class UnknownExecutorError(DiffractError):
    """The configuration names an executor no plugin provides."""

    def __init__(self, executor: str, known: Iterable[str]) -> None:
        known = list(known)
        super().__init__(
            f"Unknown executor {executor!r}.{did_you_mean(executor, known)} "
            f"Available executors: {_listing(known)}. Set [parallel] executor in the "
            "configuration to one of them, or install the plugin that provides it."
        )
        self.executor = executor


class PluginError(DiffractError):
    """A plugin is broken or conflicts with another (raised only in strict mode)."""

    def __init__(self, message: str, *, distribution: str, version: str | None) -> None:
        super().__init__(message)
        self.distribution = distribution
        self.version = version


class PluginLoadError(PluginError):
    """A plugin failed to import, or one of its hooks raised or yielded garbage."""


class PluginConflictError(PluginError):
    """Two plugins provide a record of the same kind under the same name."""


class ApplyError(DiffractError):
    """Some units of an apply failed; everything else was computed and stored.

    ``report`` is the :class:`~diffract.core.compute.execution.ApplyReport` of the run;
    ``report.failures`` lists each failure with its kernel, unit and reason.
    """

    def __init__(self, report: Any) -> None:
        failures = report.failures
        lines = [f"  {f.kernel} on {f.unit}: {f.reason}" for f in failures[:20]]
        more = f"\n  ... and {len(failures) - 20} more" if len(failures) > 20 else ""
        super().__init__(
            f"{len(failures)} unit(s) failed; every other result was stored:\n"
            + "\n".join(lines)
            + more
            + "\nFix the cause and apply again: only the failed units are recomputed. "
            "Pass errors='record' to apply() to get the report without raising."
        )
        self.report = report


class FieldUndefined(Exception):
    """Raised by a kernel when its outputs are undefined for this input (not a failure).

    The executor stores NaN for every field the kernel produces and records ``reason``
    for the unit, so later applies do not retry it: use it for input the formula does
    not cover (a 1-D spectrum too short to fit, NaN weights, an all-zero matrix).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DiffractWarning(UserWarning):
    """Base class of Diffract's warnings."""


class PluginWarning(DiffractWarning):
    """A plugin failed to load or conflicts with another; the host carries on without it."""


class PartialOutputWarning(DiffractWarning):
    """A requested field is absent but its kernel's sibling outputs are present."""
