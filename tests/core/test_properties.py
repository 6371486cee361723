"""Property: after any sequence of applies with random failures and interruptions, every
unit has its fields or a note saying why, and nothing computed is ever lost or changed."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

from diffract import FieldUndefined, KernelApplyLevel, KernelSpec, Session
from diffract.errors import ApplyError
from diffract.plugins import get_registry

hypothesis = pytest.importorskip("hypothesis")
st = hypothesis.strategies

#: What the test kernels do in the current apply: parameters they fail on, and how many
#: kernel calls may run before a KeyboardInterrupt (None: no interruption).
CONTROL: dict = {"fail": set(), "budget": None}


def _tick(name: str) -> None:
    budget = CONTROL["budget"]
    if budget is not None:
        if budget <= 0:
            raise KeyboardInterrupt
        CONTROL["budget"] = budget - 1
    if name in CONTROL["fail"]:
        raise RuntimeError(f"injected failure on {name}")


def p_sq(weights, shape):
    """sum W^2 (undefined for NaN weights), and the parameter's element count."""
    _tick(f"p_sq:{shape}")
    if not np.isfinite(weights).all():
        raise FieldUndefined("NaN weights")
    return float(np.sum(np.square(weights))), int(np.size(weights))


def p_root(p_sq_value):
    """sqrt of p_sq."""
    _tick("p_root")
    return math.sqrt(p_sq_value)


def p_total(p_root_values):
    """Sum of p_root over the model."""
    _tick("p_total")
    return float(sum(p_root_values))


def _register() -> None:
    registry = get_registry()
    for spec in (
        KernelSpec.from_function(p_sq, produce_fields=("p_sq_value", "p_size"),
                                 provider="<session>"),
        KernelSpec.from_function(p_root, require_fields=("p_sq_value",), provider="<session>"),
        KernelSpec.from_function(p_total, require_fields=("p_root",),
                                 apply_level=KernelApplyLevel.IN_MODEL, provider="<session>"),
    ):
        registry.register(spec)


def _expected(w: np.ndarray) -> dict:
    if not np.isfinite(w).all():
        return {"p_sq_value": math.nan, "p_size": math.nan, "p_root": math.nan}
    sq = float(np.sum(np.square(w)))
    return {"p_sq_value": sq, "p_size": w.size, "p_root": math.sqrt(sq)}


@st.composite
def models(draw):
    n = draw(st.integers(1, 5))
    out = {}
    for i in range(n):
        shape = draw(st.sampled_from([(3,), (2, 3), (4, 2), (0, 3), (1, 1)]))
        w = np.arange(math.prod(shape), dtype=np.float64).reshape(shape) + i
        if draw(st.booleans()) and w.size and draw(st.integers(0, 4)) == 0:
            w.flat[0] = np.nan
        out[f"p{i}"] = w
    return out


@st.composite
def runs(draw, names):
    plans = []
    for _ in range(draw(st.integers(1, 4))):
        fail = draw(st.sets(st.sampled_from([f"p_sq:{s}" for s in
                                             [(3,), (2, 3), (4, 2), (0, 3), (1, 1)]]
                                            + ["p_root", "p_total"])))
        budget = draw(st.one_of(st.none(), st.integers(0, 12)))
        plans.append((fail, budget))
    return plans


def _snapshot(session) -> dict:
    """Every stored value: ("param", name, field) and ("aggregate", contextual name, "")."""
    metrics = {
        ("param", p, f): v
        for p, row in session.results.export_metrics().get("m", {}).items()
        for f, v in row.items()
    }
    aggregates = {("aggregate", k, ""): v for k, v in session.results.export_aggregates().items()}
    return metrics | aggregates


def _same(a, b) -> bool:
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or a == b


@hypothesis.settings(max_examples=40, deadline=None,
                     suppress_health_check=[hypothesis.HealthCheck.function_scoped_fixture])
@hypothesis.given(data=st.data())
def test_every_unit_has_fields_or_a_reason_and_nothing_is_lost(data):
    """Random models, failures and interruption points never lose or alter a stored value;
    after a completed apply every unit has its fields or a note; a clean apply finishes."""
    _register()
    arrays = data.draw(models())
    plans = data.draw(runs(list(arrays)))
    fields = ("p_total",)
    with Session(config={"cache": {"max_bytes": 16}, "parallel": {"executor": "sequential"}}) as s:
        s.models.add(arrays, model_id="m")
        before: dict = {}
        for fail, budget in plans + [(set(), None)]:  # always end with a clean apply
            CONTROL["fail"], CONTROL["budget"] = fail, budget
            interrupted = False
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")  # "n unit(s) failed": expected here
                    s.compute.apply(*fields, errors="record" if fail else "raise")
            except KeyboardInterrupt:
                interrupted = True
            except ApplyError:
                pytest.fail("a clean apply (no failures injected) raised ApplyError")
            finally:
                CONTROL["budget"] = None
            now = _snapshot(s)
            for key, value in before.items():  # nothing computed is lost or changed
                assert key in now and _same(now[key], value), key
            for (kind, param, field), value in now.items():  # and every value is right
                if kind == "param":
                    assert _same(value, _expected(arrays[param])[field]), (param, field, value)
            before = now
            notes = {(n["kernel"], n["unit"]): n["kind"] for n in s.results.export_notes()}
            for kind in notes.values():
                assert kind in ("failed", "skipped", "undefined")
            if interrupted:
                continue
            rows = s.results.export_metrics().get("m", {})
            for param in arrays:
                row = rows.get(param, {})
                for kernel, outs in (("p_sq", ("p_sq_value", "p_size")), ("p_root", ("p_root",))):
                    has = all(f in row for f in outs)
                    noted = (kernel, f"m/{param}") in notes
                    assert has or noted, (param, kernel, row, notes)
                    if noted and notes[(kernel, f"m/{param}")] == "failed":
                        assert not any(f in row for f in outs)
            aggregated = "p_total@models[m]" in s.results.export_aggregates()
            assert aggregated or ("p_total", "m") in notes
        assert "failed" not in notes.values()
        total = s.results.export_aggregates()["p_total@models[m]"]
        roots = [_expected(w)["p_root"] for w in arrays.values()]
        assert _same(total, float(sum(roots))) or math.isclose(total, sum(roots))
