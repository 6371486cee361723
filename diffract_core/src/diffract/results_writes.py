"""The write side of ``session.results``: erase stored fields, ingest values computed
elsewhere. :class:`ResultsAPI <diffract.results.ResultsAPI>` inherits these methods."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from diffract.core.compute.planner import downstream_fields
from diffract.core.compute.spec import SOURCE_FIELDS
from diffract.core.scope import ScopedAPI
from diffract.core.storage.base import Batch, contextual_name, split_contextual, storable_problem
from diffract.errors import InvalidArgumentError, UnknownFieldError

__all__ = ["ResultWrites"]


class ResultWrites(ScopedAPI):
    """Erase and ingest, within the scope; the reads (``_known_fields``,
    ``_canonical``, ``_aggregate_items``, ``_in_scope``) come from ``ResultsAPI``."""

    # -- erase ------------------------------------------------------------------------
    def erase(self, *fields: str, erase_dependent_also: bool = False,
              erase_all: bool = False) -> int:
        """Erase stored ``fields`` in scope (every stored field with ``erase_all``);
        returns how many values went.

        With ``erase_dependent_also``, every field computed from them downstream is erased
        too. Erase a multi-output kernel's fields as a group: a unit is recomputed only
        when all of its kernel's outputs are absent. In a view that filters parameters,
        only those parameters' values (and pairwise aggregates) are erased."""
        fields = self._fields(fields, "erase")
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
