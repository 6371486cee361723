"""Adopting kernel-fun inside fla: register as an fla backend, or patch its bindings.

:func:`install` returns a :class:`Handle` that restores fla exactly (also usable as a
context manager). Two ways, chosen by ``mode``:

* ``"register"`` (what ``"auto"`` picks when the installed fla has
  ``fla.backends.register`` and dispatches ``causal_conv1d_fwd``/``_bwd``): kernel-fun
  registers its forward and backward as an fla backend with a verifier (the same gate
  as :func:`kernel_fun.cconv.is_supported`). fla's own ``causal_conv1d`` and autograd
  Function stay in place; calls the verifier rejects run fla's kernels.
* ``"patch"``: one table-driven swap of every place fla binds ``causal_conv1d``: the
  module that defines it, the package that re-exports it, the
  ``fla.modules.convolution`` alias, and any loaded ``fla.*`` module (a layer) that
  bound the function at import time.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable
from typing import Any

import attrs

__all__ = ["Handle", "install", "original"]

#: (module, attribute) pairs that bind causal_conv1d in fla-core 0.6; loaded layers are
#: found by scanning sys.modules for the same function object.
PATCH_TABLE: dict[str, tuple[tuple[str, str], ...]] = {
    "causal_conv1d": (
        ("fla.modules.causal_conv1d.ops", "causal_conv1d"),
        ("fla.modules.causal_conv1d", "causal_conv1d"),
        ("fla.modules.convolution", "causal_conv1d"),
    ),
}
DEFINING_MODULE = {"causal_conv1d": "fla.modules.causal_conv1d.ops"}
BACKEND_TYPE = "kernel_fun"

_ORIGINALS: dict[str, Callable[..., Any]] = {}


def original(name: str) -> Callable[..., Any]:
    """fla's own function ``name``, even while it is patched."""
    if name in _ORIGINALS:
        return _ORIGINALS[name]
    return getattr(importlib.import_module(DEFINING_MODULE[name]), name)


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


def _registries() -> tuple[Any, Any] | None:
    """fla's backend registries of causal_conv1d_fwd/_bwd, when this fla has them."""
    try:
        import fla.backends as backends
        from fla.modules.causal_conv1d import ops
    except ImportError:
        return None
    table = getattr(backends, "_function_registries", None)
    if table is None or not hasattr(backends, "register"):
        return None
    from inspect import unwrap

    fwd, bwd = table.get(unwrap(ops.causal_conv1d_fwd)), table.get(unwrap(ops.causal_conv1d_bwd))
    return (fwd, bwd) if fwd is not None and bwd is not None else None


def _fwd(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False,
         activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
         chunk_size=64, layout_fallback=False):
    from kernel_fun import _cconv_triton as k
    from kernel_fun import _support

    w = weight.contiguous()
    y = k.forward(x, w)
    _support.mark_warm(("fwd", *_support.shape_key(x, w)))
    return y, None


def _fwd_verifier(x, weight, bias=None, residual=None, initial_state=None,
                  output_final_state=False, activation=None, cu_seqlens=None,
                  cu_seqlens_cpu=None, chunk_indices=None, chunk_size=64, layout_fallback=False):
    from kernel_fun.cconv import is_supported

    return is_supported(x, weight, bias, residual, initial_state, output_final_state,
                        activation, "triton", cu_seqlens, cu_seqlens_cpu, chunk_indices)


def _bwd(x, dy, dht, weight=None, bias=None, residual=None, initial_state=None,
         activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
         chunk_size=64, layout_fallback=False):
    from kernel_fun import _cconv_triton as k
    from kernel_fun import _support

    w = weight.contiguous()
    dx, dw = k.backward(x, w, dy)
    _support.mark_warm(("bwd", *_support.shape_key(x, w)))
    return dx, dw.to(weight), None, None, None


def _bwd_verifier(x, dy, dht, weight=None, bias=None, residual=None, initial_state=None,
                  activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                  chunk_size=64, layout_fallback=False):
    if dht is not None:
        return False, "a final-state gradient is given: kernel-fun does not implement it."
    return _fwd_verifier(x, weight, bias, residual, initial_state, False, activation,
                         cu_seqlens, cu_seqlens_cpu, chunk_indices)


def _register() -> Handle:
    import fla.backends as backends
    from fla.modules.causal_conv1d import ops

    class KernelFunBackend(backends.BaseBackend):
        """kernel-fun's Triton kernels, tried before fla's defaults."""

        backend_type = BACKEND_TYPE
        priority = 1

    backends.register(ops.causal_conv1d_fwd, backend=KernelFunBackend, verifier=_fwd_verifier)(_fwd)
    backends.register(ops.causal_conv1d_bwd, backend=KernelFunBackend, verifier=_bwd_verifier)(_bwd)
    return Handle(mode="register", registered=list(_registries() or ()))


def _patch() -> Handle:
    from kernel_fun.cconv import causal_conv1d as ours

    handle = Handle(mode="patch")
    for name, table in PATCH_TABLE.items():
        fla_fn = original(name)
        _ORIGINALS[name] = fla_fn
        targets = []
        for module_name, attr in table:
            module = importlib.import_module(module_name)
            targets.append((module, attr))
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

    ``mode``: "auto" (register when fla can, else patch), "register" or "patch".
    """
    if mode not in ("auto", "register", "patch"):
        raise ValueError(f"mode must be 'auto', 'register' or 'patch', got {mode!r}")
    if mode == "register" or (mode == "auto" and _registries() is not None):
        if _registries() is None:
            raise RuntimeError("this fla has no backend registration for causal_conv1d; "
                               "use mode='patch'")
        return _register()
    return _patch()
