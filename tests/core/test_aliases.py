"""Field aliases: a kernel declares other names for its fields; apply, export, erase,
stale and provenance take either, values are stored once under the field's own name."""

from __future__ import annotations

import types
import warnings

import numpy as np
import pytest

from diffract import Session
from diffract.errors import KernelConflictError, KernelDefinitionError
from diffract.plugins import KernelSpec, hookimpl, make_plugin_manager
from diffract.plugins import kernel as mark_kernel
from diffract_report.catalog import render_catalog


@pytest.fixture
def session(rng):
    with Session() as s:
        s.models.add({"a": rng.standard_normal((6, 4)), "b": rng.standard_normal((3, 5))},
                     model_id="m")

        @s.compute.kernel(produce_fields=("t_total", "t_peak"),
                          aliases={"old_total": "t_total", "old_peak": "t_peak"})
        def t_stats(weights, *, scale: float = 1.0):
            return float(np.sum(weights)) * scale, float(np.max(weights)) * scale

        yield s


def test_apply_and_export_under_an_alias(session):
    session.compute.apply("old_total")
    table = session.results.export_metrics("old_total", "t_peak")["m"]
    stored = session.results.export_metrics("t_total")["m"]
    for param in ("a", "b"):
        assert table[param]["old_total"] == stored[param]["t_total"]
        assert set(table[param]) == {"old_total", "t_peak"}
    rows = session.results.export("old_peak")
    assert {r["field"] for r in rows} == {"old_peak"} and len(rows) == 2


def test_a_tabular_export_names_its_column_as_asked(session):
    session.compute.apply("t_total")
    text = session.results.export_metrics("old_total", export_format="csv")
    header = text.splitlines()[0].split(",")
    assert header[-1] == "old_total" and "t_total" not in header


def test_erase_under_an_alias_erases_the_field(session):
    session.compute.apply("t_total")
    assert session.results.erase("old_total", "old_peak") == 4
    assert session.results.export_metrics() == {"m": {}}


def test_stale_and_provenance_under_an_alias(session):
    session.compute.apply("t_total")
    assert session.results.provenance("old_total", "m", "a")["kernel"] == "t_stats"
    session.compute.configure_kernel("t_stats", scale=2.0)
    stale = session.results.stale("old_peak")
    assert {r["kernel"] for r in stale} == {"t_stats"} and len(stale) == 2
    session.compute.apply("old_total", recompute="stale")
    assert session.results.stale() == []


def test_the_listing_and_the_catalog_name_aliases(session):
    (record,) = [r for r in session.compute.list_available_metrics(verbose=True)
                 if r["field"] == "t_total"]
    assert record["aliases"] == ["old_total"]
    assert session.registry.canonical("old_peak") == "t_peak"
    page = render_catalog([session.registry.get("t_stats")])
    assert "| `old_total` | [t_stats](#t_stats) (alias of `t_total`) |" in page
    assert "- aliases: `old_total` for `t_total`, `old_peak` for `t_peak`" in page


def test_an_alias_must_name_a_produced_field_and_not_be_one():
    def f(weights):
        return 1.0

    with pytest.raises(KernelDefinitionError, match=r"'nope', which the kernel does not produce"):
        KernelSpec.from_function(f, aliases={"g": "nope"})
    with pytest.raises(KernelDefinitionError, match=r"already a field name"):
        KernelSpec.from_function(f, produce_fields=("x", "y"), aliases={"x": "y"})


def test_an_alias_that_names_another_kernels_field_is_refused(session):
    with pytest.raises(KernelConflictError, match=r"'t_total' already"):
        session.compute.kernel(name="t_other", aliases={"t_total": "t_other"})(
            lambda weights: 1.0)
    with pytest.raises(KernelConflictError, match=r"'old_total' already"):
        session.compute.kernel(name="old_total")(lambda weights: 1.0)


def _pack(name: str) -> types.ModuleType:
    module = types.ModuleType(name)

    @mark_kernel(aliases={"shared_alias": name})
    def fn(weights):
        return 0.0

    fn.__name__ = name

    @hookimpl
    def diffract_kernels():
        yield KernelSpec.from_function(fn, name=name)

    module.diffract_kernels = diffract_kernels
    return module


def test_two_packs_claiming_one_alias_use_neither():
    pm = make_plugin_manager(strict=False)
    pm.register_plugin(_pack("pack_one_field"), distribution="pack-one", version="1.0")
    pm.register_plugin(_pack("pack_two_field"), distribution="pack-two", version="1.0")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        catalog = pm.catalog()
    names = {spec.name for spec in catalog.kernels}
    assert not names & {"pack_one_field", "pack_two_field"}
    assert "shared_alias" in catalog.contested["kernels"]


def test_an_aggregate_under_its_alias(session):
    from diffract import KernelApplyLevel

    @session.compute.kernel(apply_level=KernelApplyLevel.IN_MODEL,
                            aliases={"old_model_total": "t_model_total"})
    def t_model_total(t_total: tuple[float, ...]) -> float:
        return float(sum(t_total))

    session.compute.apply("old_model_total")
    stored = session.results.export_aggregates("t_model_total")
    asked = session.results.export_aggregates("old_model_total")
    assert list(stored) == ["t_model_total@models[m]"]
    assert asked == {"old_model_total@models[m]": stored["t_model_total@models[m]"]}
    rows = session.results.export("old_model_total", sources="aggregates")
    assert [r["field"] for r in rows] == ["old_model_total"]
    assert session.results.erase("old_model_total") == 1
    assert session.results.export_aggregates() == {}
