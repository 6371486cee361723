"""Taichi kernels of the accelerated fitter (imported only after taichi has started).

See :mod:`diffract_kernels_spectral._taichi` for what they compute.
"""

import taichi as ti

F64 = ti.types.ndarray(dtype=ti.f64, ndim=1)
I32 = ti.types.ndarray(dtype=ti.i32, ndim=1)

@ti.kernel
def ks_bounds(
    logx: F64, first: I32, starts: I32, alphas: F64, n: ti.i32, stride: ti.i32,
    lower: F64, upper: F64,
):
    """Per candidate, a lower and an upper bound on its KS distance from every
    ``stride``-th tail point: the CDFs are monotone, so between two probed points
    ``|T - A| <= max(T(next) - A(prev), A(next) - T(prev))``."""
    for c in range(starts.shape[0]):
        s = starts[c]
        m = ti.cast(n - s, ti.f64)
        e = 1.0 - alphas[c]
        l0 = logx[s]
        prev_t = 0.0
        prev_a = 0.0
        lo = 0.0
        hi = 0.0
        j = s
        while j < n - 1:
            j = ti.min(j + stride, n - 1)
            t = 1.0 - ti.exp(e * (logx[j] - l0))
            a = ti.cast(first[j] - s, ti.f64) / m
            lo = ti.max(lo, ti.abs(t - a))
            hi = ti.max(hi, ti.max(t - prev_a, a - prev_t))
            prev_t = t
            prev_a = a
        lower[c] = lo
        upper[c] = hi

@ti.kernel
def ks_exact(
    logx: F64, first: I32, starts: I32, alphas: F64, n: ti.i32, stop_above: ti.f64,
    out: F64,
):
    """Per candidate, the exact KS distance over every tail point; a scan stops as
    soon as the distance exceeds ``stop_above`` (the candidate cannot win)."""
    for c in range(starts.shape[0]):
        s = starts[c]
        m = ti.cast(n - s, ti.f64)
        e = 1.0 - alphas[c]
        l0 = logx[s]
        d = 0.0
        j = s
        while j < n:
            t = 1.0 - ti.exp(e * (logx[j] - l0))
            a = ti.cast(first[j] - s, ti.f64) / m
            d = ti.max(d, ti.abs(t - a))
            if d > stop_above:
                break
            j += 1
        out[c] = d
