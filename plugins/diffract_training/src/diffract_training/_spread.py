"""A monitor's analysis spread over the ranks of torch.distributed (see
docs/training.md, "Distributed training"): each rank analyses its share of the matrices
of a step, and the shares meet at a step every rank reaches. Every collective is made on
the training thread, in the same order on every rank."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from diffract.plugins import contextual_name
from diffract_training._setup import configured
from diffract_training._snapshot import Snapshot

__all__ = ["SpreadMixin"]

#: The aggregate that marks an analysed step complete in the store.
DONE = "monitor_step"


class SpreadMixin:
    """The :class:`~diffract_training.Monitor`'s distributed side (its attributes are the
    monitor's)."""

    _ranks: Any
    _inflight: tuple[int, float] | None
    _share: dict[str, Any] | None

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

        from diffract.plugins import Batch

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
