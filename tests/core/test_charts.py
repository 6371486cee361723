"""The report's charts read well (issue 33 item 8): long layer names cut in the middle,
keeping the layer index and the leaf (checked in the SVG drawn by headless Chromium); a
legend placed where the data are not; the linear ESD of a matrix with a few huge
eigenvalues showing its bulk and saying what lies beyond; the ESD PNG's labels inside it."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from importlib import resources

import numpy as np
import pytest

from diffract_report import viz
from diffract_report._html import _chart, esd_chart

BERT = [f"encoder.layer.{i}.{leaf}" for i in range(12)
        for leaf in ("attention.self.query", "attention.output.dense", "intermediate.dense")]

HARNESS = """<script>
(function () {
  var out = {ticks: [], legends: []};
  document.querySelectorAll("svg").forEach(function (svg, k) {
    var pts = [];
    svg.querySelectorAll("polyline").forEach(function (p) {
      p.getAttribute("points").trim().split(" ").forEach(function (q) {
        var xy = q.split(","); pts.push([+xy[0], +xy[1]]); }); });
    svg.querySelectorAll("circle").forEach(function (c) {
      pts.push([+c.getAttribute("cx"), +c.getAttribute("cy")]); });
    svg.querySelectorAll("g.legend").forEach(function (g) {
      var b = g.getAttribute("data-box").split(",").map(Number);
      out.legends.push({chart: k, inside: pts.filter(function (q) {
        return q[0] >= b[0] && q[0] <= b[0] + b[2] && q[1] >= b[1] && q[1] <= b[1] + b[3];
      }).length, box: b});
    });
    if (k === 0) svg.querySelectorAll("text.tick").forEach(function (t) {
      if (t.getAttribute("transform")) out.ticks.push(t.firstChild.nodeValue); });
  });
  document.body.setAttribute("data-test", JSON.stringify(out));
})();
</script>"""


def _page(specs) -> str:
    script = resources.files("diffract_report").joinpath("_charts.js").read_text()
    return ("<!doctype html><html><head><meta charset=utf-8></head><body>"
            + "".join(_chart(s) for s in specs) + f"<script>{script}</script>{HARNESS}"
            "</body></html>")


def _drawn(tmp_path, specs) -> dict:
    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    page = tmp_path / "charts.html"
    page.write_text(_page(specs))
    dom = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", page.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    found = re.search(r'data-test="([^"]+)"', dom)
    assert found, dom[-500:]
    return json.loads(html.unescape(found.group(1)))


def test_layer_names_keep_their_index_and_leaf_and_legends_avoid_the_data(tmp_path):
    cats = viz.short_names(BERT)  # the common prefix "encoder." goes first
    depth = {"panels": [{"title": "alpha by layer", "cats": cats, "series": [
        {"kind": "line", "marks": True, "x": list(range(len(cats))), "label": "pl_alpha",
         "y": [2 + (i % 3) for i in range(len(cats))]}]}]}
    # data crowding the top right, where a legend was always put
    x = np.linspace(0, 10, 60)
    crowded = {"panels": [{"title": "t", "series": [
        {"kind": "line", "x": x.tolist(), "y": np.where(x > 5, 10.0, 0.0).tolist(),
         "label": "a long legend label"}]}]}
    drawn = _drawn(tmp_path, [depth, crowded])
    ticks = drawn["ticks"]
    assert len(ticks) == len(cats)
    for i in range(12):  # every layer index is readable, each with its leaves
        assert f"layer.{i}\u2026output.dense" in ticks, ticks[:6]
        assert sum(t.startswith(f"layer.{i}\u2026") for t in ticks) == 3
    assert all(len(t) <= 24 for t in ticks)
    assert {d["chart"] for d in drawn["legends"]} == {0, 1}
    for legend in drawn["legends"]:
        assert legend["inside"] == 0, legend


def test_short_names_in_the_middle_without_a_browser():
    """The same rule as the charts' script, for the names the heat maps and tables show:
    no layer index is lost from the left."""
    names = viz.short_names(BERT)
    assert names[0] == "layer.0.attention.self.query"


def test_a_few_huge_eigenvalues_leave_the_bulk_in_view():
    rng = np.random.default_rng(0)
    bulk = rng.chisquare(3, 383) / 3
    esd = np.sort(np.r_[bulk, 800.0])
    top, beyond = viz.linear_range(esd, 3.0)
    assert top == pytest.approx(max(np.quantile(esd, 0.99), 3.6)) and beyond == int(
        np.sum(esd > top)) >= 1
    assert viz.linear_range(np.sort(bulk), 3.0) == (float(bulk.max()), 0)  # nothing to cut
    spec = esd_chart({"esd": esd, "mp_bulk_max": 3.0, "pl_alpha": 2.5, "pl_xmin": 1.0},
                     (384, 384))
    linear = spec["panels"][1]
    assert linear["title"] == (f"linear ESD, the bulk: {beyond} eigenvalue(s) beyond "
                               f"{top:.3g}, up to 800")
    bars = linear["series"][0]
    assert max(bars["x1"]) == pytest.approx(top)
    shares = np.array(bars["y"]) * (np.array(bars["x1"]) - np.array(bars["x0"]))
    assert shares.sum() == pytest.approx((esd.size - beyond) / esd.size, rel=1e-4)


def test_the_esd_png_keeps_its_labels_inside():
    pytest.importorskip("matplotlib")
    rng = np.random.default_rng(1)
    for esd in (np.sort(np.r_[rng.chisquare(3, 383) / 3, 800.0]),
                np.sort(rng.pareto(1.5, 3000) + 1e-3)):
        fig = viz._draw_esd("m", "p", {"esd": esd, "pl_alpha": 2.5, "pl_xmin": 1.0,
                                        "mp_bulk_max": 3.0}, (384, 384))
        renderer = fig.canvas.get_renderer()
        width = fig.get_figwidth() * fig.dpi
        left, right = (ax.get_tightbbox(renderer) for ax in fig.axes)
        assert left.x0 >= 0 and right.x1 <= width
        assert left.x1 <= right.x0  # the panels do not overlap
