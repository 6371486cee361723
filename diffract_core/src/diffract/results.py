"""``session.results``: export, erase and ingest results; export formats.

Formats: ``dict`` (nested, the default), ``list`` (one record per row), ``pandas``,
``polars`` (optional: ``pip install polars``), ``csv`` and ``json`` (text, or written to
``path``), and any registered with :func:`register_formatter`. JSON has no NaN or
infinity: they are written as ``null``. Tabular formats carry each parameter's type and
metadata (``ptype`` and ``meta.<key>`` columns)."""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from diffract.core.compute.planner import downstream_fields
from diffract.core.compute.spec import SOURCE_FIELDS
from diffract.core.compute.staleness import find_stale
from diffract.core.scope import ScopedAPI
from diffract.core.storage.base import (
    Batch,
    Note,
    contextual_name,
    split_contextual,
    storable_problem,
)
from diffract.errors import (
    DiffractError,
    InvalidArgumentError,
    UnknownFieldError,
    UnknownFormatError,
)

__all__ = ["ResultsAPI", "plain_value", "register_formatter"]

Formatter = Callable[[list[dict[str, Any]], list[str]], Any]
_BUILTIN = ("dict", "list", "pandas", "polars", "csv", "json")
_FORMATTERS: dict[str, Formatter] = {}
_LOCK = threading.Lock()


def register_formatter(name: str, fn: Formatter) -> None:
    """Add an export format: ``fn(records, columns)`` receives the rows (dicts) and the
    column order and returns the export (process-global, like the kernel registry)."""
    if not isinstance(name, str) or not name or name in _BUILTIN:
        raise InvalidArgumentError(
            f"A formatter needs a new name, not {name!r} (built in: {list(_BUILTIN)})."
        )
    if not callable(fn):
        raise InvalidArgumentError(f"Formatter {name!r} must be callable, got {fn!r}.")
    with _LOCK:
        _FORMATTERS[name] = fn


def plain_value(value: Any) -> Any:
    """A JSON-friendly form of a stored value (or of records of them): arrays and tuples
    as lists, mappings item by item, NaN and infinities as None (JSON has no such
    numbers)."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: plain_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain_value(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class ResultsAPI(ScopedAPI):
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

    def _check_format(self, export_format: str) -> None:
        if export_format not in _BUILTIN and export_format not in _FORMATTERS:
            raise UnknownFormatError(export_format, [*_BUILTIN, *_FORMATTERS])

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
        self._check_format(export_format)
        names, rows = self._metric_rows(fields, include_arrays)
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
        return self._emit(records, columns, export_format, path)

    def to_pandas(self, *fields: str, include_arrays: bool = False) -> Any:
        """``export_metrics(*fields, export_format="pandas")``: one row per parameter."""
        return self.export_metrics(*fields, export_format="pandas",
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
        self._check_format(export_format)
        selected = self._aggregate_items(fields)
        if export_format == "dict":
            return selected
        records = []
        for name, value in selected.items():
            base, models, param = split_contextual(name)
            records.append({"name": name, "field": base, "models": ",".join(models),
                            "param": param, "value": value})
        columns = ["name", "field", "models", "param", "value"]
        return self._emit(records, columns, export_format, path)

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
        self._check_format(export_format)
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
        return self._emit(records, columns, export_format, path)

    # -- notes, staleness, provenance --------------------------------------------------
    def _in_scope(self, models: tuple[str, ...], param: str | None) -> bool:
        if not set(models) <= set(self._scope_ids()):
            return False
        if param is None or self._scope.whole_models:
            return True
        return self._scope.keeps_param(models[0], param, self._session.store)

    def export_notes(self, export_format: str = "dict") -> Any:
        """Why units were skipped, left undefined (NaN) or failed, within scope."""
        self._check_format(export_format)
        notes: list[Note] = [n for n in self._session.store.notes()
                             if self._in_scope(n.models, n.param)]
        records = [
            {"kernel": n.kernel, "unit": n.unit, "kind": n.kind, "reason": n.reason} for n in notes
        ]
        if export_format == "dict":
            return records
        return self._emit(records, ["kernel", "unit", "kind", "reason"], export_format, None)

    def stale(self, *fields: str, export_format: str = "dict") -> Any:
        """Stored results that no longer match the current configuration, in scope.

        A unit is stale when its kernel's configuration changed since it was computed,
        or when an input it was computed from is stale or was recomputed after it. With
        ``fields``, only those and their dependencies are checked. One record per kernel
        and unit: kernel, fields, unit and reason. ``apply(..., recompute="stale")``
        recomputes them."""
        self._check_format(export_format)
        session = self._session
        names = [self._canonical(f) for f in fields] if fields else None
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
        return self._emit(records, ["kernel", "fields", "unit", "reason"], export_format, None)

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

    # -- erase ------------------------------------------------------------------------
    def erase(self, *fields: str, erase_dependent_also: bool = False,
              erase_all: bool = False) -> int:
        """Erase stored ``fields`` in scope (every stored field with ``erase_all``);
        returns how many values went.

        With ``erase_dependent_also``, every field computed from them downstream is erased
        too. Erase a multi-output kernel's fields as a group: a unit is recomputed only
        when all of its kernel's outputs are absent. In a view that filters parameters,
        only those parameters' values (and pairwise aggregates) are erased."""
        if erase_all:
            if fields:
                raise InvalidArgumentError("erase() takes field names or erase_all=True, "
                                           "not both.")
            store = self._session.store
            fields = tuple(sorted(
                set().union(*(store.fields(m) for m in self._scope_ids()), set())
                | {split_contextual(n)[0] for n in self._aggregate_items(())}))
            if not fields:
                return 0
        if not fields:
            raise InvalidArgumentError("erase() needs at least one field name (or "
                                       "erase_all=True).")
        registry = self._session.registry
        known = self._known_fields()
        for f in fields:
            if f in SOURCE_FIELDS:
                raise InvalidArgumentError(
                    f"Field {f!r} holds the model's weights and cannot be erased; erase the "
                    "model instead (session.models.erase)."
                )
            if f not in known:
                raise UnknownFieldError(f, known, action="to erase")
        targets = {self._canonical(f) for f in fields}
        if erase_dependent_also:
            targets |= downstream_fields(fields, registry)
        kernels = {s.name for f in targets if (s := registry.producer(f)) is not None}
        store = self._session.store
        with self._session._lock:
            if self._scope.whole_models:
                return store.erase(targets, self._scope_ids(), kernels)
            values = [(m, p.name, f) for m in self._scope_ids()
                      for p in self._scope.params(store, m) for f in targets
                      if p.name in store.present(m, f)]
            aggregates = [n for n in self._aggregate_items(())
                          if split_contextual(n)[0] in targets and split_contextual(n)[2]]
            notes = [n.key for n in store.notes()
                     if n.kernel in kernels and n.param is not None
                     and self._in_scope(n.models, n.param)]
            return store.erase_values(values, aggregates, notes)

    # -- ingest -----------------------------------------------------------------------
    def ingest_metrics(self, data: Any, *, force: bool = False) -> int:
        """Store per-parameter values computed elsewhere.

        ``data``: ``{param_id: {field: value}}`` as the original Diffract takes it
        (``param_id`` = ``"model_id/param_name"``), ``{model_id: {param: {field:
        value}}}``, or a pandas frame with ``model_id`` and ``param`` columns and one
        column per field. Everything is checked first: known model and parameter in
        scope, storable values, arrays of the dimension the field already has, and no
        value already stored unless ``force`` (every conflict listed). On any problem
        nothing is stored. Returns how many values were."""
        table = _as_nested(data)
        store = self._session.store
        scope = self._scope_ids()
        problems: list[str] = []
        values: dict[tuple[str, str, str], Any] = {}
        for model_id, params in table.items():
            if model_id not in scope:
                problems.append(f"model {model_id!r} is not in scope {scope}")
                continue
            infos = {p.name: p for p in self._scope.params(store, model_id)}
            for param, fields in params.items():
                if param not in infos:
                    problems.append(f"{model_id}/{param}: no such parameter in scope")
                    continue
                for field, value in fields.items():
                    problems += _value_problems(store, model_id, param, field, value)
                    if not force and param in store.present(model_id, field):
                        problems.append(f"{model_id}/{param} {field!r}: already stored (pass "
                                        "force=True to overwrite)")
                    values[(model_id, param, field)] = value
        if problems:
            raise InvalidArgumentError("Nothing was ingested:\n  " + "\n  ".join(sorted(problems)))
        with self._session._lock:
            store.commit(Batch(values=values))
        return len(values)

    def ingest_aggregates(self, data: Any, *, force: bool = False) -> int:
        """Store aggregates computed elsewhere: ``{contextual_name: value}``, or the
        original Diffract's list of ``{"field_name", "context_models", "context_params",
        "value"}`` dicts. Checked first (models in scope, storable values, nothing
        already stored unless ``force``); on any problem nothing is stored. Returns how
        many were."""
        items = _as_aggregates(data)
        scope = set(self._scope_ids())
        store = self._session.store
        problems = []
        for name, value in items.items():
            _, models, _ = split_contextual(name)
            if not models:
                problems.append(f"{name!r} is not a contextual name (field@models[...])")
            elif not set(models) <= scope:
                problems.append(f"{name!r} names models outside the scope {sorted(scope)}")
            problem = storable_problem(value)
            if problem is not None:
                problems.append(f"{name!r}: {problem} cannot be stored")
            if not force and store.has_aggregate(name):
                problems.append(f"{name!r}: already stored (pass force=True to overwrite)")
        if problems:
            raise InvalidArgumentError("Nothing was ingested:\n  " + "\n  ".join(sorted(problems)))
        with self._session._lock:
            store.commit(Batch(aggregates=items))
        return len(items)

    # -- output -------------------------------------------------------------------
    @staticmethod
    def _emit(records: list[dict], columns: list[str], fmt: str, path: str | Path | None) -> Any:
        if fmt in _FORMATTERS:
            return _FORMATTERS[fmt](records, columns)
        if fmt == "list":
            return [{c: r.get(c) for c in columns} for r in records]
        if fmt == "pandas":
            try:
                import pandas as pd
            except ImportError:
                raise DiffractError(
                    "export_format='pandas' needs pandas: pip install 'diffract-core[pandas]'."
                ) from None
            return pd.DataFrame.from_records(records, columns=columns)
        if fmt == "polars":
            try:
                import polars as pl
            except ImportError:
                raise DiffractError(
                    "export_format='polars' needs polars: pip install polars."
                ) from None
            return pl.DataFrame([{c: plain_value(r.get(c)) for c in columns} for r in records],
                                schema=columns, strict=False)
        if fmt == "json":
            text = json.dumps([{k: plain_value(v) for k, v in r.items()} for r in records],
                              indent=1, allow_nan=False)
        else:
            import csv
            import io

            buf = io.StringIO()
            writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
            writer.writeheader()
            for r in records:
                for k, v in r.items():
                    if np.ndim(v) > 0:
                        raise InvalidArgumentError(
                            f"Column {k!r} holds arrays, which CSV cannot hold as numbers. "
                            "Leave the field out, or export it with export_format='json', "
                            "'dict', 'pandas' or 'polars'."
                        )
                writer.writerow(r)
            text = buf.getvalue()
        if path is None:
            return text
        Path(path).write_text(text)
        return Path(path)


def _as_nested(data: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """``{model: {param: {field: value}}}`` from a nested mapping or a pandas frame."""
    if hasattr(data, "to_dict") and hasattr(data, "columns"):
        if not {"model_id", "param"} <= set(data.columns):
            raise InvalidArgumentError("A frame to ingest needs 'model_id' and 'param' columns.")
        out: dict[str, dict[str, dict[str, Any]]] = {}
        fields = [c for c in data.columns if c not in ("model_id", "param", "ptype")
                  and not str(c).startswith("meta.")]
        for row in data.to_dict("records"):
            values = {f: row[f] for f in fields
                      if not (isinstance(row[f], float) and math.isnan(row[f]))}
            out.setdefault(row["model_id"], {}).setdefault(row["param"], {}).update(values)
        return out
    if isinstance(data, Mapping) and data and all("/" in str(k) for k in data) and all(
            isinstance(v, Mapping) and not any(isinstance(x, Mapping) for x in v.values())
            for v in data.values()):  # {param_id: {field: value}}, the original's form
        out = {}
        for pid, fields in data.items():
            model_id, _, param = str(pid).partition("/")
            out.setdefault(model_id, {})[param] = dict(fields)
        return out
    if not isinstance(data, Mapping) or not all(
            isinstance(p, Mapping) and all(isinstance(f, Mapping) for f in p.values())
            for p in data.values()):
        raise InvalidArgumentError(
            "ingest_metrics takes {model_id: {param: {field: value}}} or a pandas frame with "
            f"model_id and param columns, got {type(data).__name__}.")
    return {m: {p: dict(f) for p, f in params.items()} for m, params in data.items()}


def _as_aggregates(data: Any) -> dict[str, Any]:
    """``{contextual_name: value}`` from a mapping or the original's list of dicts."""
    if isinstance(data, Mapping):
        return dict(data)
    if isinstance(data, list) and all(isinstance(d, Mapping) for d in data):
        out = {}
        for d in data:
            try:
                models = tuple(d["context_models"])
                params = tuple(d.get("context_params") or ())
                name = contextual_name(d["field_name"], models, params[0] if params else None)
                out[name] = d["value"]
            except (KeyError, TypeError):
                raise InvalidArgumentError(
                    "Each aggregate needs field_name, context_models and value (and "
                    f"optionally context_params); got {dict(d)!r}.") from None
        return out
    raise InvalidArgumentError(
        "ingest_aggregates takes {contextual_name: value} or a list of {field_name, "
        f"context_models, context_params, value}} dicts, got {type(data).__name__}.")



def _value_problems(store: Any, model_id: str, param: str, field: str, value: Any) -> list[str]:
    where = f"{model_id}/{param} {field!r}"
    if field in SOURCE_FIELDS or "@" in field:
        return [f"{where}: not a field name that can be ingested"]
    problem = storable_problem(value)
    if problem is not None:
        return [f"{where}: {problem} cannot be stored"]
    others = [p for p in store.present(model_id, field) if p != param]
    if others and hasattr(value, "shape"):
        sample = store.read(model_id, others[0], field)
        if hasattr(sample, "ndim") and getattr(value, "ndim", 0) != sample.ndim:
            return [f"{where}: a {value.ndim}-D array, but the stored values of this field are "
                    f"{sample.ndim}-D"]
    return []

