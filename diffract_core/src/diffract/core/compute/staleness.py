"""Stale results: stored values whose producing configuration is not the current one.

Every stored value carries a :class:`~diffract.core.storage.base.Stamp`: the kernel,
provider and configuration that produced it, and the commit that wrote it. A value is
*stale* when its kernel's configuration now differs from the recorded one, or when one
of its inputs (on the same unit) is stale or was written after it (it was computed from
an older input). :func:`find_stale` walks the kernels in dependency order, so staleness
reaches everything downstream, and ``apply(..., recompute="stale")`` recomputes exactly
those units.

Values written before provenance was recorded have no stamp: their configuration is
unknown, so they are never reported stale on their own. An option a kernel gained after a
value was stored does not make it stale while the option is at its default (a pack's
upgrade keeps the stores it wrote current)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

import attrs

from diffract.core.compute._enums import KernelApplyLevel
from diffract.core.compute.planner import resolve
from diffract.core.compute.registry import KernelRegistry
from diffract.core.compute.spec import SOURCE_FIELDS, KernelSpec
from diffract.core.storage.base import (
    Stamp,
    Store,
    canonical_config,
    contextual_name,
    split_contextual,
)

__all__ = ["StaleUnit", "find_stale"]

UnitKey = tuple[str, tuple[str, ...], "str | None"]  # (kernel, models, param)


@attrs.frozen
class StaleUnit:
    """One kernel's stored outputs on one unit that no longer match: ``reason`` says why
    (its configuration changed, with both values, or an input is stale or newer)."""

    kernel: str
    fields: tuple[str, ...]
    models: tuple[str, ...]
    param: str | None
    reason: str

    @property
    def key(self) -> UnitKey:
        return (self.kernel, self.models, self.param)

    @property
    def unit(self) -> str:
        head = self.models[0] if len(self.models) == 1 else f"[{','.join(self.models)}]"
        return head if self.param is None else f"{head}/{self.param}"


def _units(spec: KernelSpec, store: Store, scope: Sequence[str]):
    """(models, param, stamp) of every stored unit of a kernel (its first output's stamp)."""
    first = spec.produce_fields[0]
    if spec.apply_level is KernelApplyLevel.PARAMETER:
        for model_id in scope:
            for param, stamp in store.stamps(model_id, first).items():
                yield (model_id,), param, stamp
        return
    wanted = set(scope)
    for name in store.aggregate_names():
        base, models, param = split_contextual(name)
        if base == first and models and set(models) <= wanted:
            stamp = store.aggregate_stamp(name)
            if stamp is not None:
                yield models, param, stamp


def _input_stamps(spec: KernelSpec, field: str, producer: KernelSpec, store: Store,
                  models: tuple[str, ...], param: str | None) -> list[tuple[UnitKey, Stamp]]:
    """The stamps of input ``field`` that the unit (models, param) of ``spec`` read."""
    out = []
    level = producer.apply_level
    if level is KernelApplyLevel.PARAMETER:
        for m in models:
            stamps = store.stamps(m, field)
            names = [param] if param is not None else list(stamps)
            out += [((producer.name, (m,), n), stamps[n]) for n in names if n in stamps]
    elif level is KernelApplyLevel.IN_MODEL:
        for m in models:
            stamp = store.aggregate_stamp(contextual_name(field, (m,)))
            if stamp is not None:
                out.append(((producer.name, (m,), None), stamp))
    else:
        stamp = store.aggregate_stamp(contextual_name(field, models, param))
        if stamp is not None:
            out.append(((producer.name, models, param), stamp))
    return out


def _added_at_default(stored: str, effective: dict, defaults: dict) -> bool:
    """Whether the stored configuration is the current one but for options the kernel
    gained since (a pack's upgrade), each now at its default: those results stand."""
    try:
        old = json.loads(stored)
    except ValueError:
        return False
    if not isinstance(old, dict) or not old.keys() <= effective.keys():
        return False
    added = effective.keys() - old.keys()
    return all(effective[k] == defaults.get(k, object()) for k in added) and \
        canonical_config({k: effective[k] for k in old}) == stored


def find_stale(registry: KernelRegistry, store: Store, scope: Sequence[str],
               fields: Iterable[str] | None = None) -> list[StaleUnit]:
    """Every stale unit in scope, dependencies first (of ``fields`` and what they need,
    or of every kernel when None)."""
    if fields is None:
        fields = [s.produce_fields[0] for s in registry.kernels()]
    stale: dict[UnitKey, StaleUnit] = {}
    root: dict[UnitKey, str] = {}  # the first cause, for reasons downstream
    for spec in resolve(list(fields), registry):
        effective = registry.effective_config(spec.name)
        current = canonical_config(effective)
        inputs = [(f, registry.producer(f)) for f in spec.require_fields if f not in SOURCE_FIELDS]
        for models, param, stamp in _units(spec, store, scope):
            reason = cause = None
            if stamp.provenance.config != current and not _added_at_default(
                    stamp.provenance.config, effective, spec.config_defaults):
                reason = cause = (f"the configuration of {spec.name!r} changed from "
                                  f"{stamp.provenance.config} to {current}")
            else:
                for field, producer in inputs:
                    if producer is None:
                        continue
                    for key, input_stamp in _input_stamps(spec, field, producer, store, models,
                                                          param):
                        if key in stale:
                            cause = root[key]
                            reason = f"input {field!r} is stale: {cause}"
                        elif input_stamp.seq > stamp.seq:
                            reason = cause = f"input {field!r} was recomputed after it"
                        if reason:
                            break
                    if reason:
                        break
            if reason is not None:
                unit = StaleUnit(spec.name, spec.produce_fields, models, param, reason)
                stale[unit.key] = unit
                root[unit.key] = cause or reason
    return list(stale.values())
