"""Kernel specifications: the one place that turns a function signature into a KernelSpec.

A kernel is a plain function. Parameters without defaults are required input fields
(named after the parameter unless ``require_fields`` renames them, positionally);
parameters with defaults are configuration, each with a domain read from its annotation
(see :mod:`diffract.core.compute._domains`). ``*args`` and ``**kwargs`` are refused.

Building a spec is two stages: :func:`_parse` reads the signature (the only
``inspect.signature`` call of the project), :func:`_validate` checks names, fields and
options. The options a kernel may carry are listed once, in :class:`KernelOptions`."""

from __future__ import annotations

import inspect
import pickle
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import attrs

from diffract.core.compute._domains import Domain, Range, domain_of
from diffract.core.compute._enums import KernelApplyLevel, KernelExecutionProtocol
from diffract.errors import KernelDefinitionError, did_you_mean

__all__ = [
    "SOURCE_FIELDS",
    "Domain",
    "KernelOptions",
    "KernelSpec",
    "Range",
    "Restriction",
    "kernel",
]

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
    when the kernel applies. ``reason`` is recorded for every skipped parameter."""

    check: Callable[[Any], bool] = attrs.field(eq=False, hash=False, repr=False)
    reason: str

    @classmethod
    def min_ndim(cls, ndim: int) -> Restriction:
        """Apply only to parameters with at least ``ndim`` dimensions."""
        return cls(
            check=lambda info: len(info.shape) >= ndim,
            reason=f"needs a parameter of at least {ndim} dimensions")


def _tuple_or_none(value: Iterable[Any] | None) -> tuple[Any, ...] | None:
    return tuple(value) if value is not None else None


@attrs.frozen
class KernelOptions:
    """Everything about a kernel its signature does not say; None: not given.

    ``name`` (default: the function's), ``require_fields`` (the field each required
    parameter reads; default: their names), ``produce_fields`` (default: the name),
    ``apply_level`` (PARAMETER), ``execution_protocol`` (SEQUENTIAL), ``restrictions``,
    ``batch`` (see :class:`KernelSpec`), ``hints`` (input field -> the distribution that
    produces it), ``aliases`` (another name -> a produced field), ``undefined_inputs``
    (True: also run on an undefined input's NaN), ``optional_inputs`` (read where stored,
    NaN elsewhere; PARAMETER kernels) and ``overlap_batches`` (True: ``batch`` is
    thread-safe; run here, a chunk's batch starts while the last one ends): docs/compute.md."""

    name: str | None = None
    require_fields: tuple[str, ...] | None = attrs.field(default=None, converter=_tuple_or_none)
    produce_fields: tuple[str, ...] | None = attrs.field(default=None, converter=_tuple_or_none)
    apply_level: KernelApplyLevel | None = None
    execution_protocol: KernelExecutionProtocol | None = None
    restrictions: tuple[Restriction, ...] | None = attrs.field(
        default=None, converter=_tuple_or_none
    )
    batch: Callable[..., Any] | None = attrs.field(default=None, eq=False, repr=False)
    hints: tuple[tuple[str, str], ...] | None = attrs.field(
        default=None, converter=lambda v: tuple(dict(v).items()) if v is not None else None
    )
    aliases: tuple[tuple[str, str], ...] | None = attrs.field(
        default=None, converter=lambda v: tuple(dict(v).items()) if v is not None else None
    )
    undefined_inputs: bool | None = None
    optional_inputs: tuple[str, ...] | None = attrs.field(default=None,
                                                         converter=_tuple_or_none)
    overlap_batches: bool | None = None

    @classmethod
    def of(cls, options: Mapping[str, Any], *, where: str) -> KernelOptions:
        """Options from keyword arguments; an unknown keyword names the known ones."""
        known = [f.name for f in attrs.fields(cls)]
        unknown = sorted(set(options) - set(known))
        if unknown:
            hint = did_you_mean(unknown[0], known)
            raise KernelDefinitionError(
                f"{where} got unknown option(s) {unknown}.{hint} Kernel options are: "
                f"{', '.join(known)}.",
                kernel=str(options.get("name") or "?"),
            )
        return cls(**options)

    def over(self, base: KernelOptions) -> KernelOptions:
        """These options where given, ``base``'s elsewhere."""
        given = {k: v for k, v in attrs.asdict(self, recurse=False).items() if v is not None}
        return attrs.evolve(base, **given)


@attrs.frozen
class KernelSpec:
    """A registered kernel: its function and what the signature says about it.

    ``inputs`` pairs each required function parameter with the field it reads;
    ``config`` holds the default of every configuration keyword and ``domains`` the
    values each accepts; ``provider`` names the distribution that registered it (filled
    in by the plugin manager).

    ``batch`` is an optional faster path for a chunk run here: ``batch(units, **config)``
    (``units``: per-unit input dicts) returns one result per unit, in order (an exception
    instance for a unit that raised), what ``function`` computes (same-shaped inputs
    batched, threads, a GPU). If it raises, the runner runs ``function`` unit by unit."""

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
    domains: tuple[tuple[str, Domain], ...] = attrs.field(default=(), repr=False)
    field_hints: tuple[tuple[str, str], ...] = attrs.field(default=(), repr=False)
    aliases: tuple[tuple[str, str], ...] = ()
    undefined_inputs: bool = False
    optional_inputs: tuple[str, ...] = ()
    overlap_batches: bool = False

    @property
    def require_fields(self) -> tuple[str, ...]:
        """The input fields, in signature order."""
        return tuple(field for _, field in self.inputs)

    @property
    def config_defaults(self) -> dict[str, Any]:
        """Each configuration keyword with its default."""
        return dict(self.config)

    @property
    def config_domains(self) -> dict[str, Domain]:
        """Each configuration keyword with the values it accepts."""
        return dict(self.domains)

    def config_problems(self, values: Mapping[str, Any]) -> list[str]:
        """Every value of ``values`` outside its keyword's domain, as sorted phrases
        (``key=value ...``); keys the kernel lacks are the caller's to report."""
        domains = self.config_domains
        problems = []
        for key in sorted(values):
            domain = domains.get(key)
            problem = domain.problem(values[key]) if domain is not None else None
            if problem is not None:
                problems.append(f"{key}: {problem}")
        return problems

    @property
    def summary(self) -> str:
        """The first paragraph of the kernel's docstring, on one line (a sentence that
        wraps is not cut)."""
        paragraph = inspect.cleandoc(self.doc).split("\n\n", 1)[0] if self.doc else ""
        return " ".join(paragraph.split())

    @classmethod
    def from_function(
        cls, fn: Callable[..., Any], *, provider: str = "unknown", **options: Any
    ) -> KernelSpec:
        """Build a spec from ``fn``'s signature; ``options`` (see :class:`KernelOptions`)
        override what ``@kernel`` marked on the function.

        Raises :class:`KernelDefinitionError` naming the kernel for ``*args``/``**kwargs``,
        a ``require_fields`` list that does not match the required parameters, an
        invalid field name, or a default outside its own annotated domain."""
        given = KernelOptions.of(options, where="KernelSpec.from_function")
        opts = given.over(getattr(fn, _MARK, KernelOptions()))
        if not callable(fn):
            raise KernelDefinitionError(
                f"A kernel must be a function, got {type(fn).__name__}.",
                kernel=str(opts.name or fn))
        name = opts.name or getattr(fn, "__name__", None)
        if not name or not _FIELD_NAME.match(name):
            raise KernelDefinitionError(
                f"Kernel name {name!r} is not valid: use letters, digits, '_' and '.'.",
                kernel=str(name))
        return _validate(fn, name, _parse(fn, name), opts, provider)


@attrs.frozen
class _Signature:
    """What a kernel function's signature says: required parameters, configuration."""

    required: tuple[str, ...]
    defaults: tuple[tuple[str, Any], ...]
    domains: tuple[tuple[str, Domain], ...]


def _parse(fn: Callable[..., Any], name: str) -> _Signature:
    """Read the signature: required parameters, configuration defaults and domains."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise KernelDefinitionError(
            f"Kernel {name!r}: cannot read the signature of {_summary(fn)} ({exc}).",
            kernel=name,
        ) from None
    required: list[str] = []
    defaults: list[tuple[str, Any]] = []
    domains: list[tuple[str, Domain]] = []
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            star = "*" if p.kind is p.VAR_POSITIONAL else "**"
            raise KernelDefinitionError(
                f"Kernel {name!r} takes {star}{p.name}: kernels may not take *args or "
                "**kwargs, because Diffract reads their inputs and configuration from "
                "the signature. Name each input field and configuration keyword.",
                kernel=name)
        if p.default is p.empty:
            required.append(p.name)
        else:
            defaults.append((p.name, p.default))
            annotation = None if p.annotation is p.empty else p.annotation
            domains.append((p.name, domain_of(annotation, p.default, fn)))
    return _Signature(tuple(required), tuple(defaults), tuple(domains))


def _check_fields(name: str, fields: tuple[str, ...], produce: tuple[str, ...]) -> None:
    for field in (*fields, *produce):
        if not isinstance(field, str) or not _FIELD_NAME.match(field):
            raise KernelDefinitionError(
                f"Kernel {name!r}: {field!r} is not a valid field name "
                "(letters, digits, '_' and '.'; '@' is reserved for contextual names).",
                kernel=name)
    if len(set(produce)) != len(produce):
        raise KernelDefinitionError(
            f"Kernel {name!r} lists a produced field twice: {produce}.", kernel=name
        )
    if SOURCE_FIELDS & set(produce):
        raise KernelDefinitionError(
            f"Kernel {name!r} may not produce {sorted(SOURCE_FIELDS & set(produce))}: "
            "those fields come from models.add.",
            kernel=name)


def _check_aliases(name: str, aliases: tuple[tuple[str, str], ...],
                   produce: tuple[str, ...]) -> None:
    for alias, field in aliases:
        if not isinstance(alias, str) or not _FIELD_NAME.match(alias):
            raise KernelDefinitionError(
                f"Kernel {name!r}: alias {alias!r} is not a valid field name.", kernel=name)
        if field not in produce:
            raise KernelDefinitionError(
                f"Kernel {name!r}: alias {alias!r} names {field!r}, which the kernel does not "
                f"produce (it produces {list(produce)}).", kernel=name)
        if alias in produce or alias in SOURCE_FIELDS:
            raise KernelDefinitionError(
                f"Kernel {name!r}: alias {alias!r} is already a field name; an alias must be "
                "a name no field has.", kernel=name)


def _check_kinds(name: str, fn: Callable[..., Any], opts: KernelOptions) -> None:
    if opts.apply_level is not None and not isinstance(opts.apply_level, KernelApplyLevel):
        raise KernelDefinitionError(
            f"Kernel {name!r}: apply_level must be a KernelApplyLevel, got {opts.apply_level!r}.",
            kernel=name)
    protocol = opts.execution_protocol
    if protocol is not None and not isinstance(protocol, KernelExecutionProtocol):
        raise KernelDefinitionError(
            f"Kernel {name!r}: execution_protocol must be a KernelExecutionProtocol, "
            f"got {protocol!r}.",
            kernel=name)
    if protocol is KernelExecutionProtocol.PARALLEL:
        try:
            pickle.dumps(fn)
        except Exception:
            raise KernelDefinitionError(
                f"Kernel {name!r} is PARALLEL but {_summary(fn)} cannot be pickled: "
                "worker processes need a top-level function of an importable module. "
                "Move it to module level or make it SEQUENTIAL.",
                kernel=name,
            ) from None
    for r in opts.restrictions or ():
        if not isinstance(r, Restriction):
            raise KernelDefinitionError(
                f"Kernel {name!r}: restrictions must be Restriction records, got {r!r}.",
                kernel=name)


def _validate(
    fn: Callable[..., Any], name: str, sig: _Signature, opts: KernelOptions, provider: str
) -> KernelSpec:
    """Check the parsed signature and the options; build the spec."""
    fields = opts.require_fields or sig.required
    if len(fields) != len(sig.required):
        raise KernelDefinitionError(
            f"Kernel {name!r}: require_fields {tuple(fields)} has {len(fields)} "
            f"entries but the function has {len(sig.required)} required parameters "
            f"{sig.required}. Give one field per parameter without a default.",
            kernel=name)
    produce = opts.produce_fields or (name,)
    _check_fields(name, fields, produce)
    optional = tuple(opts.optional_inputs or ())
    if set(optional) - set(fields):
        raise KernelDefinitionError(
            f"Kernel {name!r}: optional_inputs {sorted(set(optional) - set(fields))} are not "
            f"among its input fields {tuple(fields)}.", kernel=name)
    if optional and (opts.apply_level or KernelApplyLevel.PARAMETER) is not (
            KernelApplyLevel.PARAMETER):
        raise KernelDefinitionError(
            f"Kernel {name!r}: optional_inputs are for PARAMETER kernels.", kernel=name)
    _check_aliases(name, opts.aliases or (), produce)
    _check_kinds(name, fn, opts)
    bad_defaults = sorted(
        f"{key}={default!r} ({problem})"
        for (key, default), (_, domain) in zip(sig.defaults, sig.domains, strict=True)
        if (problem := domain.problem(default)) is not None
    )
    if bad_defaults:
        raise KernelDefinitionError(
            f"Kernel {name!r}: default(s) outside their own annotation: "
            f"{'; '.join(bad_defaults)}. Fix the default or the annotation.",
            kernel=name)
    return KernelSpec(
        name=name,
        function=fn,
        inputs=tuple(zip(sig.required, fields, strict=True)),
        produce_fields=produce,
        config=sig.defaults,
        apply_level=opts.apply_level or KernelApplyLevel.PARAMETER,
        execution_protocol=opts.execution_protocol or KernelExecutionProtocol.SEQUENTIAL,
        restrictions=opts.restrictions or (),
        doc=inspect.getdoc(fn) or "",
        provider=provider,
        batch=opts.batch,
        domains=sig.domains,
        field_hints=opts.hints or (),
        aliases=opts.aliases or (),
        undefined_inputs=bool(opts.undefined_inputs),
        optional_inputs=optional,
        overlap_batches=bool(opts.overlap_batches))


def kernel(fn: F | None = None, /, **options: Any) -> Any:
    """Mark a function as a kernel for a pack; it stays a plain, callable function.

    ``options`` are those of :class:`KernelOptions`. A pack's ``diffract_kernels`` hook
    then yields ``KernelSpec.from_function(fn)``. Bare (``@kernel``) or with options."""
    marks = KernelOptions.of(options, where="@kernel")

    def mark(f: F) -> F:
        setattr(f, _MARK, marks)
        return f

    return mark(fn) if fn is not None else mark
