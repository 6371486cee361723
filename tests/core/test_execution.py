"""Planning and running: errors, failures kept per unit, chunks, crash and resume, pools."""

from __future__ import annotations

import os
import re

import attrs
import numpy as np
import pytest

from diffract import FieldUndefined, Restriction, Session
from diffract.core.compute.execution import Chunker, KernelApplyLevel, KernelExecutionProtocol
from diffract.core.compute.planner import Step, Unit, resolve
from diffract.core.compute.spec import KernelSpec
from diffract.core.sources import ModelSource
from diffract.core.storage import ParamInfo, RamStore
from diffract.errors import (
    ApplyError,
    DependencyCycleError,
    DuplicateModelError,
    EmptyModelError,
    KernelConflictError,
    MissingProducerError,
    ModelError,
    UnknownConfigKeyError,
    UnknownFieldError,
    UnknownKernelError,
)
from diffract.plugins import get_registry
from tests.resources import kernels as test_kernels


class TestBadInput:
    def test_unknown_field_suggests_the_closest(self, session, arrays):
        """A misspelt field names the closest known field."""
        session.models.add(arrays, model_id="m")
        with pytest.raises(UnknownFieldError, match=r"Unknown field 'frob_nrom' requested\..*Did you mean 'frob_norm'\?"):
            session.compute.apply("frob_nrom")

    def test_unknown_kernel_and_config_keyword(self, session):
        """configure_kernel rejects unknown kernels and keywords, listing what exists."""
        with pytest.raises(UnknownKernelError, match=r"Unknown kernel 'frob_nrm'\. Did you mean 'frob_norm'\?"):
            session.compute.configure_kernel("frob_nrm", x=1)

        @session.compute.kernel()
        def t_cfg(weights, *, rtol: float = 1e-5):
            return 1.0

        with pytest.raises(UnknownConfigKeyError, match=r"Kernel 't_cfg' has no configuration keyword 'rtl'\. Did you mean 'rtol'\? It accepts: 'rtol'"):
            session.compute.configure_kernel("t_cfg", rtl=1e-3)
        with pytest.raises(UnknownConfigKeyError, match="It accepts: none"):
            session.compute.configure_kernel("frob_norm", scale=2)

    @pytest.mark.parametrize(
        ("result", "message"),
        [
            ((1.0, 2.0, 3.0), r"returned a tuple of 3 values for m/layer0.weight, but it produces 2"),
            ({"t_a": 1.0}, r"keys do not match its produce_fields \('t_a', 't_b'\): missing \['t_b'\]"),
            (5.0, r"returned a single float for m/layer0.weight, but it produces 2 fields"),
            ((None, 1.0), r"returned a value of type NoneType for field 't_a' on m/layer0.weight, which no store can keep"),
            ((b"text", 1.0), r"returned a value of type bytes for field 't_a' on m/layer0.weight, which no store can keep\. Return numbers"),
            ((object(), 1.0), r"returned a value of type object for field 't_a'"),
            (([1.0, 2.0], 1.0), r"returned a value of type list for field 't_a'"),
            ((np.array(["a"]), 1.0), r"returned a numpy array of dtype <U1 for field 't_a'"),
            (((1.0, "x"), 1.0), r"returned a tuple holding a string for field 't_a'"),
        ],
        ids=["tuple-too-long", "dict-missing-key", "scalar-for-two", "none-value", "bytes",
             "object", "list", "string-array", "tuple-with-string"],
    )
    def test_wrong_outputs_fail_only_their_unit(self, session, arrays, result, message):
        """Outputs that do not fit produce_fields, or that no store can keep, fail that
        unit only (kernel and unit named); every other unit and later kernels still run."""

        @session.compute.kernel(produce_fields=("t_a", "t_b"))
        def t_two(weights):
            return result if weights.shape == (16, 8) else (1.0, 2.0)

        session.models.add(arrays, model_id="m")
        with pytest.raises(ApplyError, match=r"1 unit\(s\) failed") as info:
            session.compute.apply("t_a", "frob_norm")
        (failure,) = info.value.report.failures
        assert (failure.kernel, failure.unit) == ("t_two", "m/layer0.weight")
        assert re.search(message, failure.reason), failure.reason
        rows = session.results.export_metrics()["m"]
        assert "t_a" not in rows["layer0.weight"] and rows["layer1.weight"]["t_a"] == 1.0
        assert all("frob_norm" in row for row in rows.values())

    def test_duplicate_and_empty_models(self, session, arrays):
        """A duplicate model_id and a model without parameters get their own errors."""
        session.models.add(arrays, model_id="m")
        with pytest.raises(DuplicateModelError, match="Model id 'm' is already in this session"):
            session.models.add(arrays, model_id="m")
        with pytest.raises(EmptyModelError, match="Model 'e' has no floating-point parameters"):
            session.models.add({}, model_id="e")
        with pytest.raises(ModelError, match=r"model_id must be a non-empty string without ','"):
            session.models.add(arrays, model_id="a,b")
        assert session.model_ids == ["m"]

    def test_no_models_in_scope(self, session):
        """apply with no models says how to add one."""
        with pytest.raises(ModelError, match=r"no models in scope\. Add one with session.models.add"):
            session.compute.apply("frob_norm")

    def test_cycle_and_missing_producer_are_reported_by_field(self, session):
        """Cycles list the fields on the loop; missing producers name the consumer."""
        session.compute.kernel(require_fields=("t_q",), produce_fields=("t_p",), name="t_kp")(lambda x: x)
        session.compute.kernel(require_fields=("t_p",), produce_fields=("t_q",), name="t_kq")(lambda x: x)
        with pytest.raises(DependencyCycleError, match=r"'t_p' -> 't_q' -> 't_p'"):
            resolve(["t_p"], get_registry())
        session.compute.kernel(require_fields=("t_nowhere",), name="t_orphan")(lambda x: x)
        with pytest.raises(MissingProducerError, match=r"Kernel 't_orphan' requires field 't_nowhere', which no registered kernel produces"):
            resolve(["t_orphan"], get_registry())

    def test_session_kernel_may_not_shadow_a_plugin_kernel(self, session):
        """Registering a name a plugin provides is refused naming both providers."""
        with pytest.raises(KernelConflictError, match=r"Kernel 'frob_norm' from <session> clashes with the kernel of that name from diffractml-core"):

            @session.compute.kernel()
            def frob_norm(weights):
                return 0.0


class TestFailuresAndUndefined:
    def test_failure_on_one_parameter_keeps_the_rest(self, session, arrays):
        """A kernel raising on one parameter records it; other results (and fields) stay."""
        session.compute.kernel(name="t_fail")(test_kernels.fails_on_bias)
        session.models.add(arrays, model_id="m")
        with pytest.raises(ApplyError, match=r"1 unit\(s\) failed; every other result was stored:\n  t_fail on m/layer1.bias: ValueError: cannot handle a vector of length 12") as info:
            session.compute.apply("frob_norm", "t_fail")
        metrics = session.results.export_metrics()["m"]
        assert set(metrics) == set(arrays)
        assert "t_fail" not in metrics["layer1.bias"] and "frob_norm" in metrics["layer1.bias"]
        assert metrics["layer0.weight"]["t_fail"] == pytest.approx(np.abs(arrays["layer0.weight"]).max())
        assert [n.unit for n in info.value.report.failures] == ["m/layer1.bias"]
        (note,) = session.results.export_notes()
        assert (note["kernel"], note["unit"], note["kind"]) == ("t_fail", "m/layer1.bias", "failed")
        assert re.fullmatch(r"ValueError: cannot handle a vector of length 12 \(.*kernels\.py:\d+\)",
                            note["reason"]), note["reason"]

    def test_errors_record_returns_the_report(self, session, arrays):
        """errors='record' warns and returns the report instead of raising."""
        session.compute.kernel(name="t_fail")(test_kernels.fails_on_bias)
        session.models.add(arrays, model_id="m")
        with pytest.warns(UserWarning, match=r"1 unit\(s\) failed"):
            report = session.compute.apply("t_fail", errors="record")
        assert not report.ok and report.computed == {"t_fail": 3}

    def test_field_undefined_stores_nan_with_reason_and_is_not_retried(self, session, arrays):
        """FieldUndefined stores NaN and a note; the next apply does not rerun the unit."""
        calls = []

        @session.compute.kernel()
        def t_positive_mean(weights):
            calls.append(1)
            if weights.mean() < 0:
                raise FieldUndefined("mean is negative")
            return float(weights.mean())

        session.models.add({"neg": -np.ones((2, 2)), "pos": np.ones((2, 2))}, model_id="m")
        session.compute.apply("t_positive_mean")
        session.compute.apply("t_positive_mean")
        rows = session.results.export_metrics()["m"]
        assert np.isnan(rows["neg"]["t_positive_mean"]) and rows["pos"]["t_positive_mean"] == 1.0
        assert len(calls) == 2
        assert session.results.export_notes()[0]["reason"] == "mean is negative"

    def test_restrictions_skip_with_reason_and_dependents_skip_too(self, session, arrays):
        """A restricted parameter is skipped with its reason; a dependent kernel skips it too."""
        session.compute.kernel(name="t_mat", restrictions=[Restriction.min_ndim(2)])(test_kernels.squared_sum)

        @session.compute.kernel()
        def t_mat_twice(t_mat):
            return 2 * t_mat

        session.models.add(arrays, model_id="m")
        session.compute.apply("t_mat_twice")
        rows = session.results.export_metrics()["m"]
        assert "t_mat" not in rows.get("layer1.bias", {})
        assert rows["layer0.weight"]["t_mat_twice"] == pytest.approx(2 * np.sum(arrays["layer0.weight"] ** 2))
        reasons = {(n["kernel"], n["unit"]): n["reason"] for n in session.results.export_notes()}
        assert reasons[("t_mat", "m/layer1.bias")] == "needs a parameter of at least 2 dimensions"
        assert reasons[("t_mat_twice", "m/layer1.bias")] == (
            "input 't_mat' is not available: 't_mat' skipped m/layer1.bias (needs a parameter of "
            "at least 2 dimensions)")


def chunk_sizes(step, store, budget, max_units=1024, spread=1, largest_first=False):
    chunker = Chunker(step, store, budget, largest_first=largest_first)
    sizes = []
    while not chunker.done:
        sizes.append(len(chunker.take(max_units, spread)))
    return sizes


class TestChunks:
    def test_chunks_follow_the_read_budget(self):
        """Weight-sized inputs make small chunks, every chunk has at least one unit."""
        store = RamStore()
        infos = [ParamInfo("m", f"p{i}", (10, 10), "float64") for i in range(5)]  # 800 B each
        store.add_model("m", infos, ModelSource("memory"), lambda name: np.zeros((10, 10)))
        spec = KernelSpec.from_function(test_kernels.squared_sum)
        step = Step(spec, tuple(Unit(("m",), i.name) for i in infos))
        assert chunk_sizes(step, store, budget=1700) == [2, 2, 1]
        assert chunk_sizes(step, store, budget=10) == [1] * 5

    def test_a_large_first_unit_gets_company_for_the_other_workers(self):
        """Largest first, a chunk for two workers grows past max_units until its bytes are
        twice its first unit's (that unit does not run alone while the other waits), and
        never past the read budget."""
        store = RamStore()
        shapes = [(10, 10)] * 6 + [(40, 10)]  # 800 B each, one of 3200 B
        infos = [ParamInfo("m", f"p{i}", s, "float64") for i, s in enumerate(shapes)]
        store.add_model("m", infos, ModelSource("memory"), lambda name: np.zeros((10, 10)))
        spec = KernelSpec.from_function(test_kernels.squared_sum)
        step = Step(spec, tuple(Unit(("m",), i.name) for i in infos))
        chunker = Chunker(step, store, 10**6, largest_first=True)
        assert chunker.costs == sorted(chunker.costs, reverse=True) and chunker.costs[0] == 3200
        assert chunker.units[0].param == "p6"
        big = dict(budget=10**6, max_units=2, largest_first=True)
        assert chunk_sizes(step, store, **big) == [2, 2, 2, 1]
        assert chunk_sizes(step, store, spread=2, **big) == [5, 2]  # 3200 + 4 x 800 = 6400
        assert chunk_sizes(step, store, budget=4000, max_units=2, spread=2,
                           largest_first=True) == [2, 2, 2, 1]

    def test_crash_loses_only_the_chunk_in_flight_and_apply_resumes(self, arrays):
        """An interrupt mid-apply keeps committed chunks; the next apply computes the rest."""
        calls: list[str] = []
        # A budget below one matrix puts every parameter in its own chunk.
        with Session(config={"cache": {"max_bytes": 64}}) as session:

            @session.compute.kernel()
            def t_interruptible(weights):
                calls.append("x")
                if len(calls) == 3:
                    raise KeyboardInterrupt
                return float(weights.size)

            session.models.add(arrays, model_id="m")
            with pytest.raises(KeyboardInterrupt):
                session.compute.apply("t_interruptible")
            done = set(session.results.export_metrics("t_interruptible")["m"])
            assert done == {"layer0.weight", "layer1.weight"}
            report = session.compute.apply("t_interruptible")
            assert report.computed == {"t_interruptible": 2}
            assert len(session.results.export_metrics("t_interruptible")["m"]) == 4


class TestParallel:
    def test_parallel_kernel_runs_on_worker_processes(self, arrays):
        """A PARALLEL kernel runs in spawned workers and gives the same values."""
        with Session(config={"parallel": {"executor": "processes", "process_pool": {"max_workers": 2}, "pool_min_seconds": 0}}) as session:
            session.compute.kernel(name="t_pid", execution_protocol=KernelExecutionProtocol.PARALLEL)(test_kernels.worker_pid)
            session.compute.kernel(name="t_sq", execution_protocol=KernelExecutionProtocol.PARALLEL)(test_kernels.squared_sum)
            session.compute.configure_kernel("t_sq", offset=1.0)
            session.models.add(arrays, model_id="m")
            session.compute.apply("t_pid", "t_sq")
            rows = session.results.export_metrics()["m"]
        assert all(r["t_pid"] != os.getpid() for r in rows.values())
        for name, w in arrays.items():
            assert rows[name]["t_sq"] == pytest.approx(np.sum(w**2) + 1.0)


class TestInputs:
    def test_parameter_kernel_reads_its_models_aggregate(self, session, arrays):
        """A PARAMETER kernel can read its model's IN_MODEL aggregate."""

        @session.compute.kernel()
        def t_share(frob_norm, param_norm):
            return frob_norm**2 / param_norm

        session.models.add(arrays, model_id="m")
        session.compute.apply("t_share")
        shares = [r["t_share"] for r in session.results.export_metrics("t_share")["m"].values()]
        assert sum(shares) == pytest.approx(1.0)
        assert KernelApplyLevel.IN_MODEL is get_registry().get("param_norm").apply_level


class TestBatchPath:
    def test_batch_results_and_per_unit_exceptions(self, arrays):
        """A kernel's batch path computes the chunk at once (a chunk of a batched kernel
        holds at least one unit per thread); exception instances are per unit."""
        calls = []

        def many(units, *, offset=0.0):
            calls.append(len(units))
            return [FieldUndefined("vector") if u["weights"].ndim == 1
                    else float(np.sum(u["weights"] ** 2)) + offset for u in units]

        get_registry().register(
            KernelSpec.from_function(test_kernels.squared_sum, name="t_batched", batch=many,
                                     provider="<session>")
        )
        with Session(config={"parallel": {"thread_pool": {"max_workers": 4}}}) as session:
            session.models.add(arrays, model_id="m")
            session.compute.configure_kernel("t_batched", offset=2.0)
            session.compute.apply("t_batched")
            rows = session.results.export_metrics("t_batched")["m"]
        assert calls == [4]
        assert rows["layer0.weight"]["t_batched"] == pytest.approx(np.sum(arrays["layer0.weight"] ** 2) + 2.0)
        assert np.isnan(rows["layer1.bias"]["t_batched"])

    def test_a_failing_batch_falls_back_to_units(self, session, arrays):
        """If the batch path itself raises, every unit runs through the plain function."""

        def broken(units, **config):
            raise MemoryError("simulated")

        get_registry().register(
            KernelSpec.from_function(test_kernels.squared_sum, name="t_fallback", batch=broken,
                                     provider="<session>")
        )
        session.models.add(arrays, model_id="m")
        session.compute.apply("t_fallback")
        rows = session.results.export_metrics("t_fallback")["m"]
        assert rows["conv.weight"]["t_fallback"] == pytest.approx(np.sum(arrays["conv.weight"] ** 2))


class TestProgress:
    def test_progress_after_each_committed_chunk(self, arrays):
        """apply(progress=...) reports every committed chunk, per kernel, in plan order."""
        events = []
        with Session(config={"cache": {"max_bytes": 64}}) as session:
            session.models.add(arrays, model_id="m")
            session.compute.apply("param_norm", progress=events.append)
        frob = [(e.done, e.total) for e in events if e.kernel == "frob_norm"]
        assert frob == [(1, 4), (2, 4), (3, 4), (4, 4)]
        assert [(e.kernel, e.step, e.steps) for e in events][-1] == ("param_norm", 2, 2)


class TestChunkSizes:
    def test_chunks_grow_to_about_chunk_seconds_of_work(self):
        """A step starts with a one-unit chunk; slow units keep chunks to about
        chunk_seconds of work (an interrupt loses little), cheap ones make them large."""
        import time

        model = {f"p{i}": np.ones((2, 2)) * i for i in range(40)}
        sizes = {}
        config = {"apply": {"chunk_seconds": 0.2}, "parallel": {"executor": "sequential"}}
        with Session(config=config) as session:

            @session.compute.kernel()
            def t_slow(weights):
                time.sleep(0.05)
                return float(weights.sum())

            session.models.add({k: model[k] for k in list(model)[:12]}, model_id="slow")
            session.models.add(model, model_id="fast")
            events = []
            session.filter(["slow"]).compute.apply("t_slow", progress=events.append)
            sizes["slow"] = np.diff([0] + [e.done for e in events]).tolist()
            events.clear()
            session.filter(["fast"]).compute.apply("frob_norm", progress=events.append)
            sizes["fast"] = np.diff([0] + [e.done for e in events]).tolist()
        assert sizes["slow"][0] == 1 and max(sizes["slow"]) <= 4 and sum(sizes["slow"]) == 12
        assert sizes["fast"][0] == 1 and len(sizes["fast"]) <= 4 and sum(sizes["fast"]) == 40


class TestDemand:
    """An intermediate field is computed where a pending unit reads it, not merely
    because it is absent: a tracked run erases its pairs' overlap matrices, and the next
    apply recomputed them, and the SVDs under them, for stored results."""

    def _kernels(self, session, calls):
        def t_mid(weights):
            calls.append("mid")
            return float(np.sum(weights))

        def t_top(t_mid):
            calls.append("top")
            return 2.0 * t_mid

        session.compute.kernel(name="t_mid")(t_mid)
        session.compute.kernel(name="t_top")(t_top)

    def test_an_erased_intermediate_under_stored_results_is_left_alone(self, session):
        calls = []
        self._kernels(session, calls)
        session.models.add({"a": np.ones((3, 3)), "b": np.ones((2, 2))}, model_id="m")
        session.compute.apply("t_top")
        assert sorted(calls) == ["mid", "mid", "top", "top"]
        session.results.erase("t_mid")
        calls.clear()
        report = session.compute.apply("t_top")
        assert calls == [] and dict(report.computed) == {}
        assert session.results.export_metrics("t_top")["m"]["a"]["t_top"] == 18.0

    def test_it_is_computed_where_a_consumer_needs_it(self, session):
        calls = []
        self._kernels(session, calls)
        session.models.add({"a": np.ones((3, 3)), "b": np.ones((2, 2))}, model_id="m")
        session.compute.apply("t_top")
        session.results.erase("t_mid")
        session.filter(param_names=["b"]).results.erase("t_top")
        calls.clear()
        session.compute.apply("t_top")
        assert calls == ["mid", "top"]  # b only: a's t_top is stored
        assert session.results.export_metrics("t_top")["m"]["b"]["t_top"] == 8.0
        calls.clear()
        session.compute.apply("t_mid")  # asked for: computed wherever it is absent
        assert calls == ["mid"]


class TestOverlappingBatches:
    """In this process, a PARALLEL kernel whose batch is thread-safe (overlap_batches)
    starts a chunk's batch while the previous chunk's is still running: on a 1B model,
    odd-sized chunks of 2048 x 2048 matrices had left one of two cores idle for a third of
    each chunk. A batch that did not say so never runs twice at once."""

    def _apply(self, overlap: bool, first_waits: float) -> tuple[list[bool], dict]:
        import threading

        rng = np.random.default_rng(3)
        arrays = {f"p{i}": rng.standard_normal((8, 8)) for i in range(6)}

        second, seen, calls = threading.Event(), [], []

        def many(units, **config):
            calls.append(len(units))
            if len(calls) == 1:
                seen.append(second.wait(first_waits))  # the next chunk's batch has begun
            else:
                second.set()
            return [float(np.sum(u["weights"] ** 2)) for u in units]

        get_registry().register(KernelSpec.from_function(
            test_kernels.squared_sum, name="t_overlap", batch=many, provider="<session>",
            execution_protocol=KernelExecutionProtocol.PARALLEL, overlap_batches=overlap))
        # chunks of two parameters (512 bytes each; a third of max_bytes per chunk)
        config = {"cache": {"max_bytes": 3600},
                  "parallel": {"executor": "sequential", "process_pool": {"max_workers": 2}}}
        with Session(config=config) as session:
            session.models.add(arrays, model_id="m")
            session.compute.apply("t_overlap")
            rows = session.results.export_metrics("t_overlap")["m"]
        assert calls == [2, 2, 2]
        return seen, {k: (v["t_overlap"], float(np.sum(arrays[k] ** 2))) for k, v in rows.items()}

    def test_the_next_chunk_starts_before_the_last_one_ends(self):
        seen, rows = self._apply(True, first_waits=60.0)  # 60 s: only a safety net
        assert seen == [True] and len(rows) == 6
        assert all(ours == pytest.approx(numpy) for ours, numpy in rows.values())

    def test_a_batch_not_marked_thread_safe_runs_alone(self):
        seen, rows = self._apply(False, first_waits=0.5)
        assert seen == [False] and len(rows) == 6


class TestSharedReads:
    """Independent PARALLEL kernels that read the same weights run on one read of each
    unit (runner.read_together), each with its own values, notes and restrictions."""

    @pytest.mark.parametrize("executor", ["sequential", "threads"])
    def test_each_parameter_is_read_once_for_the_kernels_that_read_it(self, arrays, executor):
        parallel = KernelExecutionProtocol.PARALLEL
        with Session(config={"parallel": {"executor": executor, "pool_min_seconds": 0}}) as s:
            s.compute.kernel(name="t_sq", execution_protocol=parallel)(test_kernels.squared_sum)
            s.compute.kernel(name="t_max", execution_protocol=parallel,
                             restrictions=[Restriction.min_ndim(2)])(test_kernels.fails_on_bias)
            s.compute.kernel(name="t_fail", execution_protocol=parallel)(
                test_kernels.fails_on_bias)
            s.models.add(arrays, model_id="m")
            reads, real = [], s.store.load_weights
            s.store.load_weights = lambda model_id, name: reads.append(name) or real(model_id,
                                                                                    name)
            events = []
            report = s.compute.apply("t_sq", "t_max", "t_fail", errors="record",
                                     progress=events.append)
            rows = s.results.export_metrics()["m"]
            notes = {(n["kernel"], n["unit"]): n["kind"] for n in s.results.export_notes()}
        assert sorted(reads) == sorted(arrays)  # once each, for the three kernels
        assert report.computed == {"t_sq": 4, "t_max": 3, "t_fail": 3}
        assert {(e.kernel, e.total, e.steps) for e in events} == {("t_sq+t_max+t_fail", 4, 1)}
        for name, w in arrays.items():
            assert rows[name]["t_sq"] == pytest.approx(np.sum(w ** 2))
            if w.ndim > 1:
                assert rows[name]["t_max"] == rows[name]["t_fail"] == np.abs(w).max()
        assert "t_max" not in rows["layer1.bias"] and "t_fail" not in rows["layer1.bias"]
        assert notes == {("t_max", "m/layer1.bias"): "skipped",
                         ("t_fail", "m/layer1.bias"): "failed"}

    def test_what_runs_together(self, session):
        """A kernel joins an earlier one when both are PARALLEL on parameters, read the
        same weights of some of the same units, and it needs nothing produced from the
        earlier one's step to its own (its inputs would not be there yet)."""
        from diffract.core.compute.runner import read_together

        parallel = KernelExecutionProtocol.PARALLEL
        for name in ("t_a", "t_b"):
            session.compute.kernel(name=name, execution_protocol=parallel)(
                test_kernels.squared_sum)
        session.compute.kernel(name="t_seq")(test_kernels.squared_sum)
        base = session.registry.get("t_a")
        specs = {"t_after": attrs.evolve(base, name="t_after", produce_fields=("t_after",),
                                         inputs=(("weights", "weights"), ("t_b", "t_b"))),
                 "t_shape": attrs.evolve(base, name="t_shape", produce_fields=("t_shape",),
                                         inputs=(("shape", "shape"),))}

        def step(name, *params):
            spec = specs.get(name) or session.registry.get(name)
            return Step(spec, tuple(Unit(("m",), p) for p in params))

        a, b, seq, after = step("t_a", "x", "y"), step("t_b", "y"), step("t_seq", "x"), \
            step("t_after", "x")
        assert read_together([a, seq, b, after]) == [(a, (b,)), (seq, ()), (after, ())]
        assert read_together([b, after, a]) == [(b, (a,)), (after, ())]
        elsewhere = step("t_b", "z")  # no unit in common: nothing to share
        assert read_together([a, elsewhere]) == [(a, ()), (elsewhere, ())]
        shape = step("t_shape", "x")  # reads no weights
        assert read_together([shape, a]) == [(shape, ()), (a, ())]
        # t_after reads t_b: not with t_a when t_b runs between them
        assert read_together([a, b, after]) == [(a, (b,)), (after, ())]
        assert read_together([b, a, after]) == [(b, (a,)), (after, ())]
