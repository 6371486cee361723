"""Fitting heavy-tailed distributions to 1-D data (spectra): power law, truncated power
law, exponential (likelihood-ratio comparisons and the CSN bootstrap p-value are in
:mod:`~diffract_kernels_spectral.significance`).

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
everything. Up to ``DENSE_MAX_POINTS`` (1024) points, unless Taichi is already running,
it scans every candidate in one dense numpy pass instead (no Taichi start-up; same
distances, same tie rule). ``"auto"`` (the default) is that exact search at every size,
the dense pass where Taichi cannot run: the CSN fit at its own xmin, exponents unbounded.
``"powerlaw"`` calls the powerlaw library (parity with it, including its limit: powerlaw
2.0 searches alpha in [0, 3] only): a fit on that bound is undefined, and one whose xmin
search the bound constrained (a candidate with alpha above 3 that would have won was
left out, so another xmin won) is marked ``bounded``. ``"small_sample"`` is the fit
WeightWatcher 0.7.7 makes of fewer than 20 points (:func:`fit_power_law_small_sample`),
at any size; ``"weightwatcher"`` is WeightWatcher 0.7.7's choice: that fit below 20
points, the exact search from 20, nothing below 8 (it skips such layers).
"""

from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np

from diffract_kernels_spectral import _taichi
from diffract_kernels_spectral._records import (
    ExponentialFit,
    PowerLawFit,
    TruncatedPowerLawFit,
)
from diffract_kernels_spectral._search import (
    _alphas,
    _dense_ks,
    _exact_fit,
    _ks,
    _ks_power_law,
    _prepare,
    _search,
    _search_dense,
    _smallest_winner,
    _starts,
    _too_few,
    candidate_range,
)
from diffract_kernels_spectral.errors import FitArgumentError, FitError

__all__ = [
    "candidate_range",
    "fit_exponential",
    "fit_power_law",
    "fit_power_law_small_sample",
    "fit_truncated_power_law",
    "resolve_fit_method",
]

_METHODS = ("auto", "diffract", "powerlaw", "small_sample", "weightwatcher")
#: WeightWatcher 0.7.7 (WW_powerlaw.SMALL_N_CUTOFF): below this many eigenvalues its
#: power law is the small-sample fit.
WW_SMALL_N = 20
#: WeightWatcher 0.7.7 (constants.DEFAULT_MIN_EVALS): layers of fewer eigenvalues are not
#: analysed, and a small-sample tail holds at least this many points (its k_min).
WW_MIN_EVALS = 8
#: The small-sample fit's tail-size term (the objective WeightWatcher 0.7.7's small-sample
#: fit states; see fit_power_law_small_sample).
SMALL_SAMPLE_WEIGHT = 0.868
#: Up to this many points, while Taichi is not running, the exact search is one dense
#: numpy pass over every (candidate, tail point) pair: it saves Taichi's start-up (about
#: 1 s: import, runtime, kernel compilation) and costs 1.9 / 5.5 / 12.3 ms per fit at
#: 384 / 768 / 1024 points (2.7 / 12.1 / 24.9 ms before its blocks skipped the points
#: below their xmin, same run, a slow hour of this VM) against the warm pruned search's
#: ~1.1 ms, so a fresh process fitting a few hundred spectra is faster without Taichi.
DENSE_MAX_POINTS = 1024


# -- method selection ------------------------------------------------------------------
def _check_method(fit_method: str) -> None:
    if fit_method not in _METHODS:
        raise FitArgumentError(
            f"Unknown fit_method {fit_method!r}; choose one of {list(_METHODS)}."
        )


def resolve_fit_method(fit_method: str, n_points: int) -> str:
    """The implementation ``fit_method`` means for ``n_points`` points: ``diffract`` (the
    exact search), ``powerlaw`` or ``small_sample``.

    Raises :class:`FitUnavailableError` for "diffract" above DENSE_MAX_POINTS points when
    taichi cannot run ("auto" scans densely then), and :class:`FitArgumentError` for an
    unknown name.
    """
    _check_method(fit_method)
    if fit_method in ("powerlaw", "small_sample"):
        return fit_method
    if fit_method == "weightwatcher":
        return "small_sample" if n_points < WW_SMALL_N else "diffract"
    if fit_method == "diffract" and n_points > DENSE_MAX_POINTS:
        _taichi.kernels()
    return "diffract"


# -- power law -------------------------------------------------------------------------
def _fit_diffract(x: np.ndarray, min_tail: int, alpha_max: float | None = None) -> PowerLawFit:
    starts = _starts(x, min_tail)
    if len(starts) == 0:
        raise FitError(_too_few(x, min_tail))
    if alpha_max is not None:
        starts = starts[_alphas(x, starts) <= alpha_max]
        if len(starts) == 0:
            raise FitError(f"every xmin candidate gives alpha > alpha_max={alpha_max}")
    if (len(x) <= DENSE_MAX_POINTS and not _taichi.running()) or not _taichi.available():
        best = _search_dense(x, starts)  # (auto without taichi: the same answer, slower)
    else:
        best, _ = _search(x, starts)
    start = int(starts[best])
    alpha, d = _exact_fit(x, start)
    n_tail = len(x) - start
    return PowerLawFit(alpha, float(x[start]), d, (alpha - 1) / math.sqrt(n_tail), n_tail,
                       len(x), float(x[-1]), len(starts), "diffract")


#: powerlaw 2.0 searches alpha in [0, 3] only (Power_Law.parameter_range).
POWERLAW_ALPHA_MAX = 3.0


def _check_library_bound(x: np.ndarray, xmin: float, alpha: float) -> None:
    """Refuse (FitError) a library fit whose exponent is its search's bound: where the
    exact MLE at the library's xmin exceeds 3, the library reports 3 (or near it, where
    its Nelder-Mead refit stopped), which is no estimate. Small spectra (a head's 32-128
    singular values) hit it often."""
    tail = x[x >= xmin]
    logs = float(np.sum(np.log(tail / xmin)))
    exact = 1.0 + len(tail) / logs if logs > 0 else math.inf
    if exact > POWERLAW_ALPHA_MAX or abs(alpha - POWERLAW_ALPHA_MAX) < 1e-6:
        raise FitError(f"the powerlaw library's fit stopped on its bound alpha = 3 (it "
                       f"searches [0, 3]; the exact MLE at its xmin {xmin:.4g} is "
                       f"{exact:.4g}): not an estimate; fit_method='diffract' fits without "
                       "that bound")


def _constrained(x: np.ndarray, d_library: float) -> bool:
    """Whether the library's bound constrained its xmin search: the candidate of smallest
    KS distance over all of its candidates (every distinct value but the largest, the same
    distances) has alpha above 3 and beats the library's pick, which it could not take."""
    starts = _starts(x, 2)
    if len(starts) == 0:
        return False
    alpha, d = _exact_fit(x, int(starts[_search_dense(x, starts)]))
    return alpha > POWERLAW_ALPHA_MAX and d < d_library - 1e-12


def fit_power_law_small_sample(data: Any, *, min_tail: int = WW_MIN_EVALS,
                               tail_weight: float = SMALL_SAMPLE_WEIGHT) -> PowerLawFit:
    """The small-sample power law of WeightWatcher 0.7.7 (``WWFit.fit_powerlaw_smallN``,
    which it uses below 20 eigenvalues), for spectra of a few dozen points (heads,
    experts).

    For each xmin candidate (a data value other than the largest, with a tail of at least
    ``min_tail`` points: WeightWatcher's k_min is 8) the exponent is the bias-corrected
    MLE ``alpha = 1 + (n - 1) / sum(ln(x_i / xmin))`` over the tail's n points, and its KS
    distance ``D = max |i / n - (1 - (x_(i) / xmin)^(1 - alpha))|`` (i = 0..n-1, the tail in
    order); the fit is the candidate of smallest ``D - tail_weight / sqrt(n)`` (the
    smallest xmin among ties): 0.868, the objective WeightWatcher's small-sample fit
    states, favours longer tails. WeightWatcher 0.7.7 itself returns the candidate of
    smallest ``D`` (its ``WWFit.__init__`` takes the argmin of the distances after that
    fit, overriding the objective's choice): ``tail_weight=0`` is what it returns.
    Candidates with alpha <= 1 or no spread are left out; where none is left the whole
    spectrum is the tail. ``sigma = (alpha - 1) / sqrt(n)``. Raises FitError when
    nothing can be fitted.
    """
    x = _prepare(data)
    if len(x) < 2 or x[0] == x[-1]:
        raise FitError(_too_few(x, 2))
    logs = np.log(x)
    best: tuple[float, int, float, float] | None = None  # (objective, start, D, alpha)
    for start in range(len(x) - 1 - max(min_tail - 2, 0)):  # tails of min_tail points on
        fit = _small_sample_at(x, logs, start)
        if fit is None:
            continue
        objective = fit[0] - tail_weight / math.sqrt(len(x) - start)
        if best is None or objective < best[0]:  # the first of equals: the smallest xmin
            best = (objective, start, *fit)
    if best is None:  # no candidate: the whole spectrum is the tail, as WeightWatcher's
        fit = _small_sample_at(x, logs, 0)
        if fit is None:
            raise FitError("the spectrum has no spread above its smallest value: a power "
                           "law cannot be fitted")
        best = (0.0, 0, *fit)
    _, start, d, alpha = best
    n_tail = len(x) - start
    return PowerLawFit(alpha, float(x[start]), d, (alpha - 1) / math.sqrt(n_tail), n_tail,
                       len(x), float(x[-1]), len(x) - 1, "small_sample")


def _small_sample_at(x: np.ndarray, logs: np.ndarray, start: int) -> tuple[float, float] | None:
    """(D, alpha) of the small-sample fit with the tail from sorted index ``start``, or
    None when the tail has no spread or its exponent is not above 1."""
    n = len(x) - start
    spread = float(np.sum(logs[start:]) - n * logs[start])
    if spread <= 1e-12:
        return None
    alpha = 1.0 + (n - 1.0) / spread
    if alpha <= 1.0:
        return None
    fitted = 1.0 - (x[start:] / x[start]) ** (1.0 - alpha)
    return float(np.max(np.abs(np.arange(n) / n - fitted))), alpha


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
    _check_library_bound(x, fitted_xmin, alpha)
    n_cand = 0 if xmin is not None else len(np.unique(x)) - 1
    return PowerLawFit(alpha, fitted_xmin, d, sigma, n_tail, len(x), float(x[-1]), n_cand,
                       "powerlaw", bounded=xmin is None and _constrained(x, d))


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
    if alpha_max is not None and method in ("powerlaw", "small_sample") and xmin is None:
        raise FitArgumentError(
            f"alpha_max needs fit_method='diffract' or 'auto' (the {method} fit cannot "
            "leave out candidates by their exponent).")
    if fit_method == "weightwatcher" and len(x) < WW_MIN_EVALS:
        raise FitError(f"only {len(x)} positive eigenvalue(s): WeightWatcher 0.7.7 analyses "
                       f"no layer of fewer than {WW_MIN_EVALS}")
    if method == "small_sample" and fit_method == "weightwatcher" and xmin is None:
        return fit_power_law_small_sample(x, min_tail=WW_MIN_EVALS, tail_weight=0.0)
    if len(x) < min_tail:
        raise FitError(_too_few(x, min_tail))
    if method == "small_sample" and xmin is None:
        return fit_power_law_small_sample(x, min_tail=min_tail)
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

