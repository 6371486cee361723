"""The planner: requested fields -> ordered steps of pending units, as plain data.

Three stages stay apart: :func:`resolve` turns field names into kernels in topological
order, :func:`validate_scope` checks pairwise kernels against the scope, :func:`make_plan`
selects each kernel's pending units by field presence and demand. The runner cuts steps
into chunks (the inputs' sizes are known only when a step starts)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence

import attrs

from diffract.core.compute._enums import KernelApplyLevel
from diffract.core.compute.registry import KernelRegistry
from diffract.core.compute.spec import SOURCE_FIELDS, KernelSpec
from diffract.core.storage.base import ParamInfo, Store, contextual_name
from diffract.errors import (
    DependencyCycleError,
    InvalidArgumentError,
    MissingProducerError,
    ScopeValidationError,
    UnknownFieldError,
)

__all__ = [
    "Plan",
    "Step",
    "Unit",
    "downstream_fields",
    "make_plan",
    "resolve",
    "validate_scope",
]

@attrs.frozen
class Unit:
    """One kernel invocation: a parameter of a model, a model, or a parameter of a pair."""

    models: tuple[str, ...]
    param: str | None = None

    @property
    def label(self) -> str:
        head = self.models[0] if len(self.models) == 1 else f"[{','.join(self.models)}]"
        return head if self.param is None else f"{head}/{self.param}"


@attrs.frozen
class Step:
    """A kernel with its pending units and the units its restrictions skip (with reasons)."""

    kernel: KernelSpec
    units: tuple[Unit, ...]
    skipped: tuple[tuple[Unit, str], ...] = ()


@attrs.frozen
class Plan:
    """What one ``apply`` will run, in order.

    ``partial`` lists (field, kernel, siblings) for requested fields that are absent
    while sibling outputs of the same kernel are present: such units are not pending."""

    requested: tuple[str, ...]
    scope: tuple[str, ...]
    steps: tuple[Step, ...]
    partial: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    @property
    def pending(self) -> int:
        return sum(len(s.units) for s in self.steps)


def resolve(fields: Iterable[str], registry: KernelRegistry) -> list[KernelSpec]:
    """Kernels needed for ``fields``, dependencies first (each kernel once).

    Raises :class:`UnknownFieldError` for a field no kernel produces (every unknown one
    is checked, the first sorted is reported with a suggestion),
    :class:`MissingProducerError` for a dependency nobody produces, and
    :class:`DependencyCycleError` with the cycle."""
    fields = list(fields)
    known = registry.fields()
    unknown = sorted(f for f in fields if f not in SOURCE_FIELDS and registry.producer(f) is None)
    for field in unknown:
        conflict = registry.conflict(field)
        if conflict is not None:
            raise conflict
    if unknown:
        field = unknown[0]
        hint = None
        if field in registry:  # a kernel's name where a field is expected
            outputs = registry.get(field).produce_fields
            hint = (f"{field!r} is a kernel; request the field(s) it produces: "
                    f"{', '.join(repr(f) for f in outputs)}.")
        raise UnknownFieldError(field, known, hint=hint)
    asked = set(fields)
    order: list[KernelSpec] = []
    done: set[str] = set()
    path: list[tuple[str, str]] = []  # (kernel, field that led to it)

    def visit(field: str, consumer: str | None) -> None:
        if field in SOURCE_FIELDS:
            return
        spec = registry.producer(field)
        if spec is None:
            conflict = registry.conflict(field)
            if conflict is not None:
                raise conflict
            hint = None
            if consumer is not None and consumer in registry:
                hint = dict(registry.get(consumer).field_hints).get(field)
            raise MissingProducerError(field, consumer or "?", known, install=hint)
        if spec.name in done:
            return
        on_path = [k for k, _ in path]
        if spec.name in on_path:
            start = on_path.index(spec.name)
            raise DependencyCycleError([f for _, f in path[start:]] + [field])
        path.append((spec.name, field))
        for needed in spec.require_fields:
            if needed in spec.optional_inputs and needed not in asked:
                continue  # read where stored, never computed for this kernel
            visit(needed, spec.name)
        path.pop()
        done.add(spec.name)
        order.append(spec)

    for field in fields:
        visit(field, None)
    return order


def validate_scope(fields: Iterable[str], registry: KernelRegistry, scope: Sequence[str]) -> None:
    """Raise :class:`ScopeValidationError` when a requested field needs a binary
    cross-model kernel (itself or transitively) and the scope is not exactly two models."""
    if len(scope) == 2:
        return
    for field in fields:
        pairwise = [
            s for s in resolve([field], registry) if s.apply_level is KernelApplyLevel.CROSS_MODEL
        ]
        if not pairwise:
            continue
        own = registry.producer(field)
        # Name the deepest pairwise kernel: the one the requested field ultimately reads.
        root = pairwise[0]
        dependency = root.produce_fields[0] if own is None or root.name != own.name else None
        pair = list(scope[:2]) if len(scope) >= 2 else ["a", "b"]
        via = (
            f" it depends on {dependency!r}, and {dependency!r}"
            if dependency is not None
            else " it"
        )
        raise ScopeValidationError(
            f"Cannot produce {field!r}:{via} is a binary cross-model kernel that requires "
            f"exactly two models in scope, but the current scope has {len(scope)}: "
            f"{list(scope)}. Restrict the scope to a model pair, e.g. "
            f"session.filter(model_ids={pair!r}).compute.apply({field!r}).",
            field=field,
            kernel=root.name,
            dependency=dependency,
            scope=list(scope))


def _passes(spec: KernelSpec, info: ParamInfo) -> str | None:
    for restriction in spec.restrictions:
        if not restriction.check(info):
            return restriction.reason
    return None


def _note_partial(partial: dict[tuple[str, str], set[str]], spec: KernelSpec,
                  requested: set[str], present: list[bool]) -> None:
    """Record requested outputs absent from a unit where sibling outputs are present."""
    outputs = spec.produce_fields
    for f, here in zip(outputs, present, strict=True):
        if f in requested and not here:
            partial.setdefault((f, spec.name), set()).update(s for s in outputs if s != f)


def make_plan(
    fields: Sequence[str],
    registry: KernelRegistry,
    store: Store,
    scope: Sequence[str],
    forced: frozenset[tuple[str, tuple[str, ...], str | None]] = frozenset(),
    keep: Callable[[ParamInfo], bool] | None = None,
) -> Plan:
    """Resolve, validate the scope and select pending units by field presence.

    A unit is pending when *all* its kernel's outputs are absent there, or ``forced``
    names it ((kernel, models, param): stale), and, for an intermediate kernel, a later
    pending unit reads it; restrictions move units to ``Step.skipped``. ``keep`` limits
    the parameters (a view's filters); IN_MODEL kernels then refuse to run."""
    kernels = resolve(fields, registry)
    validate_scope(fields, registry, scope)
    if keep is not None:
        whole = [s.name for s in kernels if s.apply_level is KernelApplyLevel.IN_MODEL]
        if whole:
            raise InvalidArgumentError(
                f"Kernel(s) {whole} summarise whole models, but this view filters their "
                "parameters: the result would describe part of a model under the model's "
                "name. Apply them on a view of whole models (session.filter(model_ids=...))."
            )
    requested = set(fields)
    steps: list[Step] = []
    partial: dict[tuple[str, str], set[str]] = {}
    for spec in kernels:
        outputs = spec.produce_fields
        wanted = [f for f in outputs if f in requested]
        units: list[Unit] = []
        skipped: list[tuple[Unit, str]] = []
        level = spec.apply_level
        if level is KernelApplyLevel.PARAMETER:
            for model_id in scope:
                have = {f: store.present(model_id, f) for f in outputs}
                any_out = set().union(*have.values())
                for f in wanted:
                    if any(p not in have[f] for p in any_out):
                        partial.setdefault((f, spec.name), set()).update(
                            s for s in outputs if s != f
                        )
                for info in store.params(model_id):
                    if keep is not None and not keep(info):
                        continue
                    if info.name in any_out and (spec.name, (model_id,), info.name) not in forced:
                        continue
                    unit = Unit((model_id,), info.name)
                    reason = _passes(spec, info)
                    (skipped.append((unit, reason)) if reason else units.append(unit))
        elif level is KernelApplyLevel.IN_MODEL:
            for model_id in scope:
                names = [contextual_name(f, (model_id,)) for f in outputs]
                present = [store.has_aggregate(n) for n in names]
                if not any(present) or (spec.name, (model_id,), None) in forced:
                    units.append(Unit((model_id,)))
                else:
                    _note_partial(partial, spec, requested, present)
        else:  # CROSS_MODEL: scope is exactly a pair (validated above)
            a, b = scope
            in_b = {p.name: p for p in store.params(b)}
            for info in store.params(a):
                if keep is not None and not keep(info):
                    continue
                unit = Unit((a, b), info.name)
                if info.name not in in_b:
                    skipped.append((unit, f"parameter {info.name!r} is not in model {b!r}"))
                    continue
                if info.shape != in_b[info.name].shape:
                    skipped.append((unit, f"parameter {info.name!r} has shape {info.shape} in "
                                          f"{a!r} but {in_b[info.name].shape} in {b!r}"))
                    continue
                present = [store.has_aggregate(contextual_name(f, (a, b), info.name))
                           for f in outputs]
                if any(present) and (spec.name, (a, b), info.name) not in forced:
                    _note_partial(partial, spec, requested, present)
                    continue
                reason = _passes(spec, info) or _passes(spec, in_b[info.name])
                (skipped.append((unit, reason)) if reason else units.append(unit))
        steps.append(Step(spec, tuple(units), tuple(skipped)))
    return Plan(
        requested=tuple(fields),
        scope=tuple(scope),
        steps=_demanded(steps, requested),
        partial=tuple((f, k, tuple(sorted(s))) for (f, k), s in sorted(partial.items())),
    )


def _demanded(steps: list[Step], requested: set[str]) -> tuple[Step, ...]:
    """Pending units of intermediate kernels (no requested output) kept only where a
    later pending unit reads them: an erased intermediate whose consumers are stored is
    not recomputed (a tracked run drops its pairs' overlap matrices)."""
    out: list[Step] = []
    for step in reversed(steps):
        made = set(step.kernel.produce_fields)
        if made & requested or not step.units:
            out.append(step)
            continue
        readers = [u for s in out if made & set(s.kernel.require_fields) for u in s.units]
        on: dict[str | None, set[str]] = {}  # param (None: a whole model) -> models read
        for u in readers:
            on.setdefault(u.param, set()).update(u.models)
        out.append(attrs.evolve(step, units=tuple(u for u in step.units if any(
            m in on.get(u.param, ()) or m in on.get(None, ()) or (u.param is None and any(
                m in v for v in on.values())) for m in u.models))))
    return tuple(reversed(out))


def downstream_fields(fields: Iterable[str], registry: KernelRegistry) -> set[str]:
    """Every field computed, directly or transitively, from ``fields`` (excluding them)."""
    seen: set[str] = set()
    frontier = list(fields)
    while frontier:
        field = frontier.pop()
        for consumer in registry.consumers(field):
            for out in consumer.produce_fields:
                if out not in seen:
                    seen.add(out)
                    frontier.append(out)
    return seen - set(fields)
