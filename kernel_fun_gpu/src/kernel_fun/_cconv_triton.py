"""Triton kernels of the depthwise causal convolution with SiLU (imported on first use).

``y[b, t, d] = silu(z[b, t, d])``, ``z[b, t, d] = sum_k w[d, k] x[b, t - (W-1) + k, d]``
(x is zero before t = 0). The backward recomputes ``z`` from the ``x`` it loads for
``dw`` anyway, so the autograd Function saves only ``x`` and ``w``:

* ``dz = dy * s (1 + z (1 - s))`` with ``s = sigmoid(z)``;
* ``dx[t] = sum_k w[k] dz[t + (W-1) - k]``;
* ``dw[k] = sum_{b,t} dz[t] x[t - (W-1) + k]``.

Layout of this module: constants, kernels, launchers, the autograd Function.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernel_fun import _support

# -- constants ----------------------------------------------------------------------------
#: Widest kernel the Triton path takes (what KDA layers use is 4).
MAX_W = 4
#: Programs the backward aims for per streaming multiprocessor (enough to hide latency,
#: few enough that the per-strip dw partials stay small).
BWD_PROGRAMS_PER_SM = 4
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _configs() -> list[triton.Config]:
    # The interpreter cannot benchmark: one small config there.
    if _INTERPRET:
        return [triton.Config({"BT": 16, "BD": 16}, num_warps=1)]
    return [
        triton.Config({"BT": bt, "BD": bd}, num_warps=nw)
        for bt in (32, 64, 128)
        for bd in (64, 128, 256)
        for nw in (4, 8)
        if bt * bd <= 16384
    ]


# -- kernels --------------------------------------------------------------------------------
@triton.autotune(configs=_configs(), key=["D", "W", "B", "T"])
@triton.jit
def _fwd_kernel(
    x, w, y, B, T, D, sxb, sxt, sxd,
    W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
):
    pid_d = tl.program_id(0)
    pid_t = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    t = pid_t * BT + tl.arange(0, BT)
    d = pid_d * BD + tl.arange(0, BD)
    d_ok = d < D
    xb = x + pid_b * sxb
    z = tl.zeros([BT, BD], dtype=tl.float32)
    for k in tl.static_range(W):
        src = t - (W - 1) + k
        ok = (src >= 0) & (src < T)
        xv = tl.load(xb + src[:, None] * sxt + d[None, :] * sxd, mask=ok[:, None] & d_ok[None, :], other=0.0)
        wk = tl.load(w + d * W + k, mask=d_ok, other=0.0)
        z += xv.to(tl.float32) * wk.to(tl.float32)[None, :]
    out = z * tl.sigmoid(z)
    yb = y + pid_b * T * D
    tl.store(yb + t[:, None] * D + d[None, :], out.to(y.dtype.element_ty),
             mask=(t < T)[:, None] & d_ok[None, :])


@triton.jit
def _z_at(xb, w, rows, d, d_ok, T, sxt, sxd, W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr):
    """Pre-activation at ``rows`` (recomputed from x)."""
    z = tl.zeros([BT, BD], dtype=tl.float32)
    for k in tl.static_range(W):
        src = rows - (W - 1) + k
        ok = (src >= 0) & (src < T)
        xv = tl.load(xb + src[:, None] * sxt + d[None, :] * sxd, mask=ok[:, None] & d_ok[None, :], other=0.0)
        wk = tl.load(w + d * W + k, mask=d_ok, other=0.0)
        z += xv.to(tl.float32) * wk.to(tl.float32)[None, :]
    return z


@triton.autotune(configs=_configs(), key=["D", "W", "B", "T"])
@triton.jit
def _bwd_kernel(
    x, w, dy, dx, dwp, B, T, D, sxb, sxt, sxd, syb, syt, syd,
    W: tl.constexpr, BT: tl.constexpr, BD: tl.constexpr,
):
    """One strip of T per program: dx for its rows, dw summed over its rows."""
    pid_d = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    n_strips = tl.num_programs(1)
    n_tiles = tl.cdiv(T, BT)
    per_strip = tl.cdiv(n_tiles, n_strips)
    d = pid_d * BD + tl.arange(0, BD)
    d_ok = d < D
    xb = x + pid_b * sxb
    dyb = dy + pid_b * syb
    dxb = dx + pid_b * T * D
    acc0 = tl.zeros([BD], dtype=tl.float32)
    acc1 = tl.zeros([BD], dtype=tl.float32)
    acc2 = tl.zeros([BD], dtype=tl.float32)
    acc3 = tl.zeros([BD], dtype=tl.float32)
    for i in range(0, per_strip):
        t = (pid_s * per_strip + i) * BT + tl.arange(0, BT)
        gx = tl.zeros([BT, BD], dtype=tl.float32)
        for s in tl.static_range(W):
            rows = t + s
            z = _z_at(xb, w, rows, d, d_ok, T, sxt, sxd, W, BT, BD)
            ok = (rows < T)[:, None] & d_ok[None, :]
            g = tl.load(dyb + rows[:, None] * syt + d[None, :] * syd, mask=ok, other=0.0).to(tl.float32)
            sg = tl.sigmoid(z)
            dz = g * sg * (1.0 + z * (1.0 - sg))
            wk = tl.load(w + d * W + (W - 1 - s), mask=d_ok, other=0.0).to(tl.float32)
            gx += dz * wk[None, :]
            if s == 0:
                for k in tl.static_range(W):
                    src = t - (W - 1) + k
                    okx = (src >= 0) & (src < T)
                    xv = tl.load(xb + src[:, None] * sxt + d[None, :] * sxd,
                                 mask=okx[:, None] & d_ok[None, :], other=0.0).to(tl.float32)
                    part = tl.sum(dz * xv, axis=0)
                    if k == 0:
                        acc0 += part
                    elif k == 1:
                        acc1 += part
                    elif k == 2:
                        acc2 += part
                    else:
                        acc3 += part
        tl.store(dxb + t[:, None] * D + d[None, :], gx.to(dx.dtype.element_ty),
                 mask=(t < T)[:, None] & d_ok[None, :])
    base = dwp + ((pid_b * n_strips + pid_s) * D + d) * W
    tl.store(base + 0, acc0, mask=d_ok)
    if W > 1:
        tl.store(base + 1, acc1, mask=d_ok)
    if W > 2:
        tl.store(base + 2, acc2, mask=d_ok)
    if W > 3:
        tl.store(base + 3, acc3, mask=d_ok)


# -- launchers ------------------------------------------------------------------------------
def _device_ctx(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else _Null()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def forward(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """``y`` (contiguous, x's dtype) for ``x [B, T, D]`` (any strides), ``w [D, W]`` contiguous."""
    B, T, D = x.shape
    W = w.shape[1]
    y = torch.empty((B, T, D), dtype=x.dtype, device=x.device)
    with _device_ctx(x):
        def grid(meta):
            return (triton.cdiv(D, meta["BD"]), triton.cdiv(T, meta["BT"]), B)

        _fwd_kernel[grid](x, w, y, B, T, D, *x.stride(), W=W)
    return y


def _strips(x: torch.Tensor, B: int, T: int, D: int) -> int:
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
    per_strip = max(1, -(-BWD_PROGRAMS_PER_SM * sms // (B * max(1, -(-D // 128)))))
    return int(min(per_strip, max(1, -(-T // 32))))


def backward(x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx contiguous in x's dtype, dw float32 [D, W]) for the saved ``x``, ``w`` and ``dy``."""
    B, T, D = x.shape
    W = w.shape[1]
    strips = _strips(x, B, T, D)
    dx = torch.empty((B, T, D), dtype=x.dtype, device=x.device)
    dwp = torch.empty((B, strips, D, W), dtype=torch.float32, device=x.device)
    with _device_ctx(x):
        def grid(meta):
            return (triton.cdiv(D, meta["BD"]), strips, B)

        _bwd_kernel[grid](x, w, dy, dx, dwp, B, T, D, *x.stride(), *dy.stride(), W=W)
    return dx, dwp.sum(dim=(0, 1))


# -- autograd ---------------------------------------------------------------------------------
class CausalConv1dSiLU(torch.autograd.Function):
    """SiLU causal depthwise convolution; saves only x and the weight."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        w = weight.contiguous()
        y = forward(x, w)
        ctx.save_for_backward(x, w)
        ctx.weight_dtype = weight.dtype
        _support.mark_warm(("fwd", *_key(x, w)))
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dx, dw = backward(x, w, dy)
        _support.mark_warm(("bwd", *_key(x, w)))
        return dx, dw.to(ctx.weight_dtype)


def _key(x: torch.Tensor, w: torch.Tensor) -> tuple:
    return (tuple(x.shape), x.stride(), x.dtype, w.dtype, str(x.device))
