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
import logging
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
from diffract.core.compute.planner import make_plan
from diffract.core.compute.registry import SESSION_PROVIDER, KernelRegistry
from diffract.core.compute.spec import KernelOptions, KernelSpec
from diffract.core.compute.staleness import find_stale
from diffract.core.executors import ExecutorHandle
from diffract.core.models import apply_overrides, read_model, with_views
from diffract.core.ptypes import ParameterOverrides
from diffract.core.scope import Scope, ScopedAPI
from diffract.core.storage.base import Batch, Store, split_contextual
from diffract.errors import (
    ApplyError,
    ConfigError,
    DiffractError,
    DuplicateModelError,
    ExecutorError,
    FailedUnitsWarning,
    InvalidArgumentError,
    MergeConflictError,
    ModelError,
    ModelWarning,
    PartialOutputWarning,
    ScopeValidationError,
    StorageError,
    UndefinedValuesWarning,
    UnknownConventionsError,
    UnknownExecutorError,
    UnknownKernelError,
    UnknownModelError,
    UnknownProfileError,
)
from diffract.results import ResultsAPI

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
        self.compute = ComputeAPI(self)
        self.results = ResultsAPI(self)

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

    def merge(self, other: Session | SessionView | Store, *, on_conflict: str = "raise") -> dict:
        """Bring the models and results of another session (or view, or store) into
        this one.

        A model this session lacks is added (its parameters, source and weights: a
        durable store copies in-memory weights while ``other`` is open); for a model
        both have, the parameters must agree (names and shapes). Values, aggregates and
        notes this session lacks are copied. A value both hold with different contents
        is a conflict: ``on_conflict="raise"`` (default) lists them all and changes
        nothing, ``"keep"`` keeps this session's, ``"theirs"`` takes the other's.
        Returns counts of what was added and the conflicts met.
        """
        if on_conflict not in ("raise", "keep", "theirs"):
            raise InvalidArgumentError(
                f"on_conflict must be 'raise', 'keep' or 'theirs', got {on_conflict!r}.")
        if isinstance(other, Session):
            src, models = other.store, other.store.model_ids()
        elif isinstance(other, SessionView):
            src, models = other.session.store, other.model_ids
        elif isinstance(other, Store):
            src, models = other, other.model_ids()
        else:
            raise InvalidArgumentError(
                f"merge takes a Session, a SessionView or a Store, got {type(other).__name__}.")
        with self._lock:
            plan = _merge_plan(self.store, src, models)
            if plan.conflicts and on_conflict == "raise":
                raise MergeConflictError(plan.conflicts)
            if any(c.startswith("model") for c in plan.conflicts):
                raise MergeConflictError([c for c in plan.conflicts if c.startswith("model")])
            for model_id in plan.new_models:
                self.store.add_model(
                    model_id, src.params(model_id), src.source(model_id),
                    lambda name, m=model_id: src.load_weights(m, name),
                    lambda name, m=model_id: src.load_tensor(m, name))
            values = dict(plan.values)
            aggregates = dict(plan.aggregates)
            if on_conflict == "theirs":
                values.update(plan.conflicting_values)
                aggregates.update(plan.conflicting_aggregates)
            fields = {k[2] for k in values} | {split_contextual(n)[0] for n in aggregates}
            for field in sorted(fields):  # one commit per field: it carries its provenance
                prov = plan.provenance.get(field)
                self.store.commit(Batch(
                    values={k: v for k, v in values.items() if k[2] == field},
                    aggregates={n: v for n, v in aggregates.items()
                                if split_contextual(n)[0] == field},
                    provenance={field: prov} if prov is not None else {}))
            self.store.commit(Batch(notes=plan.notes))
        return {"models_added": list(plan.new_models), "values": len(values),
                "aggregates": len(aggregates), "notes": len(plan.notes),
                "conflicts": list(plan.conflicts)}

    # -- scope ------------------------------------------------------------------
    @property
    def model_ids(self) -> list[str]:
        """Every model in the session, in insertion order."""
        return self.store.model_ids()

    def filter(
        self,
        model_ids: Sequence[str] | str | None = None,
        *,
        param_names: Sequence[str] | str | None = None,
        param_types: Sequence[Any] | Any | None = None,
        param_ids: Sequence[str] | str | None = None,
    ) -> SessionView:
        """A view of some models (in that order) and, within them, some parameters, with
        the same ``compute`` and ``results`` API; chain ``filter`` calls to narrow it.

        ``param_names`` match exactly, as globs (``"*.attention.*"``) or as regular
        expressions (``"re:..."``); ``param_types`` are ParameterType values or strings;
        ``param_ids`` are ``"model_id/param_name"``. See :mod:`diffract.core.scope`.
        """
        return SessionView(self, Scope()).filter(model_ids, param_names=param_names,
                                                 param_types=param_types, param_ids=param_ids)

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
    """A session seen through a :class:`~diffract.core.scope.Scope`: ``compute`` and
    ``results`` act on its models and parameters only. Usable as a context manager
    (leaving it does not close the session); ``filter`` narrows it further."""

    def __init__(self, session: Session, scope: Scope) -> None:
        self.session = session
        self.scope = scope
        self.compute = ComputeAPI(session, scope)
        self.results = ResultsAPI(session, scope)

    @property
    def model_ids(self) -> list[str]:
        """The models in this view, in its order."""
        return self.scope.model_ids(self.session.store)

    def filter(
        self,
        model_ids: Sequence[str] | str | None = None,
        *,
        param_names: Sequence[str] | str | None = None,
        param_types: Sequence[Any] | Any | None = None,
        param_ids: Sequence[str] | str | None = None,
    ) -> SessionView:
        """This view narrowed by more filters (see :meth:`Session.filter`)."""
        ids = None
        if model_ids is not None:
            ids = self.session._check_ids(model_ids)
            outside = [m for m in ids if m not in self.model_ids]
            if outside:
                raise UnknownModelError(
                    f"Model id(s) {outside} are outside this view's scope {self.model_ids}.",
                    model_id=outside[0],
                )
        return SessionView(self.session,
                           self.scope.narrow(ids, param_names, param_types, param_ids))

    def __enter__(self) -> SessionView:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def __repr__(self) -> str:
        return f"SessionView({self.scope.describe()})"


@attrs.define
class _MergePlan:
    """What merging another store adds here, and what conflicts (see Session.merge)."""

    new_models: list[str] = attrs.field(factory=list)
    values: dict = attrs.field(factory=dict)
    aggregates: dict = attrs.field(factory=dict)
    notes: list = attrs.field(factory=list)
    provenance: dict = attrs.field(factory=dict)
    conflicts: list[str] = attrs.field(factory=list)
    conflicting_values: dict = attrs.field(factory=dict)
    conflicting_aggregates: dict = attrs.field(factory=dict)


def _same_value(a: Any, b: Any) -> bool:
    """Equal stored values (arrays element-wise, NaN equal to NaN, tuples item-wise)."""
    import numpy as np

    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(_same_value(x, y) for x, y in zip(a, b, strict=True)))
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))
    except TypeError:
        return bool(a == b)


def _merge_plan(dst: Store, src: Store, models: Sequence[str]) -> _MergePlan:
    """What merging ``models`` of ``src`` into ``dst`` adds, and what conflicts."""
    plan = _MergePlan()
    here = set(dst.model_ids())
    for m in models:
        if m not in here:
            plan.new_models.append(m)
            continue
        mine = [(p.name, p.shape) for p in dst.params(m)]
        theirs = [(p.name, p.shape) for p in src.params(m)]
        if mine != theirs:
            plan.conflicts.append(f"model {m!r}: its parameters differ (names or shapes) "
                                  "between the sessions")
    if plan.conflicts:
        return plan
    for m in models:
        for field in src.fields(m):
            stamps = src.stamps(m, field)
            present = dst.present(m, field) if m in here else set()
            for param in src.present(m, field):
                value = src.read(m, param, field)
                if param in present:
                    if not _same_value(dst.read(m, param, field), value):
                        plan.conflicts.append(f"{m}/{param} {field!r}: different values")
                        plan.conflicting_values[(m, param, field)] = value
                    continue
                plan.values[(m, param, field)] = value
                if param in stamps:
                    plan.provenance.setdefault(field, stamps[param].provenance)
    wanted = set(models)
    for name in src.aggregate_names():
        base, ctx, _ = split_contextual(name)
        if not ctx or not set(ctx) <= wanted:
            continue
        value = src.read_aggregate(name)
        if dst.has_aggregate(name):
            if not _same_value(dst.read_aggregate(name), value):
                plan.conflicts.append(f"aggregate {name!r}: different values")
                plan.conflicting_aggregates[name] = value
            continue
        plan.aggregates[name] = value
        stamp = src.aggregate_stamp(name)
        if stamp is not None:
            plan.provenance.setdefault(base, stamp.provenance)
    keys = {n.key for n in dst.notes()}
    plan.notes = [n for n in src.notes() if set(n.models) <= wanted and n.key not in keys]
    return plan


def _check_model_id(model_id: Any) -> None:
    if not isinstance(model_id, str) or not model_id or any(c in model_id for c in ",[]@/"):
        raise ModelError(
            f"model_id must be a non-empty string without ',', '[', ']', '@' or '/' (they "
            f"delimit contextual field names and parameter ids), got {model_id!r}.",
            model_id=str(model_id),
        )


def _view_rules(views: Any) -> list[tuple[Any, dict[str, Any]]]:
    """The view rules ``views`` names, with their options, checked."""
    if views is None:
        return []
    if isinstance(views, str):
        views = [views]
    wanted = ({name: dict(opts or {}) for name, opts in views.items()}
              if isinstance(views, Mapping) else {name: {} for name in views})
    from diffract.plugins import get_catalog

    catalog = get_catalog()
    out, problems = [], []
    for name, options in wanted.items():
        rule = catalog.views.get(name)
        if rule is None:
            contested = catalog.conflict_message("views", name)
            problems.append(f"view rule {contested}" if contested else
                            f"no view rule {name!r} is installed (installed: "
                            f"{', '.join(sorted(catalog.views)) or 'none'})")
            continue
        problems += [f"view rule {name!r}: {p}" for p in
                     (rule.check(options) if rule.check is not None else [])]
        out.append((rule, options))
    if problems:
        raise InvalidArgumentError("Cannot add views: " + "; ".join(problems) + ".")
    return out


class ModelsAPI:
    """``session.models``: add models and look at what is there."""

    def __init__(self, session: Session) -> None:
        self._session = session

    def add(
        self,
        model: Any,
        model_id: str,
        *,
        copy_weights: bool = True,
        parameter_overrides: Mapping[str, ParameterOverrides] | None = None,
        base_model_id: str | None = None,
        views: Iterable[str] | Mapping[str, Mapping[str, Any]] | None = None,
        format: str | None = None,
    ) -> list[str]:
        """Add a torch module, a state dict, a checkpoint file or a Hugging Face-style
        checkpoint directory under ``model_id``.

        Files and directories are read by the installed model formats (the first that
        recognises the path; ``format`` names one). ``views`` turns on view rules
        (``["name"]``, or ``{"name": {option: value}}``): the views each splits a
        parameter into are added as parameters ``<parameter>[<label>]``, read as slices
        of it (see :mod:`diffract.core.views`).

        ``base_model_id`` (a model already added) makes this model the fine-tuning
        delta ``W - W_base`` of every parameter the base has with the same name and
        shape (after ``parameter_overrides``); the others are left out, with a
        :class:`~diffract.errors.ModelWarning` naming them.

        Returns the names of the parameters recorded (floating-point ones only). A
        durable profile copies the weights of an in-memory model so that it can read
        them after a reopen; ``copy_weights=False`` opts out (fields that need the
        weights are then skipped after a reopen, with that reason). Files are never
        copied: they are read again, after checking they did not change.
        ``parameter_overrides`` maps a parameter's name to a
        :class:`~diffract.ParameterOverrides`: a new name, a type, metadata.
        Raises DuplicateModelError, EmptyModelError or ModelSourceError; on any error
        nothing is added.
        """
        _check_model_id(model_id)
        store = self._session.store
        with self._session._lock:
            self._check_new(model_id)
            if base_model_id is not None:
                self._session._check_ids([base_model_id])
            rules = _view_rules(views)
            opened = read_model(model, model_id, format)
            if parameter_overrides:
                opened = apply_overrides(opened, parameter_overrides)
            if rules:
                opened = with_views(opened, rules)
            if base_model_id is not None:
                opened = self._delta(opened, base_model_id)
            store.add_model(model_id, opened.infos, opened.source, opened.load, opened.raw,
                            copy_weights=copy_weights)
        return [i.name for i in opened.infos]

    def _check_new(self, model_id: str) -> None:
        if model_id in self._session.store.model_ids():
            raise DuplicateModelError(
                f"Model id {model_id!r} is already in this session. Choose another "
                "model_id, or open a new session to replace it.",
                model_id=model_id,
            )

    def _delta(self, opened: Any, base_model_id: str) -> Any:
        from diffract.core.derived import delta_model

        store = self._session.store
        opened, left_out = delta_model(
            opened, base_model_id, store.params(base_model_id),
            lambda name: store.load_weights(base_model_id, name),
            lambda name: store.load_tensor(base_model_id, name))
        if left_out:
            warnings.warn(ModelWarning(
                f"{len(left_out)} parameter(s) of {opened.infos[0].model_id!r} have no "
                f"parameter of the same name and shape in base {base_model_id!r} and are "
                f"left out of the delta: {left_out[:5]}{' ...' if len(left_out) > 5 else ''}"
            ), stacklevel=3)
        return opened

    def add_lora(
        self,
        adapter: Any,
        model_id: str,
        *,
        scale: float | None = None,
        copy_weights: bool = True,
    ) -> list[str]:
        """Add the effective weight updates ``scale * B @ A`` of a LoRA adapter as a
        model: one parameter ``<module>.weight`` per adapted module. ``adapter``: a PEFT
        state dict, an ``adapter_model.safetensors``/``.bin`` file or the adapter's
        directory. ``scale`` defaults to ``lora_alpha / r`` from the directory's
        ``adapter_config.json`` (``lora_alpha / sqrt(r)`` with rsLoRA), else 1. Returns
        the parameter names."""
        from diffract.core.derived import lora_model

        _check_model_id(model_id)
        store = self._session.store
        with self._session._lock:
            self._check_new(model_id)
            opened = lora_model(adapter, model_id, scale=scale)
            store.add_model(model_id, opened.infos, opened.source, opened.load, opened.raw,
                            copy_weights=copy_weights)
        return [i.name for i in opened.infos]

    @property
    def model_ids(self) -> list[str]:
        """Every model id, in the order they were added (as ``session.model_ids``)."""
        return self._session.store.model_ids()

    def params(self, model_id: str) -> list[Any]:
        """ParamInfo records (name, shape, dtype, ptype, meta) of one model."""
        self._session._check_ids([model_id])
        return self._session.store.params(model_id)

    def list(self) -> list[dict[str, Any]]:
        """One record per model: id, number of parameters and of their elements, the
        parameter types present, and where its weights come from."""
        store = self._session.store
        out = []
        for model_id in store.model_ids():
            params = store.params(model_id)
            try:
                source = store.source(model_id)
                where = source.path or source.description or source.kind
            except (KeyError, NotImplementedError):
                where = "?"
            out.append({
                "model_id": model_id,
                "params": len(params),
                "numel": sum(p.numel for p in params),
                "ptypes": sorted({p.ptype for p in params}),
                "source": where,
            })
        return out

    def rename(self, old: str, new: str) -> None:
        """Give model ``old`` the id ``new``: its parameters, fields, notes and every
        aggregate that names it follow (contextual names are rewritten)."""
        session = self._session
        session._check_ids([old])
        _check_model_id(new)
        with session._lock:
            if new in session.store.model_ids():
                raise DuplicateModelError(
                    f"Cannot rename {old!r} to {new!r}: a model {new!r} is already in this "
                    "session. Erase or rename that one first.", model_id=new)
            session.store.rename_model(old, new)

    def erase(self, *model_ids: str, erase_all: bool = False) -> None:
        """Remove models (every model with ``erase_all``), their fields and notes, and
        every aggregate that involves them (pairs included). Their files, if any, are
        not touched."""
        session = self._session
        if erase_all:
            if model_ids:
                raise InvalidArgumentError("models.erase() takes model ids or erase_all=True, "
                                           "not both.")
            model_ids = tuple(session.store.model_ids())
        elif not model_ids:
            raise InvalidArgumentError("models.erase() needs model ids (or erase_all=True).")
        session._check_ids(list(model_ids))
        with session._lock:
            for model_id in model_ids:
                session.store.erase_model(model_id)

    def __len__(self) -> int:
        return len(self._session.store.model_ids())

    def __contains__(self, model_id: object) -> bool:
        return model_id in self._session.store.model_ids()


class ComputeAPI(ScopedAPI):
    """``session.compute``: apply fields, configure and register kernels."""

    def apply(
        self,
        *fields: str,
        errors: str = "raise",
        progress: Callable[[Progress], None] | None = None,
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
        fields = tuple(dict.fromkeys(registry.canonical(f) for f in fields))
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
        keep = None if self._scope.whole_models else self._scope.keeps
        plan = make_plan(list(fields), registry, session.store, scope, forced, keep)
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
            warnings.warn(FailedUnitsWarning(
                f"{len(report.failures)} unit(s) failed; see report.failures."), stacklevel=2)
        new_undefined = [n for n in report.undefined if n.kernel in report.computed]
        if new_undefined:
            groups = len({(n.kernel, n.reason) for n in new_undefined})
            warnings.warn(UndefinedValuesWarning(
                f"{len(new_undefined)} value(s) came out undefined (NaN) for {groups} "
                "reason(s); report.summary() groups them, results.export_notes() lists "
                "each."), stacklevel=2)
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
                report = ComputeAPI(self._session, self._scope.narrow((a, b))).apply(
                    *fields, errors="record", recompute=recompute
                )
            reports[(a, b)] = report
            combined.notes.extend(report.notes)
        if combined.failures:
            if errors == "raise":
                raise ApplyError(combined)
            warnings.warn(FailedUnitsWarning(
                f"{len(combined.failures)} unit(s) failed over {len(chosen)} pair(s); see the "
                "reports' failures."), stacklevel=2)
        return reports

    def configure_kernel(self, name: str, **kwargs: Any) -> None:
        """Set configuration of kernel ``name`` (process-global; see the module docstring).

        Stored results are not invalidated: erase them to recompute under the new values
        (or ``apply(..., recompute="stale")``).
        """
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
        from diffract.plugins import get_catalog

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
        from diffract.plugins import get_catalog

        return {n: c.description for n, c in sorted(get_catalog().conventions.items())}

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
