"""The planner's partial-output rule at every level, and which model's data reaches which
argument of a cross-model kernel (checked against numpy with asymmetric metrics)."""

from __future__ import annotations

import numpy as np
import pytest

from diffract import KernelApplyLevel, Session
from diffract.errors import PartialOutputWarning

LEVELS = [KernelApplyLevel.PARAMETER, KernelApplyLevel.IN_MODEL, KernelApplyLevel.CROSS_MODEL]


def _two_models(rng):
    return {
        "a": {"w": rng.standard_normal((5, 3)), "v": rng.standard_normal((4, 4))},
        "b": {"w": rng.standard_normal((5, 3)), "v": rng.standard_normal((4, 4))},
    }


class TestPartialOutputs:
    @pytest.mark.parametrize("level", LEVELS, ids=[lv.name for lv in LEVELS])
    def test_a_unit_is_pending_only_when_all_outputs_are_absent(self, level, rng):
        """Erasing one of two outputs warns with the exact erase call and recomputes
        nothing; erasing both recomputes every unit."""
        calls = []
        models = _two_models(rng)
        with Session(config={"parallel": {"executor": "sequential"}}) as session:
            for m, arrays in models.items():
                session.models.add(arrays, model_id=m)

            @session.compute.kernel(produce_fields=("t_lo", "t_hi"), apply_level=level)
            def t_pair(frob_norm):  # a value, a model's tuple, or an (a, b) pair
                calls.append(1)
                values = np.ravel(np.asarray(frob_norm, dtype=float))
                return float(values.min()), float(values.max())

            session.compute.apply("t_lo")
            units = len(calls)
            assert units == {"PARAMETER": 4, "IN_MODEL": 2, "CROSS_MODEL": 2}[level.name]
            session.results.erase("t_hi")
            with pytest.warns(PartialOutputWarning, match=r"Field 't_hi' is absent for some units, "
                              r"but kernel 't_pair' also produces \['t_lo'\].*"
                              r"session\.results\.erase\('t_hi', 't_lo'\)"):
                report = session.compute.apply("t_hi")
            assert len(calls) == units and report.computed.get("t_pair", 0) == 0
            session.results.erase("t_hi", "t_lo")
            session.compute.apply("t_hi")
            assert len(calls) == 2 * units


class TestCrossModelArguments:
    def test_weights_arrive_as_a_then_b(self, rng):
        """A CROSS_MODEL kernel reading weights gets (model a's, model b's), in scope
        order: an asymmetric metric matches numpy, and swapping the scope swaps it."""
        models = _two_models(rng)
        with Session() as session:
            for m, arrays in models.items():
                session.models.add(arrays, model_id=m)

            @session.compute.kernel(apply_level=KernelApplyLevel.CROSS_MODEL)
            def t_rel_change(weights: tuple) -> float:
                a, b = weights
                return float(np.linalg.norm(b - a) / np.linalg.norm(a))

            session.filter(["a", "b"]).compute.apply("t_rel_change")
            session.filter(["b", "a"]).compute.apply("t_rel_change")
            got = session.results.export_aggregates("t_rel_change")
        for p in ("w", "v"):
            a, b = models["a"][p], models["b"][p]
            ab = np.linalg.norm(b - a) / np.linalg.norm(a)
            ba = np.linalg.norm(a - b) / np.linalg.norm(b)
            assert abs(ab - ba) > 1e-3  # the metric is asymmetric on these data
            assert got[f"t_rel_change@models[a,b]@params[{p}]"] == pytest.approx(ab, rel=1e-12)
            assert got[f"t_rel_change@models[b,a]@params[{p}]"] == pytest.approx(ba, rel=1e-12)

    def test_per_parameter_fields_arrive_as_a_then_b(self, rng):
        """A per-parameter field reaches a CROSS_MODEL kernel as (value in a, value in b)."""
        models = _two_models(rng)
        with Session() as session:
            for m, arrays in models.items():
                session.models.add(arrays, model_id=m)

            @session.compute.kernel(apply_level=KernelApplyLevel.CROSS_MODEL)
            def t_norm_ratio(frob_norm: tuple) -> float:
                return frob_norm[0] / frob_norm[1]

            @session.compute.kernel(apply_level=KernelApplyLevel.CROSS_MODEL)
            def t_ratio_minus_one(t_norm_ratio: float) -> float:
                return t_norm_ratio - 1.0

            session.filter(["b", "a"]).compute.apply("t_ratio_minus_one")
            got = session.results.export_aggregates()
        for p in ("w", "v"):
            ratio = np.linalg.norm(models["b"][p]) / np.linalg.norm(models["a"][p])
            assert got[f"t_norm_ratio@models[b,a]@params[{p}]"] == pytest.approx(ratio, rel=1e-12)
            assert got[f"t_ratio_minus_one@models[b,a]@params[{p}]"] == pytest.approx(
                ratio - 1.0, rel=1e-12)

    def test_model_aggregates_arrive_per_model(self, rng):
        """An IN_MODEL aggregate read by a CROSS_MODEL kernel arrives as (a's, b's)."""
        models = _two_models(rng)
        with Session() as session:
            for m, arrays in models.items():
                session.models.add(arrays, model_id=m)

            @session.compute.kernel(apply_level=KernelApplyLevel.CROSS_MODEL)
            def t_share_change(frob_norm: tuple, param_norm: tuple) -> float:
                (fa, fb), (na, nb) = frob_norm, param_norm
                return fb**2 / nb - fa**2 / na

            session.filter(["a", "b"]).compute.apply("t_share_change")
            got = session.results.export_aggregates("t_share_change")
        total = {m: sum(np.sum(w**2) for w in arrays.values()) for m, arrays in models.items()}
        for p in ("w", "v"):
            share = {m: np.sum(models[m][p] ** 2) / total[m] for m in "ab"}
            assert got[f"t_share_change@models[a,b]@params[{p}]"] == pytest.approx(
                share["b"] - share["a"], rel=1e-10)
