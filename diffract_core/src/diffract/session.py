"""Sessions: models in a store, the compute API, and the results API.

    from diffract import Session

    with Session(profile="ram") as session:
        session.models.add(model, model_id="m1")
        session.compute.apply("frob_norm")
        table = session.results.export_metrics("frob_norm", export_format="pandas")

``session.filter(model_ids=[...])`` returns a view of the same session scoped to some
models, with the same ``compute`` and ``results`` API. The kernel registry and kernel
configuration are process-global (see :mod:`diffract.core.compute.registry`)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from diffract.compute import ComputeAPI
from diffract.config import Config, load_config
from diffract.core.cache import CacheManager
from diffract.core.compute.execution import Progress, Runner
from diffract.core.compute.registry import KernelRegistry
from diffract.core.executors import ExecutorHandle, one_openmp_thread
from diffract.core.scope import Scope
from diffract.core.storage.base import Store
from diffract.errors import (
    ConfigError,
    DiffractError,
    ExecutorError,
    InvalidArgumentError,
    ModelError,
    ScopeValidationError,
    StorageError,
    UnknownExecutorError,
    UnknownModelError,
    UnknownProfileError,
)
from diffract.models import ModelsAPI
from diffract.results import ResultsAPI
from diffract.session_view import SessionView

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
    the store; the stored results stay readable, and the session can be entered again."""

    def __init__(
        self,
        profile: str = "ram",
        config: str | Path | Mapping[str, Any] | Config | None = None,
        *,
        executor: str | None = None,
        executor_options: Mapping[str, Any] | None = None,
        **profile_options: Any,
    ) -> None:
        from diffract.plugins._runtime import apply_preferences, get_catalog

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
                key="kernels")
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
        Returns counts of what was added and the conflicts met."""
        from diffract.merge import merge_into

        if isinstance(other, Session):
            src, models = other.store, other.store.model_ids()
        elif isinstance(other, SessionView):
            src, models = other.session.store, other.model_ids
        elif isinstance(other, Store):
            src, models = other, other.model_ids()
        else:
            raise InvalidArgumentError(
                f"merge takes a Session, a SessionView or a Store, got {type(other).__name__}.")
        return merge_into(self, src, models, on_conflict)

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
        ``param_ids`` are ``"model_id/param_name"``. See :mod:`diffract.core.scope`."""
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
                model_id=unknown[0])
        if len(set(ids)) != len(ids):
            raise ModelError(f"filter() lists a model twice: {list(ids)}.", model_id=None)
        return ids

    # -- machinery --------------------------------------------------------------
    @property
    def registry(self) -> KernelRegistry:
        from diffract.plugins._runtime import get_registry

        return get_registry()

    def _thread_pool(self) -> ThreadPoolExecutor:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadPoolExecutor(
                    max_workers=self.config.thread_workers, thread_name_prefix="diffract-io",
                    initializer=one_openmp_thread)
            return self._threads

    def _runner(self, progress: Callable[[Progress], None] | None = None) -> Runner:
        return Runner(
            self.store, self.registry, self.cache, self._thread_pool(), self._executors,
            progress, chunk_seconds=self.config.chunk_seconds,
            parallel_workers=self.config.process_workers,
            batch_units=self.config.thread_workers,
            unit_timeout=self.config.unit_timeout or None,
            pool_min_seconds=self.config.pool_min_seconds)
