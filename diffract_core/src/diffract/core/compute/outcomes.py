"""What one apply returns, and what a kernel's return value becomes.

:class:`ApplyReport` counts the units computed per kernel and keeps every note recorded
(failed, skipped, undefined); :class:`Progress` is one committed chunk;
:func:`normalize_outputs` maps a return value onto the kernel's produce_fields, checking
that a store can keep it."""

from __future__ import annotations

import types
from html import escape as esc
from typing import Any

import attrs
import numpy as np

from diffract.core.compute.spec import KernelSpec
from diffract.core.storage.base import STORABLE_TYPES, Note, storable_problem
from diffract.errors import KernelOutputError

__all__ = ["ApplyReport", "Progress", "Summary", "is_nan", "normalize_outputs"]


@attrs.define
class ApplyReport:
    """What one apply did: units computed per kernel, and every note it recorded."""

    requested: tuple[str, ...]
    computed: dict[str, int] = attrs.field(factory=dict)
    notes: list[Note] = attrs.field(factory=list)

    def _kind(self, kind: str) -> list[Note]:
        return [n for n in self.notes if n.kind == kind]

    @property
    def failures(self) -> list[Note]:
        return self._kind("failed")

    @property
    def skipped(self) -> list[Note]:
        return self._kind("skipped")

    @property
    def undefined(self) -> list[Note]:
        return self._kind("undefined")

    @property
    def ok(self) -> bool:
        return not self.failures

    def reasons(self, kind: str | None = None) -> dict[tuple[str, str, str], list[str]]:
        """Notes grouped: (kind, kernel, reason) -> the units it applies to (``kind``
        limits it to ``"failed"``, ``"skipped"`` or ``"undefined"``). Reasons that differ
        only by naming their own unit are one group, keyed by its first unit's text."""
        groups: dict[tuple[str, str, str], list[str]] = {}
        first: dict[tuple[str, str, str], tuple[str, str, str]] = {}
        for n in self.notes:
            if kind is None or n.kind == kind:
                text = n.reason.replace(n.unit, "\0")
                text = text.replace(n.param, "\0") if n.param else text
                key = first.setdefault((n.kind, n.kernel, text), (n.kind, n.kernel, n.reason))
                groups.setdefault(key, []).append(n.unit)
        return groups

    def summary(self, failures: int = 5) -> Summary:
        """A few lines (:class:`Summary`): units computed per kernel, counts per outcome
        with their reasons grouped, and the first ``failures`` failures."""
        lines = [f"computed: {sum(self.computed.values())} unit(s) "
                 f"({', '.join(f'{k} {v}' for k, v in self.computed.items()) or 'nothing'})"]
        for kind in ("failed", "undefined", "skipped"):
            groups = self.reasons(kind)
            if not groups:
                continue
            count = sum(len(units) for units in groups.values())
            lines.append(f"{kind}: {count} unit(s), {len(groups)} distinct reason(s)")
            shown = sorted(groups.items(), key=lambda kv: -len(kv[1]))
            limit = failures if kind == "failed" else 3
            for (_, kernel, reason), units in shown[:limit]:
                more = f" and {len(units) - 1} more" if len(units) > 1 else ""
                lines.append(f"  {kernel} on {units[0]}{more}: {reason}")
        return Summary("\n".join(lines))

    def __repr__(self) -> str:
        counts = {k: len(self._kind(k)) for k in ("failed", "undefined", "skipped")}
        return (f"ApplyReport(computed={sum(self.computed.values())}, "
                + ", ".join(f"{k}={v}" for k, v in counts.items())
                + "; .summary() for reasons)")

    def _repr_html_(self) -> str:  # a notebook cell's view of it
        items = "".join(f"<li>{esc(line)}</li>" for line in self.summary().splitlines())
        return f"<div><b>ApplyReport</b> of {esc(', '.join(self.requested))}<ul>{items}</ul></div>"


class Summary(str):
    """Text whose repr is itself: a cell ending with it shows lines, not a quoted string."""

    def __repr__(self) -> str:
        return str(self)


@attrs.frozen
class Progress:
    """One committed chunk: ``kernel``, units ``done`` of ``total`` for that kernel (of
    which ``failed`` failed), the ``step`` (1-based) of ``steps`` kernels in the plan,
    and the ``rate`` so far in units per second."""

    kernel: str
    done: int
    total: int
    step: int
    steps: int
    failed: int = 0
    rate: float = 0.0


def normalize_outputs(spec: KernelSpec, unit: str, result: Any) -> dict[str, Any]:
    """Map a kernel's return value onto its produce_fields (dict, tuple or scalar).

    Raises :class:`KernelOutputError` naming the kernel and the unit when the value does
    not fit produce_fields or holds something a store cannot keep; the runner records
    that as the unit's failure."""
    produce = spec.produce_fields
    if isinstance(result, dict):
        keys = set(result)
        if keys != set(produce):
            missing, extra = sorted(set(produce) - keys), sorted(keys - set(produce))
            raise KernelOutputError(
                f"Kernel {spec.name!r} returned a dict for {unit} whose keys do not match "
                f"its produce_fields {produce}: missing {missing}, unexpected {extra}. "
                "Return exactly one entry per produced field.",
                kernel=spec.name,
                unit=unit)
        values = result
    elif isinstance(result, tuple):
        if len(result) != len(produce):
            raise KernelOutputError(
                f"Kernel {spec.name!r} returned a tuple of {len(result)} values for {unit}, "
                f"but it produces {len(produce)} field(s) {produce}. Return one value per "
                "produced field, in order.",
                kernel=spec.name,
                unit=unit)
        values = dict(zip(produce, result, strict=True))
    else:
        if len(produce) != 1:
            raise KernelOutputError(
                f"Kernel {spec.name!r} returned a single {type(result).__name__} for {unit}, "
                f"but it produces {len(produce)} fields {produce}. Return a tuple or a dict.",
                kernel=spec.name,
                unit=unit)
        values = {produce[0]: result}
    for field, value in values.items():
        problem = storable_problem(value)
        if problem is not None:
            undefined_hint = (
                " (raise FieldUndefined with a reason when the value is undefined)"
                if value is None or isinstance(value, types.GeneratorType)
                else ""
            )
            raise KernelOutputError(
                f"Kernel {spec.name!r} returned {problem} for field {field!r} on {unit}, "
                f"which no store can keep. Return {STORABLE_TYPES}{undefined_hint}.",
                kernel=spec.name,
                unit=unit)
    return values


def is_nan(value: Any) -> bool:
    """True when a stored value is or contains NaN."""
    if isinstance(value, tuple):
        return any(is_nan(v) for v in value)
    try:
        return bool(np.isnan(np.asarray(value, dtype=np.float64)).any())
    except (TypeError, ValueError):
        return False
