"""Running a plan: prefetch inputs on threads, run kernels, normalize, commit per chunk.

For each step the runner cuts the pending units into chunks by the cache manager's read
budget, prefetches the next chunk's inputs on the thread pool while the current one
computes, runs the kernel on every unit (in-process for SEQUENTIAL kernels, on the
configured executor for PARALLEL ones), normalizes each return value onto the kernel's
produce_fields and commits the chunk to the store in one atomic write. A crash loses at
most the chunk in flight; applying again resumes where it stopped.

Per-unit outcomes:

* a value: stored;
* :class:`~diffract.errors.FieldUndefined` raised: NaN stored for every output, the
  reason recorded as an ``undefined`` note (not retried);
* any other exception: recorded as a ``failed`` note, nothing stored, retried by the
  next apply; the run goes on and :class:`~diffract.errors.ApplyError` reports all
  failures at the end;
* a return value that does not fit produce_fields: a bug in the kernel, not in the
  data: the chunk's good results are committed, then
  :class:`~diffract.errors.KernelOutputError` is raised.
"""

from __future__ import annotations

import logging
import math
import traceback
import types
from collections.abc import Callable, Mapping
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

import attrs

from diffract.core.cache import CacheManager
from diffract.core.compute._enums import KernelApplyLevel, KernelExecutionProtocol
from diffract.core.compute.planner import Plan, Step, Unit, chunk_units
from diffract.core.compute.registry import KernelRegistry
from diffract.core.compute.spec import SOURCE_FIELDS, KernelSpec
from diffract.core.storage.base import Batch, Note, Store, contextual_name
from diffract.errors import FieldUndefined, KernelOutputError

__all__ = [
    "ApplyReport",
    "Progress",
    "KernelApplyLevel",
    "KernelExecutionProtocol",
    "Runner",
    "normalize_outputs",
]

log = logging.getLogger(__name__)


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


@attrs.frozen
class Progress:
    """One committed chunk: ``kernel``, units ``done`` of ``total`` for that kernel,
    and the ``step`` (1-based) of ``steps`` kernels in the plan."""

    kernel: str
    done: int
    total: int
    step: int
    steps: int


class _MissingInput(Exception):
    pass


def _invoke(fn: Callable[..., Any], inputs: Mapping[str, Any], config: Mapping[str, Any]):
    """Call a kernel; never raises (runs in worker processes too)."""
    try:
        return ("ok", fn(**inputs, **config))
    except FieldUndefined as exc:
        return ("undefined", exc.reason)
    except Exception as exc:  # noqa: BLE001 - recorded per unit, reported at the end
        where = traceback.extract_tb(exc.__traceback__)[-1]
        return ("error", f"{type(exc).__name__}: {exc} ({where.filename}:{where.lineno})")


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
            outcomes.append(("error", f"{type(result).__name__}: {result}"))
        else:
            outcomes.append(("ok", result))
    return outcomes


_BAD_TYPES = (types.GeneratorType, type(None))


def normalize_outputs(spec: KernelSpec, unit: str, result: Any) -> dict[str, Any]:
    """Map a kernel's return value onto its produce_fields (dict, tuple or scalar)."""
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
        if isinstance(value, _BAD_TYPES):
            raise KernelOutputError(
                f"Kernel {spec.name!r} returned {type(value).__name__} for field {field!r} "
                f"on {unit}. Return a number or an array (raise FieldUndefined with a reason "
                "when the value is undefined).",
                kernel=spec.name,
                unit=unit,
            )
    return values


class Runner:
    """Runs plans against one store; see the module docstring."""

    def __init__(
        self,
        store: Store,
        registry: KernelRegistry,
        cache: CacheManager,
        threads: ThreadPoolExecutor,
        parallel_executor: Callable[[], Executor],
        progress: Callable[[Progress], None] | None = None,
    ) -> None:
        self.store = store
        self.registry = registry
        self.cache = cache
        self.threads = threads
        self.parallel_executor = parallel_executor
        self.progress = progress

    # -- inputs -----------------------------------------------------------------
    def _read(self, field: str, model_id: str, param: str | None):
        store = self.store
        if field == "shape":
            return self._shapes[model_id][param]
        if field == "tensor":
            return store.load_tensor(model_id, param)
        if field in SOURCE_FIELDS:
            return store.load_weights(model_id, param)
        producer = self.registry.producer(field)
        level = producer.apply_level if producer is not None else KernelApplyLevel.PARAMETER
        try:
            if level is KernelApplyLevel.PARAMETER:
                return store.read(model_id, param, field)
            if level is KernelApplyLevel.IN_MODEL:
                return store.read_aggregate(contextual_name(field, (model_id,)))
        except KeyError:
            raise _MissingInput(field) from None
        raise _MissingInput(field)  # pragma: no cover - CROSS handled by the caller

    def _gather(self, spec: KernelSpec, unit: Unit) -> dict[str, Any]:
        inputs: dict[str, Any] = {}
        level = spec.apply_level
        for arg, field in spec.inputs:
            producer = self.registry.producer(field)
            plevel = producer.apply_level if producer is not None else KernelApplyLevel.PARAMETER
            if level is KernelApplyLevel.PARAMETER:
                inputs[arg] = self._read(field, unit.models[0], unit.param)
            elif level is KernelApplyLevel.IN_MODEL:
                (model_id,) = unit.models
                if plevel is KernelApplyLevel.PARAMETER:
                    if field in SOURCE_FIELDS:
                        names = [p.name for p in self.store.params(model_id)]
                    else:
                        have = self.store.present(model_id, field)
                        names = [p.name for p in self.store.params(model_id) if p.name in have]
                    inputs[arg] = tuple(self._read(field, model_id, n) for n in names)
                else:
                    inputs[arg] = self._read(field, model_id, None)
            else:  # CROSS_MODEL
                if plevel is KernelApplyLevel.CROSS_MODEL:
                    name = contextual_name(field, unit.models, unit.param)
                    try:
                        inputs[arg] = self.store.read_aggregate(name)
                    except KeyError:
                        raise _MissingInput(field) from None
                else:
                    inputs[arg] = tuple(
                        self._read(field, m, unit.param) for m in unit.models
                    )
        return inputs

    def _prefetch(self, spec: KernelSpec, chunk: tuple[Unit, ...]) -> list[Any]:
        def one(unit: Unit) -> Any:
            try:
                return self._gather(spec, unit)
            except _MissingInput as exc:
                return exc

        return list(self.threads.map(one, chunk))

    def _inherited_undefined(self, spec: KernelSpec, unit: Unit) -> str | None:
        """The reason an input of this unit is undefined, when its producer said so."""
        if not self._undefined or spec.apply_level is KernelApplyLevel.IN_MODEL:
            return None  # aggregates see NaN entries in their tuples and decide
        for field, producer in self._producers.items():
            level = self.registry.get(producer).apply_level
            keys = (
                [(producer, (m,), unit.param) for m in unit.models]
                if level is KernelApplyLevel.PARAMETER
                else [(producer, unit.models, unit.param)]
            )
            for key in keys:
                if key in self._undefined:
                    return f"input {field!r} is undefined: {self._undefined[key]}"
        return None

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
            self._position = (number, len(plan.steps))
            self._run_step(step, report)
        return report

    def _run_step(self, step: Step, report: ApplyReport) -> None:
        spec = step.kernel
        models = {m for u in step.units for m in u.models}
        self._shapes = {m: {p.name: p.shape for p in self.store.params(m)} for m in models}
        # Units whose inputs a producer declared undefined inherit that (NaN + reason).
        producers = {
            f: p.name for f in spec.require_fields if (p := self.registry.producer(f)) is not None
        }
        self._undefined = {
            (n.kernel, n.models, n.param): n.reason
            for n in self.store.notes()
            if n.kind == "undefined" and n.kernel in producers.values()
        }
        self._producers = producers
        if step.skipped:
            batch = Batch(
                notes=[Note(spec.name, u.models, u.param, "skipped", r) for u, r in step.skipped]
            )
            self.store.commit(batch)
            report.notes.extend(batch.notes)
        if not step.units:
            return
        config = self.registry.effective_config(spec.name)
        chunks = chunk_units(step, self.store, self.cache.read_budget())
        log.info("%s: %d unit(s) in %d chunk(s)", spec.name, len(step.units), len(chunks))
        report.computed.setdefault(spec.name, 0)
        pending: Future[list[Any]] = self.threads.submit(self._prefetch, spec, chunks[0])
        done = 0
        for i, chunk in enumerate(chunks):
            inputs = pending.result()
            if i + 1 < len(chunks):
                pending = self.threads.submit(self._prefetch, spec, chunks[i + 1])
            self._run_chunk(spec, chunk, inputs, config, report)
            done += len(chunk)
            if self.progress is not None:
                self.progress(Progress(spec.name, done, len(step.units), *self._position))

    def _run_chunk(self, spec, chunk, inputs, config, report: ApplyReport) -> None:
        batch = Batch()
        runnable = []
        for unit, got in zip(chunk, inputs, strict=True):
            if isinstance(got, _MissingInput):
                batch.notes.append(
                    Note(spec.name, unit.models, unit.param, "skipped",
                         f"input field {got.args[0]!r} is not available for this unit")
                )
                continue
            inherited = self._inherited_undefined(spec, unit)
            if inherited is not None:
                self._write(batch, spec, unit, {f: math.nan for f in spec.produce_fields})
                batch.notes.append(Note(spec.name, unit.models, unit.param, "undefined", inherited))
            else:
                runnable.append((unit, got))
        if spec.execution_protocol is KernelExecutionProtocol.PARALLEL and len(runnable) > 1:
            executor = self.parallel_executor()
            futures = [executor.submit(_invoke, spec.function, got, config) for _, got in runnable]
            outcomes = []
            for fut in futures:
                try:
                    outcomes.append(fut.result())
                except Exception as exc:  # noqa: BLE001 - a dead worker, pickling...
                    outcomes.append(("error", f"executor failed: {type(exc).__name__}: {exc}"))
        elif spec.batch is not None and len(runnable) > 1:
            outcomes = _invoke_batch(spec, [got for _, got in runnable], config)
        else:
            outcomes = [_invoke(spec.function, got, config) for _, got in runnable]

        output_error: KernelOutputError | None = None
        for (unit, _), (status, payload) in zip(runnable, outcomes, strict=True):
            key = (spec.name, unit.models, unit.param)
            if status == "ok":
                try:
                    values = normalize_outputs(spec, unit.label, payload)
                except KernelOutputError as exc:
                    output_error = output_error or exc
                    continue
                self._write(batch, spec, unit, values)
                batch.cleared_notes.add(key)
                report.computed[spec.name] += 1
            elif status == "undefined":
                self._write(batch, spec, unit, {f: math.nan for f in spec.produce_fields})
                batch.notes.append(Note(spec.name, unit.models, unit.param, "undefined", payload))
            else:
                batch.notes.append(Note(spec.name, unit.models, unit.param, "failed", payload))
        self.store.commit(batch)
        report.notes.extend(batch.notes)
        if output_error is not None:
            raise output_error
