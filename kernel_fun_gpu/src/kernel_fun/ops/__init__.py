"""kernel-fun's ops, one package each (``kernel_fun.ops.<op>``: the public function, the
Triton kernels, a plain-PyTorch reference and the fla binding), described to the rest of
the package by an :class:`OpRecord`.

Adoption (:func:`kernel_fun.install`), fla's backend registration and the ``diffract_ops``
hook are generic drivers over :data:`RECORDS`: a new op adds its package and one record.
Importing this module imports neither torch, triton nor fla.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["RECORDS", "OpRecord", "lazy_attributes", "record"]


@attrs.frozen
class OpRecord:
    """One op: where its pieces live (import paths, resolved on use).

    ``name``: fla's name of the function (``causal_conv1d``); ``package``: ours
    (``kernel_fun.ops.cconv``), exporting ``name``, ``is_supported`` and ``warmup``;
    ``defining_module``: the fla module that defines it; ``patch_table``: every
    ``(module, attribute)`` of fla that binds it (patch mode also swaps any loaded
    ``fla.*`` module holding the same function object); ``binding``: our module whose
    ``backend_targets()`` returns ``[(fla_function, our_function, verifier), ...]`` to
    register as an fla backend, or None when the installed fla cannot dispatch them.
    """

    name: str
    package: str
    defining_module: str
    patch_table: tuple[tuple[str, str], ...]
    binding: str
    priority: int = 10

    def load(self, attr: str) -> Any:
        """Our package's ``attr`` (imports the op: torch, and triton when it runs)."""
        return getattr(importlib.import_module(self.package), attr)

    def public(self) -> Callable[..., Any]:
        return self.load(self.name)

    def fla_function(self) -> Callable[..., Any]:
        """fla's own function, as its defining module holds it (patched or not: see
        :func:`kernel_fun.adopt.original`)."""
        return getattr(importlib.import_module(self.defining_module), self.name)

    def backend_targets(self) -> list[tuple[Any, Any, Any]] | None:
        return importlib.import_module(self.binding).backend_targets()


RECORDS: tuple[OpRecord, ...] = (
    OpRecord(
        name="causal_conv1d",
        package="kernel_fun.ops.cconv",
        defining_module="fla.modules.causal_conv1d.ops",
        patch_table=(
            ("fla.modules.causal_conv1d.ops", "causal_conv1d"),
            ("fla.modules.causal_conv1d", "causal_conv1d"),
            ("fla.modules.convolution", "causal_conv1d"),
        ),
        binding="kernel_fun.ops.cconv.binding",
    ),
    OpRecord(
        name="chunk_kda",
        package="kernel_fun.ops.kda",
        defining_module="fla.ops.kda.chunk",
        patch_table=(
            ("fla.ops.kda.chunk", "chunk_kda"),
            ("fla.ops.kda", "chunk_kda"),
            ("fla.ops", "chunk_kda"),
        ),
        binding="kernel_fun.ops.kda.binding",
    ),
)


def record(name: str) -> OpRecord:
    """The record of op ``name``."""
    for r in RECORDS:
        if r.name == name:
            return r
    raise KeyError(f"kernel-fun has no op {name!r}; it has {[r.name for r in RECORDS]}")


def lazy_attributes(package: str, where: dict[str, str]) -> Callable[[str], Any]:
    """An op package's module ``__getattr__``: ``name`` comes from the submodule
    ``where[name]`` of ``package``, imported on first use (so importing the package
    imports neither torch nor triton)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{module}"), name)

    return __getattr__
