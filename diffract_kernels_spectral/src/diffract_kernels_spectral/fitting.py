"""Fitting heavy-tailed distributions to 1-D data (spectra): power law, truncated power
law, exponential; likelihood-ratio comparisons; the CSN bootstrap p-value.

Conventions (shared with the powerlaw library, so results are comparable):

* Data are made 1-D float64; values above ``xmax`` (when given) and values ``<= 0`` are
  dropped, the rest sorted. NaN or Inf raise :class:`FitError`.
* **Candidates** for ``xmin`` are the distinct data values that leave a tail
  ``x >= xmin`` of at least ``min_tail`` points (default 50, the reliability bound of
  Clauset, Shalizi and Newman), excluding the largest value.
* For each candidate the exponent is the continuous maximum-likelihood estimate
  ``alpha = 1 + n_tail / sum(ln(x_i / xmin))`` (exact, never clipped: exponents above 3
  are common in trained weights' spectra).
* **KS distance** of a candidate: ``D = max_u |T(u) - A(u)|`` over the distinct tail
  values ``u``, where ``T(u) = 1 - (u / xmin)^(1 - alpha)`` is the fitted CDF and
  ``A(u) = #{tail points < u} / n_tail`` the empirical CDF just below ``u`` (the
  definition of powerlaw 2.x, so both libraries rank candidates identically).
* The fit is the candidate of smallest ``D`` (the smallest xmin among exact ties).

``fit_method``: ``"diffract"`` is the accelerated exact search (Taichi): a coarse pass
bounds every candidate's ``D`` from below and above using every k-th tail point (both
CDFs are monotone), the candidates with the smallest upper bounds are scanned exactly,
and only candidates whose lower bound does not exceed the best exact distance are
scanned afterwards (each scan stopping once it exceeds it): the same answer as scanning
everything. ``"powerlaw"`` calls the powerlaw library (unrestricted candidates: exact
parity with it, including its limits: powerlaw 2.0 bounds alpha to [0, 3]).
Up to ``DENSE_MAX_POINTS`` (1024) points, unless Taichi is already running,
``"diffract"`` scans every candidate in one dense numpy pass instead (no Taichi
start-up; same distances, same tie rule).
``"auto"`` is ``"diffract"`` when there are at least 100 points (and taichi runs, above
1024 points), else ``"powerlaw"``.
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from diffract_kernels_spectral import _taichi
from diffract_kernels_spectral._records import (
    Comparison,
    ExponentialFit,
    PowerLawFit,
    PValue,
    TruncatedPowerLawFit,
)
from diffract_kernels_spectral.errors import FitArgumentError, FitError

__all__ = [
    "MIN_POINTS_ACCELERATED",
    "candidate_range",
    "compare_distributions",
    "fit_exponential",
    "fit_power_law",
    "fit_truncated_power_law",
    "power_law_pvalue",
    "resolve_fit_method",
]

#: Below this many points, "auto" uses the powerlaw library (see the module docstring).
MIN_POINTS_ACCELERATED = 100
#: Candidates scanned exactly first (smallest upper bounds) to set the pruning threshold.
_SEEDS = 8
#: Grid of the exact scan's first pass (see ``ks_exact``).
_EXACT_STRIDE = 16
#: Grid of the first bounds pass, as a multiple of sqrt(n); later passes are 4x finer.
_COARSE = 1.0
#: Bounds passes repeat while more candidates than this survive.
_REFINE_ABOVE = 256
#: Finest bounds pass (below it the exact scan is as cheap).
_MIN_BOUND_STRIDE = 8
_METHODS = ("auto", "diffract", "powerlaw")
#: Up to this many points, while Taichi is not running, the exact search is one dense
#: numpy pass over every (candidate, tail point) pair: it saves Taichi's start-up (about
#: 1 s: import, runtime, kernel compilation) and costs 1.4 / 6.4 / 9.2 ms per fit at
#: 384 / 768 / 1024 points against the warm pruned search's ~1.1 ms (this VM), so a
#: fresh process fitting a few hundred spectra is faster without Taichi.
DENSE_MAX_POINTS = 1024

#: Above this many points a bootstrap p-value starts Taichi (about 1 s, once per
#: process) for its replicates: at 768 points a replicate then costs ~1 ms instead of the
#: dense scan's ~3 ms, so 100 replicates pay for the start-up on the first layer or two.
PVALUE_TAICHI_POINTS = 256
#: Elements of one block of the dense pass (bounds its memory: 8 MiB per array).
_DENSE_BLOCK = 1 << 20


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
    distinct = len(np.unique(x))
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
    values, first = np.unique(tail, return_index=True)
    return values, first / len(tail)


def _ks(tail: np.ndarray, cdf: Any) -> float:
    values, below = _left_ecdf(tail)
    return float(np.max(np.abs(cdf(values) - below)))


def _ks_power_law(tail: np.ndarray, xmin: float, alpha: float) -> float:
    return _ks(tail, lambda u: 1.0 - (u / xmin) ** (1.0 - alpha))


# -- method selection ------------------------------------------------------------------
def _check_method(fit_method: str) -> None:
    if fit_method not in _METHODS:
        raise FitArgumentError(
            f"Unknown fit_method {fit_method!r}; choose one of {list(_METHODS)}."
        )


def resolve_fit_method(fit_method: str, n_points: int) -> str:
    """The implementation ``fit_method`` means for ``n_points`` points: diffract or powerlaw.

    Raises :class:`FitUnavailableError` for "diffract" when taichi cannot run, and
    :class:`FitArgumentError` for an unknown name.
    """
    _check_method(fit_method)
    if fit_method == "powerlaw":
        return "powerlaw"
    if fit_method == "diffract":
        if n_points > DENSE_MAX_POINTS:
            _taichi.kernels()
        return "diffract"
    if n_points >= MIN_POINTS_ACCELERATED and (n_points <= DENSE_MAX_POINTS
                                               or _taichi.available()):
        return "diffract"
    return "powerlaw"


# -- power law -------------------------------------------------------------------------
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
    2. A coarse pass (every ``sqrt(n)``-th tail point) bounds each other candidate's
       distance from below and above; a candidate whose lower bound exceeds its set's
       ``best`` is dropped (its scan stops there). The candidates with the smallest
       upper bounds are scanned exactly, which can only lower ``best``.
    3. Every survivor is scanned exactly (interval-skipping scan, see ``ks_exact``),
       stopping once it exceeds its set's ``best``. The minimum is exact: nothing dropped
       could have been smaller.

    Returns (best index per set, candidates scanned exactly in all).
    """
    k = _taichi.kernels()
    offsets = np.cumsum([0] + [len(x) for x in xs])
    logx = np.log(np.concatenate(xs))
    first = np.concatenate([np.searchsorted(x, x, side="left") + o
                            for x, o in zip(xs, offsets, strict=False)]).astype(np.int32)
    # Candidates of every set in one list; a fixed shuffle per set spreads the long
    # tails (the early candidates) over the threads.
    orders = [np.random.default_rng(len(st)).permutation(len(st)) for st in starts_list]
    cand_set = np.concatenate([np.full(len(st), i) for i, st in enumerate(starts_list)])
    local = np.concatenate([st[o] for st, o in zip(starts_list, orders, strict=True)])
    glob = (local + offsets[cand_set]).astype(np.int32)
    ends = offsets[cand_set + 1].astype(np.int32)
    alphas = np.concatenate([_alphas(x, st[o]) for x, st, o in
                             zip(xs, starts_list, orders, strict=True)])
    cbase = np.cumsum([0] + [len(st) for st in starts_list])
    dist = np.full(len(glob), np.inf)
    best = np.full(len(xs), np.inf)
    fine = _EXACT_STRIDE

    def exact(idx: np.ndarray) -> None:
        if not len(idx):
            return
        out = np.empty(len(idx))
        k.ks_exact(logx, first, np.ascontiguousarray(glob[idx]),
                   np.ascontiguousarray(ends[idx]), np.ascontiguousarray(alphas[idx]),
                   fine, np.ascontiguousarray(best[cand_set[idx]]), out)
        dist[idx] = out
        np.minimum.at(best, cand_set[idx], out)

    # 1. small sets are scanned whole; the others get probes
    first_pass, alive = [], []
    for i, st in enumerate(starts_list):
        count = len(st)
        ids = np.arange(cbase[i], cbase[i + 1])
        if count <= 4 * _SEEDS:
            first_pass.append(ids)
            continue
        probe = ids[np.argsort(orders[i])[np.linspace(0, count - 1, _SEEDS).astype(int)]]
        first_pass.append(probe)
        alive.append(np.setdiff1d(ids, probe))
    exact(np.concatenate(first_pass))
    scanned = sum(len(p) for p in first_pass)
    alive_all = np.concatenate(alive) if alive else np.empty(0, dtype=np.int64)
    # 2. bounds passes while a set has many survivors (all sets here have one size n
    # per replicate batch; the stride follows each set's n)
    n_of = np.diff(offsets)
    stride = np.maximum(4, (np.sqrt(n_of) * _COARSE).astype(int))
    while len(alive_all):
        counts = np.bincount(cand_set[alive_all], minlength=len(xs))
        refine = (counts > _REFINE_ABOVE) & (stride >= _MIN_BOUND_STRIDE)
        sel = alive_all[refine[cand_set[alive_all]]]
        if not len(sel):
            break
        lower, upper = np.empty(len(sel)), np.empty(len(sel))
        for st_val in np.unique(stride[cand_set[sel]]):
            part = np.flatnonzero(stride[cand_set[sel]] == st_val)
            lo, hi = np.empty(len(part)), np.empty(len(part))
            ids = sel[part]
            k.ks_bounds(logx, first, np.ascontiguousarray(glob[ids]),
                        np.ascontiguousarray(ends[ids]), np.ascontiguousarray(alphas[ids]),
                        int(st_val), np.ascontiguousarray(best[cand_set[ids]]), lo, hi)
            lower[part], upper[part] = lo, hi
        seeds = []
        for i in np.unique(cand_set[sel]):
            mine = np.flatnonzero(cand_set[sel] == i)
            seeds.append(sel[mine[np.argsort(upper[mine], kind="stable")[:_SEEDS]]])
        seeds = np.concatenate(seeds)
        exact(seeds)
        scanned += len(seeds)
        # The coarse pass multiplies by 1/m where the exact pass divides: allow rounding.
        kept = sel[lower - 1e-12 <= best[cand_set[sel]]]
        untouched = alive_all[~refine[cand_set[alive_all]]]
        alive_all = np.setdiff1d(np.concatenate([kept, untouched]), seeds)
        stride = np.where(refine, stride // 4, stride)
    # 3. every survivor, exactly
    exact(alive_all)
    scanned += len(alive_all)
    winners = [_smallest_winner(orders[i], dist[cbase[i]:cbase[i + 1]])
               for i in range(len(xs))]
    return winners, scanned


def _dense_ks(x: np.ndarray, starts: np.ndarray, cdf: Any) -> np.ndarray:
    """KS distance of every candidate, against every tail point at once (numpy, in
    blocks of candidates). ``cdf(block, cols)`` is the fitted CDF of the candidates
    ``starts[block]`` at the points ``x[cols]``; the distance is ``max |T(u) - A(u)|``
    over the distinct tail values, ``A(u)`` the fraction of the tail strictly below
    ``u`` (the pruned search's definition)."""
    n = len(x)
    first = np.searchsorted(x, x, side="left")
    # Only each distinct value's first occurrence counts (A is taken just below u).
    cols = np.flatnonzero(first == np.arange(n))
    below = first[cols].astype(np.float64)
    dist = np.empty(len(starts))
    rows = max(1, _DENSE_BLOCK // max(len(cols), 1))
    for lo in range(0, len(starts), rows):
        block = slice(lo, lo + rows)
        s = starts[block].astype(np.int64)
        m = (n - s).astype(np.float64)[:, None]
        gap = np.abs(cdf(block, cols) - (below[None, :] - s[:, None]) / m)
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


def _fit_diffract(x: np.ndarray, min_tail: int, alpha_max: float | None = None) -> PowerLawFit:
    starts = _starts(x, min_tail)
    if len(starts) == 0:
        raise FitError(_too_few(x, min_tail))
    if alpha_max is not None:
        starts = starts[_alphas(x, starts) <= alpha_max]
        if len(starts) == 0:
            raise FitError(f"every xmin candidate gives alpha > alpha_max={alpha_max}")
    if len(x) <= DENSE_MAX_POINTS and not _taichi.running():
        best = _search_dense(x, starts)
    else:
        best, _ = _search(x, starts)
    start = int(starts[best])
    alpha, d = _exact_fit(x, start)
    n_tail = len(x) - start
    return PowerLawFit(alpha, float(x[start]), d, (alpha - 1) / math.sqrt(n_tail), n_tail,
                       len(x), float(x[-1]), len(starts), "diffract")


def _fit_powerlaw_library(x: np.ndarray, xmin: Any, xmax: float | None) -> PowerLawFit:
    import powerlaw

    if len(np.unique(x)) < 3 and xmin is None:
        raise FitError(_too_few(x, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit = powerlaw.Fit(x, xmin=xmin, xmax=xmax, verbose=False)
        pl = fit.power_law
        alpha, d = float(pl.alpha), float(pl.D)
        sigma = getattr(pl, "standard_err", None)
        sigma = float(sigma if sigma is not None else pl.sigma)
    fitted_xmin = float(fit.xmin)
    if not math.isfinite(fitted_xmin):
        raise FitError("the powerlaw library found no valid xmin for these data")
    n_tail = int(np.sum(x >= fitted_xmin))
    n_cand = 0 if xmin is not None else len(np.unique(x)) - 1
    return PowerLawFit(
        alpha, fitted_xmin, d, sigma, n_tail, len(x), float(x[-1]), n_cand, "powerlaw"
    )


def fit_power_law(
    data: Any,
    *,
    xmin: float | None = None,
    xmax: float | None = None,
    fit_method: str = "auto",
    min_tail: int = 50,
    alpha_max: float | None = None,
) -> PowerLawFit:
    """Fit a continuous power law to the tail of ``data`` (see the module docstring).

    ``xmin`` fixes the start of the tail (no search); ``xmax`` drops larger values first.
    ``alpha_max`` leaves out the candidates whose exponent exceeds it (the original
    Diffract accepted alpha only up to 8), so another xmin may win; it needs the
    ``"diffract"`` search.
    Returns a :class:`PowerLawFit`. Raises :class:`FitError` when the fit is undefined
    (fewer than ``min_tail`` positive points, all equal, NaN or Inf) and
    :class:`FitUnavailableError` for ``fit_method="diffract"`` without taichi.

    >>> rng = np.random.default_rng(0)
    >>> fit = fit_power_law((1 - rng.random(5000)) ** (-1 / 1.5))   # alpha = 2.5
    >>> round(fit.alpha, 1)
    2.5
    """
    if min_tail < 2:
        raise FitArgumentError(f"min_tail must be at least 2, got {min_tail}.")
    if alpha_max is not None and not alpha_max > 1:
        raise FitArgumentError(f"alpha_max must be > 1, got {alpha_max}.")
    x = _prepare(data, xmax)
    method = resolve_fit_method(fit_method, len(x))
    if alpha_max is not None and method == "powerlaw" and xmin is None:
        if fit_method == "powerlaw":
            raise FitArgumentError(
                "alpha_max needs fit_method='diffract' or 'auto' (the powerlaw library "
                "cannot leave out candidates by their exponent).")
        method = "diffract"
    if len(x) < min_tail:
        raise FitError(_too_few(x, min_tail))
    if xmin is not None:
        if method == "powerlaw":
            return _fit_powerlaw_library(x, float(xmin), xmax)
        return _fit_at(x, float(xmin), method)
    if method == "powerlaw":
        return _fit_powerlaw_library(x, None, xmax)
    return _fit_diffract(x, min_tail, alpha_max)


def _fit_at(x: np.ndarray, xmin: float, method: str) -> PowerLawFit:
    """The MLE fit of sorted positive ``x`` with the tail starting at ``xmin``."""
    start = int(np.searchsorted(x, xmin, side="left"))
    if len(x) - start < 2 or x[start] == x[-1]:
        raise FitError(f"xmin={xmin} leaves fewer than 2 distinct points in the tail")
    tail = x[start:]
    alpha = 1.0 + len(tail) / np.sum(np.log(tail / xmin))
    d = _ks_power_law(tail, xmin, float(alpha))
    return PowerLawFit(float(alpha), xmin, d, (alpha - 1) / math.sqrt(len(tail)),
                       len(tail), len(x), float(x[-1]), 0, method)


# -- alternatives ---------------------------------------------------------------------------
def _tail(data: Any, xmin: float, xmax: float | None) -> np.ndarray:
    x = _prepare(data, xmax)
    tail = x[x >= xmin]
    if len(tail) < 2 or tail[0] == tail[-1]:
        raise FitError(f"xmin={xmin} leaves fewer than 2 distinct points in the tail")
    return tail


def _expint(order: float, z: np.ndarray) -> np.ndarray:
    """Generalized exponential integral ``E_order(z) = int_1^inf exp(-z t) t^-order dt``.

    Vectorized through Tricomi's function, ``E_a(z) = z^(a-1) e^-z U(a, a, z)`` (scipy;
    within 1e-8 relative of mpmath over the exponents and arguments fits meet, tested);
    where that overflows or fails, mpmath, point by point.
    """
    from scipy.special import hyperu

    z = np.asarray(z, dtype=np.float64)
    with np.errstate(all="ignore"):
        out = np.asarray(z ** (order - 1.0) * np.exp(-z) * hyperu(order, order, z),
                         dtype=np.float64)
    bad = ~(np.isfinite(out) & (out > 0))
    if bad.any():
        import mpmath

        out[bad] = [float(mpmath.expint(order, float(v))) for v in np.atleast_1d(z[bad])]
    return out


def _log_expint(order: float, z: float) -> float:
    value = float(_expint(order, np.array([z]))[0])
    if value > 0 and math.isfinite(value):
        return math.log(value)
    import mpmath  # below float64's range: its log still is not

    return float(mpmath.log(mpmath.expint(order, z)))


def _tpl_pointwise(tail: np.ndarray, xmin: float, alpha: float, lam: float) -> np.ndarray:
    # int_xmin^inf x^-a e^(-lam x) dx = xmin^(1-a) E_a(lam xmin)
    log_z = (1.0 - alpha) * math.log(xmin) + _log_expint(alpha, lam * xmin)
    return -alpha * np.log(tail) - lam * tail - log_z


def _tpl_mle(tail: np.ndarray, xmin: float,
             start: tuple[float, float] | None = None) -> tuple[float, float, float]:
    """``(alpha, lambda, loglikelihood)`` of the truncated power law on ``tail``; from
    three starting points, or from ``start`` = ``(alpha, lambda)`` alone (a warm start
    from a neighbouring xmin during the xmin search)."""
    from scipy.optimize import minimize

    y = tail / xmin
    m = len(y)
    sum_log, sum_y = float(np.sum(np.log(y))), float(np.sum(y))

    def negll(p: np.ndarray) -> float:
        alpha, log_mu = p
        mu = math.exp(log_mu)
        try:
            value = -alpha * sum_log - mu * sum_y - m * _log_expint(alpha, mu)
        except (ValueError, ZeroDivisionError, OverflowError):
            return 1e300
        return -value if math.isfinite(value) else 1e300

    alpha0 = 1.0 + m / sum_log
    if start is not None:
        mu_start = min(max(start[1] * xmin, math.exp(-40.0)), math.exp(10.0))
        starts = [(min(max(start[0], -10.0), 30.0), math.log(mu_start))]
    else:
        starts = [(min(alpha0, 10.0), math.log(f / np.mean(y))) for f in (1e-3, 0.1, 1.0)]
    best = None
    for a0, log_mu0 in starts:
        res = minimize(negll, x0=[a0, log_mu0], method="L-BFGS-B",
                       bounds=[(-10.0, 30.0), (-40.0, 10.0)])
        if best is None or res.fun < best.fun:
            best = res
    alpha, mu = float(best.x[0]), math.exp(float(best.x[1]))
    return alpha, mu / xmin, -float(best.fun) - m * math.log(xmin)


def _tpl_ks(tail: np.ndarray, xmin: float, alpha: float, lam: float) -> float:
    norm = _expint(alpha, np.array([lam * xmin]))[0]

    def cdf(u: np.ndarray) -> np.ndarray:
        return 1.0 - (u / xmin) ** (1.0 - alpha) * _expint(alpha, lam * u) / norm

    return _ks(tail, cdf)


def _library_xmin(x: np.ndarray, law: str) -> float:
    """The xmin the powerlaw library picks for ``law`` (its own search, all candidates)."""
    import powerlaw

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        xmin = float(powerlaw.Fit(x, xmin_distribution=law, verbose=False).xmin)
    if not math.isfinite(xmin):
        raise FitError(f"the powerlaw library found no valid xmin for a {law.replace('_', ' ')}")
    return xmin


def _search_tpl(x: np.ndarray, min_tail: int) -> float:
    """The xmin whose truncated-power-law fit has the smallest KS distance (every
    candidate of the power law's rule; each fit warm-started from the next larger one)."""
    starts = _starts(x, min_tail)
    if len(starts) == 0:
        raise FitError(_too_few(x, min_tail))
    best, best_d, warm = None, math.inf, None
    for start in starts[::-1]:
        xmin, tail = float(x[start]), x[start:]
        try:
            alpha, lam, _ = _tpl_mle(tail, xmin, warm)
            d = _tpl_ks(tail, xmin, alpha, lam)
        except (ValueError, FloatingPointError, OverflowError):
            continue
        warm = (alpha, lam)
        if d <= best_d:  # ties: the smallest xmin (scanned last)
            best, best_d = xmin, d
    if best is None:
        raise FitError("no xmin candidate gives a truncated power law")
    return best


def fit_truncated_power_law(
    data: Any,
    *,
    xmin: float | None = None,
    xmax: float | None = None,
    fit_method: str = "diffract",
    min_tail: int = 50,
) -> TruncatedPowerLawFit:
    """Fit ``p(x) ~ x^-alpha exp(-lambda x)`` to the tail ``x >= xmin`` by maximum likelihood.

    ``fit_method="diffract"`` maximises the exact likelihood (normalisation
    ``xmin^(1-alpha) E_alpha(lambda xmin)``, a generalized exponential integral) with
    L-BFGS-B from several starts; ``"powerlaw"`` uses the library's fit (its parameter
    ranges included). The KS distance follows the module's definition. ``xmin`` None:
    the xmin of smallest KS distance for this law (``"diffract"``: over the power law's
    candidates with ``min_tail``, each fit warm-started from its neighbour: a few ms a
    candidate; ``"powerlaw"``: the library's own search).
    """
    _check_method(fit_method)
    method = "powerlaw" if fit_method == "powerlaw" else "diffract"
    if xmin is None:
        x = _prepare(data, xmax)
        xmin = (_library_xmin(x, "truncated_power_law") if method == "powerlaw"
                else _search_tpl(x, min_tail))
    tail = _tail(data, xmin, xmax)
    if method == "powerlaw":
        import powerlaw

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            fit = powerlaw.Fit(tail, xmin=xmin, verbose=False).truncated_power_law
            alpha, lam = float(fit.alpha), float(fit.Lambda)
    else:
        alpha, lam, _ = _tpl_mle(tail, xmin)
    ll = float(np.sum(_tpl_pointwise(tail, xmin, alpha, lam)))
    return TruncatedPowerLawFit(alpha, lam, float(xmin), _tpl_ks(tail, xmin, alpha, lam), ll,
                                len(tail), method)


def _search_exponential(x: np.ndarray, min_tail: int) -> float:
    """The xmin whose exponential fit (closed form per candidate) has the smallest KS
    distance, every candidate against every tail point in one dense pass."""
    starts = _starts(x, min_tail)
    if len(starts) == 0:
        raise FitError(_too_few(x, min_tail))
    suffix = np.cumsum(x[::-1])[::-1]
    xmins = x[starts]
    with np.errstate(divide="ignore"):
        lam = 1.0 / (suffix[starts] / (len(x) - starts) - xmins)

    def cdf(block: slice, cols: np.ndarray) -> np.ndarray:
        return -np.expm1(-lam[block, None] * (x[cols][None, :] - xmins[block, None]))

    dist = _dense_ks(x, starts, cdf)
    return float(xmins[_smallest_winner(np.arange(len(dist)), dist)])


def fit_exponential(
    data: Any,
    *,
    xmin: float | None = None,
    xmax: float | None = None,
    fit_method: str = "diffract",
    min_tail: int = 50,
) -> ExponentialFit:
    """Fit ``p(x) = lambda exp(-lambda (x - xmin))`` to the tail by maximum likelihood.

    ``"diffract"``: the closed form ``lambda = 1 / mean(x - xmin)``; ``"powerlaw"``: the
    library's numerical fit. ``xmin`` None: the xmin of smallest KS distance for this law
    (``"diffract"``: every candidate of the power law's rule with ``min_tail``, in one
    dense pass; ``"powerlaw"``: the library's own search).
    """
    _check_method(fit_method)
    if xmin is None:
        x = _prepare(data, xmax)
        xmin = (_library_xmin(x, "exponential") if fit_method == "powerlaw"
                else _search_exponential(x, min_tail))
    tail = _tail(data, xmin, xmax)
    if fit_method == "powerlaw":
        import powerlaw

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lam = float(powerlaw.Fit(tail, xmin=xmin, verbose=False).exponential.Lambda)
        method = "powerlaw"
    else:
        lam = 1.0 / float(np.mean(tail - xmin))
        method = "diffract"
    ll = float(np.sum(math.log(lam) - lam * (tail - xmin)))
    d = _ks(tail, lambda u: 1.0 - np.exp(-lam * (u - xmin)))
    return ExponentialFit(lam, float(xmin), d, ll, len(tail), method)


def _pl_pointwise(tail: np.ndarray, xmin: float, alpha: float) -> np.ndarray:
    return math.log(alpha - 1.0) - math.log(xmin) - alpha * np.log(tail / xmin)


def _lognormal_pointwise(tail: np.ndarray, xmin: float) -> np.ndarray:
    from scipy.optimize import minimize
    from scipy.special import log_ndtr

    logs = np.log(tail)

    def pointwise(mu: float, sigma: float) -> np.ndarray:
        z = (logs - mu) / sigma
        log_q = log_ndtr(-(math.log(xmin) - mu) / sigma)  # P(X >= xmin)
        return -logs - math.log(sigma) - 0.5 * math.log(2 * math.pi) - 0.5 * z * z - log_q

    def negll(p: np.ndarray) -> float:
        value = float(np.sum(pointwise(p[0], math.exp(p[1]))))
        return -value if math.isfinite(value) else 1e300

    start = [float(np.mean(logs)), math.log(max(float(np.std(logs)), 1e-3))]
    res = minimize(negll, x0=start, method="L-BFGS-B",
                   bounds=[(float(logs.min()) - 50.0, float(logs.max()) + 50.0), (-10.0, 5.0)])
    return pointwise(float(res.x[0]), math.exp(float(res.x[1])))


def compare_distributions(
    data: Any, *, xmin: float, alpha: float | None = None, xmax: float | None = None
) -> dict[str, Comparison]:
    """Likelihood-ratio tests of the power law against the truncated power law (nested:
    Wilks, ``p = chi2_1.sf(2|R|)``), the exponential and the lognormal (non-nested: Vuong,
    ``p = erfc(|R| / (sqrt(2 n) s))``, ``s`` the standard deviation of the pointwise
    log-likelihood ratios), all on the tail ``x >= xmin``. ``R > 0`` favours the power law.

    Each alternative is fitted by maximum likelihood on the tail. The lognormal's
    maximum may lie at infinity (its limit is a power law); then the limit is used: a
    lognormal is never reported worse than the power law it can become, so on power-law
    data ``R`` against it is 0 with ``p = 1`` (no evidence either way), where optimisers
    that stop on the ridge would report an arbitrary small positive ``R``.
    """
    from scipy.special import erfc
    from scipy.stats import chi2

    tail = _tail(data, xmin, xmax)
    m = len(tail)
    mle = 1.0 + m / float(np.sum(np.log(tail / xmin)))
    if alpha is None:
        alpha = mle
    ll_pl = _pl_pointwise(tail, xmin, alpha)
    t_alpha, t_lam, _ = _tpl_mle(tail, xmin)
    lam = 1.0 / float(np.mean(tail - xmin))
    # The truncated lognormal tends to a power law as mu -> -inf and sigma -> inf (with
    # -mu / sigma^2 = alpha - 1): on power-law-like data its likelihood has no finite
    # maximum, only that limit, and optimisers stop anywhere along the ridge. Its
    # supremum is therefore at least the fitted power law's likelihood: use that limit
    # whenever no finite lognormal beats it (then R = 0 for alpha at the MLE, p = 1).
    ll_logn = _lognormal_pointwise(tail, xmin)
    ll_limit = _pl_pointwise(tail, xmin, mle)
    if float(np.sum(ll_logn)) < float(np.sum(ll_limit)):
        ll_logn = ll_limit
    alternatives = {
        "truncated_power_law": (_tpl_pointwise(tail, xmin, t_alpha, t_lam), True),
        "exponential": (math.log(lam) - lam * (tail - xmin), False),
        "lognormal": (ll_logn, False),
    }
    out = {}
    for name, (ll_alt, nested) in alternatives.items():
        diff = ll_pl - ll_alt
        r = float(np.sum(diff))
        if nested:
            p = float(chi2.sf(2.0 * abs(r), 1))
        else:
            s = float(np.std(diff))
            p = float(erfc(abs(r) / (math.sqrt(2.0 * m) * s))) if s > 0 else 1.0
        out[name] = Comparison(name, r, p, nested)
    return out


# -- bootstrap -------------------------------------------------------------------------------
def power_law_pvalue(
    data: Any,
    *,
    fit: PowerLawFit | None = None,
    n_replicates: int = 100,
    seed: int = 0,
    fit_method: str = "auto",
    min_tail: int = 50,
    xmax: float | None = None,
    xmin: str = "search",
    alpha_max: float | None = None,
) -> PValue:
    """Goodness-of-fit p-value of the power-law fit by the CSN semi-parametric bootstrap.

    Each replicate draws ``n`` points: with probability ``n_tail / n`` from the fitted
    power law above xmin, otherwise uniformly from the data below xmin; it is refitted
    with the same method and candidate rule (``xmin="search"``, CSN), or with xmin held
    at the fitted one (``xmin="fixed"``: the original Diffract's shortcut, tens of times
    faster and biased towards high p, since a replicate's own best xmin would fit it
    better), and counts when its KS distance is at least the observed one. ``p`` is NaN
    (with a reason) when the fitted tail has fewer than 50 points. Reproducible for a
    seed; its standard error is about ``sqrt(p (1 - p) / n_replicates)``.
    """
    if n_replicates < 1:
        raise FitArgumentError(f"n_replicates must be at least 1, got {n_replicates}.")
    if xmin not in ("search", "fixed"):
        raise FitArgumentError(f"xmin must be 'search' or 'fixed', got {xmin!r}.")
    x = _prepare(data, xmax)
    if fit is None:
        fit = fit_power_law(x, fit_method=fit_method, min_tail=min_tail, alpha_max=alpha_max)
    if fit.n_tail < 50:
        return PValue(math.nan, fit.ks_distance, 0, seed)
    method = resolve_fit_method(fit_method, len(x))
    batched = (method == "diffract" and xmin == "search" and len(x) > PVALUE_TAICHI_POINTS
               and _taichi.available())
    rng = np.random.default_rng(seed)
    body = x[x < fit.xmin]
    n = len(x)
    replicates = []
    for _ in range(n_replicates):
        k = int(rng.binomial(n, fit.n_tail / n)) if len(body) else n
        replicates.append(np.concatenate([
            fit.xmin * (1.0 - rng.random(k)) ** (-1.0 / (fit.alpha - 1.0)),
            rng.choice(body, n - k) if n - k else np.empty(0),
        ]))
    if batched:
        distances = _replicate_distances(replicates, min_tail, alpha_max)
    else:
        distances = []
        for synthetic in replicates:
            try:
                if xmin == "fixed":
                    refit = _fit_at(np.sort(synthetic), fit.xmin, method)
                else:
                    refit = fit_power_law(synthetic, fit_method=method, min_tail=min_tail,
                                          alpha_max=alpha_max)
            except FitError:
                continue
            distances.append(refit.ks_distance)
    done = len(distances)
    hits = sum(d >= fit.ks_distance for d in distances)
    p = hits / done if done else math.nan
    return PValue(p, fit.ks_distance, done, seed)


#: Replicates whose searches share one set of Taichi launches.
_REPLICATE_BATCH = 64


def _replicate_distances(replicates: list[np.ndarray], min_tail: int,
                         alpha_max: float | None) -> list[float]:
    """The KS distance of each replicate's best power-law fit (the full CSN search, as
    ``fit_power_law`` does it), the replicates' searches batched into shared Taichi
    launches (the per-launch cost, not the scan, dominated one replicate's fit);
    replicates with no candidate are left out."""
    out: list[float] = []
    for lo in range(0, len(replicates), _REPLICATE_BATCH):
        xs, starts_list = [], []
        for synthetic in replicates[lo:lo + _REPLICATE_BATCH]:
            x = _prepare(synthetic)
            if len(x) < min_tail:
                continue
            starts = _starts(x, min_tail)
            if alpha_max is not None and len(starts):
                starts = starts[_alphas(x, starts) <= alpha_max]
            if len(starts):
                xs.append(x)
                starts_list.append(starts)
        if not xs:
            continue
        winners, _ = _search_many(xs, starts_list)
        for x, starts, best in zip(xs, starts_list, winners, strict=True):
            out.append(_exact_fit(x, int(starts[best]))[1])
    return out
