"""Accelerated ops offered by plugins through the ``diffract_ops`` hook.

    from diffract import ops
    y, _ = ops.call("causal_conv1d", x, w, activation="silu")

:func:`resolve` picks, per call, the highest-priority implementation whose
``is_supported`` accepts the arguments, else the op's reference implementation."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from diffract.errors import UnknownOpError, did_you_mean

__all__ = ["UnknownOpError", "available", "call", "implementations", "resolve"]


def implementations(name: str) -> list[Any]:
    """OpSpec records for ``name``, highest priority first."""
    from diffract.plugins._runtime import get_catalog

    specs = [op for op in get_catalog().ops if op.name == name]
    if not specs:
        known = sorted({op.name for op in get_catalog().ops})
        raise UnknownOpError(
            f"No plugin offers an op named {name!r}.{did_you_mean(name, known)} "
            f"Offered ops: {known or 'none'}. Install the package that provides it "
            "(e.g. diffractml-kernel-fun-gpu for causal_conv1d).",
            op=name)
    return sorted(specs, key=lambda op: -op.priority)


def available() -> list[str]:
    """Names of every op some plugin offers."""
    from diffract.plugins._runtime import get_catalog

    return sorted({op.name for op in get_catalog().ops})


def resolve(name: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
    """The implementation to run for this call of op ``name``."""
    specs = implementations(name)
    for spec in specs:
        ok, _reason = spec.is_supported(*args, **kwargs)
        if ok:
            return spec.implementation
    for spec in specs:
        if spec.reference is not None:
            return spec.reference
    reasons = "; ".join(f"{s.provider}: {s.is_supported(*args, **kwargs)[1]}" for s in specs)
    raise UnknownOpError(
        f"No implementation of {name!r} supports this call ({reasons}) and none offers a "
        "reference to fall back on.",
        op=name)


def call(name: str, *args: Any, **kwargs: Any) -> Any:
    """Run op ``name`` with the implementation :func:`resolve` picks."""
    return resolve(name, *args, **kwargs)(*args, **kwargs)
