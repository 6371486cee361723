"""One bad unit costs that unit only: unreadable weights, non-finite values, JSON export."""

from __future__ import annotations

import json
import math
import re

import numpy as np
import pytest

from diffract.errors import ApplyError

torch = pytest.importorskip("torch")


def _model(n: int = 21) -> dict:
    gen = torch.Generator().manual_seed(0)
    return {f"layer{i}.weight": torch.randn(4, 3, generator=gen) for i in range(n)}


class TestUnreadableWeights:
    @pytest.mark.parametrize(
        ("bad", "reason"),
        [
            (lambda: torch.empty(4, 3, device="meta"), r"meta device and has no data"),
            (lambda: torch.randn(4, 3).to_sparse(), r"sparse_coo tensor; add the dense weights"),
        ],
        ids=["meta", "sparse"],
    )
    def test_one_unreadable_parameter_fails_alone(self, session, bad, reason):
        """A parameter whose weights cannot be read fails with the reason; the 20 others
        are stored, and errors='record' returns the report."""
        state = _model()
        state["layer7.weight"] = bad()
        session.models.add(state, model_id="m")
        with pytest.warns(UserWarning, match=r"1 unit\(s\) failed"):
            report = session.compute.apply("frob_norm", errors="record")
        rows = session.results.export_metrics("frob_norm")["m"]
        assert len(rows) == 20 and "layer7.weight" not in rows
        assert rows["layer0.weight"]["frob_norm"] == pytest.approx(
            float(torch.linalg.norm(state["layer0.weight"]))
        )
        (failure,) = report.failures
        assert failure.unit == "m/layer7.weight" and failure.kind == "failed"
        assert failure.reason.startswith("cannot read input 'weights' of m/layer7.weight: ")
        assert re.search(reason, failure.reason), failure.reason
        notes = session.results.export_notes()
        assert [(n["unit"], n["kind"]) for n in notes] == [("m/layer7.weight", "failed")]

    def test_an_io_error_fails_its_unit_and_is_retried(self, session, monkeypatch):
        """An I/O error while reading one parameter fails that unit; fixed, the next apply
        computes only it."""
        session.models.add(_model(5), model_id="m")
        store = session.store
        real = store.load_weights

        def flaky(model_id, param):
            if param == "layer2.weight":
                raise OSError("disk went away")
            return real(model_id, param)

        monkeypatch.setattr(store, "load_weights", flaky)
        with pytest.raises(ApplyError, match=r"frob_norm on m/layer2.weight: cannot read input "
                                             r"'weights' of m/layer2.weight: OSError: disk went away"):
            session.compute.apply("frob_norm")
        assert len(session.results.export_metrics("frob_norm")["m"]) == 4
        monkeypatch.setattr(store, "load_weights", real)
        report = session.compute.apply("frob_norm")
        assert report.computed == {"frob_norm": 1}
        assert session.results.export_notes() == []

    def test_an_aggregate_waits_for_a_failed_parameter(self, session, monkeypatch):
        """param_norm is not stored from a partial set while one frob_norm failed (it would
        never be recomputed): it fails naming the parameter, and is computed once the
        parameter reads again."""
        state = _model(3)
        session.models.add(state, model_id="m")
        store = session.store
        real = store.load_weights

        def flaky(model_id, param):
            if param == "layer1.weight":
                raise OSError("disk went away")
            return real(model_id, param)

        monkeypatch.setattr(store, "load_weights", flaky)
        with pytest.raises(ApplyError, match=r"2 unit\(s\) failed") as info:
            session.compute.apply("param_norm")
        failure = next(f for f in info.value.report.failures if f.kernel == "param_norm")
        assert failure.reason.startswith(
            "input 'frob_norm' failed on 1 of 3 parameters of m (layer1.weight: cannot read "
            "input 'weights' of m/layer1.weight: OSError: disk went away); the aggregate is "
            "computed once they succeed")
        assert session.results.export_aggregates("param_norm") == {}
        monkeypatch.setattr(store, "load_weights", real)
        session.compute.apply("param_norm")
        expected = sum(float(torch.sum(w.double() ** 2)) for w in state.values())
        assert session.results.export_aggregates("param_norm") == {
            "param_norm@models[m]": pytest.approx(expected)}

    def test_a_dependent_of_a_failed_unit_fails_too_and_is_retried(self, session, monkeypatch):
        """A per-parameter kernel whose input failed upstream fails with that cause (not a
        permanent skip), and runs once the input exists."""

        @session.compute.kernel()
        def t_double(frob_norm):
            return 2 * frob_norm

        session.models.add(_model(2), model_id="m")
        store = session.store
        real = store.load_weights
        monkeypatch.setattr(store, "load_weights", lambda m, p: (_ for _ in ()).throw(OSError("gone"))
                            if p == "layer0.weight" else real(m, p))
        with pytest.raises(ApplyError) as info:
            session.compute.apply("t_double")
        reasons = {(f.kernel, f.unit): f.reason for f in info.value.report.failures}
        assert reasons[("t_double", "m/layer0.weight")].startswith(
            "input 'frob_norm' is missing because 'frob_norm' failed on m/layer0.weight: cannot read")
        monkeypatch.setattr(store, "load_weights", real)
        assert session.compute.apply("t_double").computed == {"frob_norm": 1, "t_double": 1}


class TestNonFiniteWeights:
    def test_nan_and_inf_weights_are_undefined_with_a_reason(self, session):
        """frob_norm of NaN/Inf weights is NaN with the count of bad values; param_norm is
        NaN with the parameters and reasons that made it so; finite parameters are kept."""
        w = np.ones((3, 3))
        nan = w.copy()
        nan[0, 0] = nan[1, 1] = np.nan
        inf = w.copy()
        inf[2, 2] = np.inf
        session.models.add({"ok": w, "nan": nan, "inf": inf}, model_id="m")
        session.compute.apply("param_norm")
        rows = session.results.export_metrics("frob_norm")["m"]
        assert rows["ok"]["frob_norm"] == pytest.approx(3.0)
        assert math.isnan(rows["nan"]["frob_norm"]) and math.isnan(rows["inf"]["frob_norm"])
        reasons = {(n["kernel"], n["unit"]): (n["kind"], n["reason"])
                   for n in session.results.export_notes()}
        assert reasons[("frob_norm", "m/nan")] == (
            "undefined", "weights contain 2 NaN and 0 Inf value(s)")
        assert reasons[("frob_norm", "m/inf")] == (
            "undefined", "weights contain 0 NaN and 1 Inf value(s)")
        kind, why = reasons[("param_norm", "m")]
        assert kind == "undefined"
        assert why.startswith("input 'frob_norm' is undefined for 2 of 3 parameters (")
        assert "nan: weights contain 2 NaN" in why and "inf: weights contain 0 NaN and 1 Inf" in why
        assert math.isnan(session.results.export_aggregates("param_norm")["param_norm@models[m]"])

    def test_a_parameter_kernel_inherits_an_undefined_aggregate(self, session):
        """A per-parameter kernel reading an undefined aggregate is undefined with its reason."""

        @session.compute.kernel()
        def t_share(frob_norm, param_norm):
            return frob_norm**2 / param_norm

        bad = np.ones((2, 2))
        bad[0, 0] = np.nan
        session.models.add({"ok": np.ones((2, 2)), "bad": bad}, model_id="m")
        session.compute.apply("t_share")
        notes = {(n["kernel"], n["unit"]): n["reason"] for n in session.results.export_notes()}
        assert notes[("t_share", "m/ok")].startswith(
            "input 'param_norm' is undefined: input 'frob_norm' is undefined for 1 of 2")
        assert math.isnan(session.results.export_metrics("t_share")["m"]["ok"]["t_share"])

    def test_an_aggregate_that_skips_nan_needs_no_note(self, session):
        """An aggregate that handles NaN inputs itself (a finite result) records no note."""
        from diffract import KernelApplyLevel

        @session.compute.kernel(apply_level=KernelApplyLevel.IN_MODEL)
        def t_finite_sum(frob_norm):
            return float(np.nansum(frob_norm))

        bad = np.ones((2, 2))
        bad[0, 0] = np.nan
        session.models.add({"ok": np.ones((2, 2)), "bad": bad}, model_id="m")
        session.compute.apply("t_finite_sum")
        assert session.results.export_aggregates("t_finite_sum") == {
            "t_finite_sum@models[m]": pytest.approx(2.0)}
        assert [n["kernel"] for n in session.results.export_notes()] == ["frob_norm"]


class TestJsonExport:
    def test_nan_and_inf_are_written_as_null(self, session, tmp_path):
        """JSON export is valid JSON: NaN and Inf become null, in scalars and arrays."""

        @session.compute.kernel()
        def t_vector(weights):
            return np.array([1.0, np.inf, np.nan])

        @session.compute.kernel()
        def t_inf(weights):
            return math.inf

        bad = np.ones((2, 2))
        bad[0, 0] = np.nan
        session.models.add({"bad": bad}, model_id="m")
        session.compute.apply("frob_norm", "t_vector", "t_inf")
        text = session.results.export_metrics(export_format="json", include_arrays=True)
        assert "NaN" not in text and "Infinity" not in text
        (row,) = json.loads(text)
        assert row == {"model_id": "m", "param": "bad", "ptype": "dense", "frob_norm": None,
                       "t_inf": None, "t_vector": [1.0, None, None]}
        session.compute.apply("param_norm")
        out = session.results.export_aggregates(export_format="json", path=tmp_path / "a.json")
        assert json.loads(out.read_text())[0]["value"] is None
