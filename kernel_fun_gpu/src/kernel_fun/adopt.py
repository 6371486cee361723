"""Adopting kernel-fun inside fla: register as an fla backend, or patch its bindings.

:func:`install` returns a :class:`Handle` that restores fla exactly (also usable as a
context manager). It drives every op of :data:`kernel_fun.ops.RECORDS` the same way;
two ways, chosen by ``mode``:

* ``"register"`` (what ``"auto"`` picks when the installed fla has
  ``fla.backends.register`` and dispatches every op's forward and backward, e.g.
  ``causal_conv1d_fwd``/``_bwd``): kernel-fun registers each op's functions as an fla
  backend with verifiers (the op's gate, its ``is_supported``). fla's own functions and
  autograd Functions stay in place; calls a verifier rejects run fla's kernels.
* ``"patch"``: one table-driven swap of every place fla binds each op (its record's
  ``patch_table``: the defining module, the package that re-exports it, aliases) and
  of any loaded ``fla.*`` module (a layer) that bound the function at import time.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from inspect import unwrap
from typing import Any

import attrs

from kernel_fun.ops import RECORDS, OpRecord, record

__all__ = ["BACKEND_TYPE", "Handle", "install", "original"]

BACKEND_TYPE = "kernel_fun"

_ORIGINALS: dict[str, Callable[..., Any]] = {}


def original(name: str) -> Callable[..., Any]:
    """fla's own function ``name``, even while it is patched."""
    if name in _ORIGINALS:
        return _ORIGINALS[name]
    return record(name).fla_function()


@attrs.define
class Handle:
    """Restores what :func:`install` changed; ``restore()`` is idempotent."""

    mode: str
    patched: list[tuple[Any, str, Any]] = attrs.field(factory=list)
    registered: list[Any] = attrs.field(factory=list)
    active: bool = True

    def restore(self) -> None:
        if not self.active:
            return
        for module, attr, old in reversed(self.patched):
            setattr(module, attr, old)
        for registry in self.registered:
            registry._backends.pop(BACKEND_TYPE, None)
        _ORIGINALS.clear()
        self.active = False

    def __enter__(self) -> Handle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.restore()


def _registries(op: OpRecord) -> list[Any] | None:
    """fla's backend registries of the op's dispatching functions, when this fla has
    them all."""
    try:
        import fla.backends as backends
    except ImportError:
        return None
    table = getattr(backends, "_function_registries", None)
    targets = op.backend_targets()
    if table is None or not hasattr(backends, "register") or targets is None:
        return None
    found = [table.get(unwrap(fla_fn)) for fla_fn, _, _ in targets]
    return found if all(r is not None for r in found) else None


def _register() -> Handle:
    import fla.backends as backends

    class KernelFunBackend(backends.BaseBackend):
        """kernel-fun's Triton kernels, tried before fla's defaults."""

        backend_type = BACKEND_TYPE
        priority = 1

    handle = Handle(mode="register")
    for op in RECORDS:
        for fla_fn, ours, verifier in op.backend_targets() or ():
            backends.register(fla_fn, backend=KernelFunBackend, verifier=verifier)(ours)
        handle.registered.extend(_registries(op) or ())
    return handle


def _patch() -> Handle:
    handle = Handle(mode="patch")
    for op in RECORDS:
        name, ours = op.name, op.public()
        fla_fn = original(name)
        _ORIGINALS[name] = fla_fn
        targets = [(importlib.import_module(m), attr) for m, attr in op.patch_table]
        for module_name, module in list(sys.modules.items()):
            if module_name.startswith("fla.") and getattr(module, name, None) is fla_fn:
                if (module, name) not in targets:
                    targets.append((module, name))
        for module, attr in targets:
            old = getattr(module, attr)
            if old is not fla_fn:
                continue  # already somebody else's: leave it alone
            handle.patched.append((module, attr, old))
            setattr(module, attr, ours)
    return handle


def install(mode: str = "auto") -> Handle:
    """Adopt kernel-fun inside fla (see the module docstring); returns the restoring handle.

    ``mode``: "auto" (register when fla can for every op, else patch), "register" or
    "patch".
    """
    if mode not in ("auto", "register", "patch"):
        raise ValueError(f"mode must be 'auto', 'register' or 'patch', got {mode!r}")
    can_register = all(_registries(op) is not None for op in RECORDS)
    if mode == "register" or (mode == "auto" and can_register):
        if not can_register:
            missing = [op.name for op in RECORDS if _registries(op) is None]
            raise RuntimeError(f"this fla has no backend registration for {missing}; "
                               "use mode='patch'")
        return _register()
    return _patch()
