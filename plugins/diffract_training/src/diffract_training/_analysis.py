"""A monitor's analysis of one step, in its worker thread: of the whole step (one
process) or of this rank's share (torch.distributed), and the numbers it hands out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from diffract import Session
from diffract.plugins import contextual_name
from diffract_training._setup import FrozenSession, configured
from diffract_training._sinks import number as _number
from diffract_training._snapshot import Snapshot
from diffract_training._spread import DONE

__all__ = ["AnalysisMixin", "matrices", "tag"]


def tag(prefix: str, metric: str, name: str) -> str:
    """The logged name of one value: ``<prefix>/<metric>/<parameter>``."""
    return f"{prefix}/{metric}/{name}"


class AnalysisMixin:
    """The :class:`~diffract_training.Monitor`'s worker side (its attributes are the
    monitor's)."""

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
                names = matrices(session, model_id, self._params)
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
        computes those from the gathered shares); found once (the registry is frozen)."""
        cached = self.__dict__.get("_inputs")
        if cached is not None:
            return cached
        registry, found = self.session.registry, set()
        todo = [self._canonical(f) for f in self._model_level]
        while todo:  # through per-model fields computed from per-model fields, if any
            spec = registry.producer(todo.pop())
            for _, field in spec.inputs if spec is not None else ():
                producer = registry.producer(field)
                if producer is not None and str(producer.apply_level).endswith("IN_MODEL"):
                    todo.append(field)
                elif producer is not None:
                    found.add(field)
        self._inputs: list[str] = sorted(found)
        return self._inputs

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
        """A field's name for an alias of it (the installed packs' table, read once)."""
        names = self.__dict__.get("_field_names")
        if names is None:
            known = self.session.compute.list_available_metrics(True)
            names = self._field_names = {  # a field's own name before any alias
                **{a: m["field"] for m in known for a in m["aliases"]},
                **{m["field"]: m["field"] for m in known}}
        return names.get(field, field)


def matrices(session: Session, model_id: str, params: Sequence[str] | str | None
              ) -> list[str]:
    """The analysed matrices of ``model_id``: its parameters of two or more dimensions
    (views left out) that ``params`` names, all by default."""
    scoped = session.filter(model_ids=[model_id])
    scoped = scoped.filter(param_names=params) if params is not None else scoped
    return [p.name for p in scoped.scope.params(session.store, model_id)
            if p.parent is None and len(p.shape) >= 2]
