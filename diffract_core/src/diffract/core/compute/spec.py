"""Kernel specifications: the one place that turns a function signature into a KernelSpec.

A kernel is a plain function. Parameters without defaults are required input fields
(named after the parameter unless ``require_fields`` renames them, positionally);
parameters with defaults are configuration. ``*args`` and ``**kwargs`` are refused.
"""

from __future__ import annotations

import inspect
import pickle
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs

from diffract.core.compute._enums import KernelApplyLevel, KernelExecutionProtocol
from diffract.errors import KernelDefinitionError

__all__ = ["KernelSpec", "Restriction", "kernel", "SOURCE_FIELDS"]

F = TypeVar("F", bound=Callable[..., Any])

#: Fields that exist as soon as a model is added; no kernel produces them:
#: ``weights`` (the parameter as a numpy array, half types as float32, read lazily),
#: ``tensor`` (the parameter as its source holds it: a detached torch tensor on its
#: device and in its dtype, or a numpy array) and ``shape`` (its shape, a tuple).
SOURCE_FIELDS: frozenset[str] = frozenset({"weights", "tensor", "shape"})

_FIELD_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")
_MARK = "__diffract_kernel__"


def _summary(fn: Callable[..., Any]) -> str:
    return f"<{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', fn)!s}>"


@attrs.frozen
class Restriction:
    """A predicate on a parameter's metadata; a parameter that fails it is skipped.

    ``check(info)`` receives a :class:`~diffract.core.storage.ParamInfo` and returns True
    when the kernel applies. ``reason`` is recorded for every skipped parameter.
    """

    check: Callable[[Any], bool] = attrs.field(eq=False, hash=False, repr=False)
    reason: str

    @classmethod
    def min_ndim(cls, ndim: int) -> Restriction:
        """Apply only to parameters with at least ``ndim`` dimensions."""
        return cls(
            check=lambda info: len(info.shape) >= ndim,
            reason=f"needs a parameter of at least {ndim} dimensions",
        )

    @classmethod
    def max_ndim(cls, ndim: int) -> Restriction:
        """Apply only to parameters with at most ``ndim`` dimensions."""
        return cls(
            check=lambda info: len(info.shape) <= ndim,
            reason=f"needs a parameter of at most {ndim} dimensions",
        )

    @classmethod
    def min_numel(cls, numel: int) -> Restriction:
        """Apply only to parameters with at least ``numel`` elements."""
        return cls(
            check=lambda info: info.numel >= numel,
            reason=f"needs a parameter of at least {numel} elements",
        )

    @classmethod
    def name_matches(cls, pattern: str) -> Restriction:
        """Apply only to parameters whose name matches the regular expression."""
        rx = re.compile(pattern)
        return cls(
            check=lambda info: rx.search(info.name) is not None,
            reason=f"applies only to parameters whose name matches {pattern!r}",
        )


def _frozen_mapping(value: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(value.items())


@attrs.frozen
class KernelSpec:
    """A registered kernel: its function and what the signature says about it.

    ``inputs`` pairs each required function parameter with the field it reads;
    ``config`` holds the default of every configuration keyword; ``provider`` names the
    distribution that registered it (filled in by the plugin manager).

    ``batch`` is an optional faster path for SEQUENTIAL kernels: called as
    ``batch(units, **config)`` with ``units`` a list of per-unit input dicts, it returns
    one result per unit, in order, where an exception instance stands for that unit
    raising it. It must compute what ``function`` computes (it may batch same-shaped
    inputs, use several threads or a GPU). If it raises, the runner falls back to
    ``function`` unit by unit.
    """

    name: str
    function: Callable[..., Any] = attrs.field(eq=False, hash=False, repr=_summary)
    inputs: tuple[tuple[str, str], ...]
    produce_fields: tuple[str, ...]
    config: tuple[tuple[str, Any], ...] = ()
    apply_level: KernelApplyLevel = KernelApplyLevel.PARAMETER
    execution_protocol: KernelExecutionProtocol = KernelExecutionProtocol.SEQUENTIAL
    restrictions: tuple[Restriction, ...] = ()
    doc: str = attrs.field(default="", repr=False)
    provider: str = "unknown"
    batch: Callable[..., Any] | None = attrs.field(default=None, eq=False, hash=False, repr=False)

    @property
    def require_fields(self) -> tuple[str, ...]:
        """The input fields, in signature order."""
        return tuple(field for _, field in self.inputs)

    @property
    def config_defaults(self) -> dict[str, Any]:
        """Each configuration keyword with its default."""
        return dict(self.config)

    @property
    def summary(self) -> str:
        """The first line of the kernel's docstring."""
        return self.doc.strip().splitlines()[0] if self.doc.strip() else ""

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        require_fields: Iterable[str] | None = None,
        produce_fields: Iterable[str] | None = None,
        apply_level: KernelApplyLevel | None = None,
        execution_protocol: KernelExecutionProtocol | None = None,
        restrictions: Iterable[Restriction] | None = None,
        batch: Callable[..., Any] | None = None,
        provider: str = "unknown",
    ) -> KernelSpec:
        """Build a spec from ``fn``'s signature; explicit arguments override ``@kernel`` marks.

        Raises :class:`KernelDefinitionError` naming the kernel for ``*args``/``**kwargs``,
        a ``require_fields`` list that does not match the required parameters, or an
        invalid field name.
        """
        marks: dict[str, Any] = dict(getattr(fn, _MARK, {}))
        given = {
            "name": name,
            "require_fields": require_fields,
            "produce_fields": produce_fields,
            "apply_level": apply_level,
            "execution_protocol": execution_protocol,
            "restrictions": restrictions,
            "batch": batch,
        }
        marks.update({k: v for k, v in given.items() if v is not None})
        if not callable(fn):
            raise KernelDefinitionError(
                f"A kernel must be a function, got {type(fn).__name__}.",
                kernel=str(marks.get("name", fn)),
            )
        kname = marks.get("name") or getattr(fn, "__name__", None)
        if not kname or not _FIELD_NAME.match(kname):
            raise KernelDefinitionError(
                f"Kernel name {kname!r} is not valid: use letters, digits, '_' and '.'.",
                kernel=str(kname),
            )
        try:
            signature = inspect.signature(fn)
        except (TypeError, ValueError) as exc:
            raise KernelDefinitionError(
                f"Kernel {kname!r}: cannot read the signature of {_summary(fn)} ({exc}).",
                kernel=kname,
            ) from None

        required: list[str] = []
        config: dict[str, Any] = {}
        for p in signature.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                star = "*" if p.kind is p.VAR_POSITIONAL else "**"
                raise KernelDefinitionError(
                    f"Kernel {kname!r} takes {star}{p.name}: kernels may not take *args or "
                    "**kwargs, because Diffract reads their inputs and configuration from "
                    "the signature. Name each input field and configuration keyword.",
                    kernel=kname,
                )
            if p.default is p.empty:
                required.append(p.name)
            else:
                config[p.name] = p.default

        fields = list(marks.get("require_fields") or required)
        if len(fields) != len(required):
            raise KernelDefinitionError(
                f"Kernel {kname!r}: require_fields {tuple(fields)} has {len(fields)} "
                f"entries but the function has {len(required)} required parameters "
                f"{tuple(required)}. Give one field per parameter without a default.",
                kernel=kname,
            )
        produce = tuple(marks.get("produce_fields") or (kname,))
        for field in (*fields, *produce):
            if not isinstance(field, str) or not _FIELD_NAME.match(field):
                raise KernelDefinitionError(
                    f"Kernel {kname!r}: {field!r} is not a valid field name "
                    "(letters, digits, '_' and '.'; '@' is reserved for contextual names).",
                    kernel=kname,
                )
        if len(set(produce)) != len(produce):
            raise KernelDefinitionError(
                f"Kernel {kname!r} lists a produced field twice: {produce}.", kernel=kname
            )
        if SOURCE_FIELDS & set(produce):
            raise KernelDefinitionError(
                f"Kernel {kname!r} may not produce {sorted(SOURCE_FIELDS & set(produce))}: "
                "those fields come from models.add.",
                kernel=kname,
            )
        level = marks.get("apply_level") or KernelApplyLevel.PARAMETER
        protocol = marks.get("execution_protocol") or KernelExecutionProtocol.SEQUENTIAL
        if not isinstance(level, KernelApplyLevel):
            raise KernelDefinitionError(
                f"Kernel {kname!r}: apply_level must be a KernelApplyLevel, got {level!r}.",
                kernel=kname,
            )
        if not isinstance(protocol, KernelExecutionProtocol):
            raise KernelDefinitionError(
                f"Kernel {kname!r}: execution_protocol must be a KernelExecutionProtocol, "
                f"got {protocol!r}.",
                kernel=kname,
            )
        if protocol is KernelExecutionProtocol.PARALLEL:
            try:
                pickle.dumps(fn)
            except Exception:
                raise KernelDefinitionError(
                    f"Kernel {kname!r} is PARALLEL but {_summary(fn)} cannot be pickled: "
                    "worker processes need a top-level function of an importable module. "
                    "Move it to module level or make it SEQUENTIAL.",
                    kernel=kname,
                ) from None
        rest = tuple(marks.get("restrictions") or ())
        for r in rest:
            if not isinstance(r, Restriction):
                raise KernelDefinitionError(
                    f"Kernel {kname!r}: restrictions must be Restriction records, got {r!r}.",
                    kernel=kname,
                )
        return cls(
            name=kname,
            function=fn,
            inputs=tuple(zip(required, fields, strict=True)),
            produce_fields=produce,
            config=_frozen_mapping(config),
            apply_level=level,
            execution_protocol=protocol,
            restrictions=rest,
            doc=inspect.getdoc(fn) or "",
            provider=provider,
            batch=marks.get("batch"),
        )


def kernel(
    fn: F | None = None,
    *,
    name: str | None = None,
    require_fields: Iterable[str] | None = None,
    produce_fields: Iterable[str] | None = None,
    apply_level: KernelApplyLevel | None = None,
    execution_protocol: KernelExecutionProtocol | None = None,
    restrictions: Iterable[Restriction] | None = None,
    batch: Callable[..., Any] | None = None,
) -> Any:
    """Mark a function as a kernel for a pack; it stays a plain, callable function.

    A pack's ``diffract_kernels`` hook then yields ``KernelSpec.from_function(fn)``.
    Usable bare (``@kernel``) or with arguments (``@kernel(apply_level=...)``).
    """

    def mark(f: F) -> F:
        setattr(
            f,
            _MARK,
            {
                "name": name,
                "require_fields": tuple(require_fields) if require_fields else None,
                "produce_fields": tuple(produce_fields) if produce_fields else None,
                "apply_level": apply_level,
                "execution_protocol": execution_protocol,
                "restrictions": tuple(restrictions) if restrictions else None,
                "batch": batch,
            },
        )
        return f

    return mark(fn) if fn is not None else mark
