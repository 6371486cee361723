"""``session.results``: export metrics and aggregates, read notes, staleness and
provenance (here); erase and ingest (:mod:`diffract.results_writes`); the export formats
(:mod:`diffract.exports`: ``register_formatter`` and ``plain_value`` are re-exported
here). Tabular formats carry each parameter's type and metadata (``ptype`` and
``meta.<key>`` columns)."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from diffract.core.compute.spec import SOURCE_FIELDS
from diffract.core.compute.staleness import find_stale
from diffract.core.storage.base import Note, contextual_name, split_contextual
from diffract.errors import InvalidArgumentError, UnknownFieldError
from diffract.exports import check_format, emit, plain_value, register_formatter
from diffract.results_writes import ResultWrites

__all__ = ["ResultsAPI", "plain_value", "register_formatter"]


class ResultsAPI(ResultWrites):
    """``session.results``: export metrics and aggregates, erase fields, read notes,
    bring in values computed elsewhere."""

    def _stored(self) -> tuple[list[str], list[str]]:
        ids, store = self._scope_ids(), self._session.store
        return ids, sorted(set().union(*(store.fields(m) for m in ids), set()))

    def __repr__(self) -> str:  # what a cell ending with session.results shows
        ids, stored = self._stored()
        return (f"ResultsAPI(models={ids}, fields={stored}; export_metrics(...), "
                "trajectory(...), to_pandas(...) read them)")

    def _repr_html_(self) -> str:
        from html import escape

        ids, stored = self._stored()
        return (f"<div><b>Results</b> of {len(ids)} model(s): {escape(', '.join(ids))}<br>"
                f"fields stored: {escape(', '.join(stored)) or 'none yet'}<br><code>"
                "export_metrics(...)</code>, <code>trajectory(field)</code>, <code>to_pandas"
                "()</code> read them</div>")

    def _known_fields(self) -> set[str]:
        store = self._session.store
        stored = set().union(*(store.fields(m) for m in store.model_ids()), set())
        stored |= {split_contextual(n)[0] for n in store.aggregate_names()}
        registry = self._session.registry
        return set(registry.fields()) | set(registry.aliases()) | stored

    def _canonical(self, field: str) -> str:
        """The stored name of ``field`` (an alias names another field; a contextual
        name keeps its context)."""
        base, models, param = split_contextual(field)
        name = self._session.registry.canonical(base)
        if name == base:
            return field
        return contextual_name(name, models, param) if models else name

    def _check_fields(self, fields: Iterable[str], action: str) -> None:
        registry = self._session.registry
        made = set(registry.fields())
        fields = [f for f in fields if "@" not in f and f not in made
                  and registry.canonical(f) == f]  # what a kernel makes needs no scan
        if not fields:
            return
        known = self._known_fields()
        for f in fields:
            if "@" not in f and f not in known:
                raise UnknownFieldError(f, known, action=action)

    # -- per-parameter metrics ------------------------------------------------------
    def _metric_rows(
        self, fields: tuple[str, ...], include_arrays: bool = True
    ) -> tuple[list[str], list[dict[str, Any]]]:
        store = self._session.store
        models = self._scope_ids()
        if fields:
            self._check_fields(fields, "to export")
            names = list(fields)
        else:
            names = sorted(set().union(*(store.fields(m) for m in models), set()) - SOURCE_FIELDS)
            if not include_arrays:
                names = [f for f in names if not self._array_field(models, f)]
        stored = {f: self._canonical(f) for f in names}
        rows = []
        for m in models:
            read = {f: store.read_field(m, stored[f]) for f in names}
            for info in self._scope.params(store, m):
                values = {f: read[f][info.name] for f in names if info.name in read[f]}
                if values:
                    rows.append({"model_id": m, "param": info.name, "ptype": info.ptype,
                                 "meta": info.meta_dict, "values": values})
        return names, rows

    def _array_field(self, models: list[str], field: str) -> bool:
        """Whether ``field`` holds arrays (judged by one stored value; a kernel's output
        keeps its kind)."""
        store = self._session.store
        for m in models:
            for param in store.present(m, field):
                return np.ndim(store.read(m, param, field)) > 0
        return False

    def export_metrics(
        self,
        *fields: str,
        export_format: str = "dict",
        path: str | Path | None = None,
        include_arrays: bool = False,
    ) -> Any:
        """Per-parameter values of ``fields``; with none named, every stored scalar
        field (array fields such as ``esd`` or ``svals`` too with ``include_arrays``).

        ``dict``: ``{model_id: {param: {field: value}}}``; tabular formats: one row per
        (model_id, param) with its training step (when models have one), its ptype,
        ``meta.<key>`` columns and one column per field
        (absent where not stored); ``csv``/``json``: written to ``path`` when given,
        returned as text otherwise."""
        check_format(export_format)
        names, rows = self._metric_rows(self._fields(fields, "export_metrics"), include_arrays)
        if export_format == "dict":
            table: dict[str, dict[str, dict[str, Any]]] = {m: {} for m in self._scope_ids()}
            for row in rows:
                table[row["model_id"]][row["param"]] = row["values"]
            return table
        meta_keys = sorted({k for row in rows for k in row["meta"]})
        steps = {m: s.get("step") for m, s in self._session.models.steps().items()}
        stepped = any(steps.get(r["model_id"]) is not None for r in rows)
        records = [
            {"model_id": r["model_id"], **({"step": steps.get(r["model_id"])} if stepped
                                            else {}),
             "param": r["param"], "ptype": r["ptype"],
             **{f"meta.{k}": r["meta"].get(k) for k in meta_keys}, **r["values"]}
            for r in rows
        ]
        columns = ["model_id", *(["step"] if stepped else []), "param", "ptype",
                   *(f"meta.{k}" for k in meta_keys), *names]
        return emit(records, columns, export_format, path)

    def to_pandas(self, *fields: str, include_arrays: bool = False) -> Any:
        """``export_metrics(*fields, export_format="pandas")``: one row per parameter."""
        return self.export_metrics(*self._fields(fields, "to_pandas"), export_format="pandas",
                                   include_arrays=include_arrays)

    def trajectory(self, field: str, by: str = "param") -> Any:
        """``field`` over training (pandas): one row per model in scope, by step (the
        index is the step when every model has one), one column per parameter
        (``by="param"``), per view (``"view"``) or per parameter type (``"ptype"``: the
        mean over its parameters). See :mod:`diffract.trajectory`."""
        from diffract.trajectory import trajectory

        return trajectory(self, self._canonical(field), by)

    # -- aggregates -------------------------------------------------------------------
    def _aggregate_items(self, fields: tuple[str, ...]) -> dict[str, Any]:
        store = self._session.store
        scope = set(self._scope_ids())
        if fields:
            self._check_fields(fields, "to export")
        selected = {}
        for name in store.aggregate_names():
            base, models, param = split_contextual(name)
            if not set(models) <= scope:
                continue
            if param is not None and not self._scope.whole_models and not (
                    self._scope.keeps_param(models[0], param, store)):
                continue
            if fields:
                asked = next((f for f in fields if self._canonical(f) in (name, base)), None)
                if asked is None:
                    continue
                # under the name asked for: an alias labels what it was asked for
                label = name if self._canonical(asked) == asked else contextual_name(
                    split_contextual(asked)[0], models, param)
                selected[label] = store.read_aggregate(name)
                continue
            selected[name] = store.read_aggregate(name)
        return selected

    def export_aggregates(
        self, *fields: str, export_format: str = "dict", path: str | Path | None = None
    ) -> Any:
        """Aggregates (IN_MODEL and CROSS_MODEL fields) within scope.

        A name matches its base (``total_frob_norm`` matches every
        ``total_frob_norm@models[...]...``) or one contextual name exactly. ``dict``:
        ``{contextual_name: value}``; tabular: columns name, field, models, param, value."""
        check_format(export_format)
        selected = self._aggregate_items(self._fields(fields, "export_aggregates"))
        if export_format == "dict":
            return selected
        records = []
        for name, value in selected.items():
            base, models, param = split_contextual(name)
            records.append({"name": name, "field": base, "models": ",".join(models),
                            "param": param, "value": value})
        columns = ["name", "field", "models", "param", "value"]
        return emit(records, columns, export_format, path)

    def export(
        self,
        *fields: str,
        sources: str | Iterable[str] = "all",
        export_format: str | None = None,
        expand_contextual: bool = True,
        path: str | Path | None = None,
    ) -> Any:
        """Per-parameter metrics and aggregates in one table: one row per field and
        value, with ``model_id`` (``model_ids`` for a pair), ``param``, ``field``,
        ``value`` and, for aggregates, ``name``. ``sources``: ``"all"`` (default),
        ``"metrics"``, ``"aggregates"`` or a list of those; ``expand_contextual=False``
        keeps an aggregate's contextual name in ``name`` only (model and parameter
        columns empty). ``export_format`` None gives a list of records."""
        export_format = export_format or "list"
        check_format(export_format)
        fields = self._fields(fields, "export")
        if isinstance(sources, str):
            sources = {"metrics", "aggregates"} if sources == "all" else {sources}
        sources = set(sources)
        unknown = sorted(sources - {"metrics", "aggregates"})
        if unknown:
            raise InvalidArgumentError(
                f"sources must be 'all', 'metrics', 'aggregates' or a list of those, got "
                f"{unknown}.")
        records: list[dict[str, Any]] = []
        if "metrics" in sources:
            metric_fields = tuple(f for f in fields if "@" not in f)
            if not fields or metric_fields:
                _, rows = self._metric_rows(metric_fields)
                for r in rows:
                    for field, value in r["values"].items():
                        records.append({"kind": "metric", "model_id": r["model_id"],
                                        "param": r["param"], "ptype": r["ptype"],
                                        "field": field, "value": value, "name": None})
        if "aggregates" in sources:
            for name, value in self._aggregate_items(fields).items():
                base, models, param = split_contextual(name)
                row = {"kind": "aggregate", "field": base, "value": value, "name": name,
                       "model_id": None, "param": None, "ptype": None}
                if expand_contextual:
                    row["model_id"] = ",".join(models)
                    row["param"] = param
                records.append(row)
        columns = ["kind", "model_id", "param", "ptype", "field", "value", "name"]
        if export_format == "dict":
            return records
        return emit(records, columns, export_format, path)

    # -- notes, staleness, provenance --------------------------------------------------
    def _in_scope(self, models: tuple[str, ...], param: str | None) -> bool:
        return set(models) <= set(self._scope_ids()) and (
            param is None or self._scope.whole_models
            or self._scope.keeps_param(models[0], param, self._session.store))

    def export_notes(self, export_format: str = "dict") -> Any:
        """Why units were skipped, left undefined (NaN) or failed, within scope."""
        check_format(export_format)
        notes: list[Note] = [n for n in self._session.store.notes()
                             if self._in_scope(n.models, n.param)]
        records = [
            {"kernel": n.kernel, "unit": n.unit, "kind": n.kind, "reason": n.reason} for n in notes
        ]
        if export_format == "dict":
            return records
        return emit(records, ["kernel", "unit", "kind", "reason"], export_format, None)

    def stale(self, *fields: str, export_format: str = "dict") -> Any:
        """Stored results that no longer match the current configuration, in scope.

        A unit is stale when its kernel's configuration changed since it was computed,
        or when an input it was computed from is stale or was recomputed after it. With
        ``fields``, only those and their dependencies are checked. One record per kernel
        and unit: kernel, fields, unit and reason. ``apply(..., recompute="stale")``
        recomputes them."""
        check_format(export_format)
        session = self._session
        names = [self._canonical(f) for f in self._fields(fields, "stale")] or None
        if names:
            self._check_fields(names, "to check")
        units = [u for u in find_stale(session.registry, session.store, self._scope_ids(), names)
                 if self._in_scope(u.models, u.param)]
        records = [
            {"kernel": u.kernel, "fields": list(u.fields), "unit": u.unit, "reason": u.reason}
            for u in units
        ]
        if export_format == "dict":
            return records
        return emit(records, ["kernel", "fields", "unit", "reason"], export_format, None)

    def provenance(self, field: str, model_id: str, param: str | None = None) -> dict | None:
        """What produced a stored value: kernel, provider and configuration (None when
        the value is absent or was stored without provenance). ``param`` None: the
        model's aggregate ``field@models[model_id]``."""
        store = self._session.store
        field = self._canonical(field)
        if param is None:
            stamp = store.aggregate_stamp(contextual_name(field, (model_id,)))
        else:
            stamp = store.stamps(model_id, field).get(param)
        if stamp is None:
            return None
        p = stamp.provenance
        return {"kernel": p.kernel, "provider": p.provider, "config": p.config_dict}


