"""The alignment pack: known answers, parity with the original's formulas, scope rules,
pairs, the randomized top-k SVD, and the missing-producer message."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from diffract import Session
from diffract.errors import (
    ApplyError,
    InvalidArgumentError,
    MissingProducerError,
    ScopeValidationError,
)

pytest.importorskip("diffract_kernels_alignment")
pytest.importorskip("diffract_kernels_spectral")

ALL_FIELDS = ("l_overlap", "r_overlap", "l_agreement", "r_agreement", "max_l_agreement",
              "max_r_agreement", "avg_l_agreement", "avg_r_agreement", "avg_max_l_agreement",
              "avg_max_r_agreement", "l_subspace_overlap", "l_principal_angles",
              "r_subspace_overlap", "r_principal_angles", "sval_rel_change",
              "intruder_dimensions")


def _spread(rng, n, m):
    """An n x m matrix with well-separated singular values (unique vectors)."""
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((m, m)))
    k = min(n, m)
    s = np.linspace(10.0, 1.0, k)
    return (u[:, :k] * s) @ v[:, :k].T


def _spectrum_pair(spectrum: str, noise: float) -> tuple[np.ndarray, np.ndarray]:
    """A 300 x 200 matrix whose spectrum has a gap after its top 8 (``"gap"``) or decays
    by 5% per direction (``"decaying"``), and it plus Gaussian noise of scale ``noise``."""
    g = np.random.default_rng(1)
    u, _ = np.linalg.qr(g.standard_normal((300, 200)))
    v, _ = np.linalg.qr(g.standard_normal((200, 200)))
    s = (np.r_[np.linspace(100, 50, 8), np.linspace(5, 0.01, 192)] if spectrum == "gap"
         else np.geomspace(100, 0.01, 200))
    a = (u * s) @ v.T
    return a, a + noise * np.random.default_rng(2).standard_normal((300, 200))


def _recorded(a: np.ndarray, b: np.ndarray, fields, **svd) -> tuple[dict, list[dict]]:
    """The pair's aggregates of ``fields`` under the svd configuration ``svd``, undefined
    values recorded, and the notes saying why."""
    with Session() as session:
        session.models.add({"w": a}, model_id="a")
        session.models.add({"w": b}, model_id="b")
        session.compute.configure_kernel("svd", **svd)
        try:
            session.filter(["a", "b"]).compute.apply(*fields, errors="record", progress=False)
            return (session.results.export_aggregates(*fields),
                    session.results.export_notes())
        finally:
            session.registry.reset_configuration("svd")


def _pair(a: dict, b: dict, fields=ALL_FIELDS, **config):
    with Session() as s:
        s.models.add(a, model_id="a")
        s.models.add(b, model_id="b")
        for kernel, values in config.items():
            s.compute.configure_kernel(kernel, **values)
        try:
            s.filter(["a", "b"]).compute.apply(*fields)
            out = s.results.export_aggregates()
        finally:
            for kernel in config:  # the registry is process-global: leave it as found
                s.registry.reset_configuration(kernel)
    return {name.split("@")[0] + "@" + name.split("@params[")[1][:-1]: v for name, v in out.items()}


class TestKnownAnswers:
    def test_identical_models_agree_perfectly(self, rng):
        """Every agreement is 1, subspaces coincide, no intruders, no change."""
        w = {"w": _spread(rng, 30, 20)}
        got = _pair(w, {"w": w["w"].copy()})
        np.testing.assert_allclose(got["l_agreement@w"], 1.0, atol=1e-10)
        np.testing.assert_allclose(got["max_r_agreement@w"], 1.0, atol=1e-10)
        assert got["avg_l_agreement@w"] == pytest.approx(1.0, abs=1e-10)
        assert got["l_subspace_overlap@w"] == 1.0  # exactly: a head ranking shows 0 change
        assert np.max(got["l_principal_angles@w"]) < 1e-14  # arccos alone gave 1.5e-8
        assert got["intruder_dimensions@w"] == 0 and got["sval_rel_change@w"] == pytest.approx(0.0, abs=1e-12)
        assert got["l_overlap@w"].shape == (20, 20)

    def test_permuted_hidden_units_keep_max_agreement_but_not_the_diagonal(self, rng):
        """Permuting rows (output units) keeps every right direction and maps each left
        one to a permuted vector: max agreement 1, the diagonal agreement of reordered
        singular values below 1 when the permutation also reorders their magnitudes."""
        w = _spread(rng, 24, 16)
        b = w[rng.permutation(24)]
        got = _pair({"w": w}, {"w": b})
        # singular values are invariant, so directions stay in place up to the permutation
        np.testing.assert_allclose(got["max_r_agreement@w"], 1.0, atol=1e-8)
        np.testing.assert_allclose(got["r_agreement@w"], 1.0, atol=1e-8)
        assert got["avg_l_agreement@w"] < 0.5  # U_b = P U_a: cosines of permuted vectors
        # the l_ side in the permuted basis: P U_a matches U_b exactly
        w_col = _spread(rng, 16, 24)
        c = w_col[:, rng.permutation(24)]  # permuted inputs of a layer with distinct svals
        got = _pair({"w": w_col}, {"w": c})
        np.testing.assert_allclose(got["max_l_agreement@w"], 1.0, atol=1e-8)
        assert got["avg_max_l_agreement@w"] == pytest.approx(1.0, abs=1e-8)
        assert got["avg_r_agreement@w"] < 1.0

    def test_reordered_directions_keep_max_agreement_and_lower_the_diagonal(self, rng):
        """Swapping which directions carry the larger singular values: every direction
        survives (max agreement 1) but not in its place (diagonal agreement < 1)."""
        n = 12
        u, _ = np.linalg.qr(rng.standard_normal((n, n)))
        v, _ = np.linalg.qr(rng.standard_normal((n, n)))
        s = np.linspace(12, 1, n)
        a = (u * s) @ v.T
        order = np.r_[1, 0, 3, 2, np.arange(4, n)]
        b = (u[:, order] * s) @ v[:, order].T
        got = _pair({"w": a}, {"w": b})
        np.testing.assert_allclose(got["max_l_agreement@w"], 1.0, atol=1e-8)
        assert got["l_agreement@w"][:4] == pytest.approx([0, 0, 0, 0], abs=1e-8)
        assert got["avg_l_agreement@w"] == pytest.approx((n - 4) / n, abs=1e-8)

    def test_a_rotation_of_the_inputs_lowers_r_and_keeps_l(self, rng):
        """W R with R a random rotation of the input space: the left directions and the
        singular values stay, the right ones move."""
        w = _spread(rng, 20, 30)
        r, _ = np.linalg.qr(rng.standard_normal((30, 30)))
        got = _pair({"w": w}, {"w": w @ r})
        assert got["avg_l_agreement@w"] == pytest.approx(1.0, abs=1e-8)
        assert got["avg_r_agreement@w"] < 0.5 and got["r_subspace_overlap@w"] < 0.9
        assert got["sval_rel_change@w"] == pytest.approx(0.0, abs=1e-10)

    def test_sign_flips_change_nothing(self, rng):
        """Flipping the sign of singular-vector pairs (the SVD's gauge) changes no field."""
        w = _spread(rng, 18, 14)
        u, s, vt = np.linalg.svd(w, full_matrices=False)
        flips = rng.choice([-1.0, 1.0], size=14)
        same = ((u * flips) * s) @ (vt * flips[:, None])
        got = _pair({"w": w}, {"w": same})
        assert got["avg_l_agreement@w"] == pytest.approx(1.0, abs=1e-8)
        assert got["avg_r_agreement@w"] == pytest.approx(1.0, abs=1e-8)

    def test_agreement_falls_as_the_perturbation_grows(self, rng):
        """Averaged over seeds, agreement decreases monotonically with the noise level."""
        levels = [0.0, 0.05, 0.2, 0.8, 3.0]
        means = []
        for eps in levels:
            values = []
            for seed in range(4):
                g = np.random.default_rng(seed)
                w = _spread(g, 20, 16)
                values.append(_pair({"w": w}, {"w": w + eps * g.standard_normal(w.shape)},
                                    fields=("avg_l_agreement",))["avg_l_agreement@w"])
            means.append(np.mean(values))
        assert all(x > y for x, y in itertools.pairwise(means)), means

    def test_intruders_of_a_random_orthogonal_replacement(self, rng):
        """A layer whose top directions are replaced by random orthogonal ones has k
        intruder dimensions (threshold 0.5); the original has none."""
        n = 64
        u, _ = np.linalg.qr(rng.standard_normal((n, n)))
        v, _ = np.linalg.qr(rng.standard_normal((n, n)))
        s = np.linspace(20, 1, n)
        a = (u * s) @ v.T
        q, _ = np.linalg.qr(rng.standard_normal((n, n)))  # a random orthogonal basis
        b = (q * s) @ v.T
        got = _pair({"w": a}, {"w": b}, fields=("intruder_dimensions",),
                    intruder_dimensions={"k": 10, "threshold": 0.5})
        assert got["intruder_dimensions@w"] == 10
        assert _pair({"w": a}, {"w": a}, fields=("intruder_dimensions",))["intruder_dimensions@w"] == 0


class TestParityWithTheOriginal:
    def test_same_numbers_as_the_originals_ascending_formulas(self, rng):
        """The original sorted directions ascending; its means equal ours and its arrays
        are ours reversed (an independent re-implementation of its formulas)."""
        a = _spread(rng, 22, 15)
        b = a + 0.3 * rng.standard_normal(a.shape)

        def original(w):  # economy SVD, ascending singular values, V as columns
            u, s, vt = np.linalg.svd(w, full_matrices=False)
            order = np.argsort(s)
            return u[:, order], s[order], vt.T[:, order]

        ua, _, va = original(a)
        ub, _, vb = original(b)
        k = min(a.shape)
        ol, orr = np.abs((ua.T @ ub)[:k, :k]), np.abs((va.T @ vb)[:k, :k])
        got = _pair({"w": a}, {"w": b})
        assert got["avg_l_agreement@w"] == pytest.approx(np.mean(np.diag(ol)), rel=1e-12)
        assert got["avg_max_r_agreement@w"] == pytest.approx(np.mean(np.max(orr, axis=1)), rel=1e-12)
        np.testing.assert_allclose(got["l_agreement@w"], np.diag(ol)[::-1], rtol=1e-10)
        np.testing.assert_allclose(got["max_r_agreement@w"], np.max(orr, axis=1)[::-1], rtol=1e-10)
        np.testing.assert_allclose(got["max_l_agreement@w"], np.max(ol, axis=1)[::-1], rtol=1e-10)
        assert not np.allclose(np.max(ol, axis=1), np.max(ol, axis=0))  # the axis matters here


class TestWeightedAndTopK:
    def test_weighted_means_use_model_as_singular_values(self, rng):
        """weighted=True weights each direction by sigma_a."""
        a = _spread(rng, 14, 10)
        b = a + 0.5 * rng.standard_normal(a.shape)
        got = _pair({"w": a}, {"w": b}, avg_l_agreement={"weighted": True})
        s = np.linalg.svd(a, compute_uv=False)
        agreement = got["l_agreement@w"]
        assert got["avg_l_agreement@w"] == pytest.approx(np.sum(s * agreement) / np.sum(s), rel=1e-10)

    @pytest.mark.parametrize(("spectrum", "atol"), [
        ("gap", 1e-12),      # a gap after the top 8: exact to rounding
        ("decaying", 2e-5),  # 5% per direction: the documented accuracy
    ])
    def test_top_k_overlap_from_a_randomized_svd_matches_the_full_one(self, spectrum, atol):
        """With svd top_k = 8 (randomized: well under a fifth of 200 directions) the
        overlap of the top k = 8 is the top-left 8 x 8 block of the full one, to the
        documented accuracy."""
        a, b = _spectrum_pair(spectrum, 0.02)
        full = _pair({"w": a}, {"w": b}, fields=("l_overlap",))["l_overlap@w"]
        top = _pair({"w": a}, {"w": b}, fields=("l_overlap",), svd={"top_k": 8},
                    l_overlap={"k": 8})["l_overlap@w"]
        assert top.shape == (8, 8)
        np.testing.assert_allclose(top, full[:8, :8], atol=atol)

    def test_the_top_tenth_under_svd_top_k_is_the_matrix_s_or_undefined(self):
        """The subspace fields' default k is the top tenth of min(N, M) = 200 directions,
        20, whatever the SVD computed: with svd top_k = 8 that is undefined, saying to set
        k (it was the top tenth of the 8 computed, one direction, under the same name);
        with k = 8 set it is the full SVD's, to the documented accuracy (a gap after the top
        8); with top_k = 50 (a truncated full SVD: over a fifth) the full SVD's exactly."""
        a, b = _spectrum_pair("gap", 0.5)
        fields = ("l_subspace_overlap", "avg_max_r_agreement_top")
        full = _pair({"w": a}, {"w": b}, fields=fields)
        full8 = _pair({"w": a}, {"w": b}, fields=fields, l_subspace={"k": 8},
                      avg_max_r_agreement_top={"k": 8})
        values, listed = _recorded(a, b, fields, top_k=8)
        notes = {n["kernel"]: n["reason"] for n in listed}
        assert all(np.isnan(v) for v in values.values()) and len(values) == 2
        assert "read the top 20 of 200 directions" in notes["l_subspace"]
        assert "(svd.top_k=8): set l_subspace.k=8 or less, or svd.top_k=20 or more" in \
            notes["l_subspace"]
        assert "avg_max_r_agreement_top" in notes
        top8 = _pair({"w": a}, {"w": b}, fields=fields, svd={"top_k": 8},
                     l_subspace={"k": 8}, avg_max_r_agreement_top={"k": 8})
        top50 = _pair({"w": a}, {"w": b}, fields=fields, svd={"top_k": 50})
        for field in fields:
            assert top8[f"{field}@w"] == pytest.approx(full8[f"{field}@w"], abs=1e-9)
            assert top50[f"{field}@w"] == pytest.approx(full[f"{field}@w"], abs=1e-12)
        assert full8["l_subspace_overlap@w"] != pytest.approx(full["l_subspace_overlap@w"],
                                                              abs=1e-3)

    def test_the_fields_over_every_direction_are_undefined_under_svd_top_k(self):
        """The overlaps and agreements with k = 0, sval_rel_change and intruder_dimensions
        are over all min(N, M) = 200 directions (intruders: b's top 10 among all of a's).
        With svd top_k = 8 they were over the 8 computed, under the same names; they are
        undefined, saying what to set, and with k = 8 set they are the full SVD's top 8."""
        a, b = _spectrum_pair("gap", 0.5)
        fields = ("avg_l_agreement", "avg_max_r_agreement", "sval_rel_change",
                  "intruder_dimensions")
        values, listed = _recorded(a, b, fields, top_k=8)
        notes = {n["kernel"]: n["reason"] for n in listed}
        assert len(values) == 4 and all(np.isnan(v) for v in values.values()), values
        for kernel in ("l_overlap", "r_overlap", "sval_rel_change"):
            assert "read all 200 directions, and the SVD computed 8" in notes[kernel]
            assert f"{kernel}.k=8 or less, or svd.top_k=0" in notes[kernel], notes[kernel]
        assert "all 200 of model a's directions" in notes["intruder_dimensions"]
        assert "set svd.top_k=0" in notes["intruder_dimensions"]
        top8 = {"l_overlap": {"k": 8}, "r_overlap": {"k": 8}, "sval_rel_change": {"k": 8}}
        full = _pair({"w": a}, {"w": b}, fields=fields[:3], **top8)
        got = _pair({"w": a}, {"w": b}, fields=fields[:3], svd={"top_k": 8}, **top8)
        for field in fields[:3]:
            assert got[f"{field}@w"] == pytest.approx(full[f"{field}@w"], abs=1e-9)
        whole = _pair({"w": a}, {"w": b}, fields=fields[:3])  # every direction: another value
        assert whole["sval_rel_change@w"] != pytest.approx(full["sval_rel_change@w"], rel=1e-2)
        assert whole["avg_l_agreement@w"] != pytest.approx(full["avg_l_agreement@w"], abs=1e-2)


class TestScopeAndPairs:
    def test_three_models_need_a_pair_and_pairs_helper_covers_them(self, rng):
        """A pairwise field on three models raises naming the dependency; apply_pairs
        runs every pair, the first against the rest, or consecutive ones."""
        w = _spread(rng, 10, 8)
        with Session() as s:
            for i in range(3):
                s.models.add({"w": w + 0.1 * i * rng.standard_normal(w.shape)}, model_id=f"c{i}")
            with pytest.raises(ScopeValidationError, match=r"it depends on 'l_overlap'"):
                s.compute.apply("avg_l_agreement")
            reports = s.compute.apply_pairs("avg_l_agreement", pairs="first")
            assert list(reports) == [("c0", "c1"), ("c0", "c2")]
            assert set(s.compute.apply_pairs("avg_l_agreement", pairs="all")) == {
                ("c0", "c1"), ("c0", "c2"), ("c1", "c2")}
            names = sorted(s.results.export_aggregates("avg_l_agreement"))
            assert names == ["avg_l_agreement@models[c0,c1]@params[w]",
                             "avg_l_agreement@models[c0,c2]@params[w]",
                             "avg_l_agreement@models[c1,c2]@params[w]"]
            with pytest.raises(InvalidArgumentError, match=r"pairs must be 'all', 'first'"):
                s.compute.apply_pairs("avg_l_agreement", pairs="every")

    def test_missing_and_reshaped_parameters_are_skipped_with_reasons(self, rng):
        """A parameter only a has, or shaped differently in b, is skipped and says why."""
        a = {"w": _spread(rng, 8, 6), "extra": np.ones((3, 3)), "grown": np.ones((4, 4))}
        b = {"w": _spread(rng, 8, 6), "grown": np.ones((5, 4))}
        with Session() as s:
            s.models.add(a, model_id="a")
            s.models.add(b, model_id="b")
            s.filter(["a", "b"]).compute.apply("avg_l_agreement")
            notes = {(n["kernel"], n["unit"]): n["reason"] for n in s.results.export_notes()}
        assert notes[("l_overlap", "[a,b]/extra")] == "parameter 'extra' is not in model 'b'"
        assert notes[("l_overlap", "[a,b]/grown")] == (
            "parameter 'grown' has shape (4, 4) in 'a' but (5, 4) in 'b'")

    def test_without_the_spectral_pack_apply_names_it(self, rng):
        """With no producer of the SVD fields, apply says which distribution to install."""
        from diffract.plugins import _runtime, make_plugin_manager, set_plugin_manager

        previous = _runtime._MANAGER
        set_plugin_manager(make_plugin_manager(allow=["diffractml-kernels-alignment"]))
        try:
            with Session() as s:
                s.models.add({"w": np.ones((3, 3))}, model_id="a")
                s.models.add({"w": np.ones((3, 3))}, model_id="b")
                with pytest.raises(MissingProducerError, match=r"Kernel 'l_overlap' requires field "
                                   r"'weights_lsvs', which no registered kernel produces\..* Install "
                                   r"diffractml-kernels-spectral \(diffractml-kernels-spectral is "
                                   r"installed but not loaded .*allow=\[\.\.\., "
                                   r"'diffractml-kernels-spectral'\]\) loads it\)"):
                    s.filter(["a", "b"]).compute.apply("avg_l_agreement")
        finally:
            set_plugin_manager(previous)

    def test_failures_of_every_pair_are_reported_together(self):
        """A kernel failing on one pair raises once at the end, naming that pair's unit;
        the other pairs are stored."""
        from diffract import KernelApplyLevel

        with Session() as s:
            s.models.add({"w": np.ones((3, 3))}, model_id="a")
            s.models.add({"w": np.zeros((3, 3))}, model_id="b")
            s.models.add({"w": np.ones((3, 3))}, model_id="c")
            s.compute.kernel(name="t_fail_zero", apply_level=KernelApplyLevel.CROSS_MODEL)(
                _fails_on_zero)
            with pytest.raises(ApplyError, match=r"1 unit\(s\) failed.*\n  t_fail_zero on "
                               r"\[a,b\]/w: ValueError: model b is all zero"):
                s.compute.apply_pairs("t_fail_zero", pairs=[("a", "b"), ("a", "c")])
            assert s.results.export_aggregates("t_fail_zero") == {
                "t_fail_zero@models[a,c]@params[w]": 1.0}


def _fails_on_zero(weights: tuple) -> float:
    if not np.any(weights[1]):
        raise ValueError("model b is all zero")
    return 1.0


class TestAgainstNumpy:
    """Issue 26 item 4: values compared with a direct numpy computation on inputs where a
    wrong side, a wrong k or a wrong reference set gives another number."""

    @staticmethod
    def _factors(rng, n, m):
        u, _ = np.linalg.qr(rng.standard_normal((n, n)))
        v, _ = np.linalg.qr(rng.standard_normal((m, m)))
        return u, np.linspace(30.0, 1.0, min(n, m)), v

    def test_r_subspace_overlap_is_the_input_side(self, rng):
        """Model b keeps a's left singular vectors and turns its right ones partway:
        l_subspace_overlap is 1, r_subspace_overlap is numpy's ||V_a,k^T V_b,k||_F^2 / k,
        with the default k = ceil(k_total / 10) (25 directions: 3, not 2)."""
        n, m = 40, 25
        u, s, v = self._factors(rng, n, m)
        a = (u[:, :m] * s) @ v.T
        turn, _ = np.linalg.qr(np.eye(m) + 0.4 * rng.standard_normal((m, m)))
        vb = v @ turn
        b = (u[:, :m] * s) @ vb.T
        got = _pair({"w": a}, {"w": b}, fields=("l_subspace_overlap", "r_subspace_overlap",
                                                 "r_principal_angles"))
        assert got["l_subspace_overlap@w"] == pytest.approx(1.0, abs=1e-12)
        # b's own right singular vectors (its singular values are a's: same order)
        vb_svd = np.linalg.svd(b)[2].T
        cross = v[:, :3].T @ vb_svd[:, :3]
        assert got["r_subspace_overlap@w"] == pytest.approx(np.sum(cross**2) / 3, rel=1e-10)
        angles = np.sort(np.arccos(np.clip(np.linalg.svd(cross, compute_uv=False), 0, 1)))
        np.testing.assert_allclose(got["r_principal_angles@w"], angles, atol=1e-10)
        assert 0.05 < got["r_subspace_overlap@w"] < 0.95  # a case that tells the sides apart
        two = np.sum((v[:, :2].T @ vb_svd[:, :2]) ** 2) / 2
        assert abs(got["r_subspace_overlap@w"] - two) > 1e-3  # and rounding down from ceil

    def test_small_principal_angles_keep_their_digits(self, rng):
        """b's top 5 left directions are a's turned by planted angles into directions a
        does not use (1e-8 to 1.2 rad): the principal angles are those, each to 1e-5 of
        itself (arccos of the cosines gave 0 for 1e-8 and 1e-7 off at 3e-7), the overlap
        the mean of their squared cosines."""
        n, m = 50, 50
        u, s, v = self._factors(rng, n, m)
        theta = np.array([1e-8, 3e-7, 1e-4, 0.3, 1.2])
        a_top, free = u[:, :5], u[:, 5:10]
        turned = a_top * np.cos(theta) + free * np.sin(theta)
        away = -a_top * np.sin(theta) + free * np.cos(theta)
        ub = np.hstack([turned, away, u[:, 10:]])  # orthogonal, b's top 5 turned
        got = _pair({"w": (u * s) @ v.T}, {"w": (ub * s) @ v.T},
                    fields=("l_subspace_overlap", "l_principal_angles"))
        np.testing.assert_allclose(got["l_principal_angles@w"], theta, rtol=1e-5)
        assert got["l_subspace_overlap@w"] == pytest.approx(np.mean(np.cos(theta) ** 2),
                                                            rel=1e-12)

    def test_vectors_kept_in_float16_span_one_subspace_for_one_matrix(self, rng):
        """svd vectors="float16": the stored columns are orthonormal only to float16's
        rounding; the subspace they span is compared, so one matrix against itself gives
        angles of float64 rounding (the raw columns gave 0.015 rad)."""
        w = {"w": _spread(rng, 60, 40)}
        got = _pair(w, {"w": w["w"].copy()}, fields=("l_subspace_overlap",
                                                     "l_principal_angles"),
                    svd={"vectors": "float16"})
        assert np.max(got["l_principal_angles@w"]) < 1e-14
        assert got["l_subspace_overlap@w"] == 1.0

    def test_a_direction_rising_into_the_top_k_is_no_intruder(self, rng):
        """b's top direction is a's 30th (its singular value raised from far below): it
        has a counterpart among a's directions, so no intruder; a new direction is one."""
        n = 48
        u, s, v = self._factors(rng, n, n)
        a = (u * s) @ v.T
        sb = s.copy()
        sb[29] = 40.0  # the 30th direction now leads
        b = (u * sb) @ v.T
        got = _pair({"w": a}, {"w": b}, fields=("intruder_dimensions",),
                    intruder_dimensions={"k": 5, "threshold": 0.5})
        assert got["intruder_dimensions@w"] == 0  # against a's top 5 only, it would be 1
        q, _ = np.linalg.qr(rng.standard_normal((n, n)))
        d = (q * s) @ v.T  # every direction new
        got_d = _pair({"w": a}, {"w": d}, fields=("intruder_dimensions",),
                      intruder_dimensions={"k": 5, "threshold": 0.5})
        assert got_d["intruder_dimensions@w"] == 5

    def test_intruders_need_every_direction_of_a(self, rng):
        """With the vectors of a's top tenth only (svd vector_share=0.1, what diffract
        track keeps), b's risen 30th direction would find no counterpart and count as an
        intruder: the field is undefined there, saying what to set, not another number
        under the same name (it gave 1 where every direction's vectors give 0)."""
        n = 48
        u, s, v = self._factors(rng, n, n)
        sb = s.copy()
        sb[29] = 40.0
        values, notes = _recorded((u * s) @ v.T, (u * sb) @ v.T, ("intruder_dimensions",),
                                  vector_share=0.1)
        assert list(values) == ["intruder_dimensions@models[a,b]@params[w]"]
        assert np.isnan(values["intruder_dimensions@models[a,b]@params[w]"])
        (note,) = [n for n in notes if n["kernel"] == "intruder_dimensions"]
        assert "all 48 of model a's directions" in note["reason"]
        assert "vector_share=1" in note["reason"]


@pytest.mark.parametrize("scale", [1.0, 1e-20, 1e-150])
def test_weights_rel_change_of_tiny_weights_is_computed_in_float64(scale):
    """Weights of 1e-20 (their squares underflow float32) change by 1%: 0.01, not "all
    zero"; a NaN in either model's weights is undefined with that reason."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((16, 12)) * scale
    b = a * 1.01
    with Session() as s:
        s.models.add({"w": a}, "a")
        s.models.add({"w": b}, "b")
        s.compute.apply("weights_rel_change", errors="record", progress=False)
        got = s.results.export_aggregates("weights_rel_change")
    assert got["weights_rel_change@models[a,b]@params[w]"] == pytest.approx(0.01, rel=1e-9)
    a[3, 4] = np.nan
    with Session() as s:
        s.models.add({"w": a}, "a")
        s.models.add({"w": b}, "b")
        s.compute.apply("weights_rel_change", errors="record", progress=False)
        (note,) = s.results.export_notes()
    assert "model a's weights hold NaN or infinite values (1 of 192)" in note["reason"]
