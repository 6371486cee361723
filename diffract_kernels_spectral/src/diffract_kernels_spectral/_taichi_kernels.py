"""Taichi kernels of the accelerated fitter (imported only after taichi has started).

See :mod:`diffract_kernels_spectral._taichi` for what they compute. Each comes twice:
``ks_lower`` and ``ks_exact`` walk the candidates in the calling thread, the
``_threads`` twins spread them over Taichi's threads (the caller shuffles the candidate
order so that the long tails spread); ``_search.PARALLEL_FROM`` says which runs.
Several data sets (bootstrap replicates) go through one launch: they are concatenated,
``first`` holds global indices, and each candidate carries the end of its data set
(``ends``) and its own threshold (``stops``).
"""

import taichi as ti

F64 = ti.types.ndarray(dtype=ti.f64, ndim=1)
I32 = ti.types.ndarray(dtype=ti.i32, ndim=1)
#: Grid points on either side of a hint that ``ks_lower`` visits first.
_NEAR = 8
#: Points on either side of a hint that ``ks_exact`` visits first.
_EXACT_NEAR = 32


@ti.func
def _lower_one(c, logx: ti.template(), first: ti.template(), grid: ti.template(),
               grid_logx: ti.template(), grid_first: ti.template(), grid_from: ti.template(),
               grid_to: ti.template(), hints: ti.template(), starts: ti.template(),
               ends: ti.template(), alphas: ti.template(), stops: ti.template(),
               lower: ti.template(), where: ti.template(), budget):
    """Per candidate, a lower bound on its KS distance: the largest gap at the grid
    points of its tail (``grid[g]`` for ``g`` in ``[grid_from, grid_to)``, with their
    logs and first indices gathered: every stride-th point of the data set, and its
    last), or any value above ``stop_above`` as soon as one gap exceeds it (such a
    candidate cannot win); ``where`` is the data index of the largest gap found.

    The grid is shared by all candidates (small, so it stays in cache). The points
    next to ``hints[c]`` (a grid index: where a coarser pass, or a neighbouring
    candidate, found the largest gap; or -1) come first, then the grid coarse to fine
    (every 2^b-th point, then the odd multiples of 2^(b-1), ...): a gap follows a
    smooth, bridge-like curve over the tail, so these find a large one after a few
    evaluations and a losing candidate stops there, at the first gap above its stop.
    At most ``budget`` grid points are visited after the hint's: a candidate that none
    of them rules out gets the largest gap seen (still a bound from below).
    """
    s = starts[c]
    stop_above = stops[c]
    inv_m = 1.0 / ti.cast(ends[c] - s, ti.f64)
    e = 1.0 - alphas[c]
    l0 = logx[s]
    lo_g = grid_from[c]
    count = grid_to[c] - lo_g
    lo = 0.0
    at = lo_g
    hint = hints[c]
    if hint >= 0:
        for d in range(2 * _NEAR + 1):
            g = ti.min(ti.max(hint + d - _NEAR, lo_g), lo_g + count - 1)
            t = 1.0 - ti.exp(e * (grid_logx[g] - l0))
            near = ti.abs(t - ti.cast(grid_first[g] - s, ti.f64) * inv_m)
            if near > lo:
                lo = near
                at = g
            if lo > stop_above:
                break
    step = 1
    while step * 2 <= count:
        step *= 2
    h = step  # every multiple of step first, then the odd multiples of each half
    i = h
    inc = h
    left = budget
    while h >= 1 and lo <= stop_above and left > 0:
        while i <= count:
            g = lo_g - 1 + i
            t = 1.0 - ti.exp(e * (grid_logx[g] - l0))
            gap = ti.abs(t - ti.cast(grid_first[g] - s, ti.f64) * inv_m)
            if gap > lo:
                lo = gap
                at = g
            left -= 1
            if lo > stop_above or left == 0:
                break
            i += inc
        inc = h
        h //= 2
        i = h
    lower[c] = lo
    where[c] = grid[at]



@ti.kernel
def ks_lower_threads(
    logx: F64, first: I32, grid: I32, grid_logx: F64, grid_first: I32, grid_from: I32,
    grid_to: I32, hints: I32, starts: I32, ends: I32, alphas: F64, stops: F64,
    lower: F64, where: I32, budget: ti.i32,
):
    """``_lower_one`` of every candidate, the candidates spread over the threads."""
    for c in range(starts.shape[0]):
        _lower_one(c, logx, first, grid, grid_logx, grid_first, grid_from, grid_to, hints,
                   starts, ends, alphas, stops, lower, where, budget)


@ti.kernel
def ks_lower(
    logx: F64, first: I32, grid: I32, grid_logx: F64, grid_first: I32, grid_from: I32,
    grid_to: I32, hints: I32, starts: I32, ends: I32, alphas: F64, stops: F64,
    lower: F64, where: I32, budget: ti.i32,
):
    """``_lower_one`` of every candidate, in the calling thread (a loop below a branch
    is not parallelised)."""
    if starts.shape[0] > 0:
        for c in range(starts.shape[0]):
            _lower_one(c, logx, first, grid, grid_logx, grid_first, grid_from, grid_to,
                       hints, starts, ends, alphas, stops, lower, where, budget)

@ti.func
def _cdfs(logx: ti.template(), first: ti.template(), s, m, e, l0, j):
    """(fitted CDF, empirical CDF just below x_j) of the candidate starting at s."""
    return 1.0 - ti.exp(e * (logx[j] - l0)), ti.cast(first[j] - s, ti.f64) / m


@ti.func
def _exact_one(c, logx: ti.template(), first: ti.template(), starts: ti.template(),
               ends: ti.template(), alphas: ti.template(), stride, stops: ti.template(),
               hints: ti.template(), out: ti.template()):
    """Per candidate, the exact KS distance, or any value above ``stop_above`` as soon as
    the distance is known to exceed it (such a candidate cannot win); ``hints[c]`` is
    then the data index of the largest gap found (unchanged when none exceeded 0).

    First the points next to ``hints[c]`` (a data index: where a bounds pass saw the
    largest gap, or -1): a candidate that loses usually loses there. Pass one takes the
    distance at every ``stride``-th tail point. Pass two visits the intervals between
    them and scans an interval's interior only when its monotone upper bound
    ``max(T(next) - A(prev), A(next) - T(prev))`` exceeds the distance found so far: the
    other intervals cannot hold a larger gap.
    """
    s = starts[c]
    n = ends[c]
    stop_above = stops[c]
    m = ti.cast(n - s, ti.f64)
    e = 1.0 - alphas[c]
    l0 = logx[s]
    d = 0.0
    hint = hints[c]
    at = hint
    if hint >= 0:
        for w in range(2 * _EXACT_NEAR + 1):
            k = ti.min(ti.max(hint + w - _EXACT_NEAR, s), n - 1)
            th, ah = _cdfs(logx, first, s, m, e, l0, k)
            if ti.abs(th - ah) > d:
                d = ti.abs(th - ah)
                at = k
    j = s
    while j < n and d <= stop_above:
        t, a = _cdfs(logx, first, s, m, e, l0, j)
        if ti.abs(t - a) > d:
            d = ti.abs(t - a)
            at = j
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
                    if ti.abs(tk - ak) > d:
                        d = ti.abs(tk - ak)
                        at = k
                    k += 1
            if d > stop_above:
                break
            prev_t = t
            prev_a = a
            j = nj
    out[c] = d
    hints[c] = at


@ti.kernel
def ks_exact_threads(
    logx: F64, first: I32, starts: I32, ends: I32, alphas: F64, stride: ti.i32,
    stops: F64, hints: I32, out: F64,
):
    """``_exact_one`` of every candidate, the candidates spread over the threads."""
    for c in range(starts.shape[0]):
        _exact_one(c, logx, first, starts, ends, alphas, stride, stops, hints, out)


@ti.kernel
def ks_exact(
    logx: F64, first: I32, starts: I32, ends: I32, alphas: F64, stride: ti.i32,
    stops: F64, hints: I32, out: F64,
):
    """``_exact_one`` of every candidate, in the calling thread."""
    if starts.shape[0] > 0:
        for c in range(starts.shape[0]):
            _exact_one(c, logx, first, starts, ends, alphas, stride, stops, hints, out)
