"""The ``ram`` storage profile: everything in process memory, the embedded default.

Weights are never copied (``copy_weights`` does not apply: nothing outlives the
process): the store keeps the loader that ``models.add`` built, which reads a tensor
from the caller's model (or a memory-mapped file) when a chunk needs it.
Commits are atomic under a lock; nothing survives the process.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np

from diffract.core.sources import ModelSource
from diffract.core.storage.base import (
    Batch,
    Note,
    ParamInfo,
    Stamp,
    Store,
    estimate_nbytes,
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
