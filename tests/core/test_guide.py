"""The compute guide's examples, as tests (custom kernels, aggregates, reconfigure, scope)."""

from __future__ import annotations

from itertools import combinations

import numpy as np
import pytest
import torch

from diffract import Session
from diffract.core.compute.execution import KernelApplyLevel, KernelExecutionProtocol
from diffract.errors import PartialOutputWarning
from diffract.session import ScopeValidationError


def _linear_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Linear(64, 16))


class TestCustomKernels:
    def test_decorated_kernel_reads_field_and_configuration(self):
        """A decorated kernel gets frob_norm as input and scale from configure_kernel."""
        model = torch.nn.Sequential(torch.nn.Linear(32, 64))
        session = Session(profile="ram")
        with session:

            @session.compute.kernel()
            def scaled_frob_norm(frob_norm: float, *, scale: float = 1.0) -> float:
                return frob_norm * scale

            session.models.add(model, model_id="m1")
            session.compute.configure_kernel("scaled_frob_norm", scale=2.0)
            session.compute.apply("scaled_frob_norm")
            metrics = session.results.export_metrics("scaled_frob_norm", export_format="dict")
        for name, p in model.named_parameters():
            expected = 2.0 * np.linalg.norm(p.detach().numpy().astype(np.float64))
            assert metrics["m1"][name]["scaled_frob_norm"] == pytest.approx(expected, rel=1e-6)

    def test_in_model_kernel_gets_tuple_and_stores_contextual_aggregate(self):
        """An IN_MODEL kernel receives per-parameter values as a tuple; one aggregate per model."""
        model = _linear_model()
        with Session(profile="ram") as session:

            @session.compute.kernel(
                name="total_frob_norm",
                apply_level=KernelApplyLevel.IN_MODEL,
                execution_protocol=KernelExecutionProtocol.SEQUENTIAL,
            )
            def total_frob_norm(frob_norm: tuple[float, ...]) -> float:
                assert isinstance(frob_norm, tuple) and len(frob_norm) == 4
                return float(np.sum(np.square(frob_norm)))

            session.models.add(model, model_id="m1")
            session.compute.apply("total_frob_norm")
            aggregates = session.results.export_aggregates("total_frob_norm", export_format="dict")
        expected = sum(float(np.sum(p.detach().numpy().astype(np.float64) ** 2)) for p in model.parameters())
        assert list(aggregates) == ["total_frob_norm@models[m1]"]
        assert aggregates["total_frob_norm@models[m1]"] == pytest.approx(expected, rel=1e-6)

    def test_builtin_param_norm_matches_numpy(self):
        """param_norm is the sum of squared Frobenius norms of the model's parameters."""
        model = _linear_model()
        with Session() as session:
            session.models.add(model, model_id="m")
            session.compute.apply("param_norm")
            value = session.results.export_aggregates("param_norm")["param_norm@models[m]"]
        expected = sum(np.sum(p.detach().numpy().astype(np.float64) ** 2) for p in model.parameters())
        assert value == pytest.approx(expected, rel=1e-9)


def _rank(weights: np.ndarray, *, rtol: float = 1e-5) -> int:
    s = np.linalg.svd(weights, compute_uv=False)
    return int(np.sum(s > rtol * s[0]))


class TestReconfigureEraseCycle:
    def test_apply_after_configure_is_noop_until_erase(self):
        """Re-applying after configure_kernel keeps old values; erase then apply recomputes."""
        # Singular values 1, 0.1, 1e-3, 1e-7: the rank depends on rtol.
        u, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((6, 4)))
        w = u @ np.diag([1.0, 0.1, 1e-3, 1e-7])
        with Session() as session:
            session.compute.kernel(name="test_hard_rank")(_rank)
            session.models.add({"w": w}, model_id="m")

            def stored() -> int:
                return session.results.export_metrics("test_hard_rank")["m"]["w"]["test_hard_rank"]

            session.compute.configure_kernel("test_hard_rank", rtol=1e-9)
            session.compute.apply("test_hard_rank")
            assert stored() == 4
            session.compute.configure_kernel("test_hard_rank", rtol=0.5)
            session.compute.apply("test_hard_rank")
            assert stored() == 4  # no-op: already stored
            session.results.erase("test_hard_rank")
            session.compute.apply("test_hard_rank")
            assert stored() == 1

    def test_erasing_one_output_of_a_group_warns_and_does_not_recompute(self):
        """A unit is pending only when all outputs are absent; a partial erase warns with the fix."""
        with Session() as session:

            @session.compute.kernel(produce_fields=("t_lo", "t_hi"))
            def t_minmax(weights):
                return float(weights.min()), float(weights.max())

            session.models.add({"w": np.arange(6.0).reshape(2, 3)}, model_id="m")
            session.compute.apply("t_lo")
            session.results.erase("t_lo")
            with pytest.warns(PartialOutputWarning, match=r"erase\('t_lo', 't_hi'\)"):
                report = session.compute.apply("t_lo")
            assert report.computed == {}
            assert "t_lo" not in session.results.export_metrics()["m"]["w"]
            session.results.erase("t_lo", "t_hi")
            session.compute.apply("t_lo")
            row = session.results.export_metrics()["m"]["w"]
            assert (row["t_lo"], row["t_hi"]) == (0.0, 5.0)

    def test_erase_dependent_also_erases_downstream(self):
        """erase_dependent_also removes fields computed from the erased ones, transitively."""
        with Session() as session:

            @session.compute.kernel()
            def t_double(frob_norm):
                return 2 * frob_norm

            @session.compute.kernel()
            def t_quad(t_double):
                return 2 * t_double

            session.models.add({"w": np.ones((2, 2))}, model_id="m")
            session.compute.apply("t_quad", "param_norm")
            session.results.erase("frob_norm")
            assert set(session.results.export_metrics()["m"]["w"]) == {"t_double", "t_quad"}
            session.results.erase("frob_norm", erase_dependent_also=True)
            assert session.results.export_metrics()["m"] == {}
            assert session.results.export_aggregates("param_norm") == {}


def _pair_kernels(session):
    @session.compute.kernel(apply_level=KernelApplyLevel.CROSS_MODEL)
    def t_overlap(weights: tuple) -> float:
        a, b = weights
        return float(np.sum(a * b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    @session.compute.kernel(apply_level=KernelApplyLevel.CROSS_MODEL)
    def t_agreement(t_overlap: float) -> float:
        return abs(t_overlap)


class TestPairwiseScope:
    def _session(self, n: int) -> Session:
        session = Session()
        rng = np.random.default_rng(3)
        for m in "abc"[:n]:
            session.models.add({"w": rng.standard_normal((4, 4)), "v": rng.standard_normal((3, 3))}, model_id=m)
        _pair_kernels(session)
        return session

    def test_three_models_raise_before_any_work(self):
        """A pairwise kernel on three models raises ScopeValidationError naming scope and fix."""
        session = self._session(3)
        with pytest.raises(ScopeValidationError, match=r"requires exactly two models in scope, but the current scope has 3: \['a', 'b', 'c'\]") as info:
            session.compute.apply("frob_norm", "t_overlap")
        assert "session.filter(model_ids=['a', 'b']).compute.apply('t_overlap')" in str(info.value)
        assert session.results.export_metrics() == {"a": {}, "b": {}, "c": {}}

    def test_requirement_is_transitive_and_names_the_dependency(self):
        """Requesting a field that reads a pairwise field names that dependency."""
        session = self._session(3)
        with pytest.raises(ScopeValidationError, match=r"Cannot produce 't_agreement': it depends on 't_overlap'") as info:
            session.compute.apply("t_agreement")
        assert info.value.dependency == "t_overlap" and info.value.scope == ("a", "b", "c")

    def test_pair_scope_stores_contextual_names(self):
        """On a pair, results land under field@models[a,b]@params[p]."""
        session = self._session(3)
        pair = session.filter(model_ids=["a", "c"])
        pair.compute.apply("t_agreement")
        got = pair.results.export_aggregates("t_overlap")
        assert sorted(got) == ["t_overlap@models[a,c]@params[v]", "t_overlap@models[a,c]@params[w]"]
        agreement = pair.results.export_aggregates("t_agreement@models[a,c]@params[w]")
        assert agreement == {"t_agreement@models[a,c]@params[w]": pytest.approx(abs(got["t_overlap@models[a,c]@params[w]"]))}

    def test_parameters_missing_from_one_model_are_skipped_with_reason(self):
        """A parameter only one model of the pair has is skipped, and the note says why."""
        session = self._session(2)
        session.models.add({"w": np.ones((4, 4)), "extra": np.ones((2, 2))}, model_id="d")
        pair = session.filter(model_ids=["d", "a"])
        pair.compute.apply("t_overlap")
        assert sorted(pair.results.export_aggregates("t_overlap")) == ["t_overlap@models[d,a]@params[w]"]
        notes = {n["unit"]: n["reason"] for n in pair.results.export_notes()}
        assert notes["[d,a]/extra"] == "parameter 'extra' is not in model 'a'"

    def test_every_pair_by_combinations(self):
        """Applying once per pair gives one result set per pair."""
        session = self._session(3)
        for x, y in combinations(["a", "b", "c"], 2):
            session.filter(model_ids=[x, y]).compute.apply("t_agreement")
        names = session.results.export_aggregates("t_agreement")
        assert len(names) == 6
        assert "t_agreement@models[b,c]@params[v]" in names


class TestDependencyChains:
    def test_requesting_y_runs_x_first(self):
        """Kernel B requiring A's output runs after A, automatically."""
        order = []
        with Session() as session:

            @session.compute.kernel(produce_fields=("t_x",))
            def t_a(weights):
                order.append("a")
                return float(weights.sum())

            @session.compute.kernel(require_fields=("t_x",), produce_fields=("t_y",))
            def t_b(value):
                order.append("b")
                return value + 1

            session.models.add({"w": np.ones((2, 3))}, model_id="m")
            session.compute.apply("t_y")
            assert order == ["a", "b"]
            assert session.results.export_metrics("t_x", "t_y")["m"]["w"] == {"t_x": 6.0, "t_y": 7.0}
