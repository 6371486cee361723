"""The runner: a plan's steps, chunk by chunk, in this process or on the executor.

See :mod:`diffract.core.compute.execution` for what becomes of every unit."""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import BrokenExecutor, CancelledError, Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from typing import Any

import attrs

from diffract.core.cache import CacheManager
from diffract.core.compute._enums import KernelApplyLevel, KernelExecutionProtocol
from diffract.core.compute.chunking import Chunker
from diffract.core.compute.inputs import (
    BlockedInput,
    Inputs,
    MissingInput,
    SkippedInput,
    StepState,
    UnreadableInput,
    on_gpu,
)
from diffract.core.compute.outcomes import ApplyReport, Progress, is_nan, normalize_outputs
from diffract.core.compute.planner import Plan, Step, Unit
from diffract.core.compute.registry import KernelRegistry
from diffract.core.compute.spec import KernelSpec
from diffract.core.compute.worker import (
    RefError,
    invoke,
    invoke_batch,
    invoke_group,
    resolve,
    timed,
)
from diffract.core.executors import ExecutorHandle, spawn_problem
from diffract.core.sources import ModelSource
from diffract.core.storage.base import Batch, Note, Provenance, Store, contextual_name
from diffract.errors import ExecutorWarning, KernelOutputError, warn

__all__ = ["Runner", "read_together"]
PARALLEL, PARAMETER = KernelExecutionProtocol.PARALLEL, KernelApplyLevel.PARAMETER

log = logging.getLogger(__name__)

_TOLD: set[str] = set()  #: why the pool could not be used, told once per process

#: Chunks awaiting results while the next is submitted (more would hold more inputs than
#: the read budget counts on; a second one did not help a Dask cluster either).
PIPELINE = 1

#: Shorter units (seconds of one worker's time) are grouped into tasks of about this
#: length: a task costs an executor milliseconds, which a 10 ms fit would double.
GROUP_SECONDS = 0.05
GROUP_MAX = 16  #: the most units one task holds


_OURS = ("processes", "threads", "sequential")  #: the core's; a plugin's was chosen


def _tell_unused(name: str, least: float) -> None:
    """Say once per process that the executor a user chose ran none of a step's work."""
    if name not in _TOLD:
        _TOLD.add(name)
        warn(ExecutorWarning(
            f"the {name!r} executor ran none of this step: its work was too small for "
            f"workers to save their start-up (parallel.pool_min_seconds = {least:g} s), so "
            "it ran in this process, with the same values; parallel.pool_min_seconds = 0 "
            "sends every PARALLEL step to the executor."))


def pool_pays(left: float, cores: float, workers: int, start_up: float) -> bool:
    """Whether ``workers`` processes save more than their ``start_up`` on ``left`` seconds
    of work that kept ``cores`` busy here: ``left * (1 - cores / workers)``."""
    return workers > 1 and left * (1.0 - min(max(cores, 1.0), workers) / workers) >= start_up


def read_together(steps: Sequence[Step]) -> list[tuple[Step, tuple[Step, ...]]]:
    """Each step with the later ones that run on its reads (its riders): PARALLEL
    kernels of parameters that read the same weights of some of the same units and
    need nothing the steps from it to them produce (the esd and the svd of ``diffract
    track``: from object storage every read is a fetch)."""
    out, taken = [], set()
    for i, step in enumerate(steps):
        if i in taken:
            continue
        kind = (step.kernel.execution_protocol, step.kernel.apply_level,
                step.kernel.overlap_batches)
        made, riders, reads = set(), [], {"weights", "tensor"} & set(step.kernel.require_fields)
        for j, other in enumerate(steps[i:], start=i):
            needs = set(other.kernel.require_fields)
            if j > i and j not in taken and kind[:2] == (PARALLEL, PARAMETER) and kind == (
                    other.kernel.execution_protocol, other.kernel.apply_level,
                    other.kernel.overlap_batches) and reads & needs and not made & needs \
                    and set(step.units) & set(other.units):
                riders.append(other)
                taken.add(j)
            made.update(other.kernel.produce_fields)
        out.append((step, tuple(riders)))
    return out


@attrs.define
class _Chunk:
    """One chunk between preparing and committing: its units, the batch being filled,
    the units to run and, once submitted to the executor, their futures."""

    units: Sequence[Unit]
    batch: Batch
    #: (unit, its inputs, the kernel's state): a unit's kernels one after the other
    runnable: list[tuple[Unit, Any, StepState]] = attrs.field(factory=list)
    #: unit indices (one task: several units when they are short) -> the task's future
    futures: dict[tuple[int, ...], Future] | None = None
    here: Future | None = None  #: its outcomes when it runs in this process, pipelined
    group: int = 1  #: units per executor task (short units are grouped; see GROUP_SECONDS)
    busy: float = 0.0  #: seconds the workers spent on the chunk's tasks, as they measured

    def note(self, spec: KernelSpec, unit: Unit, kind: str, reason: str) -> None:
        self.batch.notes.append(Note(spec.name, unit.models, unit.param, kind, reason))


class Runner(Inputs):
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
        if plan.pending:
            self.store.check_writable()  # before anything is computed
        together = read_together(plan.steps)
        for number, (step, riders) in enumerate(together, start=1):
            self._run_step(step, (number, len(together)), report, riders)
        return report

    def _state(self, step: Step, position: tuple[int, int]) -> StepState:
        spec = step.kernel
        models = {m for u in step.units for m in u.models}
        producers = {}
        for field in spec.require_fields:
            producer = self.registry.producer(field)
            if producer is not None:
                producers[field] = (producer.name, producer.apply_level)
        names = {name for name, _ in producers.values()}
        notes = {n.key: n for n in self.store.notes() if n.kernel in names} if names else {}
        return StepState(
            spec=spec,
            config=self.registry.effective_config(spec.name),
            params={m: {p.name: p for p in self.store.params(m)} for m in models},
            producers=producers,
            notes=notes,
            file_sources=self._file_sources(models),
            position=position,
            units=frozenset(step.units))

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

    def _run_step(self, step: Step, position: tuple[int, int], report: ApplyReport,
                  riders: Sequence[Step] = ()) -> None:
        """Run a step; with ``riders`` (see :func:`read_together`), their kernels too, on
        the same reads: each unit's weights read once for every kernel that runs it."""
        spec, steps = step.kernel, (step, *riders)
        skipped = [Note(e.kernel.name, u.models, u.param, "skipped", r)
                   for e in steps for u, r in e.skipped]
        if skipped:
            self.store.commit(Batch(notes=skipped))
            report.notes.extend(skipped)
        if not step.units:
            return
        states = [self._state(each, position) for each in steps]
        report.computed.update({e.kernel.name: report.computed.get(e.kernel.name, 0)
                                for e in steps})
        step = attrs.evolve(step, units=tuple(dict.fromkeys(u for e in steps for u in e.units)))
        per_unit: float | None = None
        parallel = spec.execution_protocol is PARALLEL
        chunker = Chunker(step, self.store, self.cache.read_budget(), largest_first=parallel)
        in_process = parallel and self._pool_unusable(states, self.pool_min_seconds <= 0)
        use_pool = (parallel and self.pool_min_seconds <= 0 and not self.executors.inline
                    and not in_process)
        # parallel and batched kernels: chunks that keep every worker busy
        smallest = (self.parallel_workers if parallel
                    else self.batch_units if spec.batch is not None else 1)
        if use_pool:  # two units per worker: one running, one queued behind it
            smallest = 2 * self.parallel_workers
        size = smallest
        spread = self.parallel_workers if parallel else 1
        current = chunker.take(size, spread)
        lazy = use_pool and self.executors.reads_files  # workers read the files themselves
        pending = self._prefetch(states, current, lazy)
        done = failed = 0
        begun = last = time.perf_counter()
        inflight: list[_Chunk] = []  # submitted to the executor, not yet committed
        chunks = 0
        # a batch that overlaps chunks here keeps these cores busy: local workers cannot win
        undecided = parallel and not use_pool and not self.executors.inline \
            and not (spec.overlap_batches and self.executors.spawns)
        ahead = ThreadPoolExecutor(PIPELINE + 1, "diffract-chunk") if (
            parallel and spec.overlap_batches and self.parallel_workers > 1) else None
        group = 1  # units per executor task, from the measured time per unit

        def finished(chunk: Sequence[Unit], seconds: float, failures: int, busy: float = 0.0,
                     cpu: float = 0.0) -> None:
            nonlocal done, failed, per_unit, size, use_pool, lazy, chunks, undecided, group
            units = len(chunk)
            done += units
            failed += failures
            chunks += 1
            each = seconds / max(units, 1)
            # The first chunk pays one-off costs (imports, warm-up): the pool is judged
            # on the second chunk's time alone (see pool_pays); both are kept small.
            per_unit = each if per_unit is None or chunks == 2 else 0.5 * (per_unit + each)
            if undecided and chunks >= 2:  # the rest's time by its bytes (units differ)
                undecided = False
                rest = sum(chunker.costs[done:])
                if pool_pays(seconds * rest / max(sum(chunker.costs[done - units:done]), 1),
                             cpu / max(seconds, 1e-9), self.parallel_workers, self.pool_min_seconds
                             ) and not (in_process and self._pool_unusable(states, True)):
                    use_pool = True  # (a program that cannot use it says why, now it pays)
                    lazy = self.executors.reads_files
            size = max(smallest, int(self.chunk_seconds / max(per_unit, 1e-6)))
            if undecided:
                size = smallest
            if use_pool:  # per_unit is wall time over the workers: keep them all busy
                size = max(size, 2 * self.parallel_workers)
            # one unit's time on one worker, as the workers measured it (not our wall time)
            unit_seconds = busy / max(units, 1) if busy > 0 else per_unit * self.parallel_workers
            group = max(1, min(GROUP_MAX, int(GROUP_SECONDS / max(unit_seconds, 1e-6))))
            if self.progress is not None:
                rate = done / max(time.perf_counter() - begun, 1e-9)
                self.progress(Progress("+".join(e.kernel.name for e in steps), done,
                                       len(step.units), *position, failed=failed, rate=rate))

        def finish_oldest() -> None:
            nonlocal last
            oldest = inflight.pop(0)
            failures = self._finish_chunk(oldest, report)
            now = time.perf_counter()
            finished(oldest.units, now - last, failures, oldest.busy)
            last = now

        try:
            while current:
                inputs = [f.result() for f in pending]
                following = chunker.take(size, spread)
                pending = self._prefetch(states, following, lazy) if following else []
                if use_pool or (ahead is not None and not undecided):
                    # Pipelined (PIPELINE deep): the workers never idle at a chunk's end.
                    chunk = self._prepare(states, current, inputs)
                    if use_pool:  # groups small enough for two tasks per worker
                        chunk.group = max(1, min(group, len(chunk.runnable)
                                                 // (2 * self.parallel_workers)))
                    self._submit_chunk(chunk, None if use_pool else ahead)
                    inflight.append(chunk)
                    if len(inflight) > PIPELINE:
                        finish_oldest()
                else:
                    started, cpu = time.perf_counter(), time.process_time()
                    failures = self._run_chunk(states, current, inputs, report)
                    last = time.perf_counter()
                    finished(current, last - started, failures,
                             cpu=time.process_time() - cpu)
                current = following
            while inflight:
                finish_oldest()
            if parallel and not use_pool and self.executors.name not in _OURS:
                _tell_unused(self.executors.name, self.pool_min_seconds)
        finally:
            for future in pending:  # interrupted: do not read what nobody will use
                future.cancel()
            if ahead is not None:  # a running batch cannot be stopped: it ends first
                ahead.shutdown(cancel_futures=True)

    def _pool_unusable(self, states: Sequence[StepState], tell: bool) -> bool:
        """Whether this program cannot use spawned workers for these kernels (then they run
        here, with the same values), said once per reason when ``tell`` (the pool would
        pay)."""
        problem = next(filter(None, (spawn_problem(s.spec.function) for s in states)),
                       None) if self.executors.spawns else None
        if tell and problem is not None and problem not in _TOLD:
            _TOLD.add(problem)
            warn(ExecutorWarning(
                f"PARALLEL kernels run in this process, not on the {self.executors.name!r} "
                f"executor's worker processes: {problem}. The values are the same."))
        return problem is not None

    def _in_process(self, runnable: list[tuple[Unit, Any, StepState]]) -> list[Any]:
        """Outcomes of units run here: kernel by kernel, its batch path when it has one."""
        outcomes: list[Any] = [None] * len(runnable)
        for state in dict.fromkeys(s for _, _, s in runnable):
            spec, config = state.spec, state.config
            mine = [i for i, (_, _, s) in enumerate(runnable) if s is state]
            got = [runnable[i][1] for i in mine]
            try:
                units = [resolve(g) for g in got] if spec.batch and len(got) > 1 else None
            except RefError:  # read them one by one: each unit fails alone
                units = None
            done = invoke_batch(spec, units, config) if units is not None else [
                invoke(spec.function, g, config) for g in got]
            for i, outcome in zip(mine, done, strict=True):
                outcomes[i] = outcome
        return outcomes

    def _submit_chunk(self, chunk: _Chunk, here: ThreadPoolExecutor | None = None) -> None:
        """Send a chunk's units to the executor, or its batch to ``here`` (a thread of this
        process), unless their inputs live on a GPU: those run when the chunk finishes."""
        if not chunk.runnable or any(on_gpu(got) for _, got, _ in chunk.runnable):
            return
        if here is not None:
            chunk.here = here.submit(self._in_process, chunk.runnable)
            return
        chunk.futures = self._submit(chunk.runnable, range(len(chunk.runnable)), chunk.group)

    def _finish_chunk(self, chunk: _Chunk, report: ApplyReport) -> int:
        """Collect a chunk's outcomes and commit it; returns its failures.

        A worker that dies (killed, out of memory) breaks a process pool: the pool is
        replaced and the units it had not finished run again, one at a time, so a unit
        that kills every worker fails alone. A unit still running ``unit_timeout``
        seconds after the runner starts waiting for it fails, and the pool is replaced
        so that its worker stops. Ctrl-C cancels what is queued and stops the workers;
        committed chunks stay."""
        if chunk.here is not None:
            outcomes = chunk.here.result()
        elif chunk.futures is None:
            outcomes = self._in_process(chunk.runnable)
        else:
            outcomes = [None] * len(chunk.runnable)
            lost = self._wait(chunk.futures, outcomes, chunk)
            if lost:
                log.warning("%s: a worker died or a task ran over unit_timeout; running %d "
                            "unit(s) again, one at a time, on a new executor",
                            chunk.runnable[0][2].spec.name, len(lost))
            for i in lost:
                if self._wait(self._submit(chunk.runnable, [i]), outcomes):
                    outcomes[i] = ("error", "its worker process died while running it, twice "
                                            "(killed, or out of memory?); the executor was "
                                            "replaced each time")
        return self._complete(chunk, outcomes, report)

    def _submit(self, runnable: list[tuple[Unit, Any, StepState]],
                indices: Iterable[int], group: int = 1) -> dict[tuple[int, ...], Future]:
        """One task per ``group`` consecutive units (one per unit when ``group`` is 1), a
        unit's kernels and a parameter's views in its task (they share its read, or slice
        it where it is read: not read it again)."""
        handle = self.executors
        # every worker up (SIGINT ignored, the kernel imported) first: a unit timeout
        # measures units, not workers starting
        handle.warm(tuple(dict.fromkeys(s.spec.function.__module__ for _, _, s in runnable)))
        tasks: list[list[int]] = []
        for i in indices:
            unit, _, state = runnable[i]
            info = state.params.get(unit.models[0], {}).get(unit.param or "")
            held = {runnable[j][0].param for j in tasks[-1]} - {None} if tasks else set()
            if tasks and (len(tasks[-1]) < group or runnable[tasks[-1][-1]][0] == unit
                          or info is not None and info.parent in held):
                tasks[-1].append(i)
            else:
                tasks.append([i])
        return {idx: handle.get().submit(timed, invoke_group, [
            (runnable[i][2].spec.function, runnable[i][1], runnable[i][2].config) for i in idx])
            for idx in map(tuple, tasks)}

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
                    for i, outcome in zip(idx, got, strict=True):
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
        self, states: Sequence[StepState], chunk: Sequence[Unit], inputs: Sequence[Any],
        report: ApplyReport,
    ) -> int:
        """Run one chunk here and commit it; returns how many of its units failed."""
        prepared = self._prepare(states, chunk, inputs)
        return self._complete(prepared, self._in_process(prepared.runnable), report)

    def _prepare(self, states: Sequence[StepState], chunk: Sequence[Unit],
                 inputs: Sequence[Any]) -> _Chunk:
        """Sort a chunk's units: notes for those that cannot run, the rest runnable (each
        unit with the inputs of each of its kernels, see :meth:`_gather_all`)."""
        prepared = _Chunk(chunk, Batch(provenance={
            f: Provenance.of(s.spec.name, s.spec.provider, s.config)
            for s in states for f in s.spec.produce_fields}))
        for unit, gathered in zip(chunk, inputs, strict=True):
            for state, got in zip(states, gathered, strict=True):
                spec = state.spec
                if got is None:
                    continue  # not a unit of this kernel
                if isinstance(got, MissingInput):
                    prepared.note(spec, unit, *self._why_missing(state, got))
                elif isinstance(got, SkippedInput):
                    prepared.note(spec, unit, "skipped", str(got))
                elif isinstance(got, (UnreadableInput, BlockedInput)):
                    prepared.note(spec, unit, "failed", str(got))
                elif not spec.undefined_inputs and (
                        inherited := self._inherited_undefined(state, unit)) is not None:
                    self._undefined(prepared, spec, unit, inherited)
                else:
                    prepared.runnable.append((unit, got, state))
        return prepared

    def _undefined(self, chunk: _Chunk, spec: KernelSpec, unit: Unit, reason: str) -> None:
        self._write(chunk.batch, spec, unit, {f: math.nan for f in spec.produce_fields})
        chunk.note(spec, unit, "undefined", reason)

    def _complete(self, chunk: _Chunk, outcomes: Sequence[Any], report: ApplyReport) -> int:
        """Store a chunk's outcomes in one commit; returns how many units failed."""
        batch = chunk.batch
        for (unit, _, state), (status, payload) in zip(chunk.runnable, outcomes, strict=True):
            spec = state.spec
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
            if parts is not None and any(is_nan(v) for v in values.values()):
                chunk.note(spec, unit, "undefined", parts)
            else:
                batch.cleared_notes.add((spec.name, unit.models, unit.param))
            report.computed[spec.name] += 1
        self.store.commit(batch)
        report.notes.extend(batch.notes)
        return sum(1 for n in batch.notes if n.kind == "failed")
