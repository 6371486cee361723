"""Diffract: named metrics on every parameter of neural-network checkpoints.

``import diffract`` is cheap: it imports neither torch nor any plugin. The public names
load on first access."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.2.0"

try:  # another distribution's `diffract` sharing this folder is said in one line
    from _diffract_shared import say_if_shared
except ImportError:  # the package without the rest of its distribution (copied, vendored)
    pass
else:
    say_if_shared()
    del say_if_shared

__all__ = [
    "FieldUndefined",
    "KernelApplyLevel",
    "KernelExecutionProtocol",
    "KernelSpec",
    "ParameterOverrides",
    "ParameterType",
    "Range",
    "Restriction",
    "Session",
    "__version__",
    "kernel",
]

_LAZY = {
    "Session": ("diffract.session", "Session"),
    "KernelApplyLevel": ("diffract.core.compute._enums", "KernelApplyLevel"),
    "KernelExecutionProtocol": ("diffract.core.compute._enums", "KernelExecutionProtocol"),
    "KernelSpec": ("diffract.core.compute.spec", "KernelSpec"),
    "Range": ("diffract.core.compute._domains", "Range"),
    "ParameterOverrides": ("diffract.core.ptypes", "ParameterOverrides"),
    "ParameterType": ("diffract.core.ptypes", "ParameterType"),
    "Restriction": ("diffract.core.compute.spec", "Restriction"),
    "kernel": ("diffract.core.compute.spec", "kernel"),
    "FieldUndefined": ("diffract.errors", "FieldUndefined"),
}

if TYPE_CHECKING:  # pragma: no cover
    from diffract.core.compute._domains import Range
    from diffract.core.compute._enums import KernelApplyLevel, KernelExecutionProtocol
    from diffract.core.compute.spec import KernelSpec, Restriction, kernel
    from diffract.core.ptypes import ParameterOverrides, ParameterType
    from diffract.errors import FieldUndefined
    from diffract.session import Session


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'diffract' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
