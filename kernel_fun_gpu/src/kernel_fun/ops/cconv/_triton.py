"""Triton kernels of the depthwise causal convolution with SiLU (imported on first use).

``y[b, t, d] = silu(z[b, t, d])``, ``z[b, t, d] = sum_k w[d, k] x[b, t - (W-1) + k, d]``
(x is zero before t = 0). The backward recomputes ``z`` from the ``x`` it loads for
``dw`` anyway, so the autograd Function saves only ``x`` and ``w``:

* ``dz = dy * s (1 + z (1 - s))`` with ``s = sigmoid(z)``;
* ``dx[t] = sum_k w[k] dz[t + (W-1) - k]``;
* ``dw[k] = sum_{b,t} dz[t] x[t - (W-1) + k]``.

Memory traffic: the forward reads x once and writes y; the backward reads x and dy once
(the shifted tiles overlap in cache) and writes dx, plus a ``[B, strips, D, 4]`` float32
buffer of per-strip dw partials summed on the host.

Layout of this module: constants, kernels, launchers, the autograd Function.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from kernel_fun import _support, _toolchain

# -- constants ----------------------------------------------------------------------------
#: Widest kernel the Triton path takes (what KDA layers use is 4).
MAX_W = 4
#: Programs the backward aims for per streaming multiprocessor (enough to hide latency,
#: few enough that the per-strip dw partials stay small).
BWD_PROGRAMS_PER_SM = 4
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _configs(max_tile: int, per_thread: int) -> list[triton.Config]:
    """Tile shapes to autotune over: at most ``max_tile`` elements per tile and
    ``per_thread`` per thread (register budget). The interpreter cannot benchmark: one
    small config there."""
    if _INTERPRET:
        return [triton.Config({"BT": 16, "BD": 16}, num_warps=1)]
    return [
        triton.Config({"BT": bt, "BD": bd}, num_warps=nw)
        for bt in (8, 16, 32, 64, 128)
        for bd in (64, 128, 256)
        for nw in (4, 8)
        if 1024 <= bt * bd <= max_tile and bt * bd <= per_thread * 32 * nw
    ]


#: The forward holds one fp32 accumulator tile; the backward about nine tiles at once
#: (seven shifted x tiles, a dz tile, the dx accumulator), so its tiles are smaller.
FWD_MAX_TILE = 16384
BWD_MAX_TILE = 4096
#: Tile elements a thread may hold. Compiled for sm_90 and sm_100 under Triton 3.8.0 and
#: 3.9.0 (tools/compile_kernels.py, docs/kernel_fun.md), the forward spills from 64 a
#: thread (152 to 5152 bytes) and the backward from 32 (328 to 4512 bytes: BT=32 BD=128 at
#: 4 warps spilled 904); at these budgets the worst is 184 bytes (the backward at 16).
FWD_PER_THREAD = 32
BWD_PER_THREAD = 16
FWD_CONFIGS = _configs(FWD_MAX_TILE, FWD_PER_THREAD)
BWD_CONFIGS = _configs(BWD_MAX_TILE, BWD_PER_THREAD)


# -- kernels --------------------------------------------------------------------------------
# Both kernels work with four taps: a narrower weight is left-padded with zero taps on the
# host (``_taps``), which is the same convolution. Fixed taps let the backward load the
# seven shifted x tiles it needs once and reuse them for all four recomputed rows.


@triton.jit
def _load_rows(base, rows, d, d_ok, T, st, sd):
    """x (or dy) at ``rows`` (int64: offsets of large tensors pass 2**31), 0 outside [0, T)."""
    ok = (rows >= 0) & (rows < T)
    return tl.load(base + rows[:, None] * st + d[None, :] * sd,
                   mask=ok[:, None] & d_ok[None, :], other=0.0).to(tl.float32)


def _known_good(kernel: str):
    """The autotuner's early prune: the configurations the known-bad table allows on the
    device of the call (kernel_fun._toolchain.allowed; the gate refuses the op when none
    is left) and no per-configuration check has failed on."""

    def prune(configs, named_args, **kwargs):
        return _usable(kernel, configs, named_args["x"].device) or configs

    return prune


def launch_problem(toolchain) -> str | None:
    """Why a kernel has no configuration the known-bad table allows under ``toolchain``."""
    if not _toolchain.launch_entries("causal_conv1d", toolchain):  # the usual case
        return None
    for name, configs in (("_fwd_kernel", FWD_CONFIGS), ("_bwd_kernel", BWD_CONFIGS)):
        if not _toolchain.allowed("causal_conv1d", name, configs, toolchain):
            return f"the known-bad table rules out every configuration of causal_conv1d's {name}"
    return None


@triton.autotune(configs=FWD_CONFIGS, key=["D", "W", "B", "T"],
                 prune_configs_by={"early_config_prune": _known_good("_fwd_kernel")})
@triton.jit
def _fwd_kernel(x, w4, y, B, T, D, W, sxb, sxt, sxd, BT: tl.constexpr, BD: tl.constexpr):
    pid_d = tl.program_id(0)
    pid_t = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    t = (pid_t * BT + tl.arange(0, BT)).to(tl.int64)
    d = pid_d * BD + tl.arange(0, BD)
    d_ok = d < D
    xb = x + pid_b * sxb
    w0 = tl.load(w4 + d * 4 + 0, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    w1 = tl.load(w4 + d * 4 + 1, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(w4 + d * 4 + 2, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    w3 = tl.load(w4 + d * 4 + 3, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    z = (w0 * _load_rows(xb, t - 3, d, d_ok, T, sxt, sxd)
         + w1 * _load_rows(xb, t - 2, d, d_ok, T, sxt, sxd)
         + w2 * _load_rows(xb, t - 1, d, d_ok, T, sxt, sxd)
         + w3 * _load_rows(xb, t, d, d_ok, T, sxt, sxd))
    out = z * tl.sigmoid(z)
    tl.store(y + pid_b * T * D + t[:, None] * D + d[None, :], out.to(y.dtype.element_ty),
             mask=(t < T)[:, None] & d_ok[None, :])


@triton.jit
def _dz(z, g):
    """d silu(z) / dz times the incoming gradient."""
    s = tl.sigmoid(z)
    return g * s * (1.0 + z * (1.0 - s))


@triton.autotune(configs=BWD_CONFIGS, key=["D", "W", "B", "T"],
                 prune_configs_by={"early_config_prune": _known_good("_bwd_kernel")})
@triton.jit
def _bwd_kernel(
    x, w4, dy, dx, dwp, B, T, D, W, sxb, sxt, sxd, syb, syt, syd,
    BT: tl.constexpr, BD: tl.constexpr,
):
    """One strip of T per program: dx for its rows, dw summed over its rows.

    For rows t of a tile the pre-activation is recomputed at t, t+1, t+2, t+3 (the rows
    whose gradient reaches x[t]) from the seven x tiles at t-3 .. t+3, loaded once.
    """
    pid_d = tl.program_id(0)
    pid_s = tl.program_id(1)
    pid_b = tl.program_id(2).to(tl.int64)
    n_strips = tl.num_programs(1)
    per_strip = tl.cdiv(tl.cdiv(T, BT), n_strips)
    d = pid_d * BD + tl.arange(0, BD)
    d_ok = d < D
    xb = x + pid_b * sxb
    gb = dy + pid_b * syb
    w0 = tl.load(w4 + d * 4 + 0, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    w1 = tl.load(w4 + d * 4 + 1, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    w2 = tl.load(w4 + d * 4 + 2, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    w3 = tl.load(w4 + d * 4 + 3, mask=d_ok, other=0.0).to(tl.float32)[None, :]
    a0 = tl.zeros([BD], dtype=tl.float32)
    a1 = tl.zeros([BD], dtype=tl.float32)
    a2 = tl.zeros([BD], dtype=tl.float32)
    a3 = tl.zeros([BD], dtype=tl.float32)
    for i in range(0, per_strip):
        t = ((pid_s * per_strip + i) * BT + tl.arange(0, BT)).to(tl.int64)
        # Ordered so that each x tile dies as soon as the last row using it is done.
        xm3 = _load_rows(xb, t - 3, d, d_ok, T, sxt, sxd)
        xm2 = _load_rows(xb, t - 2, d, d_ok, T, sxt, sxd)
        xm1 = _load_rows(xb, t - 1, d, d_ok, T, sxt, sxd)
        x0 = _load_rows(xb, t, d, d_ok, T, sxt, sxd)
        dz = _dz(w0 * xm3 + w1 * xm2 + w2 * xm1 + w3 * x0, _load_rows(gb, t, d, d_ok, T, syt, syd))
        a0 += tl.sum(dz * xm3, axis=0)
        a1 += tl.sum(dz * xm2, axis=0)
        a2 += tl.sum(dz * xm1, axis=0)
        a3 += tl.sum(dz * x0, axis=0)
        gx = w3 * dz
        xp1 = _load_rows(xb, t + 1, d, d_ok, T, sxt, sxd)
        g1 = _load_rows(gb, t + 1, d, d_ok, T, syt, syd)
        gx += w2 * _dz(w0 * xm2 + w1 * xm1 + w2 * x0 + w3 * xp1, g1)
        xp2 = _load_rows(xb, t + 2, d, d_ok, T, sxt, sxd)
        g2 = _load_rows(gb, t + 2, d, d_ok, T, syt, syd)
        gx += w1 * _dz(w0 * xm1 + w1 * x0 + w2 * xp1 + w3 * xp2, g2)
        xp3 = _load_rows(xb, t + 3, d, d_ok, T, sxt, sxd)
        g3 = _load_rows(gb, t + 3, d, d_ok, T, syt, syd)
        gx += w0 * _dz(w0 * x0 + w1 * xp1 + w2 * xp2 + w3 * xp3, g3)
        tl.store(dx + pid_b * T * D + t[:, None] * D + d[None, :], gx.to(dx.dtype.element_ty),
                 mask=(t < T)[:, None] & d_ok[None, :])
    base = dwp + ((pid_b * n_strips + pid_s) * D + d) * 4
    tl.store(base + 0, a0, mask=d_ok)
    tl.store(base + 1, a1, mask=d_ok)
    tl.store(base + 2, a2, mask=d_ok)
    tl.store(base + 3, a3, mask=d_ok)


# -- launchers ------------------------------------------------------------------------------
def _device_ctx(t: torch.Tensor):
    return torch.cuda.device(t.device) if t.is_cuda else _Null()


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _taps(w: torch.Tensor) -> torch.Tensor:
    """``w [D, W]`` as four taps ``[D, 4]``, zero taps first (a no-op copy-free for W=4)."""
    W = w.shape[1]
    return w.contiguous() if W == MAX_W else torch.nn.functional.pad(w, (MAX_W - W, 0)).contiguous()


def _launch(kernel, grid, args: tuple, x: torch.Tensor, config=None) -> None:
    """``kernel[grid](*args)``: autotuned, or with ``config`` pinned (as the autotuner runs
    a config: its pre-hook, then the kernel with its settings)."""
    with _device_ctx(x):
        if config is None:
            kernel[grid](*args)
            return
        if config.pre_hook is not None:
            config.pre_hook({**dict(zip(kernel.arg_names, args, strict=False)),
                            **config.all_kwargs()})
        kernel.fn[grid](*args, **config.all_kwargs())


def _tuned(kernel, name: str, grid, args, x: torch.Tensor, w: torch.Tensor) -> None:
    """Launch the autotuned ``kernel`` and make sure the configuration it picked for this
    key passed its own self-check (:func:`config_check`); a configuration that fails is
    ruled out on this device (the autotuner's prune drops it), the autotuner forgets its
    choices, and the launch is redone with another (``args()`` built afresh), so the result
    is a checked one."""
    for _ in range(len(kernel.configs)):  # at most one try a configuration
        _launch(kernel, grid, args(), x)
        config = kernel.best_config
        if _support.is_capturing() or config_check(name, config, x, w) is None:
            return
        _RULED_OUT.add((name, _config_key(config), str(x.device)))
        kernel.cache.clear()
        if not _usable(name, kernel.configs, x.device):
            break
    raise RuntimeError(
        f"kernel-fun causal_conv1d: every configuration of {name} failed its self-check on "
        "this device; set KERNEL_FUN_SELF_CHECK=0 only if you accept wrong values, or "
        "uninstall kernel-fun's adoption to run fla.")


def forward(x: torch.Tensor, w: torch.Tensor, config=None) -> torch.Tensor:
    """``y`` (contiguous, x's dtype) for ``x [B, T, D]`` (any strides), ``w [D, W]``;
    ``config`` pins a configuration (the per-configuration check) instead of autotuning."""
    B, T, D = x.shape
    W = w.shape[1]
    y = torch.empty((B, T, D), dtype=x.dtype, device=x.device)

    def grid(meta):
        return (triton.cdiv(D, meta["BD"]), triton.cdiv(T, meta["BT"]), B)

    def args():
        return (x, _taps(w), y, B, T, D, W, *x.stride())

    if config is None:
        _tuned(_fwd_kernel, "_fwd_kernel", grid, args, x, w)
    else:
        _launch(_fwd_kernel, grid, args(), x, config)
    return y


def _strips(x: torch.Tensor, B: int, T: int, D: int) -> int:
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 2
    per_strip = max(1, -(-BWD_PROGRAMS_PER_SM * sms // (B * max(1, -(-D // 128)))))
    return int(min(per_strip, max(1, -(-T // 32))))


def backward(
    x: torch.Tensor, w: torch.Tensor, dy: torch.Tensor, config=None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dx contiguous in x's dtype, dw float32 [D, W]) for the saved ``x``, ``w`` and ``dy``;
    ``config`` as in :func:`forward`."""
    B, T, D = x.shape
    W = w.shape[1]
    strips = _strips(x, B, T, D)
    dx = torch.empty((B, T, D), dtype=x.dtype, device=x.device)
    dwp = torch.empty((B, strips, D, MAX_W), dtype=torch.float32, device=x.device)

    def grid(meta):
        return (triton.cdiv(D, meta["BD"]), strips, B)

    def args():
        return (x, _taps(w), dy, dx, dwp, B, T, D, W, *x.stride(), *dy.stride())

    if config is None:
        _tuned(_bwd_kernel, "_bwd_kernel", grid, args, x, w)
    else:
        _launch(_bwd_kernel, grid, args(), x, config)
    return dx, dwp.sum(dim=(0, 1))[:, MAX_W - W:]


# -- the check of each configuration the autotuners pick -------------------------------------
#: (kernel, configuration, device) that failed their check in this process.
_RULED_OUT: set[tuple] = set()


def _config_key(config) -> tuple:
    return (tuple(sorted(config.kwargs.items())), config.num_warps, config.num_stages)


def _usable(kernel: str, configs, device) -> list:
    """``configs`` of ``kernel`` neither the known-bad table nor a failed check rules out."""
    toolchain = _toolchain.current(device)
    return [c for c in _toolchain.allowed("causal_conv1d", kernel, configs, toolchain)
            if (kernel, _config_key(c), str(device)) not in _RULED_OUT]


def config_check(kernel: str, config, x: torch.Tensor, w: torch.Tensor) -> str | None:
    """None when ``kernel`` (``"_fwd_kernel"`` or ``"_bwd_kernel"``) with ``config`` passed
    the self-check for x's and w's dtypes on x's device: on ``[2, 80, min(D, 512)]``, its
    outputs against the float32 reference within the op's tolerance (kept like every
    verdict, :mod:`kernel_fun._check`); else what differed."""
    from kernel_fun import _check

    kind = ("configuration", kernel, _config_key(config), x.dtype, w.dtype, w.shape[1])
    return _check.verdict("causal_conv1d", kind, x.device,
                          lambda: _config_probe(kernel, config, x, w),
                          then="the autotuner no longer picks that configuration here")


def _config_probe(kernel: str, config, x: torch.Tensor, w: torch.Tensor) -> str | None:
    from kernel_fun import _check
    from kernel_fun.ops.cconv.reference import TOLERANCE, reference_causal_conv1d

    gen = torch.Generator().manual_seed(1)
    D, W = min(x.shape[2], 512), w.shape[1]
    px = torch.randn(2, 80, D, generator=gen).to(device=x.device, dtype=x.dtype)
    pw = (torch.randn(D, W, generator=gen) / W**0.5).to(device=x.device, dtype=w.dtype)
    with torch.inference_mode(False), torch.enable_grad():
        a, b = px.clone().requires_grad_(), pw.clone().requires_grad_()
        want = reference_causal_conv1d(a, b)
        if kernel == "_fwd_kernel":
            return _check.compare({"y": want.detach()}, {"y": forward(px, pw, config).float()},
                                  {"*": TOLERANCE[x.dtype]})
        dy = torch.randn(2, 80, D, generator=gen).to(device=x.device, dtype=x.dtype)
        (want * dy.float()).sum().backward()
        dx, dw = backward(px, pw, dy, config)
    return _check.compare({"dx": a.grad, "dw": b.grad}, {"dx": dx.float(), "dw": dw},
                          {"*": TOLERANCE[x.dtype]})


# -- autograd ---------------------------------------------------------------------------------
class CausalConv1dSiLU(torch.autograd.Function):
    """SiLU causal depthwise convolution; saves only x and the weight."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        w = weight.contiguous()
        y = forward(x, w)
        ctx.save_for_backward(x, w)
        ctx.weight_dtype = weight.dtype
        _support.mark_warm(("fwd", *_support.shape_key(x, w)))
        return y

    @staticmethod
    def backward(ctx, dy: torch.Tensor):
        x, w = ctx.saved_tensors
        dx, dw = backward(x, w, dy)
        _support.mark_warm(("bwd", *_support.shape_key(x, w)))
        return dx, dw.to(ctx.weight_dtype)

