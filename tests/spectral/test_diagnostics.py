"""Spectral part two: the original Diffract's metrics, the randomized baseline, the
Marchenko-Pastur fit and the Tracy-Widom edge, the ESD normalisation and the
diffract-0.3 preset. Known answers by hand, numpy and scipy."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
from scipy import integrate, stats

from diffract import Session
from diffract_kernels_spectral import fit_power_law, power_law_pvalue
from diffract_kernels_spectral._rmt import mp_cdf, tracy_widom1_cdf, tracy_widom1_quantile

from .conftest import exhaustive, needs_taichi, pareto


def _apply(session, *fields):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        session.compute.apply(*fields, errors="record")
    return session.results.export_metrics(*fields, include_arrays=True)["m"]


@pytest.fixture
def session():
    with Session() as s:
        yield s
        s.registry.reset_configuration()


@pytest.fixture
def spiked(rng):
    """A 300 x 120 Gaussian matrix plus three strong rank-one spikes, and a bias."""
    w = rng.standard_normal((300, 120))
    for strength in (6.0, 8.0, 11.0):
        u, v = rng.standard_normal(300), rng.standard_normal(120)
        w += strength * np.outer(u / np.linalg.norm(u), v / np.linalg.norm(v)) * math.sqrt(300)
    return {"w": w, "conv": rng.standard_normal((8, 5, 3)), "b": rng.standard_normal(4)}


class TestSizesNormsAndRanks:
    def test_against_numpy(self, session, spiked):
        session.models.add(spiked, model_id="m")
        rows = _apply(session, "greater_dim", "lower_dim", "aspect_ratio", "weights_std",
                      "max_weights_sval", "min_weights_sval", "l2_norm", "nuclear_norm",
                      "effective_rank", "esd_max", "esd_min")
        for name, shape in (("w", (300, 120)), ("conv", (8, 15))):
            w = spiked[name].reshape(shape)
            s = np.linalg.svd(w, compute_uv=False)
            row = rows[name]
            assert (row["greater_dim"], row["lower_dim"]) == (max(shape), min(shape))
            assert row["aspect_ratio"] == max(shape) / min(shape)
            assert row["weights_std"] == pytest.approx(np.std(w), rel=1e-12)
            assert row["max_weights_sval"] == pytest.approx(s[0], rel=1e-12)
            assert row["l2_norm"] == row["max_weights_sval"]
            assert row["min_weights_sval"] == pytest.approx(s[-1], rel=1e-10)
            assert row["nuclear_norm"] == pytest.approx(s.sum(), rel=1e-12)
            p = s / s.sum()
            assert row["effective_rank"] == pytest.approx(np.exp(-np.sum(p * np.log(p))), rel=1e-12)
            eig = np.linalg.eigvalsh(w.T @ w if shape[0] >= shape[1] else w @ w.T)
            assert row["esd_max"] == pytest.approx(eig[-1], rel=1e-5)
            assert row["esd_min"] == pytest.approx(eig[0], rel=1e-3)
        assert "b" not in rows  # a bias is not a matrix

    def test_effective_rank_ends(self, session):
        session.models.add({"flat": np.eye(7), "one": np.outer(np.arange(1, 5), np.ones(3))},
                           model_id="m")
        rows = _apply(session, "effective_rank")
        assert rows["flat"]["effective_rank"] == pytest.approx(7.0, rel=1e-12)
        assert rows["one"]["effective_rank"] == pytest.approx(1.0, abs=1e-9)


class TestTails:
    def test_concentration_presence_scale_by_hand(self, session, rng):
        w = rng.standard_t(3, size=(200, 150))
        session.models.add({"w": w}, model_id="m")
        fields = ("esd", "pl_xmin", "tpl_xmin", "exp_xmin", "tpl_lambda", "exp_lambda",
                  "pl_concentration", "tpl_concentration", "exp_concentration", "pl_presence",
                  "tpl_presence", "exp_presence", "tpl_scale", "exp_scale")
        row = _apply(session, *fields)["w"]
        esd = np.asarray(row["esd"])
        assert row["tpl_xmin"] == row["exp_xmin"] == row["pl_xmin"]  # the default: pl's tail
        for law in ("pl", "tpl", "exp"):
            xmin = row[f"{law}_xmin"]
            assert row[f"{law}_concentration"] == np.count_nonzero(esd >= xmin) / esd.size
            assert row[f"{law}_presence"] == pytest.approx(
                (esd[-1] - xmin) / (esd[-1] - esd[0]), rel=1e-12)
        assert row["tpl_scale"] == pytest.approx(esd[-1] * row["tpl_lambda"], rel=1e-12)
        assert row["exp_scale"] == pytest.approx(esd[-1] * row["exp_lambda"], rel=1e-12)

    def test_alpha_norms_and_their_model_means(self, session, rng):
        model = {"a": rng.standard_t(4, size=(120, 90)), "b": rng.standard_t(4, size=(150, 100)),
                 "bias": rng.standard_normal(9)}
        session.models.add(model, model_id="m")
        rows = _apply(session, "esd", "pl_alpha", "tpl_alpha", "pl_alpha_norm", "tpl_alpha_norm",
                      "log_alpha_norm")
        logs = {"pl": [], "tpl": []}
        for name in ("a", "b"):
            row = rows[name]
            esd = np.asarray(row["esd"], dtype=np.float64)
            for law in ("pl", "tpl"):
                expected = np.sum(esd ** row[f"{law}_alpha"])
                assert row[f"{law}_alpha_norm"] == pytest.approx(expected, rel=1e-9)
                logs[law].append(math.log10(expected))
            assert math.log10(row["pl_alpha_norm"]) == pytest.approx(row["log_alpha_norm"], rel=1e-12)
        session.compute.apply("model_pl_alpha_norm", "model_tpl_alpha_norm")
        agg = session.results.export_aggregates("model_pl_alpha_norm", "model_tpl_alpha_norm")
        assert agg["model_pl_alpha_norm@models[m]"] == pytest.approx(np.mean(logs["pl"]), rel=1e-9)
        assert agg["model_tpl_alpha_norm@models[m]"] == pytest.approx(np.mean(logs["tpl"]), rel=1e-9)

    def test_an_alpha_norm_beyond_float64_is_undefined_with_the_way_out(self, session):
        session.models.add({"w": np.diag(np.linspace(1e3, 1e4, 60))}, model_id="m")
        session.compute.configure_kernel("power_law_fit", min_tail=5)
        session.models.erase("m")
        big = np.diag(np.geomspace(1e2, 1e30, 60))
        session.models.add({"w": big}, model_id="m")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session.compute.apply("pl_alpha", errors="record")
            session.results.ingest_metrics({"m": {"w": {"pl_alpha": 12.0}}}, force=True)
            session.compute.apply("pl_alpha_norm", errors="record")
        assert math.isnan(session.results.export_metrics("pl_alpha_norm")["m"]["w"]["pl_alpha_norm"])
        (note,) = [n for n in session.results.export_notes() if n["kernel"] == "pl_alpha_norm"]
        assert "outside float64's range" in note["reason"] and "log_alpha_norm" in note["reason"]


class TestModelNorms:
    def test_products_and_means_over_the_matrices(self, session, spiked):
        session.models.add(spiked, model_id="m")
        session.compute.apply("log_prod_frob_norm", "model_log_norm", "log_prod_spectral_norm",
                              "model_log_spectral_norm")
        agg = {k.split("@")[0]: v for k, v in session.results.export_aggregates().items()}
        mats = [spiked["w"], spiked["conv"].reshape(8, 15)]  # the bias is not a matrix
        frob = [np.linalg.norm(w) for w in mats]
        spec = [np.linalg.norm(w, 2) for w in mats]
        assert agg["log_prod_frob_norm"] == pytest.approx(np.sum(np.log10(frob)), rel=1e-12)
        assert agg["model_log_norm"] == pytest.approx(np.mean(np.log10(np.square(frob))), rel=1e-12)
        assert agg["log_prod_spectral_norm"] == pytest.approx(np.sum(np.log10(spec)), rel=1e-12)
        assert agg["model_log_spectral_norm"] == pytest.approx(
            np.mean(2 * np.log10(spec)), rel=1e-12)


class TestRandomizedBaseline:
    def test_a_seeded_permutation_of_the_entries(self, session, spiked):
        session.models.add(spiked, model_id="m")
        rows = _apply(session, "weights_rand", "esd_rand", "esd_rand_max", "esd_rand_min",
                      "esd", "w1_rand_distance")
        w, row = spiked["conv"].reshape(8, 15), rows["conv"]  # the matrix view, shuffled
        rand = np.asarray(row["weights_rand"])
        assert rand.shape == w.shape and not np.array_equal(rand, w)
        np.testing.assert_array_equal(np.sort(rand, axis=None), np.sort(w, axis=None))
        order = np.random.default_rng(42).permutation(w.size)  # the documented permutation
        np.testing.assert_array_equal(rand.reshape(-1), w.reshape(-1)[order])
        for name in ("w", "conv"):
            row = rows[name]
            mat = np.asarray(row["weights_rand"]).reshape(spiked[name].shape[0], -1)
            eig = np.sort(np.linalg.svd(mat, compute_uv=False) ** 2)
            np.testing.assert_allclose(row["esd_rand"], eig, rtol=1e-4, atol=1e-4 * eig[-1])
            assert (row["esd_rand_max"], row["esd_rand_min"]) == (row["esd_rand"][-1],
                                                                  row["esd_rand"][0])
            esd = np.asarray(row["esd"])
            expected = stats.wasserstein_distance(esd, row["esd_rand"]) / esd.mean()
            assert row["w1_rand_distance"] == pytest.approx(expected, rel=1e-12)
        # spikes survive in the ESD and are destroyed by shuffling: far from the baseline
        assert rows["w"]["w1_rand_distance"] > 5 * rows["conv"]["w1_rand_distance"]

    def test_reproducible_for_a_seed_and_different_for_another(self, session, spiked):
        session.models.add({"w": spiked["w"]}, model_id="m")
        first = _apply(session, "esd_rand")["w"]["esd_rand"]
        session.results.erase("esd_rand")
        np.testing.assert_array_equal(_apply(session, "esd_rand")["w"]["esd_rand"], first)
        session.results.erase("esd_rand")
        session.compute.configure_kernel("esd_rand", seed=7)
        assert not np.array_equal(_apply(session, "esd_rand")["w"]["esd_rand"], first)


class TestRandomMatrixLaws:
    @pytest.mark.parametrize("y", [1.0, 0.4, 0.05])
    def test_mp_cdf_against_quadrature(self, y):
        a, b = (1 - math.sqrt(y)) ** 2, (1 + math.sqrt(y)) ** 2

        def density(z):
            return math.sqrt(max((b - z) * (z - a), 0.0)) / (2 * math.pi * y * z)

        sigma = 1.7
        for frac in (0.02, 0.3, 0.5, 0.8, 0.99):
            z = a + frac * (b - a)
            expected = integrate.quad(density, a, z, limit=200)[0]
            assert mp_cdf(z * sigma**2, y, sigma) == pytest.approx(expected, abs=2e-7)
        assert mp_cdf(0.5 * a * sigma**2, y, sigma) == 0.0 or a == 0.0
        assert mp_cdf(1.01 * b * sigma**2, y, sigma) == 1.0

    def test_tracy_widom_against_its_published_quantiles(self):
        # Tracy-Widom beta = 1: F1(0.9793) = 0.95, F1(2.0234) = 0.99 (published tables),
        # mean -1.2065 and variance 1.6078
        assert tracy_widom1_quantile(0.95) == pytest.approx(0.9793, abs=2e-4)
        assert tracy_widom1_quantile(0.99) == pytest.approx(2.0234, abs=2e-4)
        s = np.linspace(-8, 8, 4001)
        cdf = np.array([tracy_widom1_cdf(v) for v in s])
        pdf = np.gradient(cdf, s)
        mean = integrate.trapezoid(s * pdf, s)
        assert mean == pytest.approx(-1.2065, abs=2e-3)
        assert integrate.trapezoid((s - mean) ** 2 * pdf, s) == pytest.approx(1.6078, abs=5e-3)

    @pytest.mark.parametrize("kind", ["spiked", "heavy"])
    def test_the_mp_fit_by_hand_in_both_normalisations(self, session, spiked, rng, kind):
        """Gaussian plus spikes: the shuffled matrix stays inside the first edge. Student-t
        entries: shuffled eigenvalues bleed out, so the edge is refitted on the rest."""
        w = spiked["w"] if kind == "spiked" else rng.standard_t(2.5, size=(300, 120))
        session.models.add({"w": w}, model_id="m")
        fields = ("esd", "esd_rand", "esd_max", "esd_min", "mp_esd_max", "mp_esd_min",
                  "mp_bulk_std", "mp_soft_rank", "mp_num_spikes", "mp_concentration",
                  "mp_presence", "mp_sval_max", "mp_ks", "tw_esd_bound", "tw_num_spikes")
        rows = {}
        for normalize in ("none", "greater_dim"):
            session.compute.configure_kernel("esd_scale", normalize=normalize)
            session.results.erase("esd_scale", erase_dependent_also=True)
            rows[normalize] = _apply(session, *fields)["w"]
        n, m = w.shape
        q = n / m
        for normalize, c in (("none", 1.0), ("greater_dim", 1.0 / n)):
            row = rows[normalize]
            esd, rand = np.asarray(row["esd"]), np.asarray(row["esd_rand"], dtype=np.float64)
            var = np.std(w) ** 2
            edge = c * n * var * (1 + q**-0.5) ** 2
            assert np.any(rand > edge) == (kind == "heavy")
            if kind == "heavy":
                var = rand[rand <= edge].sum() / (c * n * m)
                edge = c * n * var * (1 + q**-0.5) ** 2
            assert row["mp_esd_max"] == pytest.approx(min(edge, esd[-1]), rel=1e-9)
            assert row["mp_esd_min"] == pytest.approx(c * n * var * (1 - q**-0.5) ** 2, rel=1e-9)
            assert row["mp_bulk_std"] == pytest.approx(math.sqrt(var), rel=1e-9)
            assert row["mp_soft_rank"] == pytest.approx(row["mp_esd_max"] / esd[-1], rel=1e-12)
            assert row["mp_num_spikes"] == np.count_nonzero(esd > row["mp_esd_max"])
            bulk = (esd >= row["mp_esd_min"]) & (esd <= row["mp_esd_max"])
            assert row["mp_concentration"] == bulk.sum() / esd.size
            assert row["mp_presence"] == pytest.approx(
                min(1.0, (row["mp_esd_max"] - row["mp_esd_min"]) / (esd[-1] - esd[0])), rel=1e-12)
            assert row["mp_sval_max"] == pytest.approx(math.sqrt(row["mp_esd_max"] / c), rel=1e-12)
            # Johnstone's centring and scaling with the 0.995 quantile of TW1
            a, b = math.sqrt(n - 1), math.sqrt(m)
            mu = c * var * (a + b) ** 2
            sd = c * var * (a + b) * (1 / a + 1 / b) ** (1 / 3)
            assert row["tw_esd_bound"] == pytest.approx(
                mu + tracy_widom1_quantile(0.995) * sd, rel=1e-9)
            assert row["tw_num_spikes"] == np.count_nonzero(esd > row["tw_esd_bound"])
            if kind == "spiked":  # the three planted directions, and only them
                assert row["mp_num_spikes"] == row["tw_num_spikes"] == 3
        none, norm = rows["none"], rows["greater_dim"]
        for field in ("esd_max", "mp_esd_max", "mp_esd_min", "tw_esd_bound"):
            assert norm[field] == pytest.approx(none[field] / n, rel=1e-6), field
        for field in ("mp_bulk_std", "mp_soft_rank", "mp_ks", "mp_sval_max"):
            assert norm[field] == pytest.approx(none[field], rel=1e-6), field

    def test_mp_ks_against_the_window_law_by_quadrature(self, session, rng):
        w = rng.standard_normal((400, 100))
        session.models.add({"w": w}, model_id="m")
        session.compute.configure_kernel("esd_scale", normalize="greater_dim")
        row = _apply(session, "esd", "mp_esd_min", "mp_esd_max", "mp_bulk_std", "mp_ks")["w"]
        esd, lo, hi, s = (np.asarray(row["esd"]), row["mp_esd_min"], row["mp_esd_max"],
                          row["mp_bulk_std"])
        y = 100 / 400
        a, b = s**2 * (1 - math.sqrt(y)) ** 2, s**2 * (1 + math.sqrt(y)) ** 2

        def density(x):
            return math.sqrt(max((b - x) * (x - a), 0.0)) / (2 * math.pi * y * x * s**2)

        def cdf(x):
            return integrate.quad(density, a, min(max(x, a), b), limit=200)[0]

        inside = np.sort(esd[(esd > lo) & (esd < hi)])
        f_lo, f_hi = cdf(lo), cdf(hi)
        model = np.array([(cdf(x) - f_lo) / (f_hi - f_lo) for x in inside])
        k = np.arange(1, inside.size + 1) / inside.size
        expected = max(np.max(k - model), np.max(model - k + 1 / inside.size))
        assert row["mp_ks"] == pytest.approx(expected, abs=1e-6)
        assert row["mp_ks"] < 0.1  # a Gaussian matrix is Marchenko-Pastur


class TestNormalisationAndPreset:
    def test_normalised_esd_scales_xmins_not_exponents(self, session, rng):
        w = rng.standard_t(3, size=(240, 160))
        session.models.add({"w": w}, model_id="m")
        raw = _apply(session, "esd", "pl_alpha", "pl_xmin", "stable_rank")["w"]
        session.compute.configure_kernel("esd_scale", normalize="greater_dim")
        assert {r["kernel"] for r in session.results.stale()} >= {"esd_scale", "esd"}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            session.compute.apply("pl_alpha", "stable_rank", recompute="stale")
        norm = session.results.export_metrics(include_arrays=True)["m"]["w"]
        np.testing.assert_allclose(norm["esd"], np.asarray(raw["esd"]) / 240, rtol=1e-12)
        assert norm["pl_alpha"] == pytest.approx(raw["pl_alpha"], rel=1e-9)
        assert norm["pl_xmin"] == pytest.approx(raw["pl_xmin"] / 240, rel=1e-12)
        assert norm["stable_rank"] == pytest.approx(raw["stable_rank"], rel=1e-12)

    def test_alpha_max_picks_the_best_candidate_below_it(self, rng):
        x = np.concatenate([rng.uniform(0.2, 1.0, 150), pareto(rng, 400, 14.0)])
        table = exhaustive(np.sort(x))
        free = fit_power_law(x, fit_method="diffract")
        assert free.alpha > 8  # the steep tail wins without a bound
        capped = fit_power_law(x, fit_method="diffract", alpha_max=8.0)
        allowed = table[table[:, 1] <= 8.0]
        best = allowed[np.argmin(allowed[:, 2])]
        assert capped.alpha <= 8.0
        assert capped.xmin == best[0] and capped.alpha == pytest.approx(best[1], rel=1e-9)
        with pytest.raises(ValueError, match="alpha_max"):
            fit_power_law(x, fit_method="powerlaw", alpha_max=8.0)

    def test_the_diffract_03_preset(self, session, rng):
        settings = session.compute.configure_conventions("diffract-0.3")
        assert settings["esd_scale"] == {"normalize": "greater_dim"}
        assert settings["power_law_fit"] == {"min_tail": 50, "alpha_max": 8.0,
                                             "fit_method": "auto"}
        assert settings["pl_pvalue"]["xmin"] == "fixed"
        w = rng.standard_t(3, size=(200, 120))
        session.models.add({"w": w}, model_id="m")
        row = _apply(session, "pl_esd_xmin", "pl_alpha", "pl_ks", "pl_p_value")["w"]
        esd = np.sort(np.linalg.svd(w, compute_uv=False) ** 2) / 200
        fit = fit_power_law(esd, alpha_max=8.0)
        assert row["pl_esd_xmin"] == pytest.approx(fit.xmin, rel=1e-5)
        assert row["pl_alpha"] == pytest.approx(fit.alpha, rel=1e-4)
        assert row["pl_ks"] == pytest.approx(fit.ks_distance, rel=1e-3)
        assert 0.0 <= row["pl_p_value"] <= 1.0
        session.compute.configure_conventions("csn")
        assert session.compute.kernel_config("esd_scale") == {"normalize": "none"}
        assert session.compute.kernel_config("pl_pvalue")["xmin"] == "search"


class TestFixedXminPValue:
    def test_reproducible_and_biased_high_against_the_search(self, rng):
        fixed, search = [], []
        for i in range(6):
            x = pareto(np.random.default_rng(i), 400, 2.5)
            fit = fit_power_law(x)
            a = power_law_pvalue(x, fit=fit, n_replicates=60, seed=i, xmin="fixed")
            assert a == power_law_pvalue(x, fit=fit, n_replicates=60, seed=i, xmin="fixed")
            fixed.append(a.p)
            search.append(power_law_pvalue(x, fit=fit, n_replicates=60, seed=i).p)
        # holding xmin fixed, replicates cannot pick their own best xmin: their KS
        # distances are larger, so p is higher on the same draws
        assert np.mean(fixed) > np.mean(search)
        with pytest.raises(ValueError, match="xmin must be 'search' or 'fixed'"):
            power_law_pvalue(pareto(rng, 100, 2.5), xmin="both")


class TestWeightWatcherDiagnostics:
    def test_ranks_against_numpy(self, session, rng):
        low = rng.standard_normal((50, 3)) @ rng.standard_normal((3, 40))
        full = rng.standard_normal((50, 40)) @ np.diag(np.geomspace(1e-5, 1, 40))
        session.models.add({"low": low, "full": full}, model_id="m")
        rows = _apply(session, "matrix_rank", "rank_loss", "weak_rank_loss", "esd")
        for name, w in (("low", low), ("full", full)):
            row = rows[name]
            s = np.linalg.svd(w, compute_uv=False)
            assert row["matrix_rank"] == np.linalg.matrix_rank(w)
            assert row["rank_loss"] == 40 - row["matrix_rank"]
            # from float64 singular values (a float32 ESD would zero its noise)
            assert row["weak_rank_loss"] == np.count_nonzero(s**2 < 1e-6)
        assert rows["low"]["matrix_rank"] == 3 and rows["low"]["weak_rank_loss"] == 37
        assert rows["full"]["rank_loss"] == 0
        # the default (float64) ESD keeps those small eigenvalues: both paths agree
        assert 0 < rows["full"]["weak_rank_loss"] == np.count_nonzero(
            np.asarray(rows["full"]["esd"]) < 1e-6)

    def test_detx_by_hand(self):
        from diffract_kernels_spectral.kernels_ww import detx

        # mean 1 already: from the top 2.0, 2.0 * 1.5 = 3.0, * 0.3 = 0.9 < 1 -> 3 taken
        assert detx(np.array([0.2, 0.3, 1.5, 2.0])) == (3, 0.3)
        # never below 1 above index 0: all k, the value at index 1
        assert detx(np.array([0.1, 0.5, 1.0, 2.4])) == (4, 0.5)
        # the rescaling: the same spectrum times 10 gives the same count, values times 10
        assert detx(np.array([2.0, 3.0, 15.0, 20.0])) == (3, 3.0)

    def test_randomized_ratios_and_distance(self, session, spiked):
        from scipy.spatial.distance import jensenshannon

        session.models.add({"w": spiked["w"]}, model_id="m")
        row = _apply(session, "esd", "esd_rand", "rand_distance", "ww_softrank", "ww_maxdist",
                     "detX_num", "num_ERG_spikes", "num_pl_spikes", "pl_n_tail", "ERG_gap")["w"]
        esd, rand = np.asarray(row["esd"]), np.asarray(row["esd_rand"])
        assert row["rand_distance"] == pytest.approx(jensenshannon(esd, rand), rel=1e-9)
        assert row["ww_softrank"] == pytest.approx(rand[-1] / esd[-1], rel=1e-12)
        assert row["ww_maxdist"] == pytest.approx(esd[-1] - rand[-1], rel=1e-12)
        assert row["num_ERG_spikes"] == row["detX_num"]
        assert row["num_pl_spikes"] == row["pl_n_tail"]  # nothing clipped
        assert row["ERG_gap"] == row["detX_num"] - row["num_pl_spikes"]

    @pytest.mark.parametrize(("tests", "expected"), [
        (((5.0, 0.01), (9.0, 0.001), (1.0, 0.5)), "power_law"),
        (((-4.0, 0.01), (9.0, 0.001), (1.0, 0.5)), "truncated_power_law"),
        (((-4.0, 0.01), (-6.0, 0.05), (-9.0, 0.5)), "exponential"),  # lognormal not significant
        (((-4.0, 0.2), (3.0, 0.3), (-0.5, 0.01)), "lognormal"),
    ])
    def test_best_fit(self, tests, expected):
        from diffract_kernels_spectral.kernels_ww import best_fit

        (a, ap), (b, bp), (c, cp) = tests
        assert best_fit(a, ap, b, bp, c, cp) == expected

    def test_a_label_survives_the_durable_store(self, tmp_path, rng):
        with Session(profile="local", path=tmp_path / "s") as s:
            s.models.add({"w": rng.standard_t(3, size=(200, 120))}, model_id="m")
            s.compute.apply("best_fit")
            label = s.results.export_metrics("best_fit")["m"]["w"]["best_fit"]
        assert label in ("power_law", "truncated_power_law", "exponential", "lognormal")
        with Session(profile="local", path=tmp_path / "s") as s:
            assert s.results.export_metrics("best_fit")["m"]["w"]["best_fit"] == label
            assert s.results.export("best_fit", export_format="json").count(label) == 1


class TestOwnXmin:
    """The alternatives' own xmin (the original Diffract's): the candidate of smallest KS
    distance for that law, against a brute-force scan written here."""

    @staticmethod
    def _ks(tail, cdf):
        values, first = np.unique(tail, return_index=True)
        return np.max(np.abs(cdf(values) - first / tail.size))

    def _candidates(self, x, min_tail):
        distinct = np.unique(x)[:-1]
        return [v for v in distinct if np.count_nonzero(x >= v) >= min_tail]

    def test_exponential_against_brute_force(self, rng):
        from diffract_kernels_spectral import fit_exponential

        for seed in range(5):
            r = np.random.default_rng(seed)
            x = np.sort(np.concatenate([r.uniform(0.1, 1, 80), 1 + r.exponential(2.0, 200)]))
            scan = []
            for v in self._candidates(x, 50):
                tail = x[x >= v]
                lam = 1 / np.mean(tail - v)
                scan.append((self._ks(tail, lambda u, v=v, lam=lam: 1 - np.exp(-lam * (u - v))),
                             v))
            best = min(scan)
            fit = fit_exponential(x, min_tail=50)
            assert fit.xmin == best[1] and fit.ks_distance == pytest.approx(best[0], abs=1e-12)

    def test_truncated_power_law_against_brute_force(self):
        from diffract_kernels_spectral import fit_truncated_power_law
        from diffract_kernels_spectral.fitting import _tpl_ks, _tpl_mle

        x = np.sort(pareto(np.random.default_rng(3), 110, 2.2) * np.exp(
            np.random.default_rng(4).normal(0, 0.05, 110)))
        scan = []
        for v in self._candidates(x, 60):  # cold starts at every candidate
            alpha, lam, _ = _tpl_mle(x[x >= v], float(v))
            scan.append((_tpl_ks(x[x >= v], float(v), alpha, lam), v))
        best = min(scan)
        fit = fit_truncated_power_law(x, min_tail=60)
        assert fit.xmin == best[1] and fit.ks_distance == pytest.approx(best[0], rel=1e-6)

    def test_expint_against_mpmath(self):
        import mpmath

        from diffract_kernels_spectral.fitting import _expint

        for order in (-4.0, -0.3, 0.5, 1.0, 1.5, 2.7, 9.0, 20.0):
            z = np.geomspace(1e-9, 60, 30)
            ref = np.array([float(mpmath.expint(order, v)) for v in z])
            np.testing.assert_allclose(_expint(order, z), ref, rtol=1e-7)

    def test_the_kernels_take_their_own_tail_on_request(self, session, rng):
        session.models.add({"w": rng.standard_t(3, size=(260, 130))}, model_id="m")
        row = _apply(session, "pl_xmin", "exp_xmin", "exp_lambda")["w"]
        assert row["exp_xmin"] == row["pl_xmin"]
        session.compute.configure_kernel("exponential_fit", xmin="own")
        session.results.erase("exp_xmin", "exp_lambda", "exp_ks_distance")
        row = _apply(session, "esd", "exp_xmin", "exp_lambda")["w"]
        from diffract_kernels_spectral import fit_exponential

        esd = np.asarray(row["esd"])
        own = fit_exponential(esd[esd > 0], min_tail=50)
        assert (row["exp_xmin"], row["exp_lambda"]) == (own.xmin, own.lambda_)


class TestFingers:
    def test_clip_top_leaves_out_the_largest(self, session, rng):
        session.models.add({"w": rng.standard_t(3, size=(300, 200))}, model_id="m")
        session.compute.configure_kernel("power_law_fit", clip_top=4)
        row = _apply(session, "esd", "pl_alpha", "pl_xmax", "num_fingers")["w"]
        esd = np.asarray(row["esd"])
        fit = fit_power_law(esd[esd > 0][:-4])
        assert (row["pl_alpha"], row["pl_xmax"]) == (fit.alpha, esd[-5])
        assert row["num_fingers"] == 4

    def test_clip_xmax_keeps_the_first_refit_that_drops_alpha(self, session):
        r = np.random.default_rng(4)
        # a flat body and a tight cluster of 7 at the top: the unclipped fit takes the
        # cluster as its tail (a steep alpha); without its top two the body wins
        x = np.sort(np.concatenate([r.uniform(1, 2, 400), pareto(r, 7, 12.0) * 10]))
        first = fit_power_law(x, min_tail=5)
        expected, clipped = first, 0
        for k in range(2, 10):  # the rule, written out
            refit = fit_power_law(x[:-k], min_tail=5)
            if refit.alpha + 1.0 < first.alpha:
                expected, clipped = refit, k
                break
            if refit.alpha <= 2.0:
                break
        assert clipped == 2 and first.alpha > expected.alpha + 5  # the fix matters here
        session.models.add({"w": np.diag(np.sqrt(x))}, model_id="m")
        session.compute.configure_kernel("power_law_fit", fix_fingers="clip_xmax", min_tail=5)
        row = _apply(session, "pl_alpha", "num_fingers", "num_pl_spikes", "pl_n_tail")["w"]
        assert row["pl_alpha"] == pytest.approx(expected.alpha, rel=1e-5)
        assert row["num_fingers"] == clipped
        assert row["num_pl_spikes"] == row["pl_n_tail"] + clipped


class TestTorchPaths:
    """The GPU routes, run through torch on the CPU ("cpu:0" is a torch device that is
    not the numpy path's "cpu"): same values as the numpy path."""

    def test_svals_and_the_randomized_esd(self, rng):
        torch = pytest.importorskip("torch")
        from diffract_kernels_spectral import kernels_rmt, linalg
        from diffract_kernels_spectral.kernels import svals

        w = rng.standard_normal((30, 20)).astype(np.float32)
        conv = torch.from_numpy(rng.standard_normal((6, 4, 3)))
        for tensor in (torch.from_numpy(w), conv):
            host = svals(tensor, device="cpu")
            np.testing.assert_allclose(svals(tensor, device="cpu:0"), host, rtol=1e-12)
            rand_host = kernels_rmt.esd_rand(tensor, 0.5, device="cpu", precision="float64")
            rand_torch = kernels_rmt.esd_rand(tensor, 0.5, device="cpu:0", precision="float64")
            np.testing.assert_allclose(rand_torch, rand_host, rtol=1e-9, atol=1e-12)
        stacked = linalg.svals_batched_torch([w, w * 2, conv], "cpu")
        np.testing.assert_allclose(stacked[1], 2 * stacked[0], rtol=1e-12)
        np.testing.assert_allclose(stacked[2], np.linalg.svd(conv.numpy().reshape(6, 12),
                                                             compute_uv=False), rtol=1e-12)


@needs_taichi
class TestBatchedBootstrap:
    """The CSN p-value's replicates searched in shared Taichi launches give exactly the
    one-by-one searches' distances, hence the same p."""

    @pytest.mark.parametrize("case", ["pareto", "esd", "alpha_max", "min_tail"])
    def test_same_p_as_one_by_one(self, monkeypatch, case):
        from diffract_kernels_spectral import fitting, significance

        r = np.random.default_rng(7)
        x = (np.concatenate([r.uniform(0.2, 1.0, 200), pareto(r, 400, 2.6)])
             if case != "esd" else np.sort(np.linalg.svd(r.standard_t(4, size=(600, 300)),
                                                         compute_uv=False) ** 2))
        kwargs = {"alpha_max": 3.0} if case == "alpha_max" else (
            {"min_tail": 250} if case == "min_tail" else {})
        fit = fit_power_law(x, fit_method="diffract", **kwargs)
        monkeypatch.setattr(significance, "_REPLICATE_BATCH", 16)  # several batches
        batched = power_law_pvalue(x, fit=fit, n_replicates=40, seed=3, **kwargs)
        monkeypatch.setattr(significance, "PVALUE_TAICHI_POINTS", 10**9)
        monkeypatch.setattr(fitting, "DENSE_MAX_POINTS", 0)  # one by one, pruned search
        single = power_law_pvalue(x, fit=fit, n_replicates=40, seed=3, **kwargs)
        assert batched == single and batched.replicates == 40


def test_fitted_bulk_spikes_count_beyond_the_tracy_widom_allowance():
    """WeightWatcher's mp_fit counting, fast (issue 36): with bulk="fitted", eigenvalues
    just past the fitted edge but within the Tracy-Widom allowance
    sqrt(Q^(-1/2) edge^(2/3) k^(-2/3)) are not spikes; those beyond it are."""
    from diffract_kernels_spectral.kernels import marchenko_pastur

    rng = np.random.default_rng(4)
    n, m = 200, 800
    w = rng.standard_normal((n, m)) / np.sqrt(m)
    base = np.sort(np.linalg.eigvalsh(w @ w.T))
    edge0, _, _ = marchenko_pastur(base, (n, m), bulk="fitted")
    mean0 = base.mean()
    k, q = n, m / n
    scaled_edge = edge0 / mean0
    allowance = np.sqrt(scaled_edge ** (2 / 3) * k ** (-2 / 3) / np.sqrt(q))
    # four just past the edge (inside the allowance), three far beyond it
    extra = mean0 * np.r_[scaled_edge + allowance * np.array([0.2, 0.4, 0.6, 0.8]),
                          scaled_edge + allowance * np.array([3.0, 4.0, 5.0])]
    esd = np.sort(np.r_[base[: n - extra.size], extra])
    edge, softrank, spikes = marchenko_pastur(esd, (n, m), bulk="fitted")
    mean = esd.mean()
    e = edge / mean
    tw = np.sqrt(e ** (2 / 3) * k ** (-2 / 3) / np.sqrt(q))
    assert spikes == int(np.sum(esd / mean > e + tw))
    assert int(np.sum(esd / mean > e)) >= spikes + 3  # the allowance changes the count
    assert 3 <= spikes <= 4
    assert softrank == pytest.approx(e / (esd.max() / mean), rel=1e-12)


def test_matrix_rank_follows_numpys_rule_on_tall_and_wide_near_singular_matrices():
    """numpy.linalg.matrix_rank's default tolerance is sigma_max * max(N, M) * eps: on
    random tall and wide matrices with singular values placed between the min(N, M) and
    the max(N, M) versions of that rule (where a wrong side would count them), ours
    equals numpy's every time (issue 36, rank diagnostics)."""
    from diffract import Session

    rng = np.random.default_rng(9)
    eps = np.finfo(np.float64).eps
    model, want = {}, {}
    for case in range(24):
        k = int(rng.integers(8, 30))
        big = int(k * rng.integers(4, 12))
        n, m = (big, k) if case % 2 else (k, big)
        s = np.sort(rng.uniform(0.5, 2.0, k))[::-1]
        low, high = s[0] * k * eps, s[0] * big * eps
        tiny = int(rng.integers(1, k // 2))  # between the two rules: kept by min, not max
        s[-tiny:] = rng.uniform(2 * low, 0.5 * high, tiny)
        u, _ = np.linalg.qr(rng.standard_normal((n, k)))
        v, _ = np.linalg.qr(rng.standard_normal((m, k)))
        w = (u * s) @ v.T
        model[f"w{case}"] = w
        want[f"w{case}"] = int(np.linalg.matrix_rank(w))
        assert want[f"w{case}"] == k - tiny  # numpy drops them: the case is the one meant
    with Session() as sess:
        sess.models.add(model, "m")
        sess.compute.apply("matrix_rank", "rank_loss")
        rows = sess.results.export_metrics("matrix_rank", "rank_loss")["m"]
    for name, rank in want.items():
        assert rows[name]["matrix_rank"] == rank, name
        assert rows[name]["rank_loss"] == min(model[name].shape) - rank
