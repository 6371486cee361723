"""Cutting a step's units into chunks by the read budget: what one commit holds."""

from __future__ import annotations

from diffract.core.compute.planner import Step, Unit
from diffract.core.compute.spec import SOURCE_FIELDS
from diffract.core.storage.base import Store

__all__ = ["MAX_UNITS_PER_CHUNK", "Chunker"]

#: Most units one chunk holds, however small they are: bounds what a crash can lose.
MAX_UNITS_PER_CHUNK = 1024


class Chunker:
    """Cuts a step's units into chunks, one at a time, by bytes (from stored metadata:
    weight matrices make small chunks, scalars large ones) and by units. ``take(max_units)``
    returns the next chunk: at least one unit, at most ``max_units``, and no more input
    bytes than ``budget`` (beyond its first unit). ``largest_first`` takes the units by
    decreasing bytes of their family (a parameter, then its views, which slice it while
    it is kept: :func:`diffract.core.models._viewed`), so that workers end together, not
    waiting on a large last one;
    ``costs[i]`` is the estimated input bytes of ``units[i]``."""

    def __init__(self, step: Step, store: Store, budget: int,
                 largest_first: bool = False) -> None:
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
        costed = [(self._cost(u), u) for u in step.units]
        if largest_first:  # by family, the largest first: a view right after its parent,
            own = {u.param: c for c, u in costed}  # which it then slices, not reads again
            costed.sort(key=lambda pair: own.get(self._parent(pair[1]), pair[0]), reverse=True)
        self.costs = [cost for cost, _ in costed]
        self.units = tuple(unit for _, unit in costed)

    def _parent(self, unit: Unit) -> str | None:
        info = self._infos[unit.models[0]].get(unit.param) if unit.param else None
        return info.parent if info is not None else None

    def _cost(self, unit: Unit) -> int:
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

    def take(self, max_units: int = MAX_UNITS_PER_CHUNK, spread: int = 1) -> tuple[Unit, ...]:
        """The next chunk; for ``spread`` workers, grown past ``max_units`` until its bytes
        are ``spread`` times its first unit's (that unit does not run alone). The views of a
        parameter taken join it (they slice it where it is read)."""
        start = end = self.position
        used, taken = 0, set()
        limit = min(max(1, max_units), MAX_UNITS_PER_CHUNK)
        while end < len(self.units) and end - start < MAX_UNITS_PER_CHUNK:
            cost = self.costs[end]
            sliced = self._parent(self.units[end]) in taken  # a view of a parent taken
            if end > start and not sliced and (used + cost > self.budget or end - start >= limit
                                               and used >= spread * self.costs[start]):
                break
            taken.add(self.units[end].param)
            used += cost
            end += 1
        self.position = end
        return tuple(self.units[start:end])
