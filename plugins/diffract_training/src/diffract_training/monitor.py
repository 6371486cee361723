"""The engine behind every front end: a cadence, a snapshot of the analysed weights, the
analysis in a background thread, the numbers out through sinks, each analysed step kept
in a store as a step of a trajectory.

The loop pays for the snapshot alone: at a cadence point the analysed parameters are
copied (on their device; the copy is released as soon as its spectra are computed) and
the call returns. One analysis runs at a time: a cadence point that comes while the
previous analysis still runs is skipped, with one warning for the run. Nothing the
analysis raises reaches the loop: each failure is logged once per parameter and reason.
Sinks are called from the thread that calls :meth:`Monitor.step` (the training loop's),
never from the worker, so a tracker that is not thread-safe is safe here.
"""

from __future__ import annotations

import logging
import math
import sys
import threading
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diffract import Session
from diffract.errors import (
    FailedUnitsWarning,
    InvalidArgumentError,
    UndefinedValuesWarning,
    UnknownFieldError,
)
from diffract.plugins import contextual_name, one_openmp_thread
from diffract_training._analysis import AnalysisMixin, matrices, tag
from diffract_training._dist import Ranks, shares, world
from diffract_training._setup import (
    FrozenSession,
    check_arguments,
    checkpoint_names,
    configured,
    fsdp1_units,
    lock_store,
    unwrapped_names,
)
from diffract_training._setup import global_step as _step
from diffract_training._sinks import sinks as _sinks
from diffract_training._snapshot import Snapshot, blocks, nbytes, rank
from diffract_training._spread import DONE, SpreadMixin

__all__ = ["DEFAULT_METRICS", "VIEW_METRICS", "Monitor", "tag"]

log = logging.getLogger("diffract_training")

#: What a monitor computes per parameter by default: the fields ``diffract analyze``
#: shows that a training team reads over time (the power-law exponent and its weighted
#: form, the ranks and norms, the training warning).
DEFAULT_METRICS = ("pl_alpha", "alpha_weighted", "stable_rank", "log_norm", "spectral_norm",
                   "warning")
#: What views (heads, experts) get by default, as ``diffract analyze`` gives them.
VIEW_METRICS = ("pl_alpha_hill", "stable_rank", "spectral_norm", "matrix_entropy")
#: Levels a monitor can compute: one model at a time, never a pair.
_LEVELS = {"PARAMETER", "IN_MODEL"}
#: Monitors attached under torch.distributed in this process (the n-th on one rank meets
#: the n-th on the others).
_ATTACHED = 0


class Monitor(AnalysisMixin, SpreadMixin):
    """Analyse ``model``'s weights every ``every`` steps while it trains.

    ``metrics``: fields of the installed packs (per parameter or per model; a field
    that needs two models is refused). ``views``: view rules (``["heads"]``), whose
    views get ``view_metrics``. ``params``: the parameters to analyse (exact names,
    globs or ``re:`` patterns, as :meth:`diffract.Session.filter` takes them); all
    matrices by default. ``store``: a folder for the ``local`` profile (each analysed
    step kept there as model ``step-<n>`` with its step, so ``diffract track``'s report
    and ``results.trajectory()`` read it), else an in-memory session. ``log``: where the
    scalars go, a callable ``log(values: dict[str, float], step: int)`` or an object
    with ``add_scalar`` (a TensorBoard ``SummaryWriter``; with ``histograms`` its
    ``add_histogram`` also gets each parameter's ESD, as log10 of the nonzero
    eigenvalues), or a list of those. ``background=False`` analyses inside
    :meth:`step` (the loop waits; no cadence point is skipped). ``final`` (default): at
    :meth:`close` the running analysis is finished and the last step given to
    :meth:`step` is analysed if it was not (the final weights, the ones a user reads
    first). Parameters are named as a checkpoint of the unwrapped model names them
    (``torch.compile``'s ``_orig_mod.``, DDP's ``module.``, FSDP's and activation
    checkpointing's wrappers taken out; a Hugging Face model's parameters as its
    ``save_pretrained`` writes them, LLaVA's ``language_model.model.*``). Everything
    is checked here, before training; a monitor built with ``model=None`` checks the
    model in :meth:`attach`.
    """

    def __init__(
        self,
        model: Any,
        *,
        every: int | None = 200,
        metrics: Sequence[str] = DEFAULT_METRICS,
        views: Sequence[str] | None = None,
        view_options: Mapping[str, Any] | None = None,
        view_metrics: Sequence[str] = VIEW_METRICS,
        params: Sequence[str] | str | None = None,
        store: str | Path | None = None,
        log: Any = None,
        histograms: bool = True,
        prefix: str = "diffract",
        background: bool = True,
        copy_limit: float | None = 2**30,
        final: bool = True,
    ) -> None:
        check_arguments(every, metrics, views, view_options, view_metrics, params, store,
                        histograms, prefix, background, copy_limit, final)
        self.final = final
        self.copy_limit = copy_limit
        self.every, self.prefix, self.histograms = every, prefix, histograms
        self._model_level: list[str] = []
        self.background = background
        self._model: Any = None
        self._names: list[str] = []
        self._blocks: list[list[str]] = []
        self._limit = math.inf
        self._hook: Any = None
        self._snap: Snapshot | None = None
        self._params = params
        self._views = [views] if isinstance(views, str) else list(views or [])  # one rule
        self._view_options = dict(view_options) if view_options else None
        self._sinks = _sinks(log)
        # apply()'s summary warnings in the worker say what _tell logs already (once per
        # parameter and reason): not in a training log. Diffract says a warning at the
        # first frame not its own, which for the worker is threading's; a filter by that
        # module, since catch_warnings is not thread-safe.
        for category in (FailedUnitsWarning, UndefinedValuesWarning):
            warnings.filterwarnings("ignore", category=category, module="threading")
        #: Whether this process analyses, logs and writes (rank 0 under torch.distributed;
        #: the others only take part in gathering sharded parameters).
        self.writer = rank() == 0
        store = store if self.writer else None
        self.session = FrozenSession("local", path=str(store)) if store is not None \
            else FrozenSession()
        self._lock_file = None
        self._sharded: list[str] = []
        self._renames: dict[str, str] = {}  # live name -> the saved checkpoint's
        self._fsdp1: list[Any] = []  # FSDP1 units (see fsdp1_units)
        #: Under torch.distributed with more than one rank: the group, this rank's share of
        #: the matrices (every rank analyses its own), and the step in flight (the same on
        #: every rank) with when it started.
        self._ranks: Ranks | None = None
        self._mine: list[str] = []
        self._my_blocks: list[list[str]] = []
        self._inflight: tuple[int, float] | None = None
        self._share: dict[str, Any] | None = None
        #: What drives the monitor, told to the other ranks at attach (a schedule sets it).
        self.role = "monitor"
        try:
            self._lock_file = lock_store(store) if store is not None else None
            self.metrics = self._checked(metrics, "metrics")
            self.view_metrics = self._checked(view_metrics, "view_metrics") \
                if self._views else ()
            self._done = self._resume()
            if model is not None:
                self.attach(model)
        except BaseException:
            self._release_lock()
            self.session.close()
            raise
        self._worker: threading.Thread | None = None  # one for the monitor's life
        self._wake = threading.Condition()
        self._job: tuple[int, Any] | None = None
        self._busy = self._stop = False
        self._outbox: list[tuple[int, dict[str, float], dict[str, np.ndarray],
                                 dict[str, dict[str, Any]]]] = []
        self._latest: dict[str, dict[str, tuple[int, float]]] = {}
        self._hooks: list[Callable[[int, dict[str, dict[str, float]]], None]] = []
        self._last: int | None = None  # the last step given to step()
        self._told: set[tuple[str, str]] = set()
        self._box = threading.Lock()
        self.skipped: list[int] = []
        self.analysed: list[int] = []
        self._taken: dict[int, Snapshot] = {}
        self.closed = False

    # -- checks made before training -----------------------------------------------
    def _checked(self, fields: Sequence[str] | str, what: str) -> tuple[str, ...]:
        fields = [fields] if isinstance(fields, str) else list(fields)
        if not fields:
            raise InvalidArgumentError(f"{what} is empty: name at least one field.")
        known = {m["field"]: m for m in self.session.compute.list_available_metrics(True)}
        names = {a: f for f, m in known.items() for a in (f, *m["aliases"])}
        for field in fields:
            if field not in names:
                raise UnknownFieldError(field, sorted(names), action=f"in {what}")
            level = known[names[field]]["apply_level"]
            if level == "IN_MODEL":
                self._model_level.append(field)
            if level not in _LEVELS:
                raise InvalidArgumentError(
                    f"{field!r} compares two models ({level} level): a monitor analyses one "
                    "model at a time. Track the saved checkpoints with `diffract track` for "
                    "how a run's singular directions move.")
        return tuple(fields)

    def attach(self, model: Any) -> None:
        """Watch ``model`` (a monitor built with ``model=None``, as a callback is before
        its trainer hands the model over): its analysed matrices are found now, from a
        probe that copies nothing; a model with none, or views that split nothing, are
        refused here."""
        if self.writer and rank() != 0:  # torch.distributed began after the monitor
            self.writer = False
            self._release_lock()
            self.session.close()
            self.session, self._done = FrozenSession(), set()
        self.session.freeze()  # the kernels' configuration of now, for the whole run
        self._model = model
        self._renames = checkpoint_names(model) if hasattr(model, "named_parameters") else {}
        self._fsdp1 = fsdp1_units(model)
        self._names = self._analysed(self._params)
        named = self._named()
        flat = {self._renames.get(n, n) for _, names, _ in self._fsdp1 for n in names}
        self._sharded = [n for n in self._names
                         if hasattr(named[n], "full_tensor") or n in flat]
        sizes = {n: nbytes(named[n]) if hasattr(named[n], "element_size")
                 else np.asarray(named[n]).nbytes for n in self._names}
        total = sum(sizes.values())
        limit = self.copy_limit
        self._limit = math.inf if limit is None else total * limit if isinstance(
            limit, float) else limit
        # Blocks bound the copies alive when they cannot all fit; else one apply for all
        # (each apply plans and commits: about 5 ms of Python a block).
        self._blocks = blocks(self._names, sizes, max(max(sizes.values()), total / 8)) \
            if total > self._limit else [list(self._names)]
        self._live = {n: named[n] for n in self._names}
        self._sizes = sizes
        here, size = world()
        self._ranks = None
        if size > 1:  # every rank analyses a share; see _take_spread
            self._ranks = Ranks(here, size, "diffract's monitor")
            global _ATTACHED
            _ATTACHED += 1
            self._ranks.handshake(_ATTACHED, {
                "role": self.role, "every": self.every, "metrics": list(self.metrics),
                "views": self._views, "matrices": [
                    [n, list(getattr(named[n], "shape", ())), str(getattr(named[n], "dtype", ""))]
                    for n in self._names]})
            self._mine = shares(self._names, sizes, size)[here]
            mine = {n: sizes[n] for n in self._mine}
            held = sum(mine.values())
            self._my_limit = math.inf if limit is None else held * limit if isinstance(
                limit, float) else limit
            self._my_blocks = blocks(self._mine, mine, max(max(mine.values()), held / 8)) \
                if mine and held > self._my_limit else [list(self._mine)]
        torch = sys.modules.get("torch")
        if self._hook is None and torch is not None and any(
                isinstance(named[n], torch.Tensor) for n in self._names):
            from torch.optim.optimizer import register_optimizer_step_pre_hook

            self._hook = register_optimizer_step_pre_hook(self._before_update)

    def _analysed(self, params: Sequence[str] | str | None) -> list[str]:
        probe = Session()
        try:
            probe.models.add(configured(self._named(), self._model), "probe", copy_weights=False,
                             views=self._views or None,
                             view_options=self._view_options)
            names = matrices(probe, "probe", params)
        finally:
            probe.close()
        if not names:
            what = f" matching {params!r}" if params is not None else ""
            raise InvalidArgumentError(
                f"the model has no parameter with two or more dimensions{what}: there is no "
                "weight matrix to analyse (pass the model itself, or other params).")
        return names

    def _named(self) -> Mapping[str, Any]:
        model = self._model
        if hasattr(model, "named_parameters"):
            named = unwrapped_names(model)
            if self._fsdp1:  # FSDP1: its flat parameters' parameters, by their shapes
                named = {n: v for n, v in named.items() if type(v).__name__ != "FlatParameter"}
                for _, _, shapes in self._fsdp1:
                    named.update(shapes)
            return {self._renames.get(n, n): v for n, v in named.items()} if self._renames \
                else named
        if isinstance(model, Mapping):
            return model
        raise InvalidArgumentError(
            f"a monitor watches a torch module or a mapping of names to tensors, got a "
            f"{type(model).__name__}.")

    def _resume(self) -> set[int]:
        """The steps a previous run of this store finished; a step whose analysis was
        cut short (no completion mark) is erased, to be analysed again."""
        steps = self.session.models.steps()
        marks = set(self.session.store.aggregate_names())
        done, partial = set(), []
        for model_id, record in steps.items():
            if not model_id.startswith("step-") or record.get("step") is None:
                continue
            if contextual_name(DONE, [model_id]) in marks:
                done.add(int(record["step"]))
            else:
                partial.append(model_id)
        if partial:
            log.warning("diffract: the analysis of %s was cut short; analysing again",
                        ", ".join(partial))
            self.session.models.erase(*partial)
        return done

    # -- the loop's side -----------------------------------------------------------
    def due(self, global_step: int) -> bool:
        """Whether ``global_step`` is a cadence point not analysed yet."""
        return self.every is not None and global_step % self.every == 0 \
            and global_step not in self._done

    def step(self, global_step: int) -> bool:
        """Call once per optimizer step: at a cadence point, snapshot and start the
        analysis (True); otherwise only hand finished results to the sinks."""
        global_step = _step(global_step)
        self._emit()
        if not self.closed:
            self._last = global_step
            if self._inflight is not None:  # every rank asks alike (see _poll)
                self._poll(wait=False)
        if self.closed or self.every is None or global_step % self.every:
            return False
        if self._model is None:
            raise InvalidArgumentError("this monitor watches no model yet: attach(model) first.")
        if self._ranks is not None:
            return self._take_spread(global_step, self.due(global_step))
        go = self.writer and self.due(global_step)
        if go and self._busy:
            go = False
            self._skip(global_step)
        return self._take(global_step, go)

    def _take(self, global_step: int, go: bool) -> bool:
        """Snapshot the weights as step ``global_step`` and start its analysis (every rank
        takes part in gathering sharded parameters; rank 0 decides)."""
        start = time.perf_counter()
        gathered = self._gather(self._names) if go and self._sharded else {}
        if not go or not self.writer:
            return False
        snapshot = self._snap = self._taken[global_step] = Snapshot(
            self._live, self._sizes, self._limit, gathered)
        self._done.add(global_step)
        self._start((global_step, snapshot))
        if not self.background:
            self.wait()
        snapshot.blocked += time.perf_counter() - start  # inline: the whole analysis
        return True

    def analyse_saved(self, path: str | Path, global_step: int) -> bool:
        """Analyse the checkpoint the training wrote at ``path`` as step ``global_step``
        (a Trainer's ``on_save``), in the worker: the loop pays nothing, and the numbers
        are those of the file. A step analysed already, live or saved, is not analysed
        again; while an analysis runs, this one is skipped like a cadence point."""
        global_step = _step(global_step)
        self._emit()
        if self.closed or not self.writer or global_step in self._done:
            return False
        if self._inflight is not None:  # the ranks' shares of a step are running
            self._skip(global_step)
            return False
        if self._busy:
            self._skip(global_step)
            return False
        self._done.add(global_step)
        self._start((global_step, Path(path)))
        if not self.background:
            self.wait()
        return True

    def _skip(self, global_step: int) -> None:
        self.skipped.append(global_step)
        if len(self.skipped) == 1:
            log.warning("diffract: the analysis of the previous step is still running at "
                        "step %d; this cadence point is skipped (raise `every` to skip "
                        "none; Monitor.skipped lists them)", global_step)

    def _start(self, job: tuple[int, Any]) -> None:
        if self._worker is None:
            self._worker = threading.Thread(target=self._serve, name="diffract-monitor",
                                            daemon=True)
            self._worker.start()
        with self._wake:
            self._job, self._busy = job, True
            self._wake.notify_all()

    @property
    def blocked(self) -> dict[int, float]:
        """Seconds the loop was held per analysed step: at the cadence point, and for
        the copies (or the wait) before the optimizer's next step."""
        return {step: snap.blocked for step, snap in self._taken.items()}

    @property
    def copied(self) -> dict[int, int]:
        """Bytes the loop copied per analysed step (what the analysis had not reached
        when the optimizer stepped), at most ``copy_limit``."""
        return {step: snap.copied for step, snap in self._taken.items()}

    def _before_update(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Any optimizer's step pre-hook: the running analysis's live weights are copied
        (or waited for) before they change."""
        snapshot = self._snap
        if snapshot is not None:
            snapshot.before_update(lambda: self._busy)

    def analyse_now(self, global_step: int) -> None:
        """Analyse the weights as step ``global_step`` now, the loop waiting (a schedule's
        first factors, the final weights), unless that step is analysed already; under
        torch.distributed every rank calls it, and each analyses its share."""
        global_step = _step(global_step)
        self._last = global_step
        background, self.background = self.background, False
        try:
            if self._ranks is not None:
                if self._inflight is not None:
                    self._poll(wait=True)
                self._take_spread(global_step, global_step not in self._done)
            elif global_step not in self._done:
                self.wait()
                self._take(global_step, self.writer)
        finally:
            self.background = background
        self._emit()

    def wait(self) -> None:
        """Block until the running analysis (if any) has finished, then hand out its
        results (tests and the end of training; a loop never needs it)."""
        with self._wake:
            while self._busy:
                self._wake.wait()
        self._emit()

    def close(self) -> None:
        """Finish the running analysis, hand out its results, close the store; nothing
        is left running. Safe to call twice."""
        if self.closed:
            return
        try:
            if self._ranks is None:
                self.wait()
            elif self._inflight is not None:
                self._poll(wait=True)
            last = self._last
            if self.final and self._model is not None and last is not None:
                self.analyse_now(last)  # the final weights, unless analysed already
        finally:
            self.closed = True
            if self._worker is not None:
                with self._wake:
                    self._stop = True
                    self._wake.notify_all()
                    hung = self._busy  # a share given up on (see _poll): not waited for
                if not hung:
                    self._worker.join()
            try:
                self.session.close()
            finally:
                self._release_lock()
                if self._hook is not None:
                    self._hook.remove()
                    self._hook = None

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- the worker's side ---------------------------------------------------------
    def _serve(self) -> None:
        """The worker thread: one analysis at a time, until the monitor closes."""
        # At the process's priority: at nice 19 a CPU-only run's busy cores starved it
        # (an analysis came back 50-200+ steps late and half the points were skipped at
        # every=200) and cost the loop no less (docs/training.md, "What it costs").
        one_openmp_thread()  # else every training step slows (see its docstring)
        while True:
            with self._wake:
                while self._job is None and not self._stop:
                    self._wake.wait()
                if self._job is None:
                    return
                job, self._job = self._job, None
            began = time.perf_counter()
            try:
                if self._ranks is not None and isinstance(job[1], Snapshot):
                    self._analyse_share(*job)
                else:
                    self._analyse(*job)
            finally:
                if isinstance(job[1], Snapshot):
                    job[1].worked = time.perf_counter() - began
                with self._wake:
                    self._busy = False
                    self._wake.notify_all()

    def _tell(self, where: str, reason: str) -> None:
        key = (where, reason)
        if key not in self._told:
            self._told.add(key)
            log.warning("diffract: %s: %s", where, reason)

    @property
    def _arrays(self) -> tuple[str, ...]:
        """The array fields computed and read besides the metrics: the ESDs, when they
        are logged as histograms."""
        return ("esd",) if self.histograms else ()

    def latest(self, field: str) -> dict[str, tuple[int, float]]:
        """The latest analysed value of ``field`` (or an alias) per parameter, ``{name:
        (step, value)}``, as handed out on the training thread; undefined ones left out."""
        return dict(self._latest.get(self._canonical(field), {}))

    def on_values(self, hook: Callable[[int, dict[str, dict[str, float]]], None]) -> None:
        """Call ``hook(step, values)`` (``values``: field -> parameter -> number) on the
        training thread whenever an analysed step's values are handed out; what a hook
        raises is logged once. What acts on the values (a schedule) registers here."""
        self._hooks.append(hook)

    def _emit(self) -> None:
        with self._box:
            ready, self._outbox = self._outbox, []
        for global_step, values, spectra, numbers in ready:
            for field, row in numbers.items():
                self._latest.setdefault(field, {}).update(
                    (param, (global_step, value)) for param, value in row.items())
            for hook in self._hooks:
                try:
                    hook(global_step, numbers)
                except Exception as exc:  # noqa: BLE001 - logged, never raised into training
                    self._tell("(hook)", f"{type(exc).__name__}: {exc}")
            for sink in self._sinks if self.writer else ():
                try:
                    sink(values, spectra, global_step, self)
                except Exception as exc:  # noqa: BLE001 - a tracker's failure is not ours
                    self._tell("(logging)", f"{type(exc).__name__}: {exc}")

    def _release_lock(self) -> None:
        if self._lock_file is not None:
            self._lock_file.close()
            self._lock_file = None
