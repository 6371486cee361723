"""``causal_conv1d``: a drop-in for ``fla.modules.convolution.causal_conv1d`` (fla-core 0.6).

Same signature, defaults and ``(y, final_state)`` return. Calls inside the supported box
run kernel-fun's Triton kernels; every other call is forwarded to fla with the caller's
arguments untouched, so its result is fla's, bit for bit, except where fla-core 0.6.0's
answer is wrong: a call with ``output_final_state=True`` that needs gradients (fla drops
the gradient of ``final_state[..., 0]``) runs :mod:`kernel_fun.ops.cconv.exact`, plain
PyTorch; ``cu_seqlens`` over a batch of more than one row (fla #955: a wrong ``dweight``)
goes to fla as the equivalent ``[1, B*T, D]`` call. The box is what a Kimi Delta
Attention layer calls in pretraining:

* ``activation`` "silu" or "swish"; no ``bias``, ``residual``, ``initial_state``;
  ``output_final_state=False``; ``backend="triton"``; no variable-length or
  context-parallel arguments; no keyword fla does not document here (a new fla flag
  falls back rather than being dropped);
* ``x`` of shape ``[B, T, D]`` in bfloat16, float16 or float32, any strides; ``weight``
  ``[D, W]`` with ``W <= 4`` (a narrower W is a kernel with fewer taps);
* a CUDA device of compute capability 9.0 or newer (or Triton's interpreter on the CPU
  when ``KERNEL_FUN_INTERPRET=1`` and ``TRITON_INTERPRET=1``, for tests);
* under CUDA-graph capture, only shapes that already ran eagerly (forward and, when
  gradients are needed, backward): autotuning cannot happen during capture.

:func:`is_supported` returns ``(ok, reason)`` for a call; each distinct fallback reason
is logged once at WARNING, the first engaged call logs its shapes once, and the torch,
triton and fla versions are logged once.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import torch

from kernel_fun import _check, _support, _toolchain
from kernel_fun.ops.cconv.exact import causal_conv1d_exact, why_exact
from kernel_fun.ops.cconv.reference import TOLERANCE

__all__ = ["causal_conv1d", "fla_probe", "is_supported", "warmup"]

#: Parameters of fla-core 0.6.0's causal_conv1d, in order (the compatibility probe checks them).
FLA_PARAMETERS = (
    "x", "weight", "bias", "residual", "initial_state", "output_final_state", "activation",
    "backend", "cu_seqlens", "cu_seqlens_cpu", "chunk_indices", "cp_context", "kwargs",
)
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_MAX_W = 4


def _fla_causal_conv1d() -> Any:
    """fla's own causal_conv1d, even while kernel-fun is installed into fla."""
    from kernel_fun import adopt

    return adopt.original("causal_conv1d")


def is_supported(
    x: Any,
    weight: Any = None,
    bias: Any = None,
    residual: Any = None,
    initial_state: Any = None,
    output_final_state: bool | None = False,
    activation: str | None = None,
    backend: str | None = "triton",
    cu_seqlens: Any = None,
    cu_seqlens_cpu: Any = None,
    chunk_indices: Any = None,
    cp_context: Any = None,
    **kwargs: Any,
) -> tuple[bool, str]:
    """Whether kernel-fun runs this call itself: ``(True, "")`` or ``(False, reason)``."""
    if kwargs:
        return False, (f"unknown argument(s) {sorted(kwargs)}: fla may have grown a flag "
                       "kernel-fun does not implement, so the call goes to fla.")
    if backend != "triton":
        return False, f"backend={backend!r}: kernel-fun replaces the 'triton' backend only."
    if activation not in ("silu", "swish"):
        return False, f"activation={activation!r}: kernel-fun implements silu/swish only."
    for name, value in (("bias", bias), ("residual", residual), ("initial_state", initial_state),
                        ("cu_seqlens", cu_seqlens), ("cu_seqlens_cpu", cu_seqlens_cpu),
                        ("chunk_indices", chunk_indices), ("cp_context", cp_context)):
        if value is not None:
            return False, f"{name} is given: kernel-fun implements the call without it."
    if output_final_state:
        return False, "output_final_state=True: kernel-fun does not return the final state."
    if not isinstance(x, torch.Tensor) or not isinstance(weight, torch.Tensor):
        return False, "x and weight must both be tensors for kernel-fun's path."
    if x.dim() != 3:
        return False, f"x has shape {tuple(x.shape)}; kernel-fun takes [B, T, D]."
    if weight.dim() != 2 or weight.shape[0] != x.shape[2]:
        return False, (f"weight has shape {tuple(weight.shape)}; kernel-fun takes [D, W] with "
                       f"D = {x.shape[2]}.")
    if weight.shape[1] > _MAX_W or weight.shape[1] < 1:
        return False, f"kernel width W={weight.shape[1]}; kernel-fun takes 1 <= W <= {_MAX_W}."
    if x.dtype not in _DTYPES:
        return False, f"x is {x.dtype}; kernel-fun takes bfloat16, float16 or float32."
    if not weight.dtype.is_floating_point:
        return False, f"weight is {weight.dtype}; kernel-fun takes a floating-point weight."
    if 0 in x.shape:
        return False, f"x has an empty dimension {tuple(x.shape)}."
    reason = _support.device_reason(x)
    if reason is None:  # a toolchain known to compile wrong on this device
        toolchain = _toolchain.current(x.device)
        reason = _toolchain.refusal("causal_conv1d", toolchain)
        if reason is None and toolchain.arch is not None:  # configurations it rules out
            from kernel_fun.ops.cconv._triton import launch_problem

            problem = launch_problem(toolchain)
            if problem is not None:
                reason = (f"{problem}; this device runs {toolchain.describe()}, so kernel-fun "
                          "uses fla.")
    if reason is not None:
        return False, reason
    if weight.device != x.device:
        return False, f"weight is on {weight.device} but x on {x.device}."
    if _support.is_capturing():  # last: it only speaks for a call otherwise accepted
        key = _support.shape_key(x, weight)
        need_bwd = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
        cold_bwd = need_bwd and not _support.is_warm(("bwd", *key))
        if not _support.is_warm(("fwd", *key)) or cold_bwd:
            return False, ("CUDA-graph capture of a shape that has not run eagerly yet (forward"
                           + (" and backward" if need_bwd else "") + "): autotuning cannot happen "
                           "during capture, so this call goes to fla. Run one eager step first "
                           "(or kernel_fun.cconv.warmup).")
    return True, ""


@torch.compiler.disable
def causal_conv1d(
    x: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool | None = False,
    activation: str | None = None,
    backend: str | None = "triton",
    cu_seqlens: torch.Tensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    chunk_indices: torch.LongTensor | None = None,
    cp_context: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Depthwise causal 1-D convolution over ``x [B, T, D]`` with ``weight [D, W]``.

    Returns ``(y, final_state)`` exactly as fla's ``causal_conv1d`` does; on kernel-fun's
    own path ``y`` is ``silu(conv(x))`` of shape ``[B, T, D]`` (contiguous) and
    ``final_state`` is None. Calls outside the supported box (module docstring) go to fla
    unchanged. Wrapped in ``torch.compiler.disable``: one graph break at the call.
    """
    ok, reason = is_supported(
        x, weight, bias, residual, initial_state, output_final_state, activation, backend,
        cu_seqlens, cu_seqlens_cpu, chunk_indices, cp_context, **kwargs,
    )
    _support.log_versions()
    if not ok and isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor):
        needs_grad = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad
            for t in (x, weight, bias, residual, initial_state))
        exact = why_exact(output_final_state, needs_grad, weight)
        if exact is not None and not kwargs and cp_context is None and backend == "triton":
            _support.log_once(("exact", "causal_conv1d"), logging.WARNING,
                              "kernel-fun causal_conv1d: %s", exact)
            return causal_conv1d_exact(x, weight, bias, residual, initial_state,
                                       output_final_state, activation, cu_seqlens)
    if ok and self_check(x, weight) is not None:  # logged once by the check
        ok = False
    elif not ok:
        _support.log_once(
            ("fallback", reason), logging.WARNING, "kernel-fun causal_conv1d: %s", reason
        )
    if not ok:
        _support.fla_can_run(x, "causal_conv1d")
        batch = x.shape[0] if isinstance(x, torch.Tensor) and x.dim() == 3 else 1
        if cu_seqlens is not None and batch > 1:  # sequences packed over the rows: fla 0.6.0
            # writes dweight's partials of row 0 only (fla #955); the [1, B*T, D] call is right
            y, final = _fla_causal_conv1d()(
                x=x.reshape(1, -1, x.shape[-1]), weight=weight, bias=bias,
                residual=None if residual is None else residual.reshape(1, -1, x.shape[-1]),
                initial_state=initial_state, output_final_state=output_final_state,
                activation=activation, backend=backend, cu_seqlens=cu_seqlens,
                cu_seqlens_cpu=cu_seqlens_cpu, chunk_indices=chunk_indices,
                cp_context=cp_context, **kwargs)
            return y.reshape(x.shape), final
        return _fla_causal_conv1d()(
            x=x, weight=weight, bias=bias, residual=residual, initial_state=initial_state,
            output_final_state=output_final_state, activation=activation, backend=backend,
            cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, chunk_indices=chunk_indices,
            cp_context=cp_context, **kwargs,
        )
    from kernel_fun.ops.cconv._triton import CausalConv1dSiLU

    _support.log_once(("engaged", "causal_conv1d"), logging.INFO,
                      "kernel-fun causal_conv1d engaged: x %s %s (strides %s), weight %s %s",
                      tuple(x.shape), x.dtype, x.stride(), tuple(weight.shape), weight.dtype)
    return CausalConv1dSiLU.apply(x, weight), None


def self_check(x: torch.Tensor, weight: torch.Tensor,
               need_grad: bool | None = None) -> str | None:
    """None when kernel-fun's kernels passed the self-check (:mod:`kernel_fun._check`)
    for this kind of call (dtypes, width, gradients or not: by default, whether this call
    needs them) on its device; else why not."""
    if need_grad is None:
        need_grad = torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad)
    kind = (x.dtype, weight.dtype, weight.shape[1], min(x.shape[2], 256), need_grad)
    return _check.verdict("causal_conv1d", kind, x.device,
                          lambda: _probe(x, weight, kind[3], need_grad))


def _probe(x: torch.Tensor, weight: torch.Tensor, D: int, need_grad: bool) -> str | None:
    """Ours against the float32 reference on [2, 80, D] (a tail of time steps)."""
    from kernel_fun.ops.cconv._triton import CausalConv1dSiLU
    from kernel_fun.ops.cconv.reference import reference_causal_conv1d

    gen = torch.Generator().manual_seed(0)
    W = weight.shape[1]
    px = torch.randn(2, 80, D, generator=gen).to(device=x.device, dtype=x.dtype)
    pw = (torch.randn(D, W, generator=gen) / W**0.5).to(device=x.device, dtype=weight.dtype)
    dy = torch.randn(2, 80, D, generator=gen).to(x.device)
    ours: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    with torch.inference_mode(False), torch.enable_grad() if need_grad else torch.no_grad():
        for out, fn in ((ours, CausalConv1dSiLU.apply), (reference, reference_causal_conv1d)):
            a, b = px.clone().requires_grad_(need_grad), pw.clone().requires_grad_(need_grad)
            y = fn(a, b)
            out["y"] = y.detach().float()
            if need_grad:
                (y.float() * dy).sum().backward()
                out["dx"], out["dw"] = a.grad, b.grad
    return _check.compare(reference, ours, {"*": TOLERANCE[x.dtype]})


def fla_probe() -> list[str]:
    """Differences between the installed fla's causal_conv1d signature and the one
    kernel-fun mirrors (empty when compatible)."""
    return _support.signature_problems("causal_conv1d", _fla_causal_conv1d(), FLA_PARAMETERS)


def warmup(
    *,
    B: int,
    T: int,
    D: int | Sequence[int] = (2048, 4096),
    W: int = 4,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cuda",
) -> float:
    """Autotune both kernels for every channel count ``D`` at ``[B, T, D]``; returns seconds.

    Each new (D, W, B, T) costs a few seconds of trial launches: paying them before step 1
    keeps the first step from looking like a regression. Runs the fla compatibility probe
    first; raises RuntimeError if a call fell back to fla instead of running kernel-fun's
    kernels (set KERNEL_FUN_DEBUG=1 and see the 'kernel_fun' logger for why).
    """
    started = time.perf_counter()
    problems = fla_probe()
    if problems:
        raise RuntimeError("kernel-fun warm-up: " + "; ".join(problems))
    for d in ([D] if isinstance(D, int) else list(D)):
        x = torch.randn(B, T, d, device=device, dtype=dtype, requires_grad=True)
        w = torch.randn(d, W, device=device, dtype=dtype, requires_grad=True)
        ok, reason = is_supported(x, w, activation="silu")
        if not ok:
            raise RuntimeError(f"kernel-fun warm-up at D={d}: the call falls back to fla: {reason} "
                               "Set KERNEL_FUN_DEBUG=1 to log every decision.")
        failed = self_check(x, w)
        if failed is not None:
            raise RuntimeError(f"kernel-fun warm-up at D={d}: the self-check against the "
                               f"reference failed, so calls of this kind go to fla: {failed}")
        y, _ = causal_conv1d(x, w, activation="silu")
        y.sum().backward()
        key = _support.shape_key(x, w)
        missing = [p for p in ("fwd", "bwd") if not _support.is_warm((p, *key))]
        if missing:
            raise RuntimeError(f"kernel-fun warm-up at D={d}: the {missing} kernel(s) did not run. "
                               "Set KERNEL_FUN_DEBUG=1 to log every decision.")
    if torch.cuda.is_available() and str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started
