"""What values a kernel's configuration keyword accepts, read from its annotation.

A kernel declares the domain of each configuration keyword in its signature::

    def power_law_fit(
        esd,
        *,
        fit_method: Literal["auto", "diffract", "powerlaw"] = "auto",
        min_tail: Annotated[int, Range(ge=2)] = 50,
    ): ...

``Literal[...]`` lists the allowed values; ``int``, ``float``, ``bool`` and ``str`` fix the
type (an int is a valid float, a bool is neither); ``Annotated[..., Range(...)]`` bounds a
number; ``X | None`` also admits None. A keyword without a usable annotation takes the
type of its default when that is a bool, int, float or str, and anything otherwise.
``configure_kernel`` and the configuration file check values against the domain, so a
mistake is refused when it is made, not discovered as a wrong result later."""

from __future__ import annotations

import math
import numbers
import types
import typing
from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["Domain", "Range", "domain_of"]

_SIMPLE = (bool, int, float, str)


@attrs.frozen
class Range:
    """Bounds of a numeric configuration value: ``Annotated[float, Range(gt=0, le=1)]``."""

    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None

    def contains(self, value: float) -> bool:
        return not (
            (self.ge is not None and value < self.ge)
            or (self.gt is not None and value <= self.gt)
            or (self.le is not None and value > self.le)
            or (self.lt is not None and value >= self.lt)
        )

    def describe(self) -> str:
        """The bounds in words, each number in its shortest form: typing caches
        ``Annotated[float, Range(gt=0, le=1)]`` by equality, so a kernel may receive the
        equal ``Range(gt=0.0, le=1.0)`` another module spelled first."""
        parts = [
            f"{op} {bound:g}"
            for op, bound in ((">=", self.ge), (">", self.gt), ("<=", self.le), ("<", self.lt))
            if bound is not None
        ]
        return " and ".join(parts)


def _is_a(value: Any, kind: type) -> bool:
    if isinstance(value, bool):
        return kind is bool
    if kind is float:
        return isinstance(value, numbers.Real)
    if kind is int:
        return isinstance(value, numbers.Integral)
    return isinstance(value, kind)


def _is_nan(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and \
        math.isnan(value)


@attrs.frozen
class Domain:
    """The values one configuration keyword accepts (None fields: no constraint)."""

    types: tuple[type, ...] | None = None
    choices: tuple[Any, ...] | None = None
    bounds: Range | None = None
    optional: bool = False

    def problem(self, value: Any) -> str | None:
        """Why ``value`` is outside the domain (a phrase), or None when it is inside."""
        if value is None:
            if self.optional or (self.types is None and self.choices is None):
                return None
            return f"None is not allowed; expected {self.describe()}"
        if self.choices is not None:
            if any(value == c and type(value) is type(c) for c in self.choices):
                return None
            return f"{value!r} is not one of {', '.join(repr(c) for c in self.choices)}"
        if self.types is not None and not any(_is_a(value, t) for t in self.types):
            return f"{value!r} is a {type(value).__name__}, expected {self.describe()}"
        if (self.types is not None or self.bounds is not None) and _is_nan(value):
            return (f"NaN is not a value it can take (it would pass every comparison); "
                    f"expected {self.describe()}")
        if self.bounds is not None and not self.bounds.contains(value):
            return f"{value!r} is out of range: it must be {self.bounds.describe()}"
        return None

    def describe(self) -> str:
        """The domain in words, for error messages and ``kernels -v``."""
        if self.choices is not None:
            text = "one of " + ", ".join(repr(c) for c in self.choices)
        elif self.types is not None:
            text = " or ".join(t.__name__ for t in self.types)
            if self.bounds is not None:
                text += f" {self.bounds.describe()}"
        else:
            return "any value"
        return text + (" or None" if self.optional else "")


def _resolve(annotation: Any, fn: Callable[..., Any]) -> Any:
    """Evaluate a string annotation in the function's module; None when it cannot be."""
    if not isinstance(annotation, str):
        return annotation
    namespace = {**vars(typing), **getattr(fn, "__globals__", {})}
    try:
        return eval(annotation, namespace)  # noqa: S307 - the kernel author's own annotation
    except Exception:  # noqa: BLE001 - an annotation we cannot read constrains nothing
        return None


def _from_type(tp: Any) -> Domain | None:
    """The domain a resolved annotation states, or None when it states none we check."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        base, *extras = typing.get_args(tp)
        inner = _from_type(base) or Domain()
        bounds = next((e for e in extras if isinstance(e, Range)), None)
        return attrs.evolve(inner, bounds=bounds) if bounds is not None else inner
    if origin is typing.Literal:
        return Domain(choices=typing.get_args(tp))
    if origin is typing.Union or origin is types.UnionType:
        members = typing.get_args(tp)
        optional = type(None) in members
        rest = [m for m in members if m is not type(None)]
        inner = [_from_type(m) for m in rest]
        if any(d is None for d in inner):
            return None
        if len(inner) == 1:
            return attrs.evolve(inner[0], optional=optional)
        if all(d.types is not None and d.choices is None and d.bounds is None for d in inner):
            kinds = tuple(t for d in inner for t in d.types)
            return Domain(types=kinds, optional=optional)
        return None
    if tp in _SIMPLE:
        return Domain(types=(tp,))
    return None


def domain_of(annotation: Any, default: Any, fn: Callable[..., Any]) -> Domain:
    """The domain of a configuration keyword (see the module docstring); ``annotation``
    is None when the keyword has none."""
    tp = None if annotation is None else _resolve(annotation, fn)
    found = _from_type(tp) if tp is not None else None
    if found is not None:
        return found
    if isinstance(default, _SIMPLE):
        return Domain(types=(type(default),))
    return Domain()
