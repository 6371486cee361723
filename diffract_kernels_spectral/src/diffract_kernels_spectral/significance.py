"""Is the power law the right law? Likelihood-ratio comparisons with the alternatives
(Vuong's test for non-nested laws, Wilks' for the nested truncated power law) and the CSN
semi-parametric bootstrap p-value of the fit."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from diffract_kernels_spectral import _taichi
from diffract_kernels_spectral._records import AlphaInterval, Comparison, PowerLawFit, PValue
from diffract_kernels_spectral._search import _alphas, _exact_fit, _prepare, _search_many, _starts
from diffract_kernels_spectral.errors import FitArgumentError, FitError
from diffract_kernels_spectral.fitting import (
    _tail,
    _tpl_mle,
    _tpl_pointwise,
    fit_power_law,
    resolve_fit_method,
)

__all__ = ["compare_distributions", "power_law_alpha_interval", "power_law_pvalue"]

#: Above this many points a bootstrap p-value starts Taichi (about 1 s, once per
#: process) for its replicates: at 768 points a replicate then costs ~1 ms instead of the
#: dense scan's ~3 ms, so 100 replicates pay for the start-up on the first layer or two.
PVALUE_TAICHI_POINTS = 256


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
    if xmin == "fixed":
        distances = _fixed_xmin_distances(x, fit, n_replicates, seed)
    else:
        distances = [d for _, d in _refits(_replicates(x, fit, n_replicates, seed),
                                           fit_method, min_tail, alpha_max)]
    done = len(distances)
    hits = sum(d >= fit.ks_distance for d in distances)
    p = hits / done if done else math.nan
    return PValue(p, fit.ks_distance, done, seed)


def power_law_alpha_interval(
    data: Any,
    *,
    fit: PowerLawFit | None = None,
    level: float = 0.9,
    n_replicates: int = 100,
    seed: int = 0,
    fit_method: str = "auto",
    min_tail: int = 50,
    xmax: float | None = None,
    alpha_max: float | None = None,
) -> AlphaInterval:
    """Bootstrap confidence interval of the power law's exponent: the replicates of
    :func:`power_law_pvalue` (the same generator: the same seed gives the same data
    sets), each refitted with its own xmin search, and the ``(1 - level) / 2`` and ``(1 +
    level) / 2`` quantiles of their exponents (the percentile interval). The xmin search
    is part of what varies, so the interval is wider than the MLE's ``alpha +- z
    sigma``, which holds xmin fixed. NaN bounds when the tail has fewer than 50 points or
    fewer than 10 replicates could be refitted."""
    if not 0.0 < level < 1.0:
        raise FitArgumentError(f"level must be between 0 and 1 (e.g. 0.9), got {level!r}.")
    if n_replicates < 10:
        raise FitArgumentError(f"n_replicates must be at least 10, got {n_replicates}.")
    x = _prepare(data, xmax)
    if fit is None:
        fit = fit_power_law(x, fit_method=fit_method, min_tail=min_tail, alpha_max=alpha_max)
    if fit.n_tail < 50:
        return AlphaInterval(math.nan, math.nan, fit.alpha, level, 0, seed)
    alphas = np.array([a for a, _ in _refits(_replicates(x, fit, n_replicates, seed),
                                             fit_method, min_tail, alpha_max)])
    if len(alphas) < 10:
        return AlphaInterval(math.nan, math.nan, fit.alpha, level, len(alphas), seed)
    low, high = np.quantile(alphas, [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return AlphaInterval(float(low), float(high), fit.alpha, level, len(alphas), seed)


def _replicates(x: np.ndarray, fit: PowerLawFit, n_replicates: int,
                seed: int) -> list[np.ndarray]:
    """CSN's semi-parametric bootstrap data sets of sorted positive ``x``: each of
    ``len(x)`` points, with probability ``n_tail / n`` drawn from the fitted power law
    above xmin, otherwise uniformly from the data below xmin (all from the power law
    when nothing lies below). Reproducible for a seed."""
    rng = np.random.default_rng(seed)
    body = x[x < fit.xmin]
    n = len(x)
    out = []
    for _ in range(n_replicates):
        k = int(rng.binomial(n, fit.n_tail / n)) if len(body) else n
        out.append(np.concatenate([
            fit.xmin * (1.0 - rng.random(k)) ** (-1.0 / (fit.alpha - 1.0)),
            rng.choice(body, n - k) if n - k else np.empty(0),
        ]))
    return out


def _refits(replicates: list[np.ndarray], fit_method: str, min_tail: int,
            alpha_max: float | None) -> list[tuple[float, float]]:
    """(alpha, KS distance) of each replicate's best power-law fit, the full xmin search
    as ``fit_power_law`` does it: in shared Taichi launches above PVALUE_TAICHI_POINTS
    points, one fit at a time otherwise. Replicates that cannot be fitted are left out."""
    size = len(replicates[0]) if replicates else 0
    method = resolve_fit_method(fit_method, size)
    if method == "diffract" and size > PVALUE_TAICHI_POINTS and _taichi.available():
        return _replicate_fits(replicates, min_tail, alpha_max)
    out = []
    for synthetic in replicates:
        try:
            refit = fit_power_law(synthetic, fit_method=method, min_tail=min_tail,
                                  alpha_max=alpha_max)
        except FitError:
            continue
        out.append((refit.alpha, refit.ks_distance))
    return out


def _fixed_xmin_distances(x: np.ndarray, fit: PowerLawFit, n_replicates: int,
                          seed: int) -> list[float]:
    """The KS distance of each replicate's power law fitted at the observed xmin, all
    replicates as one array computation.

    Held at xmin, a replicate's fit reads only its points from the power law (the
    resampled body lies below xmin), so only those are drawn: the tail sizes ``k_r ~
    Binomial(n, n_tail / n)`` in one call (all ``n`` when nothing lies below xmin), then
    ``sum k_r`` uniforms ``u`` in one call, split in order; ``ln(x / xmin) = -ln(1 - u) /
    (alpha - 1)``. Each row is sorted, its MLE is ``1 + k_r / sum ln(x / xmin)``, its
    model CDF ``1 - exp((1 - alpha_r) ln(x / xmin))`` is compared with the left
    empirical CDF (first index of the value / k_r: ties count once). Replicates with
    fewer than 2 distinct tail values are left out.
    """
    rng = np.random.default_rng(seed)
    n = len(x)
    if np.any(x < fit.xmin):
        sizes = rng.binomial(n, fit.n_tail / n, size=n_replicates)
    else:
        sizes = np.full(n_replicates, n)
    logs = -np.log1p(-rng.random(int(sizes.sum()))) / (fit.alpha - 1.0)
    width = max(int(sizes.max()), 1)
    rows = np.full((n_replicates, width), np.inf)
    inside = np.arange(width) < sizes[:, None]
    rows[inside] = logs  # row-major: each row gets its own draws, in order
    rows.sort(axis=1)
    finite = np.where(inside, rows, 0.0)
    last = rows[np.arange(n_replicates), np.maximum(sizes - 1, 0)]
    keep = (sizes >= 2) & (rows[:, 0] != last)
    with np.errstate(divide="ignore", invalid="ignore"):
        alpha = 1.0 + sizes / finite.sum(axis=1)
        model = -np.expm1((1.0 - alpha[:, None]) * finite)
    position = np.arange(width)
    new = np.ones(rows.shape, dtype=bool)
    new[:, 1:] = rows[:, 1:] != rows[:, :-1]
    first = np.maximum.accumulate(np.where(new, position, 0), axis=1)
    gaps = np.where(inside, np.abs(model - first / np.maximum(sizes, 1)[:, None]), 0.0)
    return [float(d) for d in gaps.max(axis=1)[keep]]


#: Replicates whose searches share one set of Taichi launches.
_REPLICATE_BATCH = 64


def _replicate_fits(replicates: list[np.ndarray], min_tail: int,
                    alpha_max: float | None) -> list[tuple[float, float]]:
    """(alpha, KS distance) of each replicate's best power-law fit (the full CSN search,
    as ``fit_power_law`` does it), the replicates' searches batched into shared Taichi
    launches (the per-launch cost, not the scan, dominated one replicate's fit);
    replicates with no candidate are left out."""
    out: list[tuple[float, float]] = []
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
            out.append(_exact_fit(x, int(starts[best])))
    return out
