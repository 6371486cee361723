"""Diffract in a Jupyter notebook, executed by nbclient in a real kernel (issue 33 items
1-3): an apply shows a progress bar redrawn in the cell's output, a cell ending with the
report shows its HTML view, a summary shows as lines, and no stream carries a source
line of Diffract's own code."""

from __future__ import annotations

import re

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

SETUP = """\
import numpy as np
from diffract import Session
rng = np.random.default_rng(0)
s = Session()
s.models.add({f"layer{i}.weight": rng.standard_t(3, (300, 200)) for i in range(6)}
             | {"flat.weight": np.ones((80, 80)), "bias": np.ones(7)}, model_id="m")
"""
APPLY = """\
report = s.compute.apply("pl_alpha", "stable_rank")
report"""
SUMMARY = "report.summary()"
RESULTS = "s.results"
QUIET = """\
quiet = Session()
quiet.models.add({"w": rng.standard_normal((50, 40))}, model_id="q")
quiet.compute.apply("stable_rank", progress=False)
print("quiet done")"""
ADD = """s.models.add({f"h{i}.weight": rng.standard_normal((20, 10)) for i in range(40)},
             model_id="many")"""


@pytest.fixture(scope="module")
def executed():
    book = nbformat.v4.new_notebook()
    book.cells = [nbformat.v4.new_code_cell(c) for c in (SETUP, APPLY, SUMMARY, QUIET,
                                                         RESULTS, ADD)]
    nbclient.NotebookClient(book, timeout=600, kernel_name="python3").execute()
    return book.cells


def _outputs(cell, kind):
    return [o for o in cell.outputs if o.output_type == kind]


def test_an_apply_shows_progress_redrawn_in_the_cell(executed):
    shown = _outputs(executed[1], "display_data")
    assert len(shown) == 1, executed[1].outputs  # one display, updated in place
    text = shown[0].data["text/plain"]
    match = re.fullmatch(r"step (\d+)/(\d+) (\w+): (\d+)/(\d+) unit\(s\), [\d.e+]+/s", text)
    assert match is not None, text
    step, steps, kernel, done, total = match.groups()
    assert step == steps and done == total and int(total) >= 1, text  # the last draw: done
    assert '<progress value="1.000" max="1"' in shown[0].data["text/html"]


def test_a_cell_ending_with_the_report_shows_its_html_view(executed):
    (result,) = _outputs(executed[1], "execute_result")
    assert result.data["text/html"].startswith("<div><b>ApplyReport</b> of pl_alpha, "
                                               "stable_rank<ul><li>computed: ")
    assert "skipped: " in result.data["text/html"]  # the bias
    (summary,) = _outputs(executed[2], "execute_result")
    lines = summary.data["text/plain"].splitlines()
    assert lines[0].startswith("computed: ") and len(lines) >= 3, lines
    assert not summary.data["text/plain"].startswith("'") and "\\n" not in summary.data[
        "text/plain"]


def test_a_cell_ending_with_the_results_shows_what_they_hold(executed):
    (result,) = _outputs(executed[4], "execute_result")
    assert result.data["text/html"].startswith("<div><b>Results</b> of 1 model(s): m<br>"
                                               "fields stored: esd, esd_scale, pl_alpha")
    assert result.data["text/plain"].startswith("ResultsAPI(models=['m'], fields=['esd'")


def test_progress_false_shows_nothing(executed):
    assert _outputs(executed[3], "display_data") == []
    assert [o.text for o in _outputs(executed[3], "stream")] == ["quiet done\n"]


def test_no_stream_shows_a_line_of_diffracts_code(executed):
    streams = "".join(o.text for cell in executed for o in _outputs(cell, "stream"))
    assert "UndefinedValuesWarning" in streams  # flat.weight has no alpha
    for line in streams.splitlines():
        assert "site-packages/diffract" not in line and "/src/diffract" not in line, line
        assert not re.search(r"diffract\w*/.*\.py:\d+", line), line


def test_a_cell_ending_with_models_add_shows_one_line_not_every_name(executed):
    """Issue 59 item 7: the names ``models.add`` returns are a list (a notebook shows
    its repr) that reads as a count and the first names, not 40 lines of names."""
    (result,) = _outputs(executed[5], "execute_result")
    assert result.data["text/plain"] == ("<40 parameters: h0.weight, h1.weight, h2.weight, "
                                         "... (37 more)>")
