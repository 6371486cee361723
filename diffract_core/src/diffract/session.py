"""Sessions: models in a store, the compute API, and the results API.

    from diffract import Session

    with Session(profile="ram") as session:
        session.models.add(model, model_id="m1")
        session.compute.apply("frob_norm")
        table = session.results.export_metrics("frob_norm", export_format="pandas")

``session.filter(model_ids=[...])`` returns a view of the same session scoped to some
models, with the same ``compute`` and ``results`` API. The kernel registry and kernel
configuration are process-global (see :mod:`diffract.core.compute.registry`).
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import threading
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import attrs

from diffract.config import Config, load_config
from diffract.core.cache import CacheManager
from diffract.core.compute.execution import ApplyReport, Progress, Runner
from diffract.core.compute.planner import downstream_fields, make_plan
from diffract.core.compute.registry import SESSION_PROVIDER, KernelRegistry
from diffract.core.compute.spec import SOURCE_FIELDS, KernelOptions, KernelSpec
from diffract.core.compute.staleness import find_stale
from diffract.core.executors import ExecutorHandle
from diffract.core.models import read_model
from diffract.core.storage.base import Note, Store, contextual_name, split_contextual
from diffract.errors import (
    ApplyError,
    ConfigError,
    DiffractError,
    DuplicateModelError,
    ExecutorError,
    InvalidArgumentError,
    ModelError,
    PartialOutputWarning,
    ScopeValidationError,
    StorageError,
    UnknownExecutorError,
    UnknownFieldError,
    UnknownFormatError,
    UnknownModelError,
    UnknownProfileError,
)

__all__ = ["ScopeValidationError", "Session", "SessionView"]

log = logging.getLogger(__name__)


class Session:
    """Models, their fields, and the machinery that computes them.

    ``profile`` names a storage profile (``"ram"`` is built in; plugins add others);
    ``config`` is a TOML path, a mapping or None (see :mod:`diffract.config`);
    ``profile_options`` go to the profile's factory (e.g. a path for a disk profile).
    ``executor`` and ``executor_options`` choose the executor of PARALLEL kernels for
    this session (overriding ``[parallel] executor`` and ``[executor.<name>]``); its
    options are checked here, not when the first PARALLEL kernel runs.
    Use it as a context manager: leaving the block shuts down worker pools and flushes
    the store; the stored results stay readable, and the session can be entered again.
    """

    def __init__(
        self,
        profile: str = "ram",
        config: str | Path | Mapping[str, Any] | Config | None = None,
        *,
        executor: str | None = None,
        executor_options: Mapping[str, Any] | None = None,
        **profile_options: Any,
    ) -> None:
        from diffract.plugins import get_catalog
        from diffract.plugins._runtime import apply_preferences

        self.config = load_config(config)
        if self.config.prefer:
            apply_preferences(self.config.prefer)
        catalog = get_catalog()
        if profile not in catalog.profiles:
            contested = catalog.conflict_message("profiles", profile)
            if contested is not None:
                raise StorageError(f"Storage profile {contested}")
            raise UnknownProfileError(profile, catalog.profiles)
        self._executors = self._executor_handle(catalog, executor, executor_options)
        self._configure_kernels(self.config.kernels)
        spec = catalog.profiles[profile]
        options = {**self.config.profiles.get(profile, {}), **profile_options}
        store = spec.factory(options)
        if not isinstance(store, Store):
            raise StorageError(
                f"Storage profile {profile!r} from {spec.provider} returned a "
                f"{type(store).__name__}, not a diffract Store. Report this to its authors."
            )
        self.profile = profile
        self.store: Store = store
        self.cache = CacheManager(self.config.cache_max_bytes, self.config.cache_headroom)
        self._lock = threading.RLock()
        self._threads: ThreadPoolExecutor | None = None
        self.models = ModelsAPI(self)
        self.compute = ComputeAPI(self, None)
        self.results = ResultsAPI(self, None)

    def _executor_handle(
        self, catalog: Any, name: str | None, options: Mapping[str, Any] | None
    ) -> ExecutorHandle:
        """The handle of the chosen executor, its options checked now."""
        name = name or self.config.executor
        if name not in catalog.executors:
            contested = catalog.conflict_message("executors", name)
            if contested is not None:
                raise ConfigError(f"Executor {contested}", key="parallel.executor")
            raise UnknownExecutorError(name, catalog.executors)
        spec = catalog.executors[name]
        opts = dict(options if options is not None else self.config.executors.get(name, {}))
        problems = spec.check(self.config, opts) if spec.check is not None else []
        if problems:
            raise ExecutorError(
                f"Executor {name!r} ({spec.provider}): "
                + "; ".join(sorted(problems))
                + ". Fix [executor." + name + "] in the configuration or executor_options=."
            )
        spawns = spec.spawns(opts) if callable(spec.spawns) else bool(spec.spawns)
        reads = spec.reads_files(opts) if callable(spec.reads_files) else spec.reads_files
        return ExecutorHandle(name, lambda: spec.factory(self.config, opts), spawns=spawns,
                              inline=spec.inline, reads_files=reads)

    def _configure_kernels(self, tables: Mapping[str, Mapping[str, Any]]) -> None:
        """Apply ``[kernels.<name>]`` tables: every table checked first, all or nothing."""
        problems = []
        for name, values in sorted(tables.items()):
            try:
                self.registry.check_config(name, dict(values))
            except DiffractError as exc:
                problems.append(f"[kernels.{name}]: {exc}")
        if problems:
            raise ConfigError(
                "Invalid kernel configuration; nothing was applied:\n  "
                + "\n  ".join(problems),
                key="kernels",
            )
        for name, values in tables.items():
            self.registry.configure(name, **values)

    # -- lifecycle --------------------------------------------------------------
    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Shut down worker pools and close the store (a durable store flushes and
        releases its files; the ``ram`` store keeps its results readable)."""
        with self._lock:
            if self._threads is not None:
                self._threads.shutdown(wait=True, cancel_futures=True)
                self._threads = None
            # Queued PARALLEL work is dropped and workers that do not stop are
            # terminated: leaving a session never hangs on a stuck worker.
            self._executors.shutdown(cancel=True)
            self.store.close()

    def __repr__(self) -> str:
        return f"Session(profile={self.profile!r}, models={self.store.model_ids()!r})"

    # -- scope ------------------------------------------------------------------
    @property
    def model_ids(self) -> list[str]:
        """Every model in the session, in insertion order."""
        return self.store.model_ids()

    def filter(self, model_ids: Sequence[str]) -> SessionView:
        """A view scoped to ``model_ids`` (in that order), with compute and results."""
        return SessionView(self, self._check_ids(model_ids))

    def _check_ids(self, model_ids: Sequence[str]) -> tuple[str, ...]:
        if isinstance(model_ids, str):
            model_ids = [model_ids]
        ids = tuple(model_ids)
        known = self.store.model_ids()
        unknown = [m for m in ids if m not in known]
        if unknown:
            raise UnknownModelError(
                f"Unknown model id(s) {unknown}. Models in this session: {known}.",
                model_id=unknown[0],
            )
        if len(set(ids)) != len(ids):
            raise ModelError(f"filter() lists a model twice: {list(ids)}.", model_id=None)
        return ids

    # -- machinery --------------------------------------------------------------
    @property
    def registry(self) -> KernelRegistry:
        from diffract.plugins import get_registry

        return get_registry()

    def _thread_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(
                    max_workers=self.config.thread_workers, thread_name_prefix="diffract-io"
                )
            return self._threads

    def _runner(self, progress: Callable[[Progress], None] | None = None) -> Runner:
        return Runner(
            self.store, self.registry, self.cache, self._thread_pool(), self._executors,
            progress, chunk_seconds=self.config.chunk_seconds,
            parallel_workers=self.config.process_workers,
            batch_units=self.config.thread_workers,
            unit_timeout=self.config.unit_timeout or None,
            pool_min_seconds=self.config.pool_min_seconds,
        )


class SessionView:
    """A session scoped to some models; ``compute`` and ``results`` act on them only."""

    def __init__(self, session: Session, model_ids: tuple[str, ...]) -> None:
        self.session = session
        self.model_ids = list(model_ids)
        self.compute = ComputeAPI(session, model_ids)
        self.results = ResultsAPI(session, model_ids)

    def filter(self, model_ids: Sequence[str]) -> SessionView:
        ids = self.session._check_ids(model_ids)
        outside = [m for m in ids if m not in self.model_ids]
        if outside:
            raise UnknownModelError(
                f"Model id(s) {outside} are outside this view's scope {self.model_ids}.",
                model_id=outside[0],
            )
        return SessionView(self.session, ids)

    def __repr__(self) -> str:
        return f"SessionView(model_ids={self.model_ids!r})"


class ModelsAPI:
    """``session.models``: add models and look at what is there."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def add(self, model: Any, model_id: str, *, copy_weights: bool = True) -> list[str]:
        """Add a torch module, a state dict, a checkpoint file or a Hugging Face-style
        checkpoint directory under ``model_id``.

        Returns the names of the parameters recorded (floating-point ones only). A
        durable profile copies the weights of an in-memory model so that it can read
        them after a reopen; ``copy_weights=False`` opts out (fields that need the
        weights are then skipped after a reopen, with that reason). Files are never
        copied: they are read again, after checking they did not change.
        Raises DuplicateModelError, EmptyModelError or ModelSourceError; on any error
        nothing is added.
        """
        if not isinstance(model_id, str) or not model_id or any(c in model_id for c in ",[]@"):
            raise ModelError(
                f"model_id must be a non-empty string without ',', '[', ']' or '@' (they "
                f"delimit contextual field names), got {model_id!r}.",
                model_id=str(model_id),
            )
        store = self._session.store
        with self._session._lock:
            if model_id in store.model_ids():
                raise DuplicateModelError(
                    f"Model id {model_id!r} is already in this session. Choose another "
                    "model_id, or open a new session to replace it.",
                    model_id=model_id,
                )
            opened = read_model(model, model_id)
            store.add_model(model_id, opened.infos, opened.source, opened.load, opened.raw,
                            copy_weights=copy_weights)
        return [i.name for i in opened.infos]

    def ids(self) -> list[str]:
        return self._session.store.model_ids()

    def params(self, model_id: str) -> list[Any]:
        """ParamInfo records (name, shape, dtype) of one model."""
        self._session._check_ids([model_id])
        return self._session.store.params(model_id)

    def __len__(self) -> int:
        return len(self._session.store.model_ids())

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._session.store.model_ids()


class _Scoped:
    """An API bound to a session and a scope (None: every model of the session)."""

    def __init__(self, session: Session, scope: tuple[str, ...] | None) -> None:
        self._session = session
        self._scope = scope

    def _scope_ids(self) -> list[str]:
        return list(self._scope) if self._scope is not None else self._session.store.model_ids()


class ComputeAPI(_Scoped):
    """``session.compute``: apply fields, configure and register kernels."""

    def apply(
        self,
        *fields: str,
        errors: str = "raise",
        progress: Callable[[Progress], None] | None = None,
        recompute: str = "presence",
        unit_timeout: float | None = None,
    ) -> ApplyReport:
        """Compute ``fields`` (and their dependencies) for every model in scope.

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
        :class:`~diffract.core.compute.execution.Progress` record.
        """
        if errors not in ("raise", "record"):
            raise InvalidArgumentError(f"errors must be 'raise' or 'record', got {errors!r}.")
        if recompute not in ("presence", "stale"):
            raise InvalidArgumentError(
                f"recompute must be 'presence' (compute what is absent) or 'stale' (also "
                f"recompute what is stale), got {recompute!r}."
            )
        if not fields:
            raise InvalidArgumentError(
                "apply() needs at least one field name, e.g. apply('frob_norm'). "
                "List them with session.compute.list_available_kernels()."
            )
        session = self._session
        scope = self._scope_ids()
        registry = session.registry
        if not scope:
            raise ModelError(
                "There are no models in scope. Add one with session.models.add(model, "
                "model_id=...) before applying.",
                model_id=None,
            )
        forced: frozenset = frozenset()
        if recompute == "stale":
            forced = frozenset(
                u.key for u in find_stale(registry, session.store, scope, list(fields))
            )
        plan = make_plan(list(fields), registry, session.store, scope, forced)
        for field, kernel_name, siblings in plan.partial:
            warnings.warn(
                PartialOutputWarning(
                    f"Field {field!r} is absent for some units, but kernel {kernel_name!r} "
                    f"also produces {list(siblings)}, which are present there, so apply() "
                    "skips those units. Erase the whole group to recompute: "
                    f"session.results.erase({', '.join(repr(f) for f in (field, *siblings))})."
                ),
                stacklevel=2,
            )
        if unit_timeout is not None and not unit_timeout > 0:
            raise InvalidArgumentError(f"unit_timeout must be > 0 seconds, got {unit_timeout!r}.")
        with session._lock:
            runner = session._runner(progress)
            if unit_timeout is not None:
                runner.unit_timeout = float(unit_timeout)
            report = runner.run(plan)
        if report.failures:
            if errors == "raise":
                raise ApplyError(report)
            warnings.warn(
                f"{len(report.failures)} unit(s) failed; see report.failures.", stacklevel=2
            )
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
        ``"consecutive"`` (each model with the next) or explicit ``(a, b)`` tuples.
        Returns one :class:`ApplyReport` per pair. Failures of every pair are reported
        together at the end (``ApplyError``; ``errors="record"`` only warns).
        """
        ids = self._scope_ids()
        if pairs == "all":
            chosen = list(itertools.combinations(ids, 2))
        elif pairs == "first":
            chosen = [(ids[0], m) for m in ids[1:]]
        elif pairs == "consecutive":
            chosen = list(zip(ids, ids[1:], strict=False))
        elif isinstance(pairs, str):
            raise InvalidArgumentError(
                f"pairs must be 'all', 'first', 'consecutive' or a list of (a, b) model id "
                f"pairs, got {pairs!r}."
            )
        else:
            chosen = [tuple(p) for p in pairs]
            bad = [p for p in chosen if len(p) != 2 or p[0] == p[1]]
            if bad:
                raise InvalidArgumentError(
                    f"pairs must hold two different model ids each, got {bad[:3]}."
                )
            self._session._check_ids(sorted({m for p in chosen for m in p}))
        if errors not in ("raise", "record"):
            raise InvalidArgumentError(f"errors must be 'raise' or 'record', got {errors!r}.")
        reports: dict[tuple[str, str], ApplyReport] = {}
        combined = ApplyReport(requested=tuple(fields))
        for a, b in chosen:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", UserWarning)
                report = ComputeAPI(self._session, (a, b)).apply(
                    *fields, errors="record", recompute=recompute
                )
            reports[(a, b)] = report
            combined.notes.extend(report.notes)
        if combined.failures:
            if errors == "raise":
                raise ApplyError(combined)
            warnings.warn(
                f"{len(combined.failures)} unit(s) failed over {len(chosen)} pair(s); see the "
                "reports' failures.", stacklevel=2,
            )
        return reports

    def configure_kernel(self, name: str, **kwargs: Any) -> None:
        """Set configuration of kernel ``name`` (process-global; see the module docstring).

        Stored results are not invalidated: erase them to recompute under the new values.
        """
        self._session.registry.configure(name, **kwargs)

    def kernel_config(self, name: str) -> dict[str, Any]:
        """The configuration kernel ``name`` runs with now (defaults overlaid)."""
        return self._session.registry.effective_config(name)

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
        PARAMETER level, SEQUENTIAL. Inputs and configuration come from the signature.
        """
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


_FORMATS = ("dict", "pandas", "csv", "json")


def _plain(value: Any) -> Any:
    """A JSON-friendly form of a stored value: arrays and tuples as lists, NaN and
    infinities as None (JSON has no such numbers)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ResultsAPI(_Scoped):
    """``session.results``: export metrics and aggregates, erase fields, read notes."""

    def _check_format(self, export_format: str) -> None:
        if export_format not in _FORMATS:
            raise UnknownFormatError(export_format, _FORMATS)

    def _known_fields(self) -> set[str]:
        store = self._session.store
        stored = set().union(*(store.fields(m) for m in store.model_ids()), set())
        stored |= {split_contextual(n)[0] for n in store.aggregate_names()}
        return set(self._session.registry.fields()) | stored

    def export_metrics(
        self, *fields: str, export_format: str = "dict", path: str | Path | None = None
    ) -> Any:
        """Per-parameter values of ``fields`` (all stored fields when none are named).

        ``dict``: ``{model_id: {param: {field: value}}}``; ``pandas``: one row per
        (model_id, param), one column per field (NaN where absent); ``csv``/``json``:
        written to ``path`` when given, returned as text otherwise.
        """
        self._check_format(export_format)
        store = self._session.store
        models = self._scope_ids()
        if fields:
            known = self._known_fields()
            for f in fields:
                if f not in known:
                    raise UnknownFieldError(f, known, action="to export")
            names = list(fields)
        else:
            names = sorted(set().union(*(store.fields(m) for m in models), set()) - SOURCE_FIELDS)
        table: dict[str, dict[str, dict[str, Any]]] = {}
        for m in models:
            present = {f: store.present(m, f) for f in names}
            rows: dict[str, dict[str, Any]] = {}
            for info in store.params(m):
                row = {f: store.read(m, info.name, f) for f in names if info.name in present[f]}
                if row:
                    rows[info.name] = row
            table[m] = rows
        if export_format == "dict":
            return table
        records = [
            {"model_id": m, "param": p, **row}
            for m, rows in table.items()
            for p, row in rows.items()
        ]
        return self._emit(records, ["model_id", "param", *names], export_format, path)

    def export_aggregates(
        self, *fields: str, export_format: str = "dict", path: str | Path | None = None
    ) -> Any:
        """Aggregates (IN_MODEL and CROSS_MODEL fields) within scope.

        A name matches its base (``total_frob_norm`` matches every
        ``total_frob_norm@models[...]...``) or one contextual name exactly. ``dict``:
        ``{contextual_name: value}``; ``pandas``: columns name, field, models, param, value.
        """
        self._check_format(export_format)
        store = self._session.store
        scope = set(self._scope_ids())
        names = store.aggregate_names()
        if fields:
            known = self._known_fields()
            for f in fields:
                if "@" not in f and f not in known:
                    raise UnknownFieldError(f, known, action="to export")
        selected = {}
        for name in names:
            base, models, _ = split_contextual(name)
            if not set(models) <= scope:
                continue
            if fields and not any(f == name or f == base for f in fields):
                continue
            selected[name] = store.read_aggregate(name)
        if export_format == "dict":
            return selected
        records = []
        for name, value in selected.items():
            base, models, param = split_contextual(name)
            records.append(
                {"name": name, "field": base, "models": ",".join(models), "param": param,
                 "value": value}
            )
        columns = ["name", "field", "models", "param", "value"]
        return self._emit(records, columns, export_format, path)

    def export_notes(self, export_format: str = "dict") -> Any:
        """Why units were skipped, left undefined (NaN) or failed, within scope."""
        self._check_format(export_format)
        scope = set(self._scope_ids())
        notes: list[Note] = [n for n in self._session.store.notes() if set(n.models) <= scope]
        records = [
            {"kernel": n.kernel, "unit": n.unit, "kind": n.kind, "reason": n.reason} for n in notes
        ]
        if export_format == "dict":
            return records
        return self._emit(records, ["kernel", "unit", "kind", "reason"], export_format, None)

    def stale(self, *fields: str, export_format: str = "dict") -> Any:
        """Stored results that no longer match the current configuration, in scope.

        A unit is stale when its kernel's configuration changed since it was computed,
        or when an input it was computed from is stale or was recomputed after it. With
        ``fields``, only those and their dependencies are checked. One record per kernel
        and unit: kernel, fields, unit and reason. ``apply(..., recompute="stale")``
        recomputes them.
        """
        self._check_format(export_format)
        session = self._session
        names = list(fields) if fields else None
        if names:
            known = self._known_fields()
            for f in names:
                if f not in known:
                    raise UnknownFieldError(f, known, action="to check")
        units = find_stale(session.registry, session.store, self._scope_ids(), names)
        records = [
            {"kernel": u.kernel, "fields": list(u.fields), "unit": u.unit, "reason": u.reason}
            for u in units
        ]
        if export_format == "dict":
            return records
        return self._emit(records, ["kernel", "fields", "unit", "reason"], export_format, None)

    def provenance(self, field: str, model_id: str, param: str | None = None) -> dict | None:
        """What produced a stored value: kernel, provider and configuration (None when
        the value is absent or was stored without provenance). ``param`` None: the
        model's aggregate ``field@models[model_id]``."""
        store = self._session.store
        if param is None:
            stamp = store.aggregate_stamp(contextual_name(field, (model_id,)))
        else:
            stamp = store.stamps(model_id, field).get(param)
        if stamp is None:
            return None
        p = stamp.provenance
        return {"kernel": p.kernel, "provider": p.provider, "config": p.config_dict}

    def erase(self, *fields: str, erase_dependent_also: bool = False) -> int:
        """Erase stored ``fields`` for the models in scope; returns how many values went.

        With ``erase_dependent_also``, every field computed from them downstream is erased
        too. Erase a multi-output kernel's fields as a group: a unit is recomputed only
        when all of its kernel's outputs are absent.
        """
        if not fields:
            raise InvalidArgumentError("erase() needs at least one field name.")
        registry = self._session.registry
        known = self._known_fields()
        for f in fields:
            if f in SOURCE_FIELDS:
                raise InvalidArgumentError(
                    f"Field {f!r} holds the model's weights and cannot be erased; open a "
                    "new session without the model instead."
                )
            if f not in known:
                raise UnknownFieldError(f, known, action="to erase")
        targets = set(fields)
        if erase_dependent_also:
            targets |= downstream_fields(fields, registry)
        kernels = {s.name for f in targets if (s := registry.producer(f)) is not None}
        with self._session._lock:
            return self._session.store.erase(targets, self._scope_ids(), kernels)

    # -- output -------------------------------------------------------------------
    @staticmethod
    def _emit(records: list[dict], columns: list[str], fmt: str, path: str | Path | None) -> Any:
        if fmt == "pandas":
            try:
                import pandas as pd
            except ImportError:
                raise DiffractError(
                    "export_format='pandas' needs pandas: pip install 'diffract-core[pandas]'."
                ) from None
            return pd.DataFrame.from_records(records, columns=columns)
        if fmt == "json":
            text = json.dumps(
                [{k: _plain(v) for k, v in r.items()} for r in records], indent=1, allow_nan=False
            )
        else:
            import csv
            import io

            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for r in records:
                writer.writerow({k: (v if not hasattr(v, "shape") or v.shape == () else
                                     json.dumps(_plain(v))) for k, v in r.items()})
            text = buf.getvalue()
        if path is None:
            return text
        Path(path).write_text(text)
        return Path(path)
