"""Cutting a step's units into chunks by the read budget: what one commit holds."""

from __future__ import annotations

from diffract.core.compute.planner import Step, Unit
from diffract.core.compute.spec import SOURCE_FIELDS
from diffract.core.storage.base import Store

__all__ = ["MAX_UNITS_PER_CHUNK", "Chunker", "chunk_units"]

#: Most units one chunk holds, however small they are: bounds what a crash can lose.
MAX_UNITS_PER_CHUNK = 1024


class Chunker:
    """Cuts a step's units into chunks, one at a time, by bytes (from stored metadata:
    weight matrices make small chunks, scalars large ones) and by units. ``take(max_units)``
    returns the next chunk: at least one unit, at most ``max_units``, and no more input
    bytes than ``budget`` (beyond its first unit). ``largest_first`` takes the units by
    decreasing bytes (workers then end together, not waiting on a large last one)."""

    def __init__(self, step: Step, store: Store, budget: int,
                 largest_first: bool = False) -> None:
        self.units = step.units
        self.budget = budget
        self.position = 0
        self._require = step.kernel.require_fields
        self._store = store
        models = {m for u in step.units for m in u.models}
        self._infos = {m: {p.name: p for p in store.params(m)} for m in models}
        self._per_param = {  # inputs stored per parameter (others are aggregates: small)
            (m, f): store.present(m, f)
            for m in models
            for f in self._require
            if f not in SOURCE_FIELDS
        }
        if largest_first:
            self.units = tuple(sorted(self.units, key=self.cost_of, reverse=True))

    def cost_of(self, unit: Unit) -> int:
        """Estimated bytes of the unit's inputs."""
        total = 0
        for field in self._require:
            for m in unit.models:
                params = [unit.param] if unit.param is not None else list(self._infos[m])
                if field == "weights":  # read as numpy: half types become float32
                    total += sum(max(4, self._infos[m][p].itemsize) * self._infos[m][p].numel
                                 for p in params)
                elif field == "tensor":
                    total += sum(self._infos[m][p].nbytes for p in params)
                elif field in SOURCE_FIELDS:
                    total += 8 * len(params)
                elif self._per_param[(m, field)]:
                    total += sum(self._store.nbytes(m, p, field) for p in params)
                else:
                    total += 8
        return total

    @property
    def done(self) -> bool:
        return self.position >= len(self.units)

    def take(self, max_units: int = MAX_UNITS_PER_CHUNK) -> tuple[Unit, ...]:
        start = end = self.position
        used = 0
        limit = min(max(1, max_units), MAX_UNITS_PER_CHUNK)
        while end < len(self.units) and end - start < limit:
            cost = self.cost_of(self.units[end])
            if end > start and used + cost > self.budget:
                break
            used += cost
            end += 1
        self.position = end
        return tuple(self.units[start:end])


def chunk_units(step: Step, store: Store, budget: int) -> list[tuple[Unit, ...]]:
    """Every chunk of a step by bytes alone (see :class:`Chunker`)."""
    chunker = Chunker(step, store, budget)
    chunks = []
    while not chunker.done:
        chunks.append(chunker.take())
    return chunks
