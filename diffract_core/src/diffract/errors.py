"""The exception and warning hierarchy of Diffract.

Every error raised on purpose by Diffract derives from :class:`DiffractError` and keeps
the offending object as an attribute (``kernel``, ``field``, ``model_id``,
``distribution`` ...). Messages say which object, what is wrong and what to do.

The whole hierarchy, drawn as a tree: docs/compute.md, "Errors and warnings".

The unknown-name errors sit under two parents where they also belong to a family
(``UnknownKernelError`` is a ``KernelError``, ``UnknownFieldError`` a ``FieldError``,
``UnknownModelError`` a ``ModelError``, ``UnknownProfileError`` a ``StorageError``).
Kernel packs derive their own errors from these.

:class:`FieldUndefined` is not an error: a kernel raises it to say its outputs are
undefined for one input (NaN is stored with the reason).

Warnings derive from :class:`DiffractWarning`."""

from __future__ import annotations

import contextlib
import difflib
import sys
import warnings
from collections.abc import Iterable
from typing import Any

__all__ = [
    "ApplyError", "ConfigError", "DependencyCycleError", "DiffractError",
    "DiffractWarning", "DuplicateModelError", "EmptyModelError", "ExecutorError",
    "ExecutorWarning", "FailedUnitsWarning", "FieldError", "FieldUndefined",
    "InvalidArgumentError", "InvalidConfigValueError", "KernelConflictError",
    "KernelDefinitionError", "KernelError", "KernelOutputError", "MergeConflictError",
    "MissingProducerError", "ModelError", "ModelSourceError", "ModelWarning",
    "PartialOutputWarning", "PluginConflictError", "PluginError", "PluginLoadError",
    "PluginWarning", "ScopeValidationError", "StorageError", "UndefinedValuesWarning",
    "UnknownConfigKeyError", "UnknownConventionsError", "UnknownExecutorError",
    "UnknownFieldError", "UnknownFormatError", "UnknownKernelError",
    "UnknownModelError", "UnknownNameError", "UnknownOpError", "UnknownProfileError",
    "WeightsUnavailableError", "did_you_mean", "install_hint", "printable", "provider_of",
    "warn",
]


def printable(text: str, keep: str = "") -> str:
    """``text`` for a terminal: every character it would act on (ESC, CR, BEL, NUL, a
    newline, bidi overrides and other controls or format characters) written as its visible
    escape (``\\x1b``, ``\\n``, ``\\u202e``), but those in ``keep``."""
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode()
                   for c in text)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """Return ``" Did you mean 'x'?"`` for the closest known word, or an empty string."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def _listing(names: Iterable[str], limit: int = 40) -> str:
    names = sorted(names)
    shown = ", ".join(repr(n) for n in names[:limit])
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return (shown + more) if names else "(none)"


def _unknown(what: str, name: str, known: list[str], then: str) -> str:
    """The message of an unknown name: what it is, a suggestion, then ``then`` with
    ``{known}`` replaced by the listing of the known names."""
    return (f"Unknown {what} {name!r}.{did_you_mean(name, known)} "
            + then.format(known=_listing(known)))


class DiffractError(Exception):
    """Base class of every error Diffract raises on purpose."""


class InvalidArgumentError(DiffractError, ValueError):
    """A public call got an argument it cannot use; the message says what it accepts."""


class UnknownNameError(InvalidArgumentError):
    """A name (kernel, field, model, profile, executor, op, format...) nothing registered.

    ``.name`` is the unknown name; messages list the known ones with a suggestion."""

    name: str


class ConfigError(DiffractError, ValueError):
    """A configuration file or key is invalid."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.key = key


class KernelError(DiffractError):
    """Something is wrong with one kernel; ``.kernel`` names it."""

    def __init__(self, message: str, *, kernel: str) -> None:
        super().__init__(message)
        self.kernel = kernel


class KernelDefinitionError(KernelError, ValueError):
    """A function cannot be registered as a kernel (bad signature, bad metadata)."""


class KernelConflictError(KernelError, ValueError):
    """Two kernels claim the same name or produce the same field.

    ``.providers`` names the distributions that claim it, when plugins do."""

    def __init__(self, message: str, *, kernel: str, providers: Iterable[str] = ()) -> None:
        super().__init__(message, kernel=kernel)
        self.providers = tuple(providers)


class UnknownKernelError(KernelError, UnknownNameError):
    """A kernel name nobody registered."""

    def __init__(self, kernel: str, known: Iterable[str], *, hint: str | None = None) -> None:
        known = list(known)
        lead = f" {hint}" if hint else did_you_mean(kernel, known)
        super().__init__(
            f"Unknown kernel {kernel!r}.{lead} "
            f"Known kernels: {_listing(known)}. "
            "List them with `diffract kernels -v` (in Python: "
            "session.compute.list_available_kernels()).",
            kernel=kernel)
        self.name = kernel


class UnknownConfigKeyError(KernelError, UnknownNameError):
    """configure_kernel was given keywords the kernel does not accept."""

    def __init__(self, kernel: str, keys: Iterable[str], known: Iterable[str]) -> None:
        keys, known = sorted(keys), sorted(known)
        hints = "".join(did_you_mean(k, known) for k in keys)
        accepted = _listing(known) if known else "none: it takes no configuration"
        super().__init__(
            f"Kernel {kernel!r} has no configuration keyword "
            f"{', '.join(repr(k) for k in keys)}.{hints} It accepts: {accepted}.",
            kernel=kernel)
        self.keys = tuple(keys)
        self.name = keys[0]


class InvalidConfigValueError(KernelError, InvalidArgumentError):
    """configure_kernel (or the configuration file) set values outside their domain.

    ``.problems`` lists each one (``key: what is wrong``); nothing was changed."""

    def __init__(self, kernel: str, problems: Iterable[str], *, source: str = "") -> None:
        problems = sorted(problems)
        where = f" in {source}" if source else ""
        super().__init__(
            f"Invalid configuration of kernel {kernel!r}{where}:\n  "
            + "\n  ".join(problems)
            + "\nNothing was changed; see the kernel's signature (diffract kernels -v) for "
            "the values each keyword accepts.",
            kernel=kernel)
        self.problems = tuple(problems)


class KernelOutputError(KernelError):
    """A kernel returned a value that cannot be mapped onto its produce_fields."""

    def __init__(self, message: str, *, kernel: str, unit: str) -> None:
        super().__init__(message, kernel=kernel)
        self.unit = unit


class FieldError(DiffractError, ValueError):
    """Something is wrong with one field; ``.field`` names it."""

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class UnknownFieldError(FieldError, UnknownNameError):
    """A field that no registered kernel produces."""

    def __init__(self, field: str, known: Iterable[str], *, action: str = "requested",
                 hint: str | None = None) -> None:
        known = list(known)
        dist = None if hint else provider_of("fields", field)
        hint = hint or dist and (f"{field!r} comes from {dist}, which is not installed (or is "
                                 f"disabled by DIFFRACT_PLUGINS/DIFFRACT_DISABLE_PLUGINS): "
                                 f"{install_hint(dist)}.")
        lead = f" {hint}" if hint else did_you_mean(field, known)
        super().__init__(
            f"Unknown field {field!r} {action}.{lead} "
            f"Known fields: {_listing(known)}. `diffract kernels -v` shows which kernel "
            "produces each (in Python: session.compute.list_available_metrics(True)); install "
            "the kernel pack that produces it, or register a kernel with "
            "@session.compute.kernel().",
            field=field)
        self.name = field


class MissingProducerError(FieldError):
    """A kernel requires an input field that no kernel produces."""

    def __init__(self, field: str, consumer: str, known: Iterable[str], *,
                 install: str | None = None) -> None:
        install = install or provider_of("fields", field)
        fix = (f"Install {install} ({install_hint(install)}), which produces it."
               if install else f"Install the kernel pack that produces {field!r} or register "
               "a kernel for it.")
        super().__init__(
            f"Kernel {consumer!r} requires field {field!r}, which no registered kernel "
            f"produces.{did_you_mean(field, known)} {fix}",
            field=field)
        self.install = install
        self.consumer = consumer


class DependencyCycleError(FieldError):
    """Kernels whose required fields form a cycle."""

    def __init__(self, cycle: list[str]) -> None:
        super().__init__(
            "Kernels depend on each other in a cycle: "
            + " -> ".join(repr(f) for f in cycle)
            + ". Break the cycle by changing one kernel's require_fields.",
            field=cycle[0])
        self.cycle = tuple(cycle)


class ScopeValidationError(FieldError):
    """A binary cross-model kernel was applied to a scope that is not exactly two models.

    Attributes: ``field`` (what was requested), ``kernel`` (the pairwise kernel that
    cannot run), ``dependency`` (the pairwise field it came from, or None when the
    requested field's own kernel is the pairwise one), ``scope`` (model ids in scope)."""

    def __init__(
        self, message: str, *, field: str, kernel: str, dependency: str | None, scope: list[str]
    ) -> None:
        super().__init__(message, field=field)
        self.kernel = kernel
        self.dependency = dependency
        self.scope = tuple(scope)


class ModelError(DiffractError, ValueError):
    """Something is wrong with one model; ``.model_id`` names it."""

    def __init__(self, message: str, *, model_id: str | None) -> None:
        super().__init__(message)
        self.model_id = model_id


class DuplicateModelError(ModelError):
    """models.add was given a model_id that is already in the session."""


class EmptyModelError(ModelError):
    """models.add was given a model with no parameters."""


class UnknownModelError(ModelError, UnknownNameError):
    """A model id that is not in the session."""

    def __init__(self, message: str, *, model_id: str | None) -> None:
        super().__init__(message, model_id=model_id)
        self.name = str(model_id)


class ModelSourceError(ModelError):
    """models.add was given something it cannot read as a model."""


class MergeConflictError(DiffractError, ValueError):
    """``session.merge`` met models or values that differ between the sessions;
    ``.conflicts`` lists each, and nothing was changed."""

    def __init__(self, conflicts: Iterable[str]) -> None:
        conflicts = sorted(conflicts)
        shown = "\n  ".join(conflicts[:20])
        more = f"\n  ... and {len(conflicts) - 20} more" if len(conflicts) > 20 else ""
        super().__init__(
            f"{len(conflicts)} conflict(s) between the sessions; nothing was merged:\n  "
            f"{shown}{more}\nResolve them, or merge with on_conflict='keep' (keep this "
            "session's values) or 'theirs' (take the other's)."
        )
        self.conflicts = tuple(conflicts)


class WeightsUnavailableError(ModelSourceError):
    """A model's weights are not available any more: an in-memory model added to a
    durable store with ``copy_weights=False``, read after the store was reopened. Units
    that need them are skipped with this reason (not failed)."""


class StorageError(DiffractError):
    """A storage profile failed or was misused."""


class UnknownProfileError(StorageError, UnknownNameError):
    """Session(profile=...) names a profile no plugin provides."""

    def __init__(self, profile: str, known: Iterable[str]) -> None:
        super().__init__(_unknown(
            "storage profile", profile, list(known),
            "Available profiles: {known}. Install the plugin that provides it (see "
            "`diffract plugins`)."))
        self.profile = self.name = profile


class ExecutorError(DiffractError):
    """An executor cannot run PARALLEL kernels as configured; the message says why
    (invalid options, a script that spawned workers would run again) and what to do."""


class UnknownExecutorError(UnknownNameError):
    """The configuration names an executor no plugin provides."""

    def __init__(self, executor: str, known: Iterable[str]) -> None:
        super().__init__(_unknown(
            "executor", executor, list(known),
            "Available executors: {known}. Set [parallel] executor in the configuration "
            "to one of them, or install the plugin that provides it."))
        self.executor = self.name = executor


class UnknownOpError(UnknownNameError):
    """No plugin offers an op of that name, or none can run this call."""

    def __init__(self, message: str, *, op: str) -> None:
        super().__init__(message)
        self.op = self.name = op


class UnknownFormatError(UnknownNameError):
    """An export format nobody registered."""

    def __init__(self, fmt: str, known: Iterable[str]) -> None:
        super().__init__(_unknown("export_format", fmt, list(known), "Choose one of {known}."))
        self.format = self.name = fmt


class UnknownConventionsError(UnknownNameError):
    """A conventions preset no installed pack provides."""

    def __init__(self, name: str, known: Iterable[str]) -> None:
        super().__init__(_unknown(
            "conventions", name, list(known),
            "Known: {known}; `diffract analyze --help` (in Python: "
            "session.compute.list_conventions()) describes them. Kernel packs provide them "
            "(see `diffract plugins`)."))
        self.conventions = self.name = name


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
    ``report.failures`` lists each failure with its kernel, unit and reason."""

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
    not cover (a 1-D spectrum too short to fit, NaN weights, an all-zero matrix)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class DiffractWarning(UserWarning):
    """Base class of Diffract's warnings."""


class PluginWarning(DiffractWarning):
    """A plugin failed to load or conflicts with another; the host carries on without it."""


class FailedUnitsWarning(DiffractWarning):
    """``apply(..., errors="record")`` finished with failed units (report.failures)."""


class UndefinedValuesWarning(DiffractWarning):
    """An apply stored undefined (NaN) values; once per apply, reasons grouped."""


class PartialOutputWarning(DiffractWarning):
    """A requested field is absent but its kernel's sibling outputs are present."""


class ExecutorWarning(DiffractWarning):
    """The executor could not be used as configured and the work ran another way (in
    this process); the values are the same, the message says how to use it."""


class ModelWarning(DiffractWarning):
    """A model was added without some of its parameters (e.g. a fine-tuning delta's
    parameters that its base lacks); the message names them."""


_OURS = ("diffract", "pluggy", "kernel_fun")


def warn(warning: Warning) -> None:
    """``warning`` said at the user's line: the first frame not Diffract's nor pluggy's."""
    frame, level = sys._getframe(1), 2
    while frame.f_back and frame.f_globals.get("__name__", "").startswith(_OURS):
        frame, level = frame.f_back, level + 1
    warnings.warn(warning, stacklevel=level)


def _distributions() -> dict[str, dict[str, Any]]:
    """The repository's distributions: what each provides, where (tools/distributions.py)."""
    import json
    from importlib import resources

    return json.loads(resources.files("diffract").joinpath("distributions.json").read_text())


def provider_of(kind: str, name: str) -> str | None:
    """The distribution whose ``kind`` (fields, commands, formats ...) has ``name``."""
    return next((d for d, has in _distributions().items() if name in has.get(kind, ())), None)


def install_hint(distribution: str, extra: str = "") -> str:
    """``pip install`` for ``distribution`` (and ``extra``), and from a checkout; for one
    installed already (without an extra), how to load what the plugin manager left out."""
    from importlib import metadata

    with contextlib.suppress(metadata.PackageNotFoundError):
        if not extra and metadata.distribution(distribution):
            return (f"{distribution} is installed but not loaded (make_plugin_manager("
                    "autoload=False), allow=, deny=, DIFFRACT_PLUGINS or "
                    "DIFFRACT_DISABLE_PLUGINS left it out): make_plugin_manager(allow=[..., "
                    f"{distribution!r}]) loads it")
    path = _distributions().get(distribution, {}).get("path")
    name, local = (f"'{distribution}[{extra}]'", f"'./{path}[{extra}]'") if extra else (
        distribution, f"./{path}")
    return f"pip install {name}" + (f" (from a checkout of Diffract: pip install {local})"
                                    if path else "")
