"""The public fitters against the powerlaw library, an exhaustive scan and known answers."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import stats

from diffract_kernels_spectral import (
    FitArgumentError,
    FitError,
    FitUnavailableError,
    _taichi,
    candidate_range,
    compare_distributions,
    fit_exponential,
    fit_power_law,
    fit_truncated_power_law,
    fitting,
    power_law_pvalue,
)
from tests.spectral.conftest import exhaustive, heavy_esd, needs_powerlaw, needs_taichi, pareto


def _library(x, xmin=None):
    import powerlaw

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return powerlaw.Fit(x, xmin=xmin, verbose=False)


def _cases():
    rng = np.random.default_rng(7)
    cases = []
    for n in (100, 300, 1000, 4000):
        for alpha in (1.8, 2.2, 2.6):
            cases.append(pytest.param(pareto(rng, n, alpha), id=f"pareto-n{n}-a{alpha}"))
    for n, m, df in ((100, 300, 1.5), (200, 400, 2.0), (300, 900, 1.5), (500, 1000, 2.0),
                     (1000, 2000, 1.5)):
        cases.append(pytest.param(heavy_esd(rng, n, m, df), id=f"esd-{n}x{m}-t{df}"))
    cases.append(pytest.param(pareto(rng, 20_000, 2.3), id="pareto-n20000-a2.3",
                              marks=pytest.mark.slow))
    return cases


@needs_powerlaw
@needs_taichi
class TestParityWithPowerlaw:
    @pytest.mark.parametrize("x", _cases())
    def test_same_xmin_and_alpha_on_the_same_candidates(self, x):
        """Given our candidate range, powerlaw picks the same xmin and alpha (1e-9 relative).

        powerlaw 2.x computes the exact CSN estimate only where the closed-form alpha is in
        (1.5, 3); elsewhere it refits numerically within [0, 3]. The data here keep the
        winning candidates inside that region, which the test checks first.
        """
        ours = fit_power_law(x, fit_method="diffract")
        lib = _library(x, xmin=candidate_range(x))
        table = lib.xmin_fitting_results
        exact = (table["alphas"] > 1.5) & (table["alphas"] < 3) & table["valid_fits"]
        assert len(table["xmins"]) == ours.n_candidates
        assert exact[np.argmin(np.where(table["valid_fits"], table["distances"], np.inf))]
        assert ours.xmin == lib.xmin
        assert ours.alpha == pytest.approx(lib.alpha, rel=1e-9)
        assert ours.ks_distance == pytest.approx(lib.power_law.D, rel=1e-9)
        assert ours.n_tail == int(np.sum(x >= ours.xmin))

    def test_powerlaw_method_is_the_library(self, rng):
        """fit_method='powerlaw' returns the library's own unrestricted result."""
        x = pareto(rng, 400, 2.4)
        ours = fit_power_law(x, fit_method="powerlaw")
        lib = _library(x)
        assert (ours.xmin, ours.alpha, ours.method) == (lib.xmin, lib.alpha, "powerlaw")

    def test_exponents_above_three_are_fitted(self, rng):
        """Unlike powerlaw 2.x (alpha bounded to [0, 3]), alpha = 4.5 is recovered."""
        x = pareto(rng, 5000, 4.5)
        fit = fit_power_law(x, fit_method="diffract")
        assert fit.alpha == pytest.approx(4.5, abs=4 * fit.sigma)


@needs_taichi
class TestExactSearch:
    @pytest.mark.parametrize("n", [120, 700, 3000])
    def test_bounded_search_equals_exhaustive_scan(self, rng, n):
        """Pruning by KS bounds gives exactly the exhaustive scan's winner."""
        x = np.concatenate([rng.lognormal(0, 1, n // 2), pareto(rng, n - n // 2, 2.2, 3.0)])
        rows = exhaustive(x)
        best = rows[np.argmin(rows[:, 2])]
        fit = fit_power_law(x, fit_method="diffract")
        assert fit.xmin == best[0]
        assert fit.alpha == pytest.approx(best[1], rel=1e-12)
        assert fit.ks_distance == pytest.approx(best[2], rel=1e-12)

    def test_the_check_near_a_peak_drops_only_candidates_that_cannot_win(self, rng):
        """After a bounds pass the search drops a survivor whose exact gap next to its
        peak exceeds the best distance: at the candidates' true peaks exactly those with
        a distance above best go; at random peaks none with a distance at most best."""
        from diffract_kernels_spectral import _search

        x = np.sort(np.concatenate([rng.lognormal(0, 1, 2000), pareto(rng, 3000, 2.2, 3.0)]))
        starts = _search._starts(x, 50)[::12]
        logx, first, n = np.log(x), _search._first_index(x).astype(np.int32), len(x)
        alphas = _search._alphas(x, starts)
        dist, peak = np.empty(len(starts)), np.empty(len(starts), dtype=np.int32)
        for i, (s, a) in enumerate(zip(starts, alphas, strict=True)):
            gaps = np.abs(-np.expm1((1 - a) * (logx[s:] - logx[s])) - (first[s:] - s) / (n - s))
            dist[i], peak[i] = gaps.max(), s + np.argmax(gaps)
            if i % 40 == 0:  # the same distance as the exact fit's
                assert dist[i] == pytest.approx(_search._exact_fit(x, s)[1], rel=1e-12)
        best = np.full(len(starts), np.median(dist))
        ids = np.arange(len(starts))
        args = (logx, first, starts.astype(np.int32), np.full(len(starts), n, np.int32), alphas)
        kept = _search._near_peak(ids, *args, peak, best)
        assert np.array_equal(kept, ids[dist <= best])
        anywhere = (starts + rng.random(len(starts)) * (n - starts)).astype(np.int32)
        kept = _search._near_peak(ids, *args, anywhere, best)
        assert set(ids[dist <= best]) <= set(kept) and len(kept) < len(ids)

    def test_duplicates_and_ties(self, rng):
        """Repeated values use the left empirical CDF, like the reference scan."""
        x = np.round(pareto(rng, 2000, 2.0), 1)
        rows = exhaustive(x)
        fit = fit_power_law(x, fit_method="diffract")
        assert fit.xmin == rows[np.argmin(rows[:, 2]), 0]

    def test_min_tail_bounds_the_candidates(self, rng):
        """Candidates leave at least min_tail points; fixed xmin skips the search."""
        x = pareto(rng, 500, 2.5)
        assert fit_power_law(x, fit_method="diffract", min_tail=200).n_tail >= 200
        fixed = fit_power_law(x, xmin=2.0, fit_method="diffract")
        tail = x[x >= 2.0]
        assert fixed.alpha == pytest.approx(1 + len(tail) / np.sum(np.log(tail / 2.0)), rel=1e-12)
        assert fixed.n_candidates == 0 and fixed.n_tail == len(tail)

    def test_xmax_drops_larger_values(self, rng):
        """xmax removes the points above it before fitting, as powerlaw does."""
        x = pareto(rng, 1000, 2.5)
        trimmed = fit_power_law(x, xmax=20.0, fit_method="diffract")
        assert trimmed.xmax <= 20.0 and trimmed.n == int(np.sum(x <= 20.0))


class TestBadInput:
    @pytest.mark.parametrize(
        ("data", "message"),
        [
            (np.array([1.0, np.nan, 2.0]), "1 NaN or Inf"),
            (np.arange(1.0, 40.0), r"only 39 positive point\(s\), fewer than min_tail=50"),
            (np.full(500, 2.0), "all points are equal"),
            (np.zeros(100), r"only 0 positive point\(s\)"),
        ],
        ids=["nan", "short", "all-equal", "all-zero"],
    )
    @needs_taichi
    def test_undefined_fits_raise_fit_error(self, data, message):
        """Each undefined fit raises FitError with the reason."""
        with pytest.raises(FitError, match=message):
            fit_power_law(data, fit_method="diffract")

    def test_the_reason_counts_the_distinct_values(self):
        """The message's count of distinct values (unsorted input, repeats)."""
        from diffract_kernels_spectral._search import _too_few

        x = np.array([3.0, 1.0, 1.0, 2.0] * 20)
        assert _too_few(x, 50).endswith("(80 points, 3 distinct)")
        assert _too_few(np.full(60, 2.0), 50) == "all points are equal: a power law cannot be fitted"

    @pytest.mark.parametrize(
        ("call", "message"),
        [
            (lambda x: fit_power_law(x, fit_method="fast"),
             r"Unknown fit_method 'fast'; choose one of \['auto', 'diffract', 'powerlaw', "
             r"'small_sample', 'weightwatcher'\]"),
            (lambda x: fit_power_law(np.ones((3, 3))), r"data must be 1-D, got shape \(3, 3\)"),
            (lambda x: fit_power_law(x, min_tail=1), r"min_tail must be at least 2, got 1"),
            (lambda x: fit_exponential(x, xmin=2.0, fit_method="exact"), r"Unknown fit_method 'exact'"),
            (lambda x: fit_truncated_power_law(x, xmin=2.0, fit_method="x"), r"Unknown fit_method 'x'"),
            (lambda x: power_law_pvalue(x, n_replicates=0), r"n_replicates must be at least 1, got 0"),
        ],
        ids=["method", "2-d", "min-tail", "exp-method", "tpl-method", "replicates"],
    )
    def test_bad_arguments_are_value_errors_not_undefined_fits(self, call, message):
        """A bad argument raises FitArgumentError (a ValueError, not a FitError) naming it."""
        with pytest.raises(FitArgumentError, match=message) as info:
            call(np.arange(1.0, 200.0))
        assert isinstance(info.value, ValueError) and not isinstance(info.value, FitError)

    @needs_powerlaw
    def test_without_taichi_diffract_raises_and_auto_falls_back(self, rng, monkeypatch):
        """With taichi unavailable, 'diffract' still fits what the dense numpy pass takes
        (up to DENSE_MAX_POINTS), raises with the fix above it, and 'auto' scans densely
        there (the exact fit, never the library's bounded one)."""
        monkeypatch.setitem(_taichi._STATE, "kernels", None)
        monkeypatch.setitem(_taichi._STATE, "error", "taichi failed to initialize (simulated)")
        small = pareto(rng, 300, 2.5)
        assert fit_power_law(small, fit_method="diffract").method == "diffract"
        assert fit_power_law(small).method == "diffract"
        big = pareto(rng, fitting.DENSE_MAX_POINTS + 1, 2.5)
        with pytest.raises(FitUnavailableError, match="simulated"):
            fit_power_law(big, fit_method="diffract")
        fit = fit_power_law(big)
        assert fit.method == "diffract"
        from diffract_kernels_spectral._search import _exact_fit, _starts

        starts = _starts(np.sort(big), 50)  # the exhaustive rule: smallest D, smallest xmin
        fits = [_exact_fit(np.sort(big), int(i)) for i in starts]
        best = min(range(len(fits)), key=lambda i: (fits[i][1], i))
        assert (fit.alpha, fit.ks_distance) == fits[best]

    @needs_powerlaw
    def test_auto_is_the_exact_search_at_every_size(self, rng):
        """'auto' never uses the powerlaw library (its search admits alpha <= 3 only):
        the exact search from 5 points up, the same fit as 'diffract'."""
        for n in (5, 12, 40, 99, 100, 400):
            x = pareto(rng, n, 5.0)
            auto, exact = fit_power_law(x, min_tail=5), fit_power_law(
                x, min_tail=5, fit_method="diffract")
            assert auto.method == "diffract" and auto == exact


class TestAlternatives:
    @needs_powerlaw
    def test_exponential_mle_and_library(self, rng):
        """The exponential MLE is 1 / mean(x - xmin); the library agrees closely."""
        x = 1.0 + rng.exponential(0.5, 3000)
        ours = fit_exponential(x, xmin=1.0)
        assert ours.lambda_ == pytest.approx(1.0 / np.mean(x - 1.0), rel=1e-12)
        lib = fit_exponential(x, xmin=1.0, fit_method="powerlaw")
        assert lib.lambda_ == pytest.approx(ours.lambda_, rel=1e-3)
        expected_ll = np.sum(stats.expon(loc=1.0, scale=1 / ours.lambda_).logpdf(x))
        assert ours.loglikelihood == pytest.approx(expected_ll, rel=1e-10)

    @needs_powerlaw
    def test_truncated_power_law_maximises_the_likelihood(self, rng):
        """Our truncated fit recovers a cutoff and is at least as likely as powerlaw's."""
        x = pareto(rng, 20000, 2.0)
        keep = rng.random(len(x)) < np.exp(-0.05 * x)  # thinning gives x^-2 e^(-0.05 x)
        x = x[keep]
        ours = fit_truncated_power_law(x, xmin=1.0)
        lib = fit_truncated_power_law(x, xmin=1.0, fit_method="powerlaw")
        assert ours.alpha == pytest.approx(2.0, abs=0.1)
        assert ours.lambda_ == pytest.approx(0.05, rel=0.3)
        assert ours.loglikelihood >= lib.loglikelihood - 1e-6
        assert lib.alpha == pytest.approx(ours.alpha, abs=0.02)

    def test_likelihood_ratios_point_the_right_way(self, rng):
        """Power-law data favour the power law over the exponential; exponential data do not."""
        pl = compare_distributions(pareto(rng, 3000, 2.5), xmin=1.0)
        assert pl["exponential"].R > 0 and pl["exponential"].p < 1e-3
        assert pl["truncated_power_law"].nested and pl["truncated_power_law"].R <= 1e-9
        ex = compare_distributions(1.0 + rng.exponential(1.0, 3000), xmin=1.0)
        assert ex["exponential"].R < 0 and ex["exponential"].p < 1e-3

    def test_lognormal_ratio_matches_scipy(self, rng):
        """R against the lognormal uses the truncated lognormal likelihood (checked by scipy)."""
        x = rng.lognormal(1.0, 0.8, 4000)
        x = x[x >= 2.0]
        out = compare_distributions(x, xmin=2.0)["lognormal"]
        alpha = 1 + len(x) / np.sum(np.log(x / 2.0))
        ll_pl = np.sum(np.log(alpha - 1) - np.log(2.0) - alpha * np.log(x / 2.0))
        # the MLE of the truncated lognormal, independently, by scipy
        from scipy.optimize import minimize

        def nll(p):
            d = stats.lognorm(s=np.exp(p[1]), scale=np.exp(p[0]))
            return -np.sum(d.logpdf(x) - d.logsf(2.0))

        res = minimize(nll, [1.0, np.log(0.8)], method="Nelder-Mead", options={"xatol": 1e-10, "fatol": 1e-10})
        assert out.R == pytest.approx(ll_pl + res.fun, abs=1e-4)
        assert out.R < 0


@needs_taichi
class TestPValue:
    def test_power_law_data_pass_and_exponential_data_fail(self, rng):
        """The CSN bootstrap accepts power-law data and rejects 5000 exponential points.

        (With few points the extreme tail of exponential data can pass: with a free xmin
        the power law may fit its last hundred points, which is what the method finds.)
        """
        good = power_law_pvalue(pareto(rng, 1000, 2.5), n_replicates=50, seed=1)
        bad = power_law_pvalue(1.0 + rng.exponential(1.0, 5000), n_replicates=50, seed=1)
        assert good.p > 0.1 and good.replicates == 50
        assert bad.p < 0.05

    def test_reproducible_for_a_seed(self, rng):
        """The same seed gives the same p-value, and the seed is used: other seeds give
        other bootstrap samples (an implementation that ignored it would repeat one)."""
        x = pareto(rng, 600, 2.2)
        a = power_law_pvalue(x, n_replicates=30, seed=5)
        assert power_law_pvalue(x, n_replicates=30, seed=5) == a
        others = {power_law_pvalue(x, n_replicates=30, seed=s).p for s in range(6, 11)}
        assert len(others | {a.p}) >= 3

    @needs_powerlaw
    def test_nan_for_short_tails(self, rng):
        """A fitted tail below 50 points gives NaN."""
        x = pareto(rng, 60, 2.5)
        fit = fit_power_law(x, fit_method="powerlaw")
        assert fit.n_tail < 50, "the library picked a long tail; choose other data"
        result = power_law_pvalue(x, fit=fit)
        assert math.isnan(result.p) and result.replicates == 0
