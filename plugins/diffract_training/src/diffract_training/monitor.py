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
from diffract_training._sinks import number as _number
from diffract_training._sinks import sinks as _sinks
from diffract_training._snapshot import Snapshot, blocks, nbytes, rank

__all__ = ["DEFAULT_METRICS", "VIEW_METRICS", "Monitor", "tag"]

log = logging.getLogger("diffract_training")

#: What a monitor computes per parameter by default: the fields ``diffract analyze``
#: shows that a training team reads over time (the power-law exponent and its weighted
#: form, the ranks and norms, the training warning).
DEFAULT_METRICS = ("pl_alpha", "alpha_weighted", "stable_rank", "log_norm", "spectral_norm",
                   "warning")
#: What views (heads, experts) get by default, as ``diffract analyze`` gives them.
VIEW_METRICS = ("pl_alpha_hill", "stable_rank", "spectral_norm", "matrix_entropy")
#: The aggregate that marks an analysed step complete in the store.
DONE = "monitor_step"
#: Levels a monitor can compute: one model at a time, never a pair.
_LEVELS = {"PARAMETER", "IN_MODEL"}
#: Monitors attached under torch.distributed in this process (the n-th on one rank meets
#: the n-th on the others).
_ATTACHED = 0


def tag(prefix: str, metric: str, name: str) -> str:
    """The logged name of one value: ``<prefix>/<metric>/<parameter>``."""
    return f"{prefix}/{metric}/{name}"


class Monitor:
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
            names = _matrices(probe, "probe", params)
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

    def _take_spread(self, global_step: int, due: bool) -> bool:
        """Under torch.distributed (every rank calls it at the same point): unless rank 0
        says the step is not due, or any rank is still busy, each rank snapshots its share
        of the matrices (the sharded ones gathered one at a time, every rank taking part,
        each keeping those of its share) and its worker analyses them; :meth:`_poll`
        brings the shares together."""
        assert self._ranks is not None
        start = time.perf_counter()
        busy = self._busy or self._inflight is not None
        veto, stop = self._ranks.most([int(busy), int(self.writer and not due)])
        if stop or veto:
            if veto and not stop and self.writer:
                self._skip(global_step)
            return False
        mine = set(self._mine)
        gathered = self._gather(mine) if self._sharded else {}
        snapshot = self._snap = self._taken[global_step] = Snapshot(
            {n: self._live[n] for n in self._mine}, self._sizes, self._my_limit, gathered)
        self._done.add(global_step)
        self._share = None
        self._inflight = (global_step, time.monotonic())
        self._start((global_step, snapshot))
        if not self.background:
            self._poll(wait=True)
        snapshot.blocked += time.perf_counter() - start
        return True

    def _poll(self, wait: bool) -> None:
        """With a step in flight under torch.distributed (every rank calls it at the same
        point): one small collective says whether every rank's share is done; if so the
        shares are gathered (:meth:`_complete`). ``wait``: block until this rank's share
        is done first. Past the deadline (``DIFFRACT_DIST_TIMEOUT``) on any rank, the step
        is given up on every rank, each saying so: no rank hangs on another's analysis."""
        assert self._ranks is not None and self._inflight is not None
        global_step, started = self._inflight
        deadline = started + self._ranks.timeout
        if wait:
            with self._wake:
                while self._busy and time.monotonic() < deadline:
                    self._wake.wait(timeout=max(0.01, deadline - time.monotonic()))
        pending, late = self._ranks.most([int(self._busy),
                                          int(self._busy and time.monotonic() >= deadline)])
        if pending and not late:
            return
        self._inflight = None
        if pending:
            self._tell("(step)", f"the analysis of step {global_step} did not finish on every "
                       f"rank within {self._ranks.timeout:g} s (DIFFRACT_DIST_TIMEOUT), so "
                       "that step is given up on every rank (schedules keep their factors); "
                       "the next cadence point waits for the late rank")
            return
        self._complete(global_step)

    def _complete(self, global_step: int) -> None:
        """Every rank's share of ``global_step``, on every rank (a collective): the
        values handed to the schedules on every rank, logged and stored by rank 0 alone.
        A share that failed keeps the step out of the store and from the schedules, on
        every rank alike."""
        assert self._ranks is not None
        share = self._share if self._share and self._share.get("step") == global_step \
            else {"step": global_step, "error": "its analysis left no result"}
        self._share = None
        shares_ = self._ranks.gather(share)
        errors = [(r, s["error"]) for r, s in enumerate(shares_) if s.get("error")]
        if errors:
            for r, error in errors:
                self._tell("(step)", f"rank {r}: {error}; step {global_step} is not kept")
            return
        if self.writer:
            for s in shares_:
                for where, reason in s["failures"]:
                    self._tell(where, reason)
        table: dict[str, dict[str, Any]] = {}
        for s in shares_:
            table.update(s["table"])
        names = set(self._names)
        values, spectra, numbers = self._collect_table(table, names)
        if self.writer:
            try:
                values, spectra, numbers = self._commit(global_step, shares_)
            except Exception as exc:  # noqa: BLE001 - an analysis never stops training
                self._tell("(step)", f"step {global_step} could not be stored: "
                           f"{type(exc).__name__}: {exc}")
        with self._box:
            self._outbox.append((global_step, values, spectra, numbers))
            self.analysed.append(global_step)
        self._emit()

    def _commit(self, global_step: int, shares_: Sequence[Mapping[str, Any]]
                ) -> tuple[dict[str, float], dict[str, Any], dict[str, dict[str, float]]]:
        """Rank 0: the step's model (its matrices' shapes; the weights stay where they
        are), every share's values, notes and provenance written as one commit, the
        per-model fields computed from them, the completion mark; what is logged, read
        back from the store as one process would."""
        import torch

        from diffract.core.storage.base import Batch

        model_id = f"step-{global_step}"
        session = self.session
        shapes = {n: torch.empty(tuple(self._live[n].shape), dtype=self._live[n].dtype,
                                 device="meta") for n in self._names}
        session.models.add(configured(shapes, self._model), model_id, step=global_step,
                           copy_weights=False, views=self._views or None,
                           view_options=self._view_options)
        batch = Batch()
        for s in shares_:
            batch.values.update(s["values"])
            batch.notes.extend(s["notes"])
            batch.provenance.update(s["provenance"])
        try:
            with session._lock:
                session.store.commit(batch)
            scoped = session.filter(model_ids=[model_id])
            if self._model_level:
                report = scoped.compute.apply(*self._model_level, errors="record",
                                              progress=False)
                for note in report.failures:
                    self._tell(note.param or model_id, note.reason)
            out = self._collect(scoped, model_id, set(self._names))
            session.results.ingest_aggregates({contextual_name(DONE, [model_id]): global_step})
        except BaseException:
            session.models.erase(model_id)
            raise
        return out

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

    def _gather(self, keep: Sequence[str] | set[str]) -> dict[str, Any]:
        """The sharded (DTensor) parameters, whole, one at a time on their device (every
        rank takes part in each); those of ``keep`` kept on the CPU, so the device holds
        one gathered parameter at most."""
        named, out = self._named(), {}
        for name in self._sharded:
            if not hasattr(named[name], "full_tensor"):
                continue  # an FSDP1 unit's, below
            whole = named[name].detach().full_tensor()
            if name in keep:
                out[name] = whole.cpu() if whole.device.type != "cpu" else whole
            del whole
        analysed = set(self._names)
        for unit, names, _ in self._fsdp1:  # one unit at a time, every rank taking part
            wanted = {self._renames.get(n, n): fqn for n, fqn in names.items()
                      if self._renames.get(n, n) in analysed}
            if not wanted:
                continue
            from torch.distributed.fsdp import FullyShardedDataParallel

            with FullyShardedDataParallel.summon_full_params(unit, recurse=False,
                                                             writeback=False):
                inside = dict(unit.named_parameters())
                for name, fqn in wanted.items():
                    if name in keep:
                        out[name] = inside[fqn].detach().to("cpu", copy=True)
        return out

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

    def _analyse(self, global_step: int, source: Snapshot | Path) -> None:
        """One step's analysis, of the live weights (a snapshot) or of a checkpoint file
        the training wrote (``analyse_saved``)."""
        model_id = f"step-{global_step}"
        session = self.session
        snapshot = source if isinstance(source, Snapshot) else Snapshot({}, {}, 0, {})
        try:
            session.models.add(configured(snapshot.aliases(), self._model)
                               if source is snapshot else source,
                               model_id, step=global_step, copy_weights=False,
                               views=self._views or None,
                               view_options=self._view_options)
            scoped = session.filter(model_ids=[model_id])
            if source is snapshot:
                names, runs = self._names, self._blocks
            else:
                names = _matrices(session, model_id, self._params)
                runs = [names]
            children: dict[str, list[str]] = {}
            for p in session.models.params(model_id):
                if p.parent is not None:
                    children.setdefault(p.parent, []).append(p.name)
            per_param = [m for m in self.metrics if m not in self._model_level]
            reports = []
            for i, block in enumerate(runs):  # copies live while analysed
                snapshot.take(block, runs[i + 1:])
                inputs = self._model_inputs() if self._model_level else []
                reports.append(scoped.filter(param_names=block).compute.apply(
                    *per_param, *self._arrays, *inputs, errors="record", progress=False))
                viewed = [c for name in block for c in children.get(name, ())]
                if self.view_metrics and viewed:
                    reports.append(scoped.filter(param_names=viewed).compute.apply(
                        *self.view_metrics, errors="record", progress=False))
                snapshot.release(block)
            if self._model_level:  # over the whole step (a filter of its parameters is
                reports.append(scoped.compute.apply(  # refused); views are not counted
                    *self._model_level, errors="record", progress=False))
            if snapshot.stale:
                session.models.erase(model_id)
                self._tell("(step)", f"{', '.join(snapshot.stale[:3])} changed in place "
                           f"outside an optimizer step while step {global_step} was analysed, "
                           "so that step is not kept; call monitor.step after every in-place "
                           "change of a step (the optimizer's, then any projection or "
                           "clipping of the weights)")
                return
            for report in reports:
                for note in report.failures:
                    self._tell(note.param or model_id, note.reason)
            values, spectra, table = self._collect(scoped, model_id, set(names))
            session.results.ingest_aggregates({contextual_name(DONE, [model_id]): global_step})
        except Exception as exc:  # noqa: BLE001 - an analysis never stops training
            self._tell("(step)", f"{type(exc).__name__}: {exc}")
            return
        finally:  # the copies go now, whatever the store keeps
            snapshot.release(snapshot.order)
            snapshot.forget()
            if self._snap is snapshot:
                self._snap = None
        with self._box:
            self._outbox.append((global_step, values, spectra, table))
            self.analysed.append(global_step)

    def _analyse_share(self, global_step: int, snapshot: Snapshot) -> None:
        """This rank's share of a step, in a session of its own (the worker's side of
        :meth:`_take_spread`): what the store would keep of it, and the logged table, left
        for :meth:`_complete` to gather."""
        model_id = f"step-{global_step}"
        share: dict[str, Any] = {"step": global_step, "table": {}, "values": {}, "notes": [],
                                 "provenance": {}, "failures": []}
        work = FrozenSession()
        work._frozen = self.session._frozen  # the monitor's kernels' configuration
        try:
            if self._mine:
                work.models.add(configured(snapshot.aliases(), self._model), model_id,
                                step=global_step, copy_weights=False,
                                views=self._views or None, view_options=self._view_options)
                scoped = work.filter(model_ids=[model_id])
                children: dict[str, list[str]] = {}
                for p in work.models.params(model_id):
                    if p.parent is not None:
                        children.setdefault(p.parent, []).append(p.name)
                per_param = [m for m in self.metrics if m not in self._model_level]
                reports = []
                runs = self._my_blocks
                for i, block in enumerate(runs):
                    snapshot.take(block, runs[i + 1:])
                    part = scoped.filter(param_names=block)
                    # With the per-model fields' per-parameter inputs, where the weights
                    # are (rank 0 computes those fields from the gathered shares).
                    inputs = self._model_inputs() if self._model_level else []
                    reports.append(part.compute.apply(*per_param, *self._arrays, *inputs,
                                                      errors="record", progress=False))
                    viewed = [c for name in block for c in children.get(name, ())]
                    if self.view_metrics and viewed:
                        reports.append(scoped.filter(param_names=viewed).compute.apply(
                            *self.view_metrics, errors="record", progress=False))
                    snapshot.release(block)
                if snapshot.stale:
                    share["error"] = (f"{', '.join(snapshot.stale[:3])} changed in place "
                                      "outside an optimizer step while it was analysed")
                    return
                share["failures"] = [(n.param or model_id, n.reason) for r in reports
                                     for n in r.failures if n.param is not None]
                store = work.store
                for field in store.fields(model_id):
                    stamps = store.stamps(model_id, field)
                    if stamps:
                        share["provenance"][field] = next(iter(stamps.values())).provenance
                    for param in store.present(model_id, field):
                        share["values"][(model_id, param, field)] = store.read(
                            model_id, param, field)
                share["notes"] = [n for n in store.notes()
                                  if n.models == (model_id,) and n.param is not None]
                share["table"] = scoped.results.export_metrics(
                    *per_param, *self.view_metrics, *self._arrays,
                    include_arrays=True)[model_id]
        except Exception as exc:  # noqa: BLE001 - an analysis never stops training
            share["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            snapshot.release(snapshot.order)
            snapshot.forget()
            if self._snap is snapshot:
                self._snap = None
            work.close()
            self._share = share

    def _model_inputs(self) -> list[str]:
        """The per-parameter fields the per-model metrics are computed from (rank 0
        computes those from the gathered shares)."""
        from diffract.core.compute.planner import resolve

        kernels = resolve(self._model_level, self.session.registry)
        return sorted({field for k in kernels if str(k.apply_level).endswith("IN_MODEL")
                       for _, field in k.inputs})

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

    def _collect(self, scoped: Any, model_id: str, parents: set[str]
                 ) -> tuple[dict[str, float], dict[str, Any], dict[str, dict[str, float]]]:
        """The logged scalars, the spectra, and field -> parameter -> number."""
        table = scoped.results.export_metrics(*self.metrics, *self.view_metrics,
                                              *self._arrays, include_arrays=True)[model_id]
        values, spectra, numbers = self._collect_table(table, parents)
        if self._model_level:  # per-model fields: one value a step
            stored = scoped.results.export_aggregates(*self._model_level)
            for field in self._model_level:
                value = stored.get(contextual_name(self._canonical(field), [model_id]))
                if _number(value):
                    values[f"{self.prefix}/model/{field}"] = float(value)
        return values, spectra, numbers

    def _collect_table(self, table: Mapping[str, Mapping[str, Any]], parents: set[str]
                       ) -> tuple[dict[str, float], dict[str, Any], dict[str, dict[str, float]]]:
        values: dict[str, float] = {}
        spectra: dict[str, np.ndarray] = {}
        numbers: dict[str, dict[str, float]] = {}
        per_metric: dict[str, list[float]] = {}  # over the matrices, views left out
        warned = analysed = 0
        for param, row in table.items():
            for field, value in row.items():
                if field == "esd":
                    spectra[param] = np.asarray(value)
                elif field in ("warning", "training_warning"):
                    analysed += 1
                    warned += bool(value)
                elif _number(value):
                    values[tag(self.prefix, field, param)] = float(value)
                    numbers.setdefault(field, {})[param] = float(value)
                    if param in parents:
                        per_metric.setdefault(field, []).append(float(value))
        for field, seen in per_metric.items():
            values[f"{self.prefix}/summary/{field}_mean"] = float(np.mean(seen))
            values[f"{self.prefix}/summary/{field}_max"] = max(seen)
        if analysed:
            values[f"{self.prefix}/summary/warning_share"] = warned / analysed
        return values, spectra, numbers

    def _canonical(self, field: str) -> str:
        known = {m["field"]: m for m in self.session.compute.list_available_metrics(True)}
        return next((f for f, m in known.items() if field == f or field in m["aliases"]),
                    field)

    def latest(self, field: str) -> dict[str, tuple[int, float]]:
        """The latest analysed value of ``field`` (or an alias) per parameter, ``{name:
        (step, value)}``, as handed out on the training thread; undefined ones left out."""
        known = {m["field"]: m for m in self.session.compute.list_available_metrics(True)}
        name = next((f for f, m in known.items() if field == f or field in m["aliases"]),
                    field)
        return dict(self._latest.get(name, {}))

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


def _matrices(session: Session, model_id: str, params: Sequence[str] | str | None
              ) -> list[str]:
    """The analysed matrices of ``model_id``: its parameters of two or more dimensions
    (views left out) that ``params`` names, all by default."""
    scoped = session.filter(model_ids=[model_id])
    scoped = scoped.filter(param_names=params) if params is not None else scoped
    return [p.name for p in scoped.scope.params(session.store, model_id)
            if p.parent is None and len(p.shape) >= 2]
