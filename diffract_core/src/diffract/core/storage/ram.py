"""The ``ram`` storage profile: everything in process memory, the embedded default.

Weights are never copied (``copy_weights`` does not apply: nothing outlives the
process): the store keeps the loader that ``models.add`` built, which reads a tensor
from the caller's model (or a memory-mapped file) when a chunk needs it.
Commits are atomic under a lock; nothing survives the process."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import numpy as np

if TYPE_CHECKING:  # a record the stores hold: sources' lookups need the catalog
    from diffract.core.sources import ModelSource

from diffract.core.storage.base import (
    Batch,
    Note,
    ParamInfo,
    Stamp,
    Store,
    estimate_nbytes,
    rename_in_contextual,
    split_contextual,
)

__all__ = ["RamStore"]


class RamStore(Store):
    """An in-memory store; see the module docstring."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._params: dict[str, dict[str, ParamInfo]] = {}
        self._loaders: dict[str, Callable[[str], np.ndarray]] = {}
        self._raw: dict[str, Callable[[str], Any]] = {}
        self._values: dict[str, dict[str, dict[str, Any]]] = {}  # model -> field -> param -> v
        self._sizes: dict[tuple[str, str, str], int] = {}
        self._aggregates: dict[str, Any] = {}
        self._notes: dict[tuple[str, tuple[str, ...], str | None], Note] = {}
        self._sources: dict[str, ModelSource] = {}
        self._stamps: dict[tuple[str, str, str], Stamp] = {}  # (model, field, param)
        self._agg_stamps: dict[str, Stamp] = {}
        self._seq = 0

    def source(self, model_id: str) -> ModelSource:
        return self._sources[model_id]

    def add_model(
        self,
        model_id: str,
        params: Sequence[ParamInfo],
        source: ModelSource,
        load: Callable[[str], np.ndarray],
        load_raw: Callable[[str], Any] | None = None,
        *,
        copy_weights: bool = True,
    ) -> None:
        with self._lock:
            self._sources[model_id] = source
            self._params[model_id] = {p.name: p for p in params}
            self._loaders[model_id] = load
            self._raw[model_id] = load_raw or load
            self._values[model_id] = {}

    def model_ids(self) -> list[str]:
        return list(self._params)

    def params(self, model_id: str) -> list[ParamInfo]:
        return list(self._params[model_id].values())

    def load_weights(self, model_id: str, param: str) -> np.ndarray:
        return self._loaders[model_id](param)

    def load_tensor(self, model_id: str, param: str) -> Any:
        return self._raw[model_id](param)

    def present(self, model_id: str, field: str) -> set[str]:
        return set(self._values[model_id].get(field, ()))

    def read(self, model_id: str, param: str, field: str) -> Any:
        return self._values[model_id][field][param]

    def read_field(self, model_id: str, field: str) -> dict[str, Any]:
        with self._lock:
            return dict(self._values.get(model_id, {}).get(field, {}))

    def nbytes(self, model_id: str, param: str, field: str) -> int:
        return self._sizes.get((model_id, param, field), 0)

    def fields(self, model_id: str) -> set[str]:
        return {f for f, per in self._values[model_id].items() if per}

    def aggregate_names(self) -> list[str]:
        return list(self._aggregates)

    def read_aggregate(self, name: str) -> Any:
        return self._aggregates[name]

    def has_aggregate(self, name: str) -> bool:
        return name in self._aggregates

    def stamps(self, model_id: str, field: str) -> dict[str, Stamp]:
        per = self._values[model_id].get(field, {})
        return {p: self._stamps[(model_id, field, p)] for p in per
                if (model_id, field, p) in self._stamps}

    def aggregate_stamp(self, name: str) -> Stamp | None:
        return self._agg_stamps.get(name)

    def notes(self) -> list[Note]:
        return list(self._notes.values())

    def commit(self, batch: Batch) -> None:
        # Validate everything first so a bad key cannot leave a half-applied batch.
        for model_id, _param, _field in batch.values:
            if model_id not in self._values:
                raise KeyError(f"commit names unknown model {model_id!r}")
        with self._lock:
            self._seq += 1
            for (model_id, param, field), value in batch.values.items():
                self._values[model_id].setdefault(field, {})[param] = value
                self._sizes[(model_id, param, field)] = estimate_nbytes(value)
                if field in batch.provenance:
                    stamp = Stamp(batch.provenance[field], self._seq)
                    self._stamps[(model_id, field, param)] = stamp
            for name, value in batch.aggregates.items():
                self._aggregates[name] = value
                base = split_contextual(name)[0]
                if base in batch.provenance:
                    self._agg_stamps[name] = Stamp(batch.provenance[base], self._seq)
            for key in batch.cleared_notes:
                self._notes.pop(key, None)
            self._notes.update((note.key, note) for note in batch.notes)

    def erase_values(self, values, aggregates=(), notes=()) -> int:
        erased = 0
        with self._lock:
            for model_id, param, field in values:
                per = self._values.get(model_id, {}).get(field, {})
                if param in per:
                    del per[param]
                    erased += 1
                    self._sizes.pop((model_id, param, field), None)
                    self._stamps.pop((model_id, field, param), None)
            for name in aggregates:
                if self._aggregates.pop(name, None) is not None:
                    erased += 1
                self._agg_stamps.pop(name, None)
            for key in notes:
                self._notes.pop(key, None)
        return erased

    def rename_model(self, old: str, new: str) -> None:
        with self._lock:
            if new in self._params:
                raise KeyError(f"model {new!r} exists")
            def moved(table: dict) -> dict:  # same order, the key renamed
                return {(new if k == old else k): v for k, v in table.items()}

            self._loaders, self._raw = moved(self._loaders), moved(self._raw)
            self._values, self._sources = moved(self._values), moved(self._sources)
            self._params = {m: ({p.name: attrs.evolve(p, model_id=new) for p in ps.values()}
                                if m == new else ps) for m, ps in moved(self._params).items()}
            self._sizes = {((new if k[0] == old else k[0]),) + k[1:]: v
                           for k, v in self._sizes.items()}
            self._stamps = {((new if k[0] == old else k[0]),) + k[1:]: v
                            for k, v in self._stamps.items()}
            self._aggregates = {rename_in_contextual(n, old, new): v
                                for n, v in self._aggregates.items()}
            self._agg_stamps = {rename_in_contextual(n, old, new): v
                                for n, v in self._agg_stamps.items()}
            notes = {}
            for note in self._notes.values():
                models = tuple(new if m == old else m for m in note.models)
                moved = attrs.evolve(note, models=models)
                notes[moved.key] = moved
            self._notes = notes

    def erase_model(self, model_id: str) -> None:
        with self._lock:
            for table in (self._params, self._loaders, self._raw, self._values, self._sources):
                table.pop(model_id, None)
            self._sizes = {k: v for k, v in self._sizes.items() if k[0] != model_id}
            self._stamps = {k: v for k, v in self._stamps.items() if k[0] != model_id}
            for name in list(self._aggregates):
                if model_id in split_contextual(name)[1]:
                    del self._aggregates[name]
                    self._agg_stamps.pop(name, None)
            self._notes = {k: n for k, n in self._notes.items() if model_id not in n.models}

    def erase(
        self, fields: Iterable[str], model_ids: Iterable[str], kernels: Iterable[str] = ()
    ) -> int:
        fields, models, kernels = set(fields), set(model_ids), set(kernels)
        erased = 0
        with self._lock:
            for model_id in models & set(self._values):
                for field in fields:
                    per = self._values[model_id].pop(field, {})
                    erased += len(per)
                    for param in per:
                        self._sizes.pop((model_id, param, field), None)
                        self._stamps.pop((model_id, field, param), None)
            for name in list(self._aggregates):
                base, ctx_models, _ = split_contextual(name)
                if base in fields and ctx_models and set(ctx_models) <= models:
                    del self._aggregates[name]
                    self._agg_stamps.pop(name, None)
                    erased += 1
            for key, note in list(self._notes.items()):
                if note.kernel in kernels and set(note.models) <= models:
                    del self._notes[key]
        return erased
