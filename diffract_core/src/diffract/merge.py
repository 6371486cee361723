"""``session.merge``: bring another session's (or view's, or store's) models and results
into a session, conflicts listed or resolved by policy."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from diffract.core.storage.base import Batch, Store, split_contextual
from diffract.errors import InvalidArgumentError, MergeConflictError

__all__ = ["merge_into"]


def merge_into(session: Any, src: Store, models: Sequence[str], on_conflict: str) -> dict:
    """Merge ``models`` of store ``src`` into ``session`` (see :meth:`diffract.Session.merge`)."""
    if on_conflict not in ("raise", "keep", "theirs"):
        raise InvalidArgumentError(
            f"on_conflict must be 'raise', 'keep' or 'theirs', got {on_conflict!r}.")
    with session._lock:
        plan = _merge_plan(session.store, src, models)
        if plan.conflicts and on_conflict == "raise":
            raise MergeConflictError(plan.conflicts)
        if any(c.startswith("model") for c in plan.conflicts):
            raise MergeConflictError([c for c in plan.conflicts if c.startswith("model")])
        for model_id in plan.new_models:
            session.store.add_model(
                model_id, src.params(model_id), src.source(model_id),
                lambda name, m=model_id: src.load_weights(m, name),
                lambda name, m=model_id: src.load_tensor(m, name))
        values = dict(plan.values)
        aggregates = dict(plan.aggregates)
        if on_conflict == "theirs":
            values.update(plan.conflicting_values)
            aggregates.update(plan.conflicting_aggregates)
        fields = {k[2] for k in values} | {split_contextual(n)[0] for n in aggregates}
        for field in sorted(fields):  # one commit per field: it carries its provenance
            prov = plan.provenance.get(field)
            session.store.commit(Batch(
                values={k: v for k, v in values.items() if k[2] == field},
                aggregates={n: v for n, v in aggregates.items()
                            if split_contextual(n)[0] == field},
                provenance={field: prov} if prov is not None else {}))
        session.store.commit(Batch(notes=plan.notes))
    return {"models_added": list(plan.new_models), "values": len(values),
            "aggregates": len(aggregates), "notes": len(plan.notes),
            "conflicts": list(plan.conflicts)}


@attrs.define
class _MergePlan:
    """What merging another store adds here, and what conflicts (see Session.merge)."""

    new_models: list[str] = attrs.field(factory=list)
    values: dict = attrs.field(factory=dict)
    aggregates: dict = attrs.field(factory=dict)
    notes: list = attrs.field(factory=list)
    provenance: dict = attrs.field(factory=dict)
    conflicts: list[str] = attrs.field(factory=list)
    conflicting_values: dict = attrs.field(factory=dict)
    conflicting_aggregates: dict = attrs.field(factory=dict)


def _same_value(a: Any, b: Any) -> bool:
    """Equal stored values (arrays element-wise, NaN equal to NaN, tuples item-wise)."""
    import numpy as np

    if isinstance(a, tuple) or isinstance(b, tuple):
        return (isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b)
                and all(_same_value(x, y) for x, y in zip(a, b, strict=True)))
    try:
        return bool(np.array_equal(np.asarray(a), np.asarray(b), equal_nan=True))
    except TypeError:
        return bool(a == b)


def _merge_plan(dst: Store, src: Store, models: Sequence[str]) -> _MergePlan:
    """What merging ``models`` of ``src`` into ``dst`` adds, and what conflicts."""
    plan = _MergePlan()
    here = set(dst.model_ids())
    for m in models:
        if m not in here:
            plan.new_models.append(m)
            continue
        mine = [(p.name, p.shape) for p in dst.params(m)]
        theirs = [(p.name, p.shape) for p in src.params(m)]
        if mine != theirs:
            plan.conflicts.append(f"model {m!r}: its parameters differ (names or shapes) "
                                  "between the sessions")
    if plan.conflicts:
        return plan
    for m in models:
        for field in src.fields(m):
            stamps = src.stamps(m, field)
            present = dst.present(m, field) if m in here else set()
            for param in src.present(m, field):
                value = src.read(m, param, field)
                if param in present:
                    if not _same_value(dst.read(m, param, field), value):
                        plan.conflicts.append(f"{m}/{param} {field!r}: different values")
                        plan.conflicting_values[(m, param, field)] = value
                    continue
                plan.values[(m, param, field)] = value
                if param in stamps:
                    plan.provenance.setdefault(field, stamps[param].provenance)
    wanted = set(models)
    for name in src.aggregate_names():
        base, ctx, _ = split_contextual(name)
        if not ctx or not set(ctx) <= wanted:
            continue
        value = src.read_aggregate(name)
        if dst.has_aggregate(name):
            if not _same_value(dst.read_aggregate(name), value):
                plan.conflicts.append(f"aggregate {name!r}: different values")
                plan.conflicting_aggregates[name] = value
            continue
        plan.aggregates[name] = value
        stamp = src.aggregate_stamp(name)
        if stamp is not None:
            plan.provenance.setdefault(base, stamp.provenance)
    keys = {n.key for n in dst.notes()}
    plan.notes = [n for n in src.notes() if set(n.models) <= wanted and n.key not in keys]
    return plan
