"""Provenance: what produced each stored value, which results are stale, and
``apply(recompute="stale")`` (on both profiles, and across a reopen)."""

from __future__ import annotations

import numpy as np
import pytest

from diffract import Session
from diffract.errors import InvalidArgumentError

pytest.importorskip("diffract_storage_local")


@pytest.fixture(params=["ram", "local"])
def open_session(request, tmp_path):
    def make():
        if request.param == "ram":
            return Session(profile="ram")
        return Session(profile="local", path=tmp_path / "st")
    return make


def _model(rng):
    return {"w": rng.standard_t(3, size=(120, 80)), "v": rng.standard_normal((60, 70))}


class TestProvenance:
    def test_each_value_records_kernel_provider_and_configuration(self, open_session, rng):
        """A stored value says which kernel, distribution and configuration produced it."""
        with open_session() as s:
            s.models.add(_model(rng), model_id="m")
            s.compute.configure_kernel("hard_rank", rtol=1e-3)
            try:
                s.compute.apply("hard_rank", "param_norm")
                got = s.results.provenance("hard_rank", "m", "w")
                agg = s.results.provenance("param_norm", "m")
            finally:
                s.compute.configure_kernel("hard_rank", rtol=1e-5)
        assert got["kernel"] == "hard_rank" and got["config"] == {"rtol": 1e-3}
        assert got["provider"].startswith("diffractml-kernels-spectral ")
        assert agg == {"kernel": "param_norm", "provider": agg["provider"], "config": {}}
        assert agg["provider"].startswith("diffractml-core ")


class TestStale:
    def test_a_configuration_change_makes_the_field_and_its_dependents_stale(self, open_session, rng):
        """Changing esd's precision makes esd stale on every unit, and stable_rank and
        pl_alpha computed from it; fields that do not depend on it stay fresh."""
        with open_session() as s:
            s.models.add(_model(rng), model_id="m")
            s.compute.apply("stable_rank", "pl_alpha", "frob_norm")
            assert s.results.stale() == []
            s.compute.configure_kernel("esd", precision="float32")
            try:
                stale = s.results.stale()
            finally:
                s.compute.configure_kernel("esd", precision="float64")
            assert s.results.stale() == []  # back to the recorded configuration
        kernels = sorted({(r["kernel"], r["unit"]) for r in stale})
        assert kernels == sorted((k, f"m/{p}") for k in ("esd", "stable_rank", "power_law_fit")
                                 for p in ("w", "v"))
        reasons = {(r["kernel"], r["unit"]): r["reason"] for r in stale}
        assert reasons[("esd", "m/w")] == ("the configuration of 'esd' changed from "
                                           '{"conv": "matrix", "device": "auto", "precision": '
                                           '"float64"} to {"conv": "matrix", "device": "auto", '
                                           '"precision": "float32"}')
        assert reasons[("stable_rank", "m/w")].startswith("input 'esd' is stale: the configuration")

    def test_recompute_stale_recomputes_exactly_those_units(self, open_session, rng):
        """apply(recompute='stale') recomputes the stale units and what depends on them,
        nothing else; afterwards nothing is stale and values follow the new configuration."""
        model = _model(rng)
        with open_session() as s:
            s.models.add(model, model_id="m")
            s.compute.apply("hard_rank", "frob_norm", "stable_rank")
            s.compute.configure_kernel("hard_rank", rtol=0.5)
            try:
                assert s.compute.apply("hard_rank").computed.get("hard_rank", 0) == 0  # presence
                report = s.compute.apply("hard_rank", "frob_norm", recompute="stale")
                assert report.computed == {"hard_rank": 2}
                assert s.results.stale() == []
                ranks = s.results.export_metrics("hard_rank")["m"]
            finally:
                s.compute.configure_kernel("hard_rank", rtol=1e-5)
        for name, w in model.items():
            sv = np.linalg.svd(w, compute_uv=False)
            assert ranks[name]["hard_rank"] == int(np.sum(sv > 0.5 * sv[0]))
        with pytest.raises(InvalidArgumentError, match=r"recompute must be 'presence'"):
            Session().compute.apply("frob_norm", recompute="all")

    def test_an_input_recomputed_later_makes_its_dependents_stale(self, open_session, rng):
        """Erasing and recomputing an input alone leaves its dependents stale, found again
        after a reopen; recompute='stale' brings them up to date."""
        expected = [("param_norm", "m", "input 'frob_norm' was recomputed after it")]
        with open_session() as s:
            s.models.add(_model(rng), model_id="m")
            s.compute.apply("param_norm")
            s.results.erase("frob_norm")
            s.compute.apply("frob_norm")
            stale = s.results.stale()
            assert [(r["kernel"], r["unit"], r["reason"]) for r in stale] == expected
            durable = s.store.durable
        if durable:
            with open_session() as s:
                stale = s.results.stale()
                assert [(r["kernel"], r["unit"], r["reason"]) for r in stale] == expected
                s.compute.apply("param_norm", recompute="stale")
                assert s.results.stale() == []
