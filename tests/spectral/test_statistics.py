"""Likelihood-ratio statistics and p-values against an independent scipy computation,
the KS distances of the alternative fits by direct evaluation, and the calibration of the
bootstrap p-value."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import integrate, optimize, stats

from diffract_kernels_spectral import (
    compare_distributions,
    fit_exponential,
    fit_truncated_power_law,
    power_law_pvalue,
)
from tests.spectral.conftest import needs_taichi, pareto


def _tpl_logpdf(x: np.ndarray, xmin: float, alpha: float, lam: float) -> np.ndarray:
    """log of x^-alpha e^(-lam x) / C on [xmin, inf), C by numerical integration."""
    c, _ = integrate.quad(lambda u: u ** -alpha * math.exp(-lam * u), xmin, np.inf,
                          epsabs=0, epsrel=1e-12, limit=200)
    return -alpha * np.log(x) - lam * x - math.log(c)


def _tpl_mle(x: np.ndarray, xmin: float) -> tuple[float, float, float]:
    """The truncated power law's MLE by Nelder-Mead from a few starts (our own fitter
    is L-BFGS-B on a closed-form normaliser; this one integrates numerically)."""
    scale = 1.0 / np.mean(x)

    def nll(p):
        alpha, log_lam = p
        try:
            return -float(np.sum(_tpl_logpdf(x, xmin, alpha, math.exp(log_lam) * scale)))
        except (OverflowError, ValueError, ZeroDivisionError):
            return 1e300

    best = None
    for a0, l0 in ((1.3, 0.0), (1.8, -2.0), (2.5, -6.0)):
        res = optimize.minimize(nll, [a0, l0], method="Nelder-Mead",
                                options={"xatol": 1e-9, "fatol": 1e-10, "maxiter": 4000})
        if best is None or res.fun < best.fun:
            best = res
    return float(best.x[0]), math.exp(float(best.x[1])) * scale, -float(best.fun)


def _data(kind: str, rng: np.random.Generator) -> np.ndarray:
    if kind == "power-law":
        return pareto(rng, 1500, 2.4, 1.0)
    if kind == "cutoff":
        x = pareto(rng, 8000, 1.8, 1.0)
        return x[rng.random(len(x)) < np.exp(-0.1 * x)]
    if kind == "lognormal":
        x = rng.lognormal(0.5, 0.9, 6000)
        return x[x >= 1.0]
    x = 1.0 + rng.exponential(2.0, 1500)
    return x


class TestLikelihoodRatios:
    @pytest.mark.parametrize("kind", ["power-law", "cutoff", "lognormal", "exponential"])
    def test_ratios_and_p_values_match_scipy(self, kind):
        """R = sum(log p_pl - log p_alt) and its p-value (Wilks chi2_1 for the nested
        truncated power law, Vuong's normal test otherwise) equal an independent
        computation with scipy's distributions, integrator and optimiser."""
        rng = np.random.default_rng({"power-law": 1, "cutoff": 2, "lognormal": 3,
                                     "exponential": 4}[kind])
        x, xmin = _data(kind, rng), 1.0
        x = x[x >= xmin]
        n = len(x)
        ours = compare_distributions(x, xmin=xmin)
        alpha = 1.0 + n / np.sum(np.log(x / xmin))
        ll_pl = stats.pareto(b=alpha - 1.0, scale=xmin).logpdf(x)

        lam = 1.0 / np.mean(x - xmin)
        ll_exp = stats.expon(loc=xmin, scale=1.0 / lam).logpdf(x)

        def lognormal_nll(p):
            d = stats.lognorm(s=math.exp(p[1]), scale=math.exp(p[0]))
            return -float(np.sum(d.logpdf(x) - d.logsf(xmin)))

        logs = np.log(x)
        res = optimize.minimize(lognormal_nll, [logs.mean(), math.log(logs.std())],
                                method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-11,
                                                               "maxiter": 1500})
        d = stats.lognorm(s=math.exp(res.x[1]), scale=math.exp(res.x[0]))
        ll_logn = d.logpdf(x) - d.logsf(xmin)
        if ll_logn.sum() < ll_pl.sum():  # the family's supremum includes its power-law limit
            ll_logn = ll_pl

        t_alpha, t_lam, _ = _tpl_mle(x, xmin)
        ll_tpl = _tpl_logpdf(x, xmin, t_alpha, t_lam)

        for name, ll_alt, nested in (("exponential", ll_exp, False), ("lognormal", ll_logn, False),
                                     ("truncated_power_law", ll_tpl, True)):
            diff = ll_pl - ll_alt
            r = float(np.sum(diff))
            if nested:
                p = float(stats.chi2(df=1).sf(2 * abs(r)))
            elif np.std(diff) == 0:
                p = 1.0
            else:
                p = float(2 * stats.norm.sf(abs(r) / (math.sqrt(n) * np.std(diff))))
            got = ours[name]
            assert got.nested is nested
            # The optimisers agree on the maximum to ~1e-6 of the log-likelihood.
            assert got.R == pytest.approx(r, abs=1e-5 * max(1.0, abs(r))), name
            assert got.p == pytest.approx(p, rel=1e-3, abs=1e-12), name

    def test_the_truncated_fit_reaches_the_likelihood_maximum(self):
        """fit_truncated_power_law's parameters are the MLE (scipy's optimiser finds no
        higher likelihood)."""
        x = _data("cutoff", np.random.default_rng(2))
        ours = fit_truncated_power_law(x, xmin=1.0)
        alpha, lam, ll = _tpl_mle(x, 1.0)
        assert ours.loglikelihood == pytest.approx(ll, abs=1e-6 * abs(ll))
        assert ours.loglikelihood >= ll - 1e-6 * abs(ll)
        assert (ours.alpha, ours.lambda_) == pytest.approx((alpha, lam), rel=1e-3)


class TestKsDistancesOfAlternatives:
    def test_exponential_ks_by_direct_evaluation(self):
        """D of the exponential fit is max |F(u) - A(u)| over the distinct tail values,
        with F scipy's exponential CDF and A the empirical CDF just below u."""
        rng = np.random.default_rng(11)
        x = np.round(2.0 + rng.exponential(1.5, 800), 2)  # ties on purpose
        fit = fit_exponential(x, xmin=2.0)
        u = np.unique(x)
        below = np.searchsorted(np.sort(x), u, side="left") / len(x)
        direct = np.max(np.abs(stats.expon(loc=2.0, scale=1.0 / fit.lambda_).cdf(u) - below))
        assert fit.ks_distance == pytest.approx(direct, rel=1e-12)

    def test_truncated_power_law_ks_by_direct_evaluation(self):
        """D of the truncated fit against its CDF integrated numerically at each point."""
        rng = np.random.default_rng(12)
        x = pareto(rng, 2000, 1.9)
        x = x[rng.random(len(x)) < np.exp(-0.2 * x)][:300]
        fit = fit_truncated_power_law(x, xmin=1.0)
        a, lam = fit.alpha, fit.lambda_
        total, _ = integrate.quad(lambda v: v ** -a * math.exp(-lam * v), 1.0, np.inf,
                                  epsabs=0, epsrel=1e-12, limit=200)
        u = np.unique(x)
        cdf = np.array([integrate.quad(lambda v: v ** -a * math.exp(-lam * v), 1.0, t,
                                       epsabs=0, epsrel=1e-12, limit=200)[0] for t in u]) / total
        below = np.searchsorted(np.sort(x), u, side="left") / len(x)
        assert fit.ks_distance == pytest.approx(np.max(np.abs(cdf - below)), rel=1e-7)


@needs_taichi
class TestBootstrapCalibration:
    def test_p_values_are_roughly_uniform_for_power_laws(self):
        """Over 30 seeded power-law samples (xmin fitted each time) the p-values spread
        over [0, 1]: mean near 1/2, few below 0.1, some above 0.5."""
        rng = np.random.default_rng(31)
        ps = []
        for i in range(30):
            x = np.concatenate([rng.uniform(0.2, 1.0, 100), pareto(rng, 300, rng.uniform(2.0, 3.0))])
            ps.append(power_law_pvalue(x, n_replicates=40, seed=i, fit_method="diffract").p)
        ps = np.array(ps)
        assert 0.3 <= ps.mean() <= 0.7, ps
        assert np.mean(ps < 0.1) <= 0.25, ps
        assert np.mean(ps > 0.5) >= 0.25, ps

    def test_p_values_are_small_for_non_power_laws(self):
        """Exponential and lognormal samples are rejected when the tail must hold a
        quarter of the points (with the default min_tail of 50 the extreme tail of such
        data can pass: the method then fits what it is shown)."""
        rng = np.random.default_rng(32)
        ps = []
        for i in range(6):
            x = (1.0 + rng.exponential(1.0, 4000)) if i % 2 else rng.lognormal(0.0, 0.5, 4000)
            ps.append(power_law_pvalue(x, n_replicates=20, seed=i, fit_method="diffract",
                                       min_tail=1000).p)
        assert max(ps) <= 0.05, ps
