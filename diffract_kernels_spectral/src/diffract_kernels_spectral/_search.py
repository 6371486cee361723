"""The exact xmin search of the power-law fit: candidates, their exponents and KS
distances, the bounded Taichi search and the dense numpy pass (see
:mod:`diffract_kernels_spectral.fitting` for the method and its guarantees)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from diffract_kernels_spectral import _taichi
from diffract_kernels_spectral.errors import FitArgumentError, FitError

__all__ = ["candidate_range"]

#: Evenly spread candidates scanned exactly first, to set the pruning threshold.
_SEEDS = 8
#: Survivors of a bounds pass scanned exactly (smallest bounds) to lower the threshold.
_PASS_SEEDS = 16
#: Candidates of a set scouted (bounded without pruning) for seeds before the passes.
_SCOUTS = 4096
#: Offsets (in xmin order) from a set's best candidate scanned exactly after each pass.
_NEAR_OFFSETS = np.r_[-(2 ** np.arange(12))[::-1], np.arange(-15, 16), 2 ** np.arange(12)]
#: The kernels run on Taichi's threads only for a data set of at least this many points;
#: below it they run in the calling thread. Measured (docs/spectral.md): below 10^5
#: points the threads never paid (the passes are short and the fit waits at each
#: launch for every thread to check in, which a busy machine delays), and a fit in a
#: process pool's worker would take a second core from the other worker.
PARALLEL_FROM = 2**18
#: Grid of the exact scan's first pass (see ``ks_exact``).
_EXACT_STRIDE = 16
#: Grid of the first bounds pass, as a multiple of sqrt(n); later passes are 4x finer.
_COARSE = 0.5
#: Bounds passes repeat while more candidates than this survive.
_REFINE_ABOVE = 256
#: How much finer each bounds pass is than the last.
_REFINE = 4
#: Finest bounds pass (below it the exact scan is as cheap).
_MIN_BOUND_STRIDE = 8
#: Grid points (beyond the hint's) the first bounds pass over every candidate visits at
#: most: it drops the clear losers; a near-tie, which no grid point rules out, would
#: visit all of them at a coarse stride only to meet the finer passes anyway.
_FIRST_BUDGET = 64
#: No budget (the scouts, and the passes after the first).
_UNBOUNDED = 1 << 30
#: Data points on either side of a survivor's peak checked exactly after a bounds pass.
_WINDOW = 32
#: Distinct data points (the closest candidates' largest gaps) every survivor is held
#: to before a bounds pass, and the points on either side of each it checks.
_SHARED_PEAKS = 4
_SHARED_WINDOW = 4
#: Elements of one block of the dense pass (bounds its memory: 8 MiB per array).
_DENSE_BLOCK = 1 << 20
#: Blocks of candidates the dense pass takes at the least (see ``_dense_ks``).
_DENSE_STEPS = 8


# -- data ---------------------------------------------------------------------------
def _prepare(data: Any, xmax: float | None = None) -> np.ndarray:
    x = np.asarray(data, dtype=np.float64)
    if x.ndim != 1:
        raise FitArgumentError(
            f"data must be 1-D, got shape {x.shape}. Pass a spectrum (a vector)."
        )
    if not np.isfinite(x).all():
        bad = int((~np.isfinite(x)).sum())
        raise FitError(f"data contain {bad} NaN or Inf value(s); drop them before fitting.")
    if xmax is not None:
        x = x[x <= xmax]
    return np.sort(x[x > 0])


def _starts(x: np.ndarray, min_tail: int) -> np.ndarray:
    """First sorted index of each candidate xmin (see the module docstring)."""
    n = len(x)
    distinct = np.flatnonzero(np.r_[True, x[1:] != x[:-1]])[:-1]
    return distinct[(n - distinct) >= min_tail].astype(np.int32)


def candidate_range(
    data: Any, *, min_tail: int = 50, xmax: float | None = None
) -> tuple[float, float]:
    """The ``xmin=(lo, hi)`` range that makes ``powerlaw.Fit`` search exactly our candidates.

    powerlaw searches the distinct values in ``[lo, hi)`` except the last one, so ``hi``
    is the second distinct value above our largest candidate.
    """
    x = _prepare(data, xmax)
    starts = _starts(x, min_tail)
    if len(starts) == 0:
        raise FitError(_too_few(x, min_tail))
    distinct = np.unique(x)
    top = np.searchsorted(distinct, x[starts[-1]])
    if top + 2 >= len(distinct):
        return float(x[starts[0]]), float(np.nextafter(distinct[-1], np.inf))
    return float(x[starts[0]]), float(distinct[top + 2])


def _too_few(x: np.ndarray, min_tail: int) -> str:
    ordered = np.sort(x)  # the distinct values counted without np.unique's numpy.ma import
    distinct = int(np.count_nonzero(ordered[1:] != ordered[:-1])) + 1 if len(x) else 0
    if len(x) < min_tail:
        return (f"only {len(x)} positive point(s), fewer than min_tail={min_tail}: no tail can "
                "be fitted reliably")
    if distinct < 2:
        return "all points are equal: a power law cannot be fitted"
    return (f"no xmin candidate leaves a tail of at least min_tail={min_tail} points "
            f"({len(x)} points, {distinct} distinct)")


def _alphas(x: np.ndarray, starts: np.ndarray) -> np.ndarray:
    # Logs relative to the maximum keep the suffix sums small (no large cancellation).
    rel = np.log(x) - math.log(x[-1])
    suffix = np.cumsum(rel[::-1])[::-1]
    m = len(x) - starts
    return 1.0 + m / (suffix[starts] - m * rel[starts])


def _exact_fit(x: np.ndarray, start: int) -> tuple[float, float]:
    """alpha and D for the tail starting at sorted index ``start`` (numpy, exact)."""
    tail = x[start:]
    xmin = tail[0]
    alpha = 1.0 + len(tail) / np.sum(np.log(tail / xmin))
    return float(alpha), _ks_power_law(tail, xmin, alpha)


def _left_ecdf(tail: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Distinct tail values and the fraction of the tail strictly below each."""
    if len(tail) and np.all(tail[1:] >= tail[:-1]):  # sorted (the fits' tails): one pass
        first = np.flatnonzero(np.r_[True, tail[1:] != tail[:-1]])
        values = tail[first]
    else:
        values, first = np.unique(tail, return_index=True)
    return values, first / len(tail)


def _ks(tail: np.ndarray, cdf: Any) -> float:
    values, below = _left_ecdf(tail)
    return float(np.max(np.abs(cdf(values) - below)))


def _ks_power_law(tail: np.ndarray, xmin: float, alpha: float) -> float:
    return _ks(tail, lambda u: 1.0 - (u / xmin) ** (1.0 - alpha))


def _search(x: np.ndarray, starts: np.ndarray) -> tuple[int, int]:
    """Index (into ``starts``) of the minimum-KS candidate of one data set, by the bounded
    Taichi search (:func:`_search_many`); returns (best index, candidates scanned
    exactly)."""
    (best,), scanned = _search_many([x], [starts])
    return best, scanned


def _search_many(xs: list[np.ndarray], starts_list: list[np.ndarray]) -> tuple[list[int], int]:
    """Per data set (sorted, positive), the index into its ``starts`` of the minimum-KS
    candidate, by the bounded Taichi search, every data set in the same kernel launches
    (bootstrap replicates: one set of launches for all of them).

    1. Exact distances of a few evenly spread candidates per set give its threshold
       ``best``.
    2. A coarse pass (every ``sqrt(n)``-th tail point, coarse to fine, see ``ks_lower``;
       first next to where the nearest scout in xmin order saw its largest gap) bounds
       each other candidate's distance from below (the first pass visits at most
       ``_FIRST_BUDGET`` grid points each); a candidate whose bound exceeds its set's
       ``best`` is dropped (its scan stops there). The survivors of
       smallest bound are scanned exactly, which can only lower ``best``; the others are
       held to their exact gaps next to where their bound peaked (``_near_peak``); the
       next pass takes a 4x finer grid.
    3. Every survivor is scanned exactly (interval-skipping scan, see ``ks_exact``),
       stopping once it exceeds its set's ``best``. The minimum is exact: nothing dropped
       could have been smaller.

    Returns (best index per set, candidates scanned exactly in all).
    """
    k = _taichi.kernels()
    threads = max(len(x) for x in xs) >= PARALLEL_FROM
    ks_lower, ks_exact = ((k.ks_lower_threads, k.ks_exact_threads) if threads else
                          (k.ks_lower, k.ks_exact))
    offsets = np.cumsum([0] + [len(x) for x in xs])
    logx = np.log(np.concatenate(xs))
    first = np.concatenate([_first_index(x) + o
                            for x, o in zip(xs, offsets, strict=False)]).astype(np.int32)
    # Candidates of every set in one list; a fixed shuffle per set spreads the long
    # tails (the early candidates) over the threads.
    orders, inverses = zip(*[_spread(len(st)) for st in starts_list], strict=True)
    cand_set = np.concatenate([np.full(len(st), i) for i, st in enumerate(starts_list)])
    local = np.concatenate([st[o] for st, o in zip(starts_list, orders, strict=True)])
    glob = (local + offsets[cand_set]).astype(np.int32)
    ends = offsets[cand_set + 1].astype(np.int32)
    alphas = np.concatenate([_alphas(x, st)[o] for x, st, o in
                             zip(xs, starts_list, orders, strict=True)])
    cbase = np.cumsum([0] + [len(st) for st in starts_list])
    dist = np.full(len(glob), np.inf)
    peak = np.full(len(glob), -1, dtype=np.int32)  # where a candidate's largest gap was seen
    best = np.full(len(xs), np.inf)
    fine = _EXACT_STRIDE

    found_at = np.full(len(glob), -1, dtype=np.int32)  # an exact scan's largest gap

    def exact(idx: np.ndarray) -> None:
        if not len(idx):
            return
        out = np.empty(len(idx))
        at = np.ascontiguousarray(peak[idx])  # in: where to look first; out: largest gap
        ks_exact(logx, first, np.ascontiguousarray(glob[idx]),
                 np.ascontiguousarray(ends[idx]), np.ascontiguousarray(alphas[idx]),
                 fine, np.ascontiguousarray(best[cand_set[idx]]), at, out)
        dist[idx] = out
        found_at[idx] = at
        np.minimum.at(best, cand_set[idx], out)

    def shared(ids: np.ndarray) -> np.ndarray:
        """``ids`` without the candidates that lose at the data points where the exact
        scans of their set's closest candidates found their largest gaps."""
        return _at_shared_peaks(ids, logx, first, glob, ends, alphas, best[cand_set],
                                _peaks_by_set(dist, found_at, cand_set, len(xs)), cand_set)

    n_of = np.diff(offsets)
    stride = np.maximum(4, (np.sqrt(n_of) * _COARSE).astype(int))

    def bounds(sel: np.ndarray, stop: np.ndarray, budget: int = _UNBOUNDED) -> np.ndarray:
        """ks_lower of the candidates ``sel`` at their sets' strides, stopping above
        ``stop`` (per candidate) or after ``budget`` grid points; remembers where each
        saw its largest gap."""
        lower, where = np.empty(len(sel)), np.empty(len(sel), dtype=np.int32)
        # one stride for every set (one set, or replicates of one size): no split
        if (stride == stride[0]).all():
            groups = [(stride[0], slice(None))]
        else:
            each = stride[cand_set[sel]]
            groups = [(v, np.flatnonzero(each == v)) for v in np.unique(stride)]
        for st_val, part in groups:
            ids = sel[part]
            if not len(ids):
                continue
            grid, index, grid_to = _grid(offsets, n_of, int(st_val), cand_set[ids])
            peaks = peak[ids]
            hints = np.where(peaks >= 0, index(peaks), -1).astype(np.int32)
            lo, at = np.empty(len(ids)), np.empty(len(ids), dtype=np.int32)
            ks_lower(logx, first, grid, logx[grid], first[grid], index(glob[ids]), grid_to,
                     hints, np.ascontiguousarray(glob[ids]),
                     np.ascontiguousarray(ends[ids]), np.ascontiguousarray(alphas[ids]),
                     np.ascontiguousarray(stop[part]), lo, at, budget)
            lower[part], where[part] = lo, at
        peak[sel] = where
        return lower

    def likely(sel: np.ndarray, lower: np.ndarray) -> np.ndarray:
        """Per set, the ``_PASS_SEEDS`` candidates of ``sel`` most likely to be best: a
        small bound plus the rise of the CDFs between grid points (a loose upper bound:
        a short tail's few grid points bound it from below poorly)."""
        rise = np.sqrt(stride[cand_set[sel]]) / (ends[sel] - glob[sel])
        order = np.lexsort((lower + rise, cand_set[sel]))
        in_set = cand_set[sel][order]
        return sel[order[np.arange(len(order)) - np.searchsorted(in_set, in_set)
                         < _PASS_SEEDS]]

    positions: dict[int, np.ndarray] = {}  # per set, where each sorted candidate went

    def near_best() -> np.ndarray:
        """Per set, the unscanned candidates next to its best one (in xmin order: at
        offsets 1, 2, ..., then doubling): distances change little from one xmin to
        the next, so these often hold a smaller one."""
        found = []
        for i, position in positions.items():
            here = int(orders[i][np.argmin(dist[cbase[i]:cbase[i + 1]])])
            near = np.clip(here + _NEAR_OFFSETS, 0, len(position) - 1)
            ids = cbase[i] + position[near]
            found.append(ids[np.isinf(dist[ids])])
        return np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)

    def seed(likeliest: np.ndarray) -> np.ndarray:
        """Scans ``likeliest`` exactly, then the candidates next to each set's best (see
        near_best); returns every candidate it scanned."""
        exact(likeliest)
        near = near_best()
        exact(near)
        return np.r_[likeliest, near]

    # 1. small sets are scanned whole; the others get probes: a few evenly spread
    # candidates, then the likeliest of a scouting pass over every few candidates
    first_pass, alive, scouts = [], [], []
    scout_every: dict[int, int] = {}
    for i, st in enumerate(starts_list):
        count = len(st)
        ids = np.arange(cbase[i], cbase[i + 1])
        if count <= 4 * _SEEDS:
            first_pass.append(ids)
            continue
        positions[i] = position = inverses[i]  # where each sorted candidate went
        probe = ids[position[np.linspace(0, count - 1, _SEEDS).astype(int)]]
        first_pass.append(probe)
        alive.append(ids[~np.isin(ids, probe)])
        if count > _SCOUTS:
            scout_every[i] = count // _SCOUTS
            scouts.append(ids[position[::scout_every[i]]])
    exact(np.concatenate(first_pass))
    scanned = sum(len(p) for p in first_pass)
    alive_all = np.concatenate(alive) if alive else np.empty(0, dtype=np.int64)
    if scouts:
        scout = np.concatenate(scouts)
        scout = scout[np.isinf(dist[scout])]
        seeds = seed(likely(scout, bounds(scout, np.full(len(scout), np.inf))))
        scanned += len(seeds)
        for i, every in scout_every.items():
            # every candidate looks first where its nearest scout (in xmin order) had
            # its largest gap: neighbours' gaps peak at about the same point
            near = orders[i] + every // 2
            near = np.minimum(near - near % every, (len(near) - 1) // every * every)
            own = peak[cbase[i]:cbase[i + 1]]
            np.copyto(own, peak[cbase[i] + positions[i][near]], where=own < 0)
        alive_all = alive_all[~np.isin(alive_all, seeds)]
    # 2. bounds passes while a set has many survivors (all sets here have one size n
    # per replicate batch; the stride follows each set's n)
    budget = _FIRST_BUDGET
    while len(alive_all):
        if budget == _UNBOUNDED:  # after the first pass (over every candidate: too many)
            alive_all = shared(alive_all)
        counts = np.bincount(cand_set[alive_all], minlength=len(xs))
        refine = (counts > _REFINE_ABOVE) & (stride >= _MIN_BOUND_STRIDE)
        chosen = refine[cand_set[alive_all]]
        sel, untouched = alive_all[chosen], alive_all[~chosen]
        if not len(sel):
            break
        lower = bounds(sel, best[cand_set[sel]], budget)
        budget = _UNBOUNDED
        # The lower bound multiplies by 1/m where the exact pass divides: allow rounding.
        below = lower - 1e-12 <= best[cand_set[sel]]
        # the likeliest survivors are scanned exactly (which can only lower the best),
        # then the others are held against the lowered best
        seeds = seed(likely(sel[below], lower[below]))
        scanned += len(seeds)
        below &= lower - 1e-12 <= best[cand_set[sel]]
        dropped = np.zeros(len(glob), dtype=bool)
        dropped[seeds] = True
        alive = sel[below]
        alive_all = np.concatenate([_near_peak(alive[~dropped[alive]], logx, first, glob, ends,
                                               alphas, peak, best[cand_set]), untouched])
        stride = np.where(refine, stride // _REFINE, stride)
    # 3. every survivor, exactly
    alive_all = shared(alive_all)
    exact(alive_all)
    scanned += len(alive_all)
    winners = [_smallest_winner(orders[i], dist[cbase[i]:cbase[i + 1]])
               for i in range(len(xs))]
    return winners, scanned


def _near_peak(ids: np.ndarray, logx: np.ndarray, first: np.ndarray, starts: np.ndarray,
               ends: np.ndarray, alphas: np.ndarray, peak: np.ndarray,
               best: np.ndarray) -> np.ndarray:
    """The candidates of ``ids`` whose exact gaps at the ``_WINDOW`` data points on either
    side of their ``peak`` (a data index) do not exceed their ``best`` (per candidate, as
    ``starts``, ``ends``, ``alphas``): a gap at any point bounds the distance from below,
    so the others cannot win. A survivor of a bounds pass usually loses there, for far
    less than a finer pass over its whole tail (or the exact scan's) costs."""
    window = np.arange(-_WINDOW, _WINDOW + 1)
    return _held(ids, len(window), lambda part, s: peak[part][:, None] + window,
                 logx, first, starts, ends, alphas, best)


def _held(ids: np.ndarray, points: int, where: Any, logx: np.ndarray, first: np.ndarray,
          starts: np.ndarray, ends: np.ndarray, alphas: np.ndarray,
          best: np.ndarray) -> np.ndarray:
    """The candidates of ``ids`` whose exact gaps at the ``points`` data indices
    ``where(part, s)`` gives each (clipped into its tail; ``s``: the tails' starts as a
    column) do not exceed their ``best``, in blocks of bounded memory."""
    kept, rows = [], max(1, _DENSE_BLOCK // points)
    for lo in range(0, len(ids), rows):
        part = ids[lo:lo + rows]
        s, e = starts[part].astype(np.int64)[:, None], ends[part].astype(np.int64)[:, None]
        j = np.clip(where(part, s), s, e - 1)
        fitted = -np.expm1((1.0 - alphas[part])[:, None] * (logx[j] - logx[s]))
        gap = np.abs(fitted - (first[j] - s) / (e - s)).max(axis=1)
        # ks_exact computes the same gaps in Taichi: allow for its rounding
        kept.append(part[gap - 1e-12 <= best[part]])
    return np.concatenate(kept) if kept else ids


def _peaks_by_set(dist: np.ndarray, found_at: np.ndarray, cand_set: np.ndarray,
                  sets: int) -> np.ndarray:
    """Per data set, the distinct data indices where the exact scans of its
    ``_SHARED_PEAKS`` closest candidates (smallest distances) found their largest gaps
    (-1 where there are fewer): ``[sets, _SHARED_PEAKS]``."""
    out = np.full((sets, _SHARED_PEAKS), -1, dtype=np.int64)
    scanned = np.flatnonzero(np.isfinite(dist) & (found_at >= 0))
    order = scanned[np.lexsort((dist[scanned], cand_set[scanned]))]
    bounds = np.searchsorted(cand_set[order], np.arange(sets + 1))
    for i in range(sets):  # the closest first; a few more than kept, for repeats
        mine = found_at[order[bounds[i]:min(bounds[i + 1], bounds[i] + 8 * _SHARED_PEAKS)]]
        at = list(dict.fromkeys(mine.tolist()))[:_SHARED_PEAKS]
        out[i, :len(at)] = at
    return out


def _at_shared_peaks(ids: np.ndarray, logx: np.ndarray, first: np.ndarray, starts: np.ndarray,
                     ends: np.ndarray, alphas: np.ndarray, best: np.ndarray,
                     peaks: np.ndarray, cand_set: np.ndarray) -> np.ndarray:
    """The candidates of ``ids`` whose exact gaps at the data points next to their set's
    shared peaks (``peaks``: the largest gaps of its closest candidates, which near-ties
    share: when the best xmin lies at the bottom of a long power law, thousands of
    candidates tie to 1e-5 and all peak at the same one or two points) do not exceed their
    ``best``: a gap at any point bounds the distance from below, so the others cannot
    win. One look there settles what a bounds pass over every tail would not."""
    if not len(ids) or (peaks < 0).all():
        return ids
    window = np.arange(-_SHARED_WINDOW, _SHARED_WINDOW + 1)

    def around(part: np.ndarray, s: np.ndarray) -> np.ndarray:
        at = peaks[cand_set[part]]  # [part, K]; -1: none (looked at the tail's start)
        return (np.where(at >= 0, at, s)[:, :, None] + window).reshape(len(part), -1)

    return _held(ids, peaks.shape[1] * len(window), around, logx, first, starts, ends,
                 alphas, best)


def _spread(count: int) -> tuple[np.ndarray, np.ndarray]:
    """A fixed permutation of ``range(count)`` that sets candidates far apart in xmin
    side by side (a multiplicative step near the golden section, coprime to ``count``),
    and its inverse: ``(order, position)``, ``order[position] == arange(count)``."""
    step = max(1, round(count * 0.6180339887))
    while math.gcd(step, count) != 1:
        step += 1
    ramp = np.arange(count, dtype=np.int64)  # starting at step, not 0: the smallest xmin
    # must not come first, or an argmin would pick it among ties by chance
    return (ramp + 1) * step % count, (ramp * pow(step, -1, count) - 1) % count


def _first_index(x: np.ndarray) -> np.ndarray:
    """Per point of sorted ``x``, the first index holding its value (in one pass)."""
    new = np.r_[True, x[1:] != x[:-1]]
    return np.maximum.accumulate(np.where(new, np.arange(len(x)), 0))


def _grid(offsets: np.ndarray, n_of: np.ndarray, stride: int, sets: np.ndarray
          ) -> tuple[np.ndarray, Any, np.ndarray]:
    """The points at which ``ks_lower`` bounds the distances (every ``stride``-th index of
    each data set and its last, ascending) and, for candidates in data sets ``sets``,
    ``index`` and the end of their sets' grids: ``(grid, index, to)``. ``index(points)``
    is, per candidate, the first grid index at or after its point (a data index of its
    set): ``np.searchsorted(grid, points)``, by arithmetic."""
    counts = (n_of - 2) // stride + 2  # indices 0, stride, ... below n - 1, and n - 1
    base = np.r_[0, np.cumsum(counts)]
    grid = np.concatenate([np.r_[np.arange(o, o + n - 1, stride), o + n - 1]
                           for o, n in zip(offsets[:-1], n_of, strict=True)]).astype(np.int32)
    if len(n_of) == 1:  # one data set: no per-candidate gathers
        o, last, b, to = offsets[0], counts[0] - 1, 0, np.full(len(sets), base[1], np.int32)
    else:
        o, last, b, to = offsets[sets], counts[sets] - 1, base[sets], base[sets + 1]

    def index(points: np.ndarray) -> np.ndarray:
        return (np.minimum(-(-(points - o) // stride), last) + b).astype(np.int32)

    return grid, index, np.asarray(to, dtype=np.int32)


def _dense_ks(x: np.ndarray, starts: np.ndarray, cdf: Any) -> np.ndarray:
    """KS distance of every candidate, against every tail point at once (numpy, in
    blocks of candidates). ``cdf(block, cols)`` is the fitted CDF of the candidates
    ``starts[block]`` at the points ``x[cols]``; the distance is ``max |T(u) - A(u)|``
    over the distinct tail values, ``A(u)`` the fraction of the tail strictly below
    ``u`` (the pruned search's definition).

    A block of candidates needs only the points from its smallest xmin on: with
    ``starts`` ascending (as :func:`_starts` gives them) the blocks, at least
    ``_DENSE_STEPS`` of them, make a staircase that skips most of the points below each
    candidate's xmin, which count for nothing."""
    n = len(x)
    first = np.searchsorted(x, x, side="left")
    # Only each distinct value's first occurrence counts (A is taken just below u).
    every = np.flatnonzero(first == np.arange(n))
    dist = np.empty(len(starts))
    rows = max(1, min(_DENSE_BLOCK // max(len(every), 1), -(-len(starts) // _DENSE_STEPS)))
    for lo in range(0, len(starts), rows):
        block = slice(lo, lo + rows)
        s = starts[block].astype(np.int64)
        cols = every[np.searchsorted(every, s.min()):]
        m = (n - s).astype(np.float64)[:, None]
        gap = np.abs(cdf(block, cols) - (first[cols][None, :] - s[:, None]) / m)
        gap[cols[None, :] < s[:, None]] = 0.0  # points below the candidate's xmin
        dist[block] = gap.max(axis=1)
    return dist


def _search_dense(x: np.ndarray, starts: np.ndarray) -> int:
    """Index (into ``starts``) of the minimum-KS power-law candidate by the dense scan
    (for small data, see DENSE_MAX_POINTS): the same distances as the pruned search."""
    alphas = _alphas(x, starts)
    logx = np.log(x)

    def cdf(block: slice, cols: np.ndarray) -> np.ndarray:
        return -np.expm1((1.0 - alphas[block, None])
                         * (logx[cols][None, :] - logx[starts[block]][:, None]))

    dist = _dense_ks(x, starts, cdf)
    return _smallest_winner(np.arange(len(dist)), dist)


def _smallest_winner(order: np.ndarray, dist: np.ndarray) -> int:
    """The candidate of smallest distance; exact ties go to the smallest xmin (as in an
    ordered scan), whatever order the shuffle put them in."""
    winners = np.flatnonzero(dist == dist.min())
    return int(order[winners].min())
