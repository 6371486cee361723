"""Running a plan: cut steps into chunks, prefetch inputs, run kernels, commit per chunk.

For each step the runner cuts the pending units into chunks by the read budget and by
time (a chunk grows to about ``[apply] chunk_seconds`` of work: what an interrupt loses),
prefetches the next chunk's inputs while the current one computes, runs the kernel on
every unit (PARALLEL ones on the executor when it pays, a thread-safe batch overlapping
the next chunk's), normalizes each return value onto the kernel's produce_fields and
commits the chunk in one atomic write. A crash loses at most the chunks in flight.

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
  failures at the end (``apply(errors="record")`` only warns)."""

from __future__ import annotations

from diffract.core.compute._enums import KernelApplyLevel, KernelExecutionProtocol
from diffract.core.compute.chunking import MAX_UNITS_PER_CHUNK, Chunker
from diffract.core.compute.outcomes import ApplyReport, Progress, normalize_outputs
from diffract.core.compute.runner import Runner

__all__ = [
    "ApplyReport",
    "KernelApplyLevel",
    "KernelExecutionProtocol",
    "MAX_UNITS_PER_CHUNK",
    "Progress",
    "Chunker",
    "Runner",
    "normalize_outputs",
]
