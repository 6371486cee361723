"""What an apply returns reads well (issue 33 item 2): reasons that differ only by naming
their own unit are one group, the summary shows as lines when a cell ends with it, and
the report has an HTML view."""

from __future__ import annotations

import warnings

import numpy as np

from diffract import Session
from diffract.core.compute.outcomes import ApplyReport, Summary
from diffract.core.storage.base import Note


def _report() -> ApplyReport:
    with Session() as s, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        arrays = {f"l{i}.bias": np.ones(5) for i in range(6)}
        arrays.update({f"l{i}.weight": np.ones((60, 60)) for i in range(3)})
        s.models.add(arrays, model_id="m")
        return s.compute.apply("pl_alpha", "alpha_weighted", errors="record")


def test_reasons_naming_their_own_unit_are_one_group():
    report = _report()
    skipped = report.reasons("skipped")
    # six biases, each skipped by three kernels: the dependent skips' reasons name the
    # bias ("'esd' skipped m/l3.bias (...)"), yet they are one reason per kernel
    assert sorted((kernel, len(units)) for (_, kernel, _), units in skipped.items()) == [
        ("alpha_weighted", 6), ("esd", 6), ("esd_scale", 6), ("power_law_fit", 6),
        ("spectral_norm", 6)]
    for (_, _, reason), units in skipped.items():
        assert units[0] in reason or "input" not in reason  # the first unit's own text
    assert "skipped: 30 unit(s), 5 distinct reason(s)" in report.summary()
    undefined = report.reasons("undefined")
    assert sum(map(len, undefined.values())) == 6 and len(undefined) == 2


def test_different_reasons_stay_apart():
    report = ApplyReport(requested=("x",), notes=[
        Note("k", ("m",), "a.weight", "skipped", "needs 2 dimensions"),
        Note("k", ("m",), "b.weight", "skipped", "needs 3 dimensions"),
        Note("k", ("m",), "c.weight", "skipped", "input 'y' skipped m/c.weight (why)"),
        Note("k", ("m",), "d.weight", "skipped", "input 'y' skipped m/d.weight (why)"),
        Note("k", ("m",), "e.weight", "skipped", "input 'y' skipped m/e.weight (other)"),
    ])
    groups = report.reasons()
    assert [len(units) for units in groups.values()] == [1, 1, 2, 1]
    assert ("skipped", "k", "input 'y' skipped m/c.weight (why)") in groups


def test_the_summary_reads_as_lines_and_the_report_has_an_html_view():
    report = _report()
    summary = report.summary()
    assert isinstance(summary, Summary) and isinstance(summary, str)
    assert repr(summary) == str(summary) and "\n" in repr(summary)
    assert "\\n" not in repr(summary)
    html = report._repr_html_()
    assert html.startswith("<div><b>ApplyReport</b> of pl_alpha, alpha_weighted<ul>")
    assert html.count("<li>") == len(summary.splitlines())
    assert "input &#x27;esd&#x27; is not available" in html  # reasons escaped


def test_a_results_view_says_what_it_holds():
    with Session() as s:
        s.models.add({"a.weight": np.random.default_rng(0).random((30, 20))}, model_id="m")
        s.models.add({"a.weight": np.eye(20)}, model_id="n")
        s.filter(model_ids=["m"]).compute.apply("stable_rank")
        assert repr(s.filter(model_ids=["m"]).results) == (
            "ResultsAPI(models=['m'], fields=['esd', 'esd_scale', 'stable_rank']; "
            "export_metrics(...), trajectory(...), to_pandas(...) read them)")
        assert repr(s.filter(model_ids=["n"]).results).startswith(
            "ResultsAPI(models=['n'], fields=[];")
        assert s.results._repr_html_() == (
            "<div><b>Results</b> of 2 model(s): m, n<br>fields stored: esd, esd_scale, "
            "stable_rank<br><code>export_metrics(...)</code>, <code>trajectory(field)</code>"
            ", <code>to_pandas()</code> read them</div>")
