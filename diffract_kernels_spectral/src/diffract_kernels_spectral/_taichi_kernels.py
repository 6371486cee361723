"""Taichi kernels of the accelerated fitter (imported only after taichi has started).

See :mod:`diffract_kernels_spectral._taichi` for what they compute. Both walk candidates
in parallel (the caller shuffles the candidate order so that the long tails spread
over the threads). Several data sets (bootstrap replicates) go through one launch:
they are concatenated, ``first`` holds global indices, and each candidate carries the
end of its data set (``ends``) and its own threshold (``stops``).
"""

import taichi as ti

F64 = ti.types.ndarray(dtype=ti.f64, ndim=1)
I32 = ti.types.ndarray(dtype=ti.i32, ndim=1)


@ti.kernel
def ks_bounds(
    logx: F64, first: I32, starts: I32, ends: I32, alphas: F64, stride: ti.i32,
    stops: F64, lower: F64, upper: F64,
):
    """Per candidate, a lower and an upper bound on its KS distance from every
    ``stride``-th tail point.

    The CDFs are monotone, so between two probed points ``|T - A| <= max(T(next) -
    A(prev), A(next) - T(prev))``. A candidate whose lower bound exceeds ``stop_above``
    cannot win: its scan stops and its upper bound is +inf.
    """
    for c in range(starts.shape[0]):
        s = starts[c]
        n = ends[c]
        stop_above = stops[c]
        inv_m = 1.0 / ti.cast(n - s, ti.f64)
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
            a = ti.cast(first[j] - s, ti.f64) * inv_m
            lo = ti.max(lo, ti.abs(t - a))
            hi = ti.max(hi, ti.max(t - prev_a, a - prev_t))
            prev_t = t
            prev_a = a
            if lo > stop_above:
                hi = ti.math.inf
                break
        lower[c] = lo
        upper[c] = hi


@ti.func
def _cdfs(logx: ti.template(), first: ti.template(), s, m, e, l0, j):
    """(fitted CDF, empirical CDF just below x_j) of the candidate starting at s."""
    return 1.0 - ti.exp(e * (logx[j] - l0)), ti.cast(first[j] - s, ti.f64) / m


@ti.kernel
def ks_exact(
    logx: F64, first: I32, starts: I32, ends: I32, alphas: F64, stride: ti.i32,
    stops: F64, out: F64,
):
    """Per candidate, the exact KS distance, or any value above ``stop_above`` as soon as
    the distance is known to exceed it (such a candidate cannot win).

    Pass one takes the distance at every ``stride``-th tail point. Pass two visits the
    intervals between them and scans an interval's interior only when its monotone
    upper bound ``max(T(next) - A(prev), A(next) - T(prev))`` exceeds the distance found
    so far: the other intervals cannot hold a larger gap.
    """
    for c in range(starts.shape[0]):
        s = starts[c]
        n = ends[c]
        stop_above = stops[c]
        m = ti.cast(n - s, ti.f64)
        e = 1.0 - alphas[c]
        l0 = logx[s]
        d = 0.0
        j = s
        while j < n:
            t, a = _cdfs(logx, first, s, m, e, l0, j)
            d = ti.max(d, ti.abs(t - a))
            if j == n - 1 or d > stop_above:
                break
            j = ti.min(j + stride, n - 1)
        if stride > 1 and d <= stop_above:
            prev_t, prev_a = _cdfs(logx, first, s, m, e, l0, s)
            j = s
            while j < n - 1:
                nj = ti.min(j + stride, n - 1)
                t, a = _cdfs(logx, first, s, m, e, l0, nj)
                if ti.max(t - prev_a, a - prev_t) + 1e-12 > d:
                    k = j + 1
                    while k < nj:
                        tk, ak = _cdfs(logx, first, s, m, e, l0, k)
                        d = ti.max(d, ti.abs(tk - ak))
                        k += 1
                if d > stop_above:
                    break
                prev_t = t
                prev_a = a
                j = nj
        out[c] = d
