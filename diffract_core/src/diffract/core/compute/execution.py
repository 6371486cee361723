"""Running a plan: cut steps into chunks, prefetch inputs, run kernels, commit per chunk.

For each step the runner cuts the pending units into chunks by the read budget and by
time (a chunk grows from one unit to about ``[apply] chunk_seconds`` of work, so an
interrupt loses at most that), prefetches the next chunk's inputs on the thread pool
while the current one computes,
runs the kernel on every unit (in-process for SEQUENTIAL kernels, on the configured
executor for PARALLEL ones), normalizes each return value onto the kernel's
produce_fields and commits the chunk to the store in one atomic write. A crash loses at
most the chunk in flight; applying again resumes where it stopped.

Every outcome belongs to one unit; nothing one unit does costs another its results:

* a value: stored (after checking that it fits produce_fields and that a store can keep
  it, see :func:`~diffract.core.storage.base.storable_problem`);
* :class:`~diffract.errors.FieldUndefined` raised, or an input a producer declared
  undefined: NaN stored for every output, the reason recorded as an ``undefined`` note
  (not retried). An aggregate that comes out NaN because some of its inputs are
  undefined records which ones, and why;
* a required input that is absent because a restriction skipped it upstream: a
  ``skipped`` note naming the upstream reason, nothing stored;
* a required input that is absent because its kernel failed upstream: a ``failed`` note
  naming that failure, nothing stored, retried next time. An aggregate over a model's
  parameters waits the same way while any of its inputs failed (it would otherwise be
  stored from a partial set and never recomputed);
* anything else -- the kernel raised, its weights could not be read (a meta or sparse
  tensor, an I/O error), it returned the wrong number of values or a value no store can
  keep, a worker died: a ``failed`` note naming the cause, nothing stored, retried by
  the next apply. The run goes on and :class:`~diffract.errors.ApplyError` reports all
  failures at the end (``apply(errors="record")`` only warns).
"""

from __future__ import annotations

import logging
import math
import time
import traceback
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import BrokenExecutor, CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

import attrs
import numpy as np

from diffract.core.cache import CacheManager
from diffract.core.compute._enums import KernelApplyLevel, KernelExecutionProtocol
from diffract.core.compute.planner import Plan, Step, Unit
from diffract.core.compute.registry import KernelRegistry
from diffract.core.compute.spec import SOURCE_FIELDS, KernelSpec
from diffract.core.executors import ExecutorHandle, check_spawn_safe
from diffract.core.sources import ModelSource
from diffract.core.storage.base import (
    STORABLE_TYPES,
    Batch,
    Note,
    ParamInfo,
    Provenance,
    Store,
    contextual_name,
    storable_problem,
)
from diffract.errors import FieldUndefined, KernelOutputError, WeightsUnavailableError

__all__ = [
    "ApplyReport",
    "KernelApplyLevel",
    "KernelExecutionProtocol",
    "MAX_UNITS_PER_CHUNK",
    "Progress",
    "Chunker",
    "Runner",
    "chunk_units",
    "normalize_outputs",
]

log = logging.getLogger(__name__)

#: Most units one chunk holds, however small they are: bounds what a crash can lose.
MAX_UNITS_PER_CHUNK = 1024
#: Chunks on the executor awaiting their results while the next one is submitted (more
#: would hold more inputs than the read budget counts on: measured, a second one does
#: not help a Dask cluster either).
PIPELINE = 1

#: Units shorter than this (seconds of one worker's time) are grouped into executor
#: tasks of about this length: a task costs the executor a few milliseconds of its own
#: (Dask's scheduler, on the machine's cores too), which a 10 ms fit would double.
GROUP_SECONDS = 0.05
#: The most units one task holds.
GROUP_MAX = 16


@attrs.define
class ApplyReport:
    """What one apply did: units computed per kernel, and every note it recorded."""

    requested: tuple[str, ...]
    computed: dict[str, int] = attrs.field(factory=dict)
    notes: list[Note] = attrs.field(factory=list)

    def _kind(self, kind: str) -> list[Note]:
        return [n for n in self.notes if n.kind == kind]

    @property
    def failures(self) -> list[Note]:
        return self._kind("failed")

    @property
    def skipped(self) -> list[Note]:
        return self._kind("skipped")

    @property
    def undefined(self) -> list[Note]:
        return self._kind("undefined")

    @property
    def ok(self) -> bool:
        return not self.failures

    def reasons(self, kind: str | None = None) -> dict[tuple[str, str, str], list[str]]:
        """Notes grouped: (kind, kernel, reason) -> the units it applies to (``kind``
        limits it to ``"failed"``, ``"skipped"`` or ``"undefined"``)."""
        groups: dict[tuple[str, str, str], list[str]] = {}
        for n in self.notes:
            if kind is None or n.kind == kind:
                groups.setdefault((n.kind, n.kernel, n.reason), []).append(n.unit)
        return groups

    def summary(self, failures: int = 5) -> str:
        """A few lines: units computed per kernel, counts per outcome with their
        reasons grouped, and the first ``failures`` failures."""
        lines = [f"computed: {sum(self.computed.values())} unit(s) "
                 f"({', '.join(f'{k} {v}' for k, v in self.computed.items()) or 'nothing'})"]
        for kind in ("failed", "undefined", "skipped"):
            groups = self.reasons(kind)
            if not groups:
                continue
            count = sum(len(units) for units in groups.values())
            lines.append(f"{kind}: {count} unit(s), {len(groups)} distinct reason(s)")
            shown = sorted(groups.items(), key=lambda kv: -len(kv[1]))
            limit = failures if kind == "failed" else 3
            for (_, kernel, reason), units in shown[:limit]:
                more = f" and {len(units) - 1} more" if len(units) > 1 else ""
                lines.append(f"  {kernel} on {units[0]}{more}: {reason}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        counts = {k: len(self._kind(k)) for k in ("failed", "undefined", "skipped")}
        return (f"ApplyReport(computed={sum(self.computed.values())}, "
                + ", ".join(f"{k}={v}" for k, v in counts.items())
                + "; .summary() for reasons)")


@attrs.frozen
class Progress:
    """One committed chunk: ``kernel``, units ``done`` of ``total`` for that kernel (of
    which ``failed`` failed), the ``step`` (1-based) of ``steps`` kernels in the plan,
    and the ``rate`` so far in units per second."""

    kernel: str
    done: int
    total: int
    step: int
    steps: int
    failed: int = 0
    rate: float = 0.0


# -- chunks --------------------------------------------------------------------------------
class Chunker:
    """Cuts a step's units into chunks, one at a time, by bytes and by units.

    Sizes come from stored metadata (parameter shape and dtype, stored field sizes),
    so weight matrices make small chunks and scalars large ones. ``take(max_units)``
    returns the next chunk: at least one unit, at most ``max_units``, and no more input
    bytes than ``budget`` (beyond its first unit).
    """

    def __init__(self, step: Step, store: Store, budget: int) -> None:
        self.units = step.units
        self.budget = budget
        self.position = 0
        self._require = step.kernel.require_fields
        self._store = store
        models = {m for u in step.units for m in u.models}
        self._infos = {m: {p.name: p for p in store.params(m)} for m in models}
        self._per_param = {  # inputs stored per parameter (others are aggregates: small)
            (m, f): store.present(m, f)
            for m in models
            for f in self._require
            if f not in SOURCE_FIELDS
        }

    def cost_of(self, unit: Unit) -> int:
        """Estimated bytes of the unit's inputs."""
        total = 0
        for field in self._require:
            for m in unit.models:
                params = [unit.param] if unit.param is not None else list(self._infos[m])
                if field == "weights":  # read as numpy: half types become float32
                    total += sum(max(4, self._infos[m][p].itemsize) * self._infos[m][p].numel
                                 for p in params)
                elif field == "tensor":
                    total += sum(self._infos[m][p].nbytes for p in params)
                elif field in SOURCE_FIELDS:
                    total += 8 * len(params)
                elif self._per_param[(m, field)]:
                    total += sum(self._store.nbytes(m, p, field) for p in params)
                else:
                    total += 8
        return total

    @property
    def done(self) -> bool:
        return self.position >= len(self.units)

    def take(self, max_units: int = MAX_UNITS_PER_CHUNK) -> tuple[Unit, ...]:
        start = end = self.position
        used = 0
        limit = min(max(1, max_units), MAX_UNITS_PER_CHUNK)
        while end < len(self.units) and end - start < limit:
            cost = self.cost_of(self.units[end])
            if end > start and used + cost > self.budget:
                break
            used += cost
            end += 1
        self.position = end
        return tuple(self.units[start:end])


def chunk_units(step: Step, store: Store, budget: int) -> list[tuple[Unit, ...]]:
    """Every chunk of a step by bytes alone (see :class:`Chunker`)."""
    chunker = Chunker(step, store, budget)
    chunks = []
    while not chunker.done:
        chunks.append(chunker.take())
    return chunks


# -- calling kernels ----------------------------------------------------------------------
class _MissingInput(Exception):
    """A required input field is absent for one (models, param) of the unit."""

    def __init__(self, field: str, models: tuple[str, ...], param: str | None) -> None:
        super().__init__(field)
        self.field, self.models, self.param = field, models, param


class _SkippedInput(Exception):
    """An input is unavailable for a lasting reason (weights not kept): skip the unit."""


class _BlockedInput(Exception):
    """An aggregate's inputs failed upstream on some parameters: it must wait."""


class _UnreadableInput(Exception):
    """A required input exists but could not be read (meta tensor, I/O error...)."""


def _describe(exc: BaseException) -> str:
    """``Type: message (file:line)`` of an exception raised by a kernel."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = f" ({frames[-1].filename}:{frames[-1].lineno})" if frames else ""
    return f"{type(exc).__name__}: {exc}{where}"


@attrs.frozen
class WeightsRef:
    """A parameter of a file-backed model, sent to a worker process instead of its
    data: the worker reads it from the file itself (no copy through the session's
    process, and the reading happens in parallel)."""

    source: ModelSource
    model_id: str
    param: str
    raw: bool  # the ``tensor`` field (as stored) rather than ``weights`` (numpy)

    def load(self) -> Any:
        key = (self.source, self.model_id)
        loaders = _OPENED.get(key)
        if loaders is None:
            from diffract.core.models import open_source

            loaders = _OPENED[key] = open_source(self.source, self.model_id)
        return loaders[1 if self.raw else 0](self.param)


#: Sources a worker process opened (kept: a worker reads many parameters of a model).
_OPENED: dict[tuple[ModelSource, str], tuple[Callable[[str], Any], Callable[[str], Any]]] = {}


def _resolve(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Inputs with every :class:`WeightsRef` read (in the process that runs the kernel)."""
    out = {}
    for arg, value in inputs.items():
        if isinstance(value, WeightsRef):
            value = _load_ref(arg, value)
        elif isinstance(value, tuple) and any(isinstance(v, WeightsRef) for v in value):
            value = tuple(_load_ref(arg, v) if isinstance(v, WeightsRef) else v for v in value)
        out[arg] = value
    return out


class _RefError(Exception):
    pass


def _load_ref(arg: str, ref: WeightsRef) -> Any:
    try:
        return ref.load()
    except Exception as exc:  # noqa: BLE001 - the unit fails with the reason
        field = "tensor" if ref.raw else "weights"
        raise _RefError(f"cannot read input {field!r} of {ref.model_id}/{ref.param}: "
                        f"{type(exc).__name__}: {exc}") from None


def _invoke(fn: Callable[..., Any], inputs: Mapping[str, Any], config: Mapping[str, Any]):
    """Call a kernel; never raises (runs in worker processes too)."""
    try:
        return ("ok", fn(**_resolve(inputs), **config))
    except _RefError as exc:
        return ("error", str(exc))
    except FieldUndefined as exc:
        return ("undefined", exc.reason)
    except Exception as exc:  # noqa: BLE001 - recorded per unit, reported at the end
        return ("error", _describe(exc))


def _invoke_group(fn: Callable[..., Any], inputs: Sequence[Mapping[str, Any]],
                  config: Mapping[str, Any]) -> list[Any]:
    """:func:`_invoke` over several units in one executor task (short units: one task
    each would cost more in the executor than in the kernel)."""
    return [_invoke(fn, got, config) for got in inputs]


def _timed(call: Callable[..., Any], *args: Any) -> tuple[Any, float]:
    """``call(*args)`` in a worker, with the seconds it took there (what the runner
    groups short units by: the wall time it sees includes the executor's latency)."""
    start = time.perf_counter()
    return call(*args), time.perf_counter() - start


def _invoke_batch(spec: KernelSpec, units: list[Mapping[str, Any]], config: Mapping[str, Any]):
    """Run a kernel's batch path; on any failure of the batch itself, unit by unit."""
    try:
        results = list(spec.batch(units, **config))
        if len(results) != len(units):
            raise ValueError(f"batch returned {len(results)} results for {len(units)} units")
    except Exception as exc:  # noqa: BLE001 - the per-unit path decides per unit
        log.warning("%s: batch path failed (%s); running unit by unit", spec.name, exc)
        return [_invoke(spec.function, got, config) for got in units]
    outcomes = []
    for result in results:
        if isinstance(result, FieldUndefined):
            outcomes.append(("undefined", result.reason))
        elif isinstance(result, Exception):
            outcomes.append(("error", _describe(result)))
        else:
            outcomes.append(("ok", result))
    return outcomes


def normalize_outputs(spec: KernelSpec, unit: str, result: Any) -> dict[str, Any]:
    """Map a kernel's return value onto its produce_fields (dict, tuple or scalar).

    Raises :class:`KernelOutputError` naming the kernel and the unit when the value does
    not fit produce_fields or holds something a store cannot keep; the runner records
    that as the unit's failure.
    """
    produce = spec.produce_fields
    if isinstance(result, dict):
        keys = set(result)
        if keys != set(produce):
            missing, extra = sorted(set(produce) - keys), sorted(keys - set(produce))
            raise KernelOutputError(
                f"Kernel {spec.name!r} returned a dict for {unit} whose keys do not match "
                f"its produce_fields {produce}: missing {missing}, unexpected {extra}. "
                "Return exactly one entry per produced field.",
                kernel=spec.name,
                unit=unit,
            )
        values = result
    elif isinstance(result, tuple):
        if len(result) != len(produce):
            raise KernelOutputError(
                f"Kernel {spec.name!r} returned a tuple of {len(result)} values for {unit}, "
                f"but it produces {len(produce)} field(s) {produce}. Return one value per "
                "produced field, in order.",
                kernel=spec.name,
                unit=unit,
            )
        values = dict(zip(produce, result, strict=True))
    else:
        if len(produce) != 1:
            raise KernelOutputError(
                f"Kernel {spec.name!r} returned a single {type(result).__name__} for {unit}, "
                f"but it produces {len(produce)} fields {produce}. Return a tuple or a dict.",
                kernel=spec.name,
                unit=unit,
            )
        values = {produce[0]: result}
    for field, value in values.items():
        problem = storable_problem(value)
        if problem is not None:
            undefined_hint = (
                " (raise FieldUndefined with a reason when the value is undefined)"
                if value is None or isinstance(value, types.GeneratorType)
                else ""
            )
            raise KernelOutputError(
                f"Kernel {spec.name!r} returned {problem} for field {field!r} on {unit}, "
                f"which no store can keep. Return {STORABLE_TYPES}{undefined_hint}.",
                kernel=spec.name,
                unit=unit,
            )
    return values


def _on_gpu(inputs: Mapping[str, Any]) -> bool:
    """Whether a unit's inputs hold a tensor on a GPU: its kernel runs here, where the
    device is (shipping device tensors to worker processes would copy them through the
    host, or fail)."""
    for value in inputs.values():
        for item in value if isinstance(value, tuple) else (value,):
            if getattr(getattr(item, "device", None), "type", "cpu") != "cpu":
                return True
    return False


def _is_nan(value: Any) -> bool:
    """True when a stored value is or contains NaN."""
    if isinstance(value, tuple):
        return any(_is_nan(v) for v in value)
    try:
        return bool(np.isnan(np.asarray(value, dtype=np.float64)).any())
    except (TypeError, ValueError):
        return False


# -- the runner -----------------------------------------------------------------------------
NoteKey = tuple[str, tuple[str, ...], "str | None"]


@attrs.frozen
class _StepState:
    """What the runner knows while one step runs (built once when the step starts)."""

    spec: KernelSpec
    config: Mapping[str, Any]
    params: Mapping[str, Mapping[str, ParamInfo]]  # model -> name -> info
    #: input field -> (producing kernel, its level), for fields some kernel produces
    producers: Mapping[str, tuple[str, KernelApplyLevel]]
    #: (kernel, models, param) -> the note the producers of the inputs left there
    notes: Mapping[NoteKey, Note]
    #: model -> its source, for the models whose weights are files (workers read them)
    file_sources: Mapping[str, ModelSource]
    position: tuple[int, int]


def _whole(state: _StepState, model_id: str) -> list[str]:
    """The stored parameters of a model, without views: what an aggregate over the whole
    model summarises (a view is part of its parent and would count twice)."""
    return [n for n, p in state.params[model_id].items() if p.parent is None]


@attrs.define
class _Chunk:
    """One chunk between preparing and committing: its units, the batch being filled,
    the units to run and, once submitted to the executor, their futures."""

    units: Sequence[Unit]
    batch: Batch
    runnable: list[tuple[Unit, Any]] = attrs.field(factory=list)
    #: unit indices (one task: several units when they are short) -> the task's future
    futures: dict[tuple[int, ...], Future] | None = None
    #: units per executor task (short units are grouped; see GROUP_SECONDS)
    group: int = 1
    #: seconds the workers spent on the chunk's tasks, as they measured them
    busy: float = 0.0

    def note(self, spec: KernelSpec, unit: Unit, kind: str, reason: str) -> None:
        self.batch.notes.append(Note(spec.name, unit.models, unit.param, kind, reason))


class Runner:
    """Runs plans against one store; see the module docstring."""

    def __init__(
        self,
        store: Store,
        registry: KernelRegistry,
        cache: CacheManager,
        threads: ThreadPoolExecutor,
        executors: ExecutorHandle,
        progress: Callable[[Progress], None] | None = None,
        chunk_seconds: float = 2.0,
        parallel_workers: int = 1,
        batch_units: int = 1,
        unit_timeout: float | None = None,
        pool_min_seconds: float = 2.0,
    ) -> None:
        self.unit_timeout = unit_timeout
        self.pool_min_seconds = pool_min_seconds
        self.chunk_seconds = chunk_seconds
        self.parallel_workers = parallel_workers
        self.batch_units = batch_units
        self.store = store
        self.registry = registry
        self.cache = cache
        self.threads = threads
        self.executors = executors
        self.progress = progress

    # -- inputs -----------------------------------------------------------------
    def _read(self, state: _StepState, field: str, model_id: str, param: str | None,
              lazy: bool = False) -> Any:
        store = self.store
        if field == "shape":
            return state.params[model_id][param].shape
        if lazy and field in ("weights", "tensor") and model_id in state.file_sources:
            return WeightsRef(state.file_sources[model_id], model_id, param, field == "tensor")
        if field in SOURCE_FIELDS:
            try:
                if field == "tensor":
                    return store.load_tensor(model_id, param)
                return store.load_weights(model_id, param)
            except WeightsUnavailableError as exc:
                raise _SkippedInput(str(exc)) from None
            except Exception as exc:  # noqa: BLE001 - that unit fails, with the reason
                raise _UnreadableInput(
                    f"cannot read input {field!r} of {model_id}/{param}: "
                    f"{type(exc).__name__}: {exc}"
                ) from None
        level = state.producers[field][1] if field in state.producers else None
        try:
            if level is KernelApplyLevel.PARAMETER:
                return store.read(model_id, param, field)
            if level is KernelApplyLevel.IN_MODEL:
                return store.read_aggregate(contextual_name(field, (model_id,)))
        except KeyError:
            pass
        at = param if level is KernelApplyLevel.PARAMETER else None
        raise _MissingInput(field, (model_id,), at)

    def _gather(self, state: _StepState, unit: Unit, lazy: bool = False) -> dict[str, Any]:
        """The keyword arguments of one kernel call (raises _MissingInput/_UnreadableInput)."""
        spec = state.spec
        inputs: dict[str, Any] = {}
        for arg, field in spec.inputs:
            plevel = state.producers.get(field, ("", KernelApplyLevel.PARAMETER))[1]
            if spec.apply_level is KernelApplyLevel.PARAMETER:
                inputs[arg] = self._read(state, field, unit.models[0], unit.param, lazy)
            elif spec.apply_level is KernelApplyLevel.IN_MODEL:
                (model_id,) = unit.models
                if plevel is KernelApplyLevel.PARAMETER:
                    names = _whole(state, model_id)
                    if field not in SOURCE_FIELDS:
                        have = self.store.present(model_id, field)
                        self._check_not_blocked(state, field, model_id, names, have)
                        names = [n for n in names if n in have]
                    inputs[arg] = tuple(self._read(state, field, model_id, n) for n in names)
                else:
                    inputs[arg] = self._read(state, field, model_id, None)
            elif plevel is KernelApplyLevel.CROSS_MODEL:
                name = contextual_name(field, unit.models, unit.param)
                try:
                    inputs[arg] = self.store.read_aggregate(name)
                except KeyError:
                    raise _MissingInput(field, unit.models, unit.param) from None
            else:
                inputs[arg] = tuple(self._read(state, field, m, unit.param, lazy)
                                    for m in unit.models)
        return inputs

    def _gather_one(self, state: _StepState, unit: Unit, lazy: bool = False) -> Any:
        try:
            return self._gather(state, unit, lazy)
        except (_MissingInput, _UnreadableInput, _BlockedInput, _SkippedInput) as exc:
            return exc
        except Exception as exc:  # noqa: BLE001 - a store that fails on one unit
            return _UnreadableInput(f"cannot read the inputs of {unit.label}: {_describe(exc)}")

    def _prefetch(self, state: _StepState, chunk: Sequence[Unit],
                  lazy: bool = False) -> list[Future[Any]]:
        """Start reading a chunk's inputs on the thread pool: one task per unit. With
        ``lazy``, weights of file-backed models stay references for the workers to read.

        Tasks never wait on other tasks of the pool (a task that did could hold every
        worker while the tasks it waits for sit in the queue).
        """
        return [self.threads.submit(self._gather_one, state, unit, lazy) for unit in chunk]

    @staticmethod
    def _check_not_blocked(
        state: _StepState, field: str, model_id: str, names: list[str], have: set[str]
    ) -> None:
        """Raise _BlockedInput when ``field`` is absent on parameters whose producer
        failed there (those parameters will be retried: the aggregate waits for them)."""
        producer = state.producers[field][0]
        failed = [
            (n, note.reason)
            for n in names
            if n not in have
            and (note := state.notes.get((producer, (model_id,), n))) is not None
            and note.kind == "failed"
        ]
        if failed:
            shown = "; ".join(f"{n}: {why}" for n, why in failed[:3])
            more = f"; and {len(failed) - 3} more" if len(failed) > 3 else ""
            raise _BlockedInput(
                f"input {field!r} failed on {len(failed)} of {len(names)} parameters of "
                f"{model_id} ({shown}{more}); the aggregate is computed once they succeed"
            )

    @staticmethod
    def _why_missing(state: _StepState, missing: _MissingInput) -> tuple[str, str]:
        """(note kind, reason) for a unit whose input is absent: failed when the input's
        kernel failed there (retried next time), skipped otherwise."""
        field = missing.field
        producer = state.producers.get(field, ("", None))[0]
        note = state.notes.get((producer, missing.models, missing.param))
        if note is None:
            return "skipped", f"input field {field!r} is not available for this unit"
        if note.kind == "failed":
            return "failed", f"input {field!r} is missing because {producer!r} failed on " \
                f"{note.unit}: {note.reason}"
        return "skipped", f"input {field!r} is not available: {producer!r} skipped " \
            f"{note.unit} ({note.reason})"

    @staticmethod
    def _input_keys(level: KernelApplyLevel, unit: Unit) -> list[tuple[tuple[str, ...], Any]]:
        """The (models, param) keys of one input of ``unit`` produced at ``level``."""
        if level is KernelApplyLevel.PARAMETER:
            return [((m,), unit.param) for m in unit.models]
        if level is KernelApplyLevel.IN_MODEL:
            return [((m,), None) for m in unit.models]
        return [(unit.models, unit.param)]

    def _inherited_undefined(self, state: _StepState, unit: Unit) -> str | None:
        """The reason an input of this unit is undefined, when its producer said so.

        Aggregates over a model's parameters are not covered here: they see NaN entries
        in their tuples and decide (see :meth:`_undefined_parts`).
        """
        for field, (producer, level) in state.producers.items():
            if state.spec.apply_level is KernelApplyLevel.IN_MODEL and (
                level is KernelApplyLevel.PARAMETER
            ):
                continue
            for models, param in self._input_keys(level, unit):
                note = state.notes.get((producer, models, param))
                if note is not None and note.kind == "undefined":
                    return f"input {field!r} is undefined: {note.reason}"
        return None

    def _undefined_parts(self, state: _StepState, unit: Unit) -> str | None:
        """For an aggregate over a model's parameters: which inputs were undefined, why."""
        if state.spec.apply_level is not KernelApplyLevel.IN_MODEL:
            return None
        (model_id,) = unit.models
        parts = []
        for field, (producer, level) in state.producers.items():
            if level is not KernelApplyLevel.PARAMETER:
                continue
            bad = [
                (name, note.reason)
                for name in _whole(state, model_id)
                if (note := state.notes.get((producer, (model_id,), name))) is not None
                and note.kind == "undefined"
            ]
            if bad:
                shown = "; ".join(f"{name}: {why}" for name, why in bad[:3])
                more = f"; and {len(bad) - 3} more" if len(bad) > 3 else ""
                parts.append(
                    f"input {field!r} is undefined for {len(bad)} of "
                    f"{len(_whole(state, model_id))} parameters ({shown}{more})"
                )
        return "; ".join(parts) or None

    # -- outputs ----------------------------------------------------------------
    @staticmethod
    def _write(batch: Batch, spec: KernelSpec, unit: Unit, values: Mapping[str, Any]) -> None:
        for field, value in values.items():
            if spec.apply_level is KernelApplyLevel.PARAMETER:
                batch.values[(unit.models[0], unit.param, field)] = value
            else:
                batch.aggregates[contextual_name(field, unit.models, unit.param)] = value

    # -- running ----------------------------------------------------------------
    def run(self, plan: Plan) -> ApplyReport:
        report = ApplyReport(requested=plan.requested)
        for number, step in enumerate(plan.steps, start=1):
            self._run_step(step, (number, len(plan.steps)), report)
        return report

    def _state(self, step: Step, position: tuple[int, int]) -> _StepState:
        spec = step.kernel
        models = {m for u in step.units for m in u.models}
        producers = {}
        for field in spec.require_fields:
            producer = self.registry.producer(field)
            if producer is not None:
                producers[field] = (producer.name, producer.apply_level)
        names = {name for name, _ in producers.values()}
        notes = {n.key: n for n in self.store.notes() if n.kernel in names} if names else {}
        return _StepState(
            spec=spec,
            config=self.registry.effective_config(spec.name),
            params={m: {p.name: p for p in self.store.params(m)} for m in models},
            producers=producers,
            notes=notes,
            file_sources=self._file_sources(models),
            position=position,
        )

    def _file_sources(self, models: Iterable[str]) -> dict[str, ModelSource]:
        out = {}
        for model_id in models:
            try:
                source = self.store.source(model_id)
            except (KeyError, NotImplementedError):
                continue
            if source.is_file_backed:
                out[model_id] = source
        return out

    def _run_step(self, step: Step, position: tuple[int, int], report: ApplyReport) -> None:
        spec = step.kernel
        if step.skipped:
            batch = Batch(
                notes=[Note(spec.name, u.models, u.param, "skipped", r) for u, r in step.skipped]
            )
            self.store.commit(batch)
            report.notes.extend(batch.notes)
        if not step.units:
            return
        state = self._state(step, position)
        chunker = Chunker(step, self.store, self.cache.read_budget())
        report.computed.setdefault(spec.name, 0)
        # Chunks grow from one unit to what takes about chunk_seconds, so an interrupt
        # (Ctrl-C, a kill) loses at most a few seconds of work whatever the kernel costs.
        per_unit: float | None = None
        parallel = spec.execution_protocol is KernelExecutionProtocol.PARALLEL
        # A PARALLEL kernel goes to the executor once the work left is worth a pool
        # (its start-up costs seconds): measured on the first chunk, run here.
        use_pool = parallel and self.pool_min_seconds <= 0 and not self.executors.inline
        # Parallel and batched kernels need chunks that keep every worker busy.
        smallest = (self.parallel_workers if parallel
                    else self.batch_units if spec.batch is not None else 1)
        if use_pool:  # two units per worker: one running, one queued behind it
            smallest = 2 * self.parallel_workers
        size = smallest
        current = chunker.take(size)
        lazy = use_pool and self.executors.reads_files  # workers read the files themselves
        pending = self._prefetch(state, current, lazy)
        done = failed = 0
        begun = last = time.perf_counter()
        inflight: list[_Chunk] = []  # submitted to the executor, not yet committed

        chunks = 0
        undecided = parallel and not use_pool and not self.executors.inline
        group = 1  # units per executor task, from the measured time per unit

        def finished(units: int, seconds: float, failures: int, busy: float = 0.0) -> None:
            nonlocal done, failed, per_unit, size, use_pool, lazy, chunks, undecided, group
            done += units
            failed += failures
            chunks += 1
            each = seconds / max(units, 1)
            # The first chunk pays the kernel's one-off costs (imports, library
            # warm-up: 0.2 s for an esd that then takes 10 ms), so the pool is judged
            # on the second chunk's time alone; both are kept small until then.
            per_unit = each if per_unit is None or chunks == 2 else 0.5 * (per_unit + each)
            left = len(step.units) - done
            if undecided and chunks >= 2:
                undecided = False
                if per_unit * left >= self.pool_min_seconds:
                    use_pool = True
                    lazy = self.executors.reads_files
            size = max(smallest, int(self.chunk_seconds / max(per_unit, 1e-6)))
            if undecided:
                size = smallest
            if use_pool:  # per_unit is wall time over the workers: keep them all busy
                size = max(size, 2 * self.parallel_workers)
            # one unit's time on one worker: as the workers measured it when they ran the
            # chunk (the wall time seen here includes the executor's latency)
            unit_seconds = (busy / max(units, 1) if busy > 0
                            else per_unit * self.parallel_workers)
            group = max(1, min(GROUP_MAX, int(GROUP_SECONDS / max(unit_seconds, 1e-6))))
            if self.progress is not None:
                rate = done / max(time.perf_counter() - begun, 1e-9)
                self.progress(Progress(spec.name, done, len(step.units), *position,
                                       failed=failed, rate=rate))

        def finish_oldest() -> None:
            nonlocal last
            oldest = inflight.pop(0)
            failures = self._finish_chunk(state, oldest, report)
            now = time.perf_counter()
            finished(len(oldest.units), now - last, failures, oldest.busy)
            last = now

        try:
            while current:
                inputs = [f.result() for f in pending]
                following = chunker.take(size)
                pending = self._prefetch(state, following, lazy) if following else []
                if use_pool:
                    # Pipelined: chunks are submitted before the earlier ones are
                    # awaited (up to PIPELINE deep), so the workers never idle at a
                    # chunk's end, whatever the executor's latency.
                    chunk = self._prepare(state, current, inputs)
                    # groups small enough that every worker gets two tasks of the chunk
                    chunk.group = max(1, min(group, len(chunk.runnable)
                                             // (2 * self.parallel_workers)))
                    self._submit_chunk(state, chunk)
                    inflight.append(chunk)
                    if len(inflight) > PIPELINE:
                        finish_oldest()
                else:
                    started = time.perf_counter()
                    failures = self._run_chunk(state, current, inputs, report)
                    last = time.perf_counter()
                    finished(len(current), last - started, failures)
                current = following
            while inflight:
                finish_oldest()
        finally:
            for future in pending:  # interrupted: do not read what nobody will use
                future.cancel()

    def _in_process(self, state: _StepState, runnable: list[tuple[Unit, Any]]) -> list[Any]:
        """Outcomes of units run here: the kernel's batch path when it has one."""
        spec, config = state.spec, state.config
        if spec.batch is not None and len(runnable) > 1:
            try:
                units = [_resolve(got) for _, got in runnable]
            except _RefError:  # read them one by one: each unit fails alone
                return [_invoke(spec.function, got, config) for _, got in runnable]
            return _invoke_batch(spec, units, config)
        return [_invoke(spec.function, got, config) for _, got in runnable]

    def _submit_chunk(self, state: _StepState, chunk: _Chunk) -> None:
        """Send a chunk's units to the executor (unless their inputs live on a GPU:
        those run here when the chunk is finished)."""
        if not chunk.runnable or any(_on_gpu(got) for _, got in chunk.runnable):
            return
        if self.executors.spawns:
            check_spawn_safe(state.spec.function, state.spec.name)
        chunk.futures = self._submit(state, chunk.runnable, range(len(chunk.runnable)),
                                     chunk.group)

    def _finish_chunk(self, state: _StepState, chunk: _Chunk, report: ApplyReport) -> int:
        """Collect a chunk's outcomes and commit it; returns its failures.

        A worker that dies (killed, out of memory) breaks a process pool: the pool is
        replaced and the units it had not finished run again, one at a time, so a unit
        that kills every worker fails alone. A unit still running ``unit_timeout``
        seconds after the runner starts waiting for it fails, and the pool is replaced
        so that its worker stops. Ctrl-C cancels what is queued and stops the workers;
        committed chunks stay.
        """
        if chunk.futures is None:
            outcomes = self._in_process(state, chunk.runnable)
        else:
            outcomes = [None] * len(chunk.runnable)
            lost = self._wait(chunk.futures, outcomes, chunk)
            if lost:
                log.warning("%s: a worker died or a task ran over unit_timeout; running %d "
                            "unit(s) again, one at a time, on a new executor",
                            state.spec.name, len(lost))
            for i in lost:
                if self._wait(self._submit(state, chunk.runnable, [i]), outcomes):
                    outcomes[i] = ("error", "its worker process died while running it, twice "
                                            "(killed, or out of memory?); the executor was "
                                            "replaced each time")
        return self._complete(state, chunk, outcomes, report)

    def _submit(self, state: _StepState, runnable: list[tuple[Unit, Any]],
                indices: Iterable[int], group: int = 1) -> dict[tuple[int, ...], Future]:
        """One task per ``group`` consecutive units (one per unit when ``group`` is 1)."""
        spec, config, handle = state.spec, state.config, self.executors
        order = list(indices)
        tasks = [tuple(order[k:k + group]) for k in range(0, len(order), group)]
        return {
            idx: (handle.get().submit(_timed, _invoke, spec.function, runnable[idx[0]][1],
                                      config)
                  if len(idx) == 1 else
                  handle.get().submit(_timed, _invoke_group, spec.function,
                                      [runnable[i][1] for i in idx], config))
            for idx in tasks
        }

    def _wait(self, futures: dict[tuple[int, ...], Future], outcomes: list[Any],
              chunk: _Chunk | None = None) -> list[int]:
        """Collect outcomes; returns the units lost to a broken executor (to run again).
        A timed-out or broken executor is replaced. A task of several units has
        ``unit_timeout`` per unit; when it runs over, its units are lost (the caller runs
        them again one at a time, so only the stuck one fails)."""
        handle = self.executors
        lost: list[int] = []
        stop = False
        try:
            for idx, fut in futures.items():
                if stop and not fut.done():
                    lost.extend(idx)
                    continue
                timeout = None if stop or self.unit_timeout is None else (
                    self.unit_timeout * len(idx))
                try:
                    got, seconds = fut.result(timeout=timeout)
                    if chunk is not None:
                        chunk.busy += seconds
                    for i, outcome in zip(idx, got if len(idx) > 1 else [got], strict=True):
                        outcomes[i] = outcome
                except FuturesTimeout:
                    if len(idx) > 1:  # which of them is stuck: run them again one by one
                        lost.extend(idx)
                    else:
                        outcomes[idx[0]] = ("error", f"timed out: still running after "
                                                     f"{self.unit_timeout:g} s (unit_timeout); "
                                                     "its worker was stopped")
                    stop = True
                except (BrokenExecutor, CancelledError):
                    lost.extend(idx)
                    stop = True
                except Exception as exc:  # noqa: BLE001 - pickling, a remote error...
                    for i in idx:
                        outcomes[i] = ("error",
                                       f"executor failed: {type(exc).__name__}: {exc}")
        except BaseException:  # Ctrl-C: drop the queue, stop the workers
            handle.shutdown(cancel=True, grace=1.0)
            raise
        if stop:
            handle.replace()
        return lost

    def _run_chunk(
        self, state: _StepState, chunk: Sequence[Unit], inputs: Sequence[Any],
        report: ApplyReport,
    ) -> int:
        """Run one chunk here and commit it; returns how many of its units failed."""
        prepared = self._prepare(state, chunk, inputs)
        return self._complete(state, prepared, self._in_process(state, prepared.runnable),
                              report)

    def _prepare(self, state: _StepState, chunk: Sequence[Unit], inputs: Sequence[Any]) -> _Chunk:
        """Sort a chunk's units: notes for those that cannot run, the rest runnable."""
        spec = state.spec
        provenance = Provenance.of(spec.name, spec.provider, state.config)
        prepared = _Chunk(chunk, Batch(provenance={f: provenance for f in spec.produce_fields}))
        for unit, got in zip(chunk, inputs, strict=True):
            if isinstance(got, _MissingInput):
                prepared.note(spec, unit, *self._why_missing(state, got))
            elif isinstance(got, _SkippedInput):
                prepared.note(spec, unit, "skipped", str(got))
            elif isinstance(got, (_UnreadableInput, _BlockedInput)):
                prepared.note(spec, unit, "failed", str(got))
            elif (inherited := self._inherited_undefined(state, unit)) is not None:
                self._undefined(prepared, spec, unit, inherited)
            else:
                prepared.runnable.append((unit, got))
        return prepared

    def _undefined(self, chunk: _Chunk, spec: KernelSpec, unit: Unit, reason: str) -> None:
        self._write(chunk.batch, spec, unit, {f: math.nan for f in spec.produce_fields})
        chunk.note(spec, unit, "undefined", reason)

    def _complete(self, state: _StepState, chunk: _Chunk, outcomes: Sequence[Any],
                  report: ApplyReport) -> int:
        """Store a chunk's outcomes in one commit; returns how many units failed."""
        spec, batch = state.spec, chunk.batch
        for (unit, _), (status, payload) in zip(chunk.runnable, outcomes, strict=True):
            if status == "undefined":
                self._undefined(chunk, spec, unit, payload)
                continue
            if status != "ok":
                chunk.note(spec, unit, "failed", payload)
                continue
            try:
                values = normalize_outputs(spec, unit.label, payload)
            except KernelOutputError as exc:
                chunk.note(spec, unit, "failed", str(exc))
                continue
            self._write(batch, spec, unit, values)
            parts = self._undefined_parts(state, unit)
            if parts is not None and any(_is_nan(v) for v in values.values()):
                chunk.note(spec, unit, "undefined", parts)
            else:
                batch.cleared_notes.add((spec.name, unit.models, unit.param))
            report.computed[spec.name] += 1
        self.store.commit(batch)
        report.notes.extend(batch.notes)
        return sum(1 for n in batch.notes if n.kind == "failed")
