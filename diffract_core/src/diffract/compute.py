"""``session.compute``: apply fields (and their dependencies), over pairs too; configure
and register kernels; conventions presets."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from diffract._notebook import notebook_progress
from diffract.core.compute.execution import ApplyReport, Progress
from diffract.core.compute.planner import make_plan
from diffract.core.compute.registry import SESSION_PROVIDER
from diffract.core.compute.spec import KernelOptions, KernelSpec
from diffract.core.compute.staleness import find_stale
from diffract.core.scope import ScopedAPI
from diffract.errors import (
    ApplyError,
    ConfigError,
    FailedUnitsWarning,
    InvalidArgumentError,
    ModelError,
    PartialOutputWarning,
    UndefinedValuesWarning,
    UnknownConventionsError,
    UnknownKernelError,
    warn,
)

__all__ = ["ComputeAPI"]


class ComputeAPI(ScopedAPI):
    """``session.compute``: apply fields, configure and register kernels."""

    def apply(
        self,
        *fields: str,
        errors: str = "raise",
        progress: Callable[[Progress], None] | bool | None = None,
        recompute: str = "presence",
        unit_timeout: float | None = None,
    ) -> ApplyReport:
        """Compute ``fields`` (and their dependencies) for every model in scope; a field's
        alias (``list_available_metrics(verbose=True)``) computes the field it names.

        Work is selected by field presence: units that already have a kernel's outputs are
        skipped. ``recompute="stale"`` also recomputes the stored units that are stale
        (their kernel's configuration changed since, or an input did; see
        ``results.stale()``), and what depends on them. ``unit_timeout`` (seconds)
        overrides ``[parallel] unit_timeout`` for this call: a PARALLEL unit still
        running after it fails. Returns an :class:`ApplyReport`.
        When some units failed, everything else is stored and
        :class:`~diffract.errors.ApplyError` is raised at the end
        (``errors="record"`` returns the report instead, after a warning).
        ``progress`` is called after each committed chunk with a
        :class:`~diffract.core.compute.execution.Progress` record; left at None, a Jupyter
        notebook shows a bar redrawn in the cell's output (False: nothing)."""
        if errors not in ("raise", "record"):
            raise InvalidArgumentError(f"errors must be 'raise' or 'record', got {errors!r}.")
        if recompute not in ("presence", "stale"):
            raise InvalidArgumentError(
                f"recompute must be 'presence' (compute what is absent) or 'stale' (also "
                f"recompute what is stale), got {recompute!r}.")
        fields = self._fields(fields, "apply")
        if not fields:
            raise InvalidArgumentError(
                "apply() needs at least one field name, e.g. apply('frob_norm'). "
                "List them with session.compute.list_available_kernels().")
        session = self._session
        scope = self._scope_ids()
        registry = session.registry
        fields = tuple(dict.fromkeys(registry.canonical(f) for f in fields))
        if not scope:
            raise ModelError(
                "There are no models in scope. Add one with session.models.add(model, "
                "model_id=...) before applying.",
                model_id=None)
        forced: frozenset = frozenset()
        if recompute == "stale":
            forced = frozenset(
                u.key for u in find_stale(registry, session.store, scope, list(fields))
            )
        keep = None if self._scope.whole_models else self._scope.keeps
        plan = make_plan(list(fields), registry, session.store, scope, forced, keep)
        for field, kernel_name, siblings in plan.partial:
            warn(PartialOutputWarning(
                f"Field {field!r} is absent for some units, but kernel {kernel_name!r} "
                f"also produces {list(siblings)}, which are present there, so apply() "
                "skips those units. Erase the whole group to recompute: "
                f"session.results.erase({', '.join(repr(f) for f in (field, *siblings))})."))
        if unit_timeout is not None and not unit_timeout > 0:
            raise InvalidArgumentError(f"unit_timeout must be > 0 seconds, got {unit_timeout!r}.")
        with session._lock:
            runner = session._runner(notebook_progress() if progress is None else progress or None)
            if unit_timeout is not None:
                runner.unit_timeout = float(unit_timeout)
            report = runner.run(plan)
        if report.failures:
            if errors == "raise":
                raise ApplyError(report)
            warn(FailedUnitsWarning(f"{len(report.failures)} unit(s) failed; see report.failures."))
        new_undefined = [n for n in report.undefined if n.kernel in report.computed]
        if new_undefined:
            groups = len({(n.kernel, n.reason) for n in new_undefined})
            warn(UndefinedValuesWarning(
                f"{len(new_undefined)} value(s) came out undefined (NaN) for {groups} "
                "reason(s): apply() returns an ApplyReport, and report.summary() groups "
                "them; session.results.export_notes() lists each."))
        return report

    def apply_pairs(
        self,
        *fields: str,
        pairs: str | Iterable[tuple[str, str]] = "all",
        errors: str = "raise",
        recompute: str = "presence",
    ) -> dict[tuple[str, str], ApplyReport]:
        """Apply pairwise (CROSS_MODEL) ``fields`` to many pairs of the models in scope.

        ``pairs``: ``"all"`` (every pair, in model order), ``"first"`` (the first model
        against each other one: a base and its fine-tunes, checkpoint 0 and the rest),
        ``"consecutive"`` (each model with the next) or explicit ``(a, b)`` tuples; the
        order is by training step where the models have one (``models.ordered()``).
        Returns one :class:`ApplyReport` per pair. Failures of every pair are reported
        together at the end (``ApplyError``; ``errors="record"`` only warns)."""
        fields = self._fields(fields, "apply_pairs")
        ids = self._session.models.ordered(self._scope_ids())
        if pairs == "all":
            chosen = list(itertools.combinations(ids, 2))
        elif pairs == "first":
            chosen = [(ids[0], m) for m in ids[1:]]
        elif pairs == "consecutive":
            chosen = list(zip(ids, ids[1:], strict=False))
        elif isinstance(pairs, str):
            raise InvalidArgumentError(
                f"pairs must be 'all', 'first', 'consecutive' or a list of (a, b) model id "
                f"pairs, got {pairs!r}.")
        else:
            chosen = [tuple(p) for p in pairs]
            bad = [p for p in chosen if len(p) != 2 or p[0] == p[1]]
            if bad:
                raise InvalidArgumentError(
                    f"pairs must hold two different model ids each, got {bad[:3]}.")
            self._session._check_ids(sorted({m for p in chosen for m in p}))
        if errors not in ("raise", "record"):
            raise InvalidArgumentError(f"errors must be 'raise' or 'record', got {errors!r}.")
        reports: dict[tuple[str, str], ApplyReport] = {}
        combined = ApplyReport(requested=tuple(fields))
        shown = notebook_progress() or False  # one bar for every pair
        for a, b in chosen:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                report = ComputeAPI(self._session, self._scope.narrow((a, b))).apply(
                    *fields, errors="record", recompute=recompute, progress=shown)
            reports[(a, b)] = report
            combined.notes.extend(report.notes)
        if combined.failures:
            if errors == "raise":
                raise ApplyError(combined)
            warn(FailedUnitsWarning(f"{len(combined.failures)} unit(s) failed over "
                                    f"{len(chosen)} pair(s); see the reports' failures."))
        return reports

    def configure_kernel(self, name: str, **kwargs: Any) -> None:
        """Set configuration of kernel ``name`` (process-global; see the module docstring).

        Stored results are not invalidated: erase them to recompute under the new values
        (or ``apply(..., recompute="stale")``)."""
        registry = self._session.registry
        if name not in registry and (producer := registry.producer(name)) is not None:
            raise UnknownKernelError(name, [s.name for s in registry.kernels()],
                                     hint=f"{name!r} is a field; kernel {producer.name!r} "
                                          "produces it: configure that.")
        registry.configure(name, **kwargs)

    def configure_conventions(self, name: str) -> dict[str, dict[str, Any]]:
        """Apply the named conventions preset (``list_conventions()`` lists them): each
        of its kernels' settings, checked as ``configure_kernel`` checks them, all or
        nothing. Returns what was set. Process-global, like ``configure_kernel``; stored
        results are not recomputed (``apply(..., recompute="stale")`` does that)."""
        from diffract.plugins._runtime import get_catalog

        catalog = get_catalog()
        preset = catalog.conventions.get(name)
        if preset is None:
            contested = catalog.conflict_message("conventions", name)
            if contested is not None:
                raise ConfigError(f"Conventions {contested}", key="conventions")
            raise UnknownConventionsError(name, catalog.conventions)
        registry = self._session.registry
        for kernel, values in preset.settings.items():
            if kernel not in registry:
                raise UnknownKernelError(kernel, [s.name for s in registry.kernels()],
                                         hint=f"conventions {name!r} ({preset.provider}) "
                                              "configure it, but it is not registered.")
            registry.check_config(kernel, values, source=f"conventions {name!r}")
        for kernel, values in preset.settings.items():
            registry.configure(kernel, **values)
        return {k: dict(v) for k, v in preset.settings.items()}

    def list_conventions(self) -> dict[str, str]:
        """Conventions presets the installed packs provide: name -> description."""
        from diffract.plugins._runtime import get_catalog

        return {n: c.description for n, c in sorted(get_catalog().conventions.items())}

    def conventions_in_effect(self) -> list[str]:
        """The conventions presets whose every setting the kernels run with now (a
        preset is in effect after ``configure_conventions``, or when its settings are
        the defaults); empty when the configuration matches none."""
        from diffract.plugins._runtime import get_catalog

        registry = self._session.registry
        return [name for name, preset in sorted(get_catalog().conventions.items())
                if all(k in registry and all(registry.effective_config(k).get(key) == value
                                             for key, value in values.items())
                       for k, values in preset.settings.items())]

    def kernel_config(self, name: str) -> dict[str, Any]:
        """The configuration kernel ``name`` runs with now (defaults overlaid)."""
        return self._session.registry.effective_config(name)

    def list_available_metrics(self, verbose: bool = False) -> list[Any]:
        """Every field some kernel produces, sorted; with ``verbose``, one dict per field
        with the kernel that produces it, its level, its provider, its summary and its
        aliases (other names apply, export and erase accept for it)."""
        registry = self._session.registry
        specs = {f: s for s in registry.kernels() for f in s.produce_fields}
        if not verbose:
            return sorted(specs)
        aliases: dict[str, list[str]] = {}
        for alias, field in registry.aliases().items():
            aliases.setdefault(field, []).append(alias)
        return [
            {"field": f, "kernel": s.name, "apply_level": s.apply_level.name,
             "provider": s.provider, "summary": s.summary, "aliases": aliases.get(f, [])}
            for f, s in sorted(specs.items())
        ]

    def list_available_kernels(self, verbose: bool = False) -> list[Any]:
        """Names of every registered kernel; with ``verbose``, one dict per kernel with
        its fields, level, protocol, configuration (and the values each keyword
        accepts), provider and summary."""
        registry = self._session.registry
        if not verbose:
            return [s.name for s in registry.kernels()]
        return [
            {
                "name": s.name,
                "require_fields": s.require_fields,
                "produce_fields": s.produce_fields,
                "apply_level": s.apply_level.name,
                "execution_protocol": s.execution_protocol.name,
                "config": registry.effective_config(s.name),
                "accepts": {k: d.describe() for k, d in s.config_domains.items()},
                "provider": s.provider,
                "summary": s.summary,
            }
            for s in registry.kernels()
        ]

    def kernel(
        self, name: str | None = None, /, **options: Any
    ) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
        """Register the decorated function as a kernel (process-global); returns it unchanged.

        ``options`` are those of :class:`~diffract.core.compute.spec.KernelOptions`
        (require_fields, produce_fields, apply_level, execution_protocol, restrictions,
        batch). Defaults: named after the function, one output field of the same name,
        PARAMETER level, SEQUENTIAL. Inputs and configuration come from the signature."""
        if callable(name):
            raise InvalidArgumentError(
                "Use @session.compute.kernel() with parentheses (it takes options)."
            )
        if name is not None:
            options["name"] = name
        opts = KernelOptions.of(options, where="session.compute.kernel")

        def register(fn: Callable[..., Any]) -> Callable[..., Any]:
            spec = KernelSpec.from_function(
                fn, provider=SESSION_PROVIDER, **attrs.asdict(opts, recurse=False)
            )
            self._session.registry.register(spec)
            return fn

        return register
