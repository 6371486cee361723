"""The spectral kernels in a session: known answers, the guide's hard_rank cycle, bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from diffract import KernelApplyLevel, Session
from diffract_kernels_spectral import fit_power_law, linalg
from tests.spectral.conftest import pareto


def _metrics(session, model_id="m"):
    return session.results.export_metrics(export_format="dict", include_arrays=True)[model_id]


def _notes(session):
    return {(n["kernel"], n["unit"]): (n["kind"], n["reason"]) for n in session.results.export_notes()}


@pytest.fixture
def small(rng):
    """A 40 x 24 matrix, a conv kernel [6, 4, 3] and a bias."""
    return {"w": rng.standard_normal((40, 24)), "conv": rng.standard_normal((6, 4, 3)),
            "b": rng.standard_normal(5)}


class TestKnownAnswers:
    def test_spectra_and_norms_match_numpy(self, small):
        """ESD, singular values, SVD, norms and ranks equal their numpy definitions."""
        with Session() as session:
            session.models.add(small, model_id="m")
            session.compute.configure_kernel("esd", precision="float64")
            session.compute.apply("weights_svals", "esd", "stable_rank", "log_norm", "spectral_norm",
                                  "log_spectral_norm", "hard_rank", "matrix_entropy")
            rows = _metrics(session)
            session.compute.configure_kernel("esd", precision="float32")
        for name in ("w", "conv"):
            w = small[name].reshape(small[name].shape[0], -1)
            s = np.linalg.svd(w, compute_uv=False)
            lam = np.sort(s**2)
            row = rows[name]
            np.testing.assert_allclose(row["esd"], lam, rtol=1e-10, atol=1e-12 * lam[-1])
            np.testing.assert_allclose(row["weights_svals"], s, rtol=1e-12)
            u, sv, vt = row["weights_lsvs"], row["weights_svals"], row["weights_rsvs"]
            np.testing.assert_allclose(u @ np.diag(sv) @ vt, w, atol=1e-12)
            assert row["stable_rank"] == pytest.approx(np.sum(w**2) / s[0] ** 2, rel=1e-10)
            assert row["log_norm"] == pytest.approx(math.log10(np.sum(w**2)), rel=1e-12)
            assert row["spectral_norm"] == pytest.approx(s[0] ** 2, rel=1e-10)
            assert row["log_spectral_norm"] == pytest.approx(math.log10(s[0] ** 2), rel=1e-12)
            assert row["hard_rank"] == np.linalg.matrix_rank(w)
            p = lam / lam.sum()
            assert row["matrix_entropy"] == pytest.approx(-np.sum(p * np.log(p)) / np.log(len(p)), rel=1e-10)
        assert "esd" not in rows.get("b", {})
        assert _notes(session)[("esd", "m/b")] == ("skipped", "needs a parameter of at least 2 dimensions")

    def test_float32_esd_is_accurate_where_documented(self, rng):
        """float32 ESD: large eigenvalues to ~1e-5 relative; rounding noise stored as 0."""
        w = rng.standard_normal((300, 200)) @ np.diag(np.logspace(0, -6, 200)) @ rng.standard_normal((200, 200))
        exact = np.sort(np.linalg.svd(w, compute_uv=False) ** 2)
        got = linalg.esd(w, "float32")
        big = exact > 1e-3 * exact[-1]
        np.testing.assert_allclose(got[big], exact[big], rtol=1e-4)
        floor = linalg.noise_floor(200, exact[-1], "float32")
        assert np.all(got[exact < floor / 100] == 0.0)

    def test_guide_hard_rank_reconfigure_erase_cycle(self, rng):
        """configure -> apply, reconfigure -> no-op, erase -> recompute (singular values 1..1e-7)."""
        u, _ = np.linalg.qr(rng.standard_normal((30, 6)))
        v, _ = np.linalg.qr(rng.standard_normal((8, 6)))
        w = u @ np.diag([1.0, 0.5, 1e-2, 1e-4, 1e-6, 1e-8]) @ v.T
        with Session() as session:
            session.models.add({"w": w}, model_id="m")
            session.compute.configure_kernel("hard_rank", rtol=1e-9)
            session.compute.apply("hard_rank")
            assert _metrics(session)["w"]["hard_rank"] == 6
            session.compute.configure_kernel("hard_rank", rtol=0.3)
            session.compute.apply("hard_rank")
            assert _metrics(session)["w"]["hard_rank"] == 6
            session.results.erase("hard_rank")
            session.compute.apply("hard_rank")
            assert _metrics(session)["w"]["hard_rank"] == 2
            session.compute.configure_kernel("hard_rank", rtol=1e-5)

    def test_marchenko_pastur_counts_spikes(self, rng):
        """A random matrix has no spikes; adding rank-2 signal gives two."""
        n, m = 1000, 400
        noise = rng.standard_normal((n, m))
        spikes = 4.0 * np.sqrt(n) * (rng.standard_normal((n, 2)) / np.sqrt(n)) @ (rng.standard_normal((2, m)) / np.sqrt(m)) * np.sqrt(m)
        with Session() as session:
            session.models.add({"noise": noise, "spiked": noise + spikes / 4.0 * 3.0}, model_id="m")
            session.compute.apply("num_spikes", "mp_softrank")
            rows = _metrics(session)
        edge = (np.sqrt(n) + np.sqrt(m)) ** 2
        assert rows["noise"]["mp_bulk_max"] == pytest.approx(edge, rel=0.02)
        assert rows["noise"]["num_spikes"] == 0
        assert rows["spiked"]["num_spikes"] == 2
        assert rows["spiked"]["mp_softrank"] < 1.0 < rows["noise"]["mp_softrank"] * 1.05

    def test_fits_in_the_session_match_the_function(self, rng):
        """power_law_fit stores the public fitter's result; derived fields follow the formulas."""
        w = rng.standard_t(1.8, size=(400, 800))
        with Session() as session:
            session.models.add({"w": w}, model_id="m")
            session.compute.apply("pl_alpha", "alpha_weighted", "log_alpha_norm", "exp_lambda",
                                  "tpl_alpha", "lr_exp_R")
            row = _metrics(session)["w"]
        lam = row["esd"]
        fit = fit_power_law(lam[lam > 0], fit_method="diffract")
        assert (row["pl_alpha"], row["pl_xmin"], row["pl_n_tail"]) == (fit.alpha, fit.xmin, fit.n_tail)
        assert row["alpha_weighted"] == pytest.approx(fit.alpha * math.log10(lam[-1]))
        assert row["log_alpha_norm"] == pytest.approx(math.log10(np.sum(lam ** fit.alpha)), rel=1e-9)
        tail = lam[lam >= fit.xmin]
        assert row["exp_lambda"] == pytest.approx(1 / np.mean(tail - fit.xmin))
        assert math.isfinite(row["tpl_alpha"]) and math.isfinite(row["lr_exp_R"])


class TestBadInput:
    def test_each_bad_parameter_is_nan_with_reason_and_the_rest_computes(self, rng):
        """NaN, zero, rank-1, short, all-equal and huge-range matrices: NaN + reason, no exception."""
        q, _ = np.linalg.qr(rng.standard_normal((80, 80)))
        huge = rng.standard_normal((200, 100)) @ np.diag(np.logspace(-150, 150, 100)) @ np.linalg.qr(rng.standard_normal((100, 100)))[0]
        model = {
            "nan": np.where(rng.random((60, 60)) < 0.01, np.nan, rng.standard_normal((60, 60))),
            "zero": np.zeros((70, 60)),
            "rank1": np.outer(rng.standard_normal(90), rng.standard_normal(70)),
            "short": rng.standard_normal((30, 40)),
            "orthogonal": q,
            "huge": huge,
            "good": rng.standard_t(1.8, size=(300, 600)),
        }
        with Session() as session:
            session.models.add(model, model_id="m")
            report = session.compute.apply("pl_alpha", "stable_rank", "log_norm", "hard_rank", "pl_pvalue")
            rows = _metrics(session)
            notes = _notes(session)
        assert report.ok
        assert math.isnan(rows["nan"]["pl_alpha"]) and math.isnan(rows["nan"]["stable_rank"])
        assert notes[("esd", "m/nan")][1].startswith("weights contain")
        assert "input 'esd' is undefined: weights contain" in notes[("power_law_fit", "m/nan")][1]
        assert math.isnan(rows["zero"]["stable_rank"]) and rows["zero"]["hard_rank"] == 0
        assert "all-zero matrix" in notes[("stable_rank", "m/zero")][1]
        assert rows["rank1"]["stable_rank"] == pytest.approx(1.0) and rows["rank1"]["hard_rank"] == 1
        assert "only 1 positive point(s)" in notes[("power_law_fit", "m/rank1")][1]
        assert "only 30 positive point(s), fewer than min_tail=50" in notes[("power_law_fit", "m/short")][1]
        assert "all eigenvalues are equal within rounding" in notes[("power_law_fit", "m/orthogonal")][1]
        assert rows["orthogonal"]["stable_rank"] == pytest.approx(80.0, rel=1e-5)
        assert math.isfinite(rows["huge"]["log_norm"]) and rows["huge"]["hard_rank"] < 100
        assert math.isfinite(rows["good"]["pl_alpha"]) and 0.0 <= rows["good"]["pl_pvalue"] <= 1.0

    @pytest.mark.parametrize("shape", [(0, 5), (7, 0), (3, 0, 2), (0, 3, 3)],
                             ids=["0x5", "7x0", "3x0x2", "0x3x3"])
    def test_a_zero_size_matrix_is_undefined_in_every_field(self, rng, shape):
        """A 0-size parameter: every spectral field is NaN with a reason, nothing fails."""
        from diffract.plugins import get_registry

        fields = sorted(
            f for spec in get_registry().kernels()
            if spec.provider.startswith("diffractml-kernels-spectral")
            and spec.apply_level is KernelApplyLevel.PARAMETER
            for f in spec.produce_fields
        )
        with Session() as session:
            session.models.add({"empty": np.zeros(shape), "good": rng.standard_normal((60, 80))},
                               model_id="m")
            session.compute.configure_kernel("pl_pvalue", n_replicates=5)
            report = session.compute.apply(*fields)
            rows = _metrics(session)
            notes = _notes(session)
        assert report.ok and len(fields) > 20
        n, m = shape[0], math.prod(shape[1:])
        # what reads only the shape is defined: the sizes, and the ESD factor; the fit's
        # quality says it failed
        sizes = {"esd_scale": 1.0, "greater_dim": max(n, m), "lower_dim": min(n, m),
                 "num_evals": min(n, m), "pl_fit_quality": "failed"}
        for field in fields:
            value = rows["empty"][field]
            if field in sizes:
                assert value == sizes[field], field
            elif field == "pl_fit_quality_reason":
                assert value.startswith("the spectrum is undefined"), value
            else:
                assert np.all(np.isnan(value)), (field, value)
        assert notes[("esd", "m/empty")] == (
            "undefined", f"the matrix has no elements (shape {(shape[0], math.prod(shape[1:]))})")
        assert notes[("spectral_norm", "m/empty")][1].startswith("input 'esd' is undefined: the matrix")
        assert math.isfinite(rows["good"]["stable_rank"])

    def test_diffract_method_without_taichi_is_a_failure_not_nan(self, rng, monkeypatch):
        """fit_method='diffract' without taichi fails the unit with the fix, keeping the rest."""
        from diffract.errors import ApplyError
        from diffract_kernels_spectral import _taichi, fitting

        monkeypatch.setitem(_taichi._STATE, "kernels", None)
        monkeypatch.setitem(_taichi._STATE, "error", "taichi is not installed (simulated)")
        monkeypatch.setattr(fitting, "DENSE_MAX_POINTS", 0)  # small spectra need no taichi
        with Session() as session:
            session.models.add({"w": rng.standard_normal((200, 300))}, model_id="m")
            session.compute.configure_kernel("power_law_fit", fit_method="diffract")
            try:
                with pytest.raises(ApplyError, match="FitUnavailableError: taichi is not installed"):
                    session.compute.apply("pl_alpha", "stable_rank")
            finally:
                session.compute.configure_kernel("power_law_fit", fit_method="auto")
            assert "stable_rank" in _metrics(session)["w"]


def test_pvalue_kernel_is_reproducible(rng):
    """pl_pvalue with a seed gives the same value in two sessions."""
    x = np.diag(np.sqrt(pareto(rng, 300, 2.5)))
    values = []
    for _ in range(2):
        with Session() as session:
            session.models.add({"w": x}, model_id="m")
            session.compute.configure_kernel("pl_pvalue", n_replicates=20, seed=3)
            session.compute.apply("pl_pvalue")
            values.append(_metrics(session)["w"]["pl_pvalue"])
    assert values[0] == values[1] and 0.0 <= values[0] <= 1.0


class TestBatchedSpectra:
    @pytest.mark.parametrize("precision", ["float64", "float32"])
    def test_torch_batched_esd_equals_lapack(self, rng, precision):
        """The batched torch path (GPU when present; CPU here) equals the LAPACK path."""
        mats = [rng.standard_normal((40, 24)), rng.standard_normal((40, 24)),
                rng.standard_normal((24, 60)) * 1e30, np.zeros((5, 7))]
        batched = linalg.esd_batched_torch(mats, precision, "cpu")
        rtol = 1e-10 if precision == "float64" else 1e-4
        for m, got in zip(mats, batched, strict=True):
            ref = linalg.esd(m, precision)
            big = ref > 1e-3 * max(ref.max(), 1e-300)
            np.testing.assert_allclose(got[big], ref[big], rtol=rtol)
            assert got.shape == ref.shape and np.all(got[~big] <= 1e-3 * max(ref.max(), 1e-300))

    @pytest.mark.parametrize("normalize", ["none", "greater_dim"])
    @pytest.mark.parametrize("precision", ["float64", "float32"])
    def test_session_batch_equals_one_by_one(self, rng, normalize, precision):
        """The esd batch path (one solver per core) stores what the per-matrix kernel
        gives, under every ESD normalisation and precision (issue 26 item 4)."""
        from diffract_kernels_spectral.kernels import esd as esd_kernel

        model = {f"w{i}": rng.standard_normal((50, 30 + i)) for i in range(5)}
        model["tall"] = rng.standard_normal((20, 70))
        with Session() as session:
            session.models.add(model, model_id="m")
            session.compute.configure_kernel("esd_scale", normalize=normalize)
            session.compute.configure_kernel("esd", precision=precision)
            try:
                session.compute.apply("esd", "esd_scale")
            finally:
                session.registry.reset_configuration()
            rows = _metrics(session)
        for name, w in model.items():
            scale = 1.0 / max(w.shape) if normalize == "greater_dim" else 1.0
            assert rows[name]["esd_scale"] == scale
            one = esd_kernel(w, scale, precision=precision, device="cpu")
            np.testing.assert_array_equal(rows[name]["esd"], one)
            exact = np.sort(np.linalg.svd(w, compute_uv=False) ** 2) * scale
            np.testing.assert_allclose(one, exact, rtol=1e-10 if precision == "float64" else 1e-4)


    def test_spectra_do_not_depend_on_the_blas_thread_count(self, rng):
        """The same bits whether the caller runs BLAS on one thread or two (the batch
        path limits it to one; a lone call would otherwise use every core)."""
        from threadpoolctl import threadpool_limits

        w = (rng.standard_normal((120, 90)) / 10).astype(np.float32)
        with threadpool_limits(1):
            one = (linalg.esd(w), linalg.singular_values(w), linalg.svd(w)[1])
        with threadpool_limits(2):
            two = (linalg.esd(w), linalg.singular_values(w), linalg.svd(w)[1])
        for a, b in zip(one, two, strict=True):
            np.testing.assert_array_equal(a, b)

def test_esd_of_torch_parameters_matches_numpy(rng):
    """esd reads the `tensor` field: a bf16 torch model gives the spectrum of its float32
    values, the same as the numpy path and the batched torch path."""
    import torch

    layer = torch.nn.Linear(30, 40).to(torch.bfloat16)
    with Session() as session:
        session.models.add(layer, model_id="m")
        session.compute.apply("esd")
        got = _metrics(session)["weight"]["esd"]
    w32 = layer.weight.detach().float().numpy()
    np.testing.assert_array_equal(got, linalg.esd(w32))
    (batched,) = linalg.esd_batched_torch([layer.weight.detach()], "float64", "cpu")
    exact = np.sort(np.linalg.svd(w32.astype(np.float64), compute_uv=False) ** 2)
    np.testing.assert_allclose(batched, exact, rtol=1e-9, atol=1e-12 * exact[-1])


class TestTopK:
    def _matrix(self, spectrum):
        g = np.random.default_rng(5)
        u, _ = np.linalg.qr(g.standard_normal((300, 200)))
        v, _ = np.linalg.qr(g.standard_normal((200, 200)))
        return (u * spectrum) @ v.T

    @pytest.mark.parametrize(("name", "rtol"), [("gap", 1e-12), ("decaying", 1e-5)])
    def test_randomized_top_k_matches_the_full_svd(self, name, rtol):
        """The randomized top-k SVD: values and vectors (up to sign) of the full SVD, to
        the accuracy linalg documents for each kind of spectrum."""
        s = (np.r_[np.linspace(100, 50, 8), np.linspace(5, 0.01, 192)] if name == "gap"
             else np.geomspace(100, 0.01, 200))
        w = self._matrix(s)
        u, sv, vt = np.linalg.svd(w, full_matrices=False)
        ur, sr, vr = linalg.svd(w, top_k=8)
        assert ur.shape == (300, 8) and sr.shape == (8,) and vr.shape == (8, 200)
        np.testing.assert_allclose(sr, sv[:8], rtol=rtol)
        np.testing.assert_allclose(np.abs(np.sum(ur * u[:, :8], axis=0)), 1.0, atol=10 * rtol)
        np.testing.assert_allclose(np.abs(np.sum(vr * vt[:8], axis=1)), 1.0, atol=10 * rtol)

    def test_torch_svd_path_equals_lapack(self, rng):
        """The torch SVD (what runs on a GPU) gives LAPACK's values and vectors up to sign."""
        pytest.importorskip("torch")
        w = rng.standard_normal((40, 25))
        u, s, vt = np.linalg.svd(w, full_matrices=False)
        tu, ts, tvt = linalg.svd_torch(w, "cpu")
        np.testing.assert_allclose(ts, s, rtol=1e-12)
        np.testing.assert_allclose(np.abs(np.sum(tu * u, axis=0)), 1.0, atol=1e-10)
        assert linalg.svd_torch(w, "cpu", top_k=5)[1].shape == (5,)

    def test_float32_vectors_are_the_float64_ones_rounded(self, rng):
        """svd vectors="float32": U and V^T are the float64 SVD's rounded to float32,
        the singular values the float64 ones, bit for bit."""
        from diffract_kernels_spectral.kernels import svd

        w = rng.standard_normal((60, 40))
        u, s, vt = svd(w)
        u32, s32, vt32 = svd(w, vectors="float32")
        assert u.dtype == vt.dtype == np.float64 and u32.dtype == vt32.dtype == np.float32
        np.testing.assert_array_equal(u32, u.astype(np.float32))
        np.testing.assert_array_equal(vt32, vt.astype(np.float32))
        np.testing.assert_array_equal(s32, s)

    def test_float16_vectors_and_a_share_of_them(self, rng):
        """vectors="float16" rounds the float64 vectors; vector_share keeps those of the
        top ceil(share k) directions (7 of 61 for a tenth), every singular value."""
        from diffract_kernels_spectral.kernels import svd

        w = rng.standard_normal((80, 61))
        u, s, vt = svd(w)
        u16, s16, vt16 = svd(w, vectors="float16", vector_share=0.1)
        assert u16.shape == (80, 7) and vt16.shape == (7, 61) and s16.shape == (61,)
        assert u16.dtype == vt16.dtype == np.float16 and u16.flags.c_contiguous
        np.testing.assert_array_equal(u16, u[:, :7].astype(np.float16))
        np.testing.assert_array_equal(vt16, vt[:7].astype(np.float16))
        np.testing.assert_array_equal(s16, s)
        u64 = svd(w, vector_share=0.5)[0]
        assert u64.shape == (80, 31) and u64.base is None  # a copy, not a view of all
        np.testing.assert_array_equal(u64, u[:, :31])

    def test_top_k_in_a_session(self, rng):
        """svd top_k keeps that many triplets in the stored fields."""
        with Session() as session:
            session.models.add({"w": rng.standard_normal((120, 80))}, model_id="m")
            session.compute.configure_kernel("svd", top_k=6)
            try:
                session.compute.apply("weights_svals")
                row = _metrics(session)["w"]
            finally:
                session.compute.configure_kernel("svd", top_k=0)
        assert row["weights_lsvs"].shape == (120, 6) and row["weights_rsvs"].shape == (6, 80)


@pytest.mark.parametrize("exponent", [130, 260, -140, -300])
def test_weights_far_outside_float32s_range_give_their_true_spectrum(exponent):
    """Weights of magnitude 2^130 (beyond float32) or 2^-140 (below its normal range): the
    ESD is computed on an exactly rescaled copy, so spectral_norm, log_norm and
    stable_rank match float64 numpy; no zeros stored as a normal result (issue 25 item 8)."""
    from diffract import Session

    w = np.random.default_rng(3).standard_normal((60, 40)) * 2.0**exponent
    top = np.linalg.svd(w, compute_uv=False)
    with Session() as s:
        s.models.add({"w": w}, "m")
        s.compute.apply("spectral_norm", "log_norm", "stable_rank")
        got = s.results.export_metrics("spectral_norm", "log_norm", "stable_rank")["m"]["w"]
    assert got["spectral_norm"] == pytest.approx(top[0] ** 2, rel=1e-5)
    assert got["log_norm"] == pytest.approx(np.log10(np.sum(top**2)), rel=1e-6)
    assert got["stable_rank"] == pytest.approx(np.sum(top**2) / top[0] ** 2, rel=1e-4)


class TestFittedBulk:
    """marchenko_pastur(bulk="fitted"): WeightWatcher's mp_fit (its numbers on MiniLM are
    pinned in test_conventions.py, where WeightWatcher is installed)."""

    def _fields(self, model, bulk):
        with Session() as s:
            s.models.add(model, model_id="m")
            s.compute.configure_kernel("marchenko_pastur", bulk=bulk)
            try:
                s.compute.apply("mp_bulk_max", "mp_softrank", "num_spikes", "esd")
            finally:
                s.registry.reset_configuration()
            return s.results.export_metrics(include_arrays=True)["m"]

    def test_a_random_matrix_is_all_bulk_and_planted_spikes_are_counted(self, rng):
        from diffract_kernels_spectral.kernels import fit_mp_sigma

        noise = rng.standard_normal((600, 300))
        u, _ = np.linalg.qr(rng.standard_normal((600, 3)))
        v, _ = np.linalg.qr(rng.standard_normal((300, 3)))
        spiked = noise + (u * np.array([120.0, 100.0, 90.0])) @ v.T
        rows = self._fields({"noise": noise, "spiked": spiked}, "fitted")
        assert rows["noise"]["num_spikes"] == 0 and rows["spiked"]["num_spikes"] == 3
        esd = np.asarray(rows["noise"]["esd"])
        sigma = fit_mp_sigma(esd / esd.mean(), 2.0)
        assert sigma == pytest.approx(1.0, abs=0.05)  # pure MP: unit scale once rescaled
        edge = esd.mean() * (sigma * (1 + 1 / np.sqrt(2.0))) ** 2
        assert rows["noise"]["mp_bulk_max"] == pytest.approx(edge, rel=1e-12)
        assert rows["noise"]["mp_softrank"] == pytest.approx(edge / esd.max(), rel=1e-12)
        # the frobenius bulk (default) counts the spikes too, from another edge
        plain = self._fields({"spiked": spiked}, "frobenius")["spiked"]
        assert plain["num_spikes"] == 3 and plain["mp_bulk_max"] != rows["spiked"]["mp_bulk_max"]

    def test_a_square_matrix_takes_the_quarter_circle(self, rng):
        """Q = 1: the singular values' quarter circle, whose edge is 2 sigma; a pure
        random square matrix rescaled to mean eigenvalue 1 has sigma 1 and its largest
        eigenvalue at the edge (4)."""
        from diffract_kernels_spectral.kernels import fit_mp_sigma

        rows = self._fields({"w": rng.standard_normal((300, 300))}, "fitted")
        esd = np.asarray(rows["w"]["esd"])
        sigma = fit_mp_sigma(esd / esd.mean(), 1.0)
        assert sigma == pytest.approx(1.0, abs=0.02)
        assert rows["w"]["mp_softrank"] == pytest.approx(4 * sigma**2 * esd.mean() / esd.max(),
                                                         rel=1e-12)
        assert rows["w"]["num_spikes"] == 0 and rows["w"]["mp_softrank"] == pytest.approx(
            1.0, abs=0.06)


def test_the_esd_kernel_scans_a_matrix_for_its_range_once(monkeypatch):
    """The NaN/Inf check's min and max also give linalg.esd its largest magnitude (one
    pass of each over a large matrix, not two: a 1B model's 5.6 GiB of float32), with
    the same bits as linalg.esd taking it itself."""
    from diffract_kernels_spectral.kernels import esd as esd_kernel

    w = np.random.default_rng(5).standard_normal((60, 40)).astype(np.float32) * 2.0**50
    alone = linalg.esd(w)  # 2**50: the rescaled route
    given = []
    real = linalg.esd
    monkeypatch.setattr(linalg, "esd", lambda *a, **k: given.append(k.get("top"))
                        or real(*a, **k))
    got = esd_kernel(w, 1.0, device="cpu")
    assert given == [float(np.abs(w).max())]
    assert np.array_equal(got, alone)
