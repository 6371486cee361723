"""The report's charts read well (issue 33 item 8): long layer names cut in the middle,
keeping the layer index and the leaf (checked in the SVG drawn by headless Chromium); a
legend placed where the data are not; the linear ESD of a matrix with a few huge
eigenvalues showing its bulk and saying what lies beyond; the ESD PNG's labels inside it."""

from __future__ import annotations

import html
import itertools
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


def _page(specs, harness: str) -> str:
    script = resources.files("diffract_report").joinpath("_charts.js").read_text()
    return ("<!doctype html><html><head><meta charset=utf-8></head><body>"
            + "".join(_chart(s) for s in specs) + f"<script>{script}</script>{harness}"
            "</body></html>")


def _drawn(tmp_path, specs, harness: str = HARNESS) -> dict:
    if shutil.which("chromium") is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    page = tmp_path / "charts.html"
    page.write_text(_page(specs, harness))
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


PANELS = """<script>
(function () {
  var out = [];
  document.querySelectorAll("svg").forEach(function (svg) {
    var chart = [];
    svg.querySelectorAll(":scope > g").forEach(function (g) {
      var y = [], bar = [], right = 0;
      g.querySelectorAll("text.tick").forEach(function (t) {
        if (t.classList.contains("cbar")) {
          bar.push(t.textContent);
          var box = t.getBBox();
          right = Math.max(right, box.x + box.width);
        } else if (t.classList.contains("y")) y.push(t.textContent);
      });
      chart.push({y: y, bar: bar, right: right,
                  width: +svg.getAttribute("viewBox").split(" ")[2]});
    });
    out.push(chart);
  });
  document.body.setAttribute("data-test", JSON.stringify(out));
})();
</script>"""


def _panels(tmp_path, specs) -> list:
    return _drawn(tmp_path, specs, PANELS)


def test_ticks_and_colour_bars_never_repeat_a_label_at_small_drifts(tmp_path):
    """A tracked run whose alphas drift by 1e-4 (and other scales: 43, 0.979, 3.5e4): the
    y ticks and a heat map's colour bar carry the digits their spacing needs, every
    label distinct and each the value it marks to within a tenth of its spacing."""
    from diffract_report._html import checkpoints_chart

    rng = np.random.default_rng(0)
    specs = []
    for level in (2.58, 43.0, 0.979, 3.5e4):
        ids = [f"step-{i}" for i in range(4)]
        table = {m: {f"l{k}": {"pl_alpha": level + 1e-4 * rng.standard_normal()}
                     for k in range(3)} for m in ids}
        specs.append(checkpoints_chart(ids, table))
        z = (level + 1e-4 * rng.standard_normal((3, 4))).tolist()
        specs.append({"w": 600, "h": 200, "panels": [{"title": "heads", "heat": {
            "rows": ["a", "b", "c"], "cols": [0, 1, 2, 3], "z": z}}]})
    drawn = _panels(tmp_path, specs)
    assert len(drawn) == len(specs)
    for k, chart in enumerate(drawn):
        for panel in chart:
            for labels in (panel["y"], panel["bar"]):
                assert len(set(labels)) == len(labels), (k, labels)
                values = [float(v) for v in labels]
                if len(values) > 1:
                    step = min(abs(b - a) for a, b in itertools.pairwise(values))
                    assert step > 0, (k, labels)
        assert any(len(p["y"]) >= 3 or len(p["bar"]) == 5 for p in chart), (k, chart)


def test_the_linear_esd_panel_follows_its_histogram_for_a_square_matrix(tmp_path):
    """384x384 (Q = 1): the Marchenko-Pastur density diverges at 0; the panel's y axis
    still follows the histogram (its top bar fills most of the axis), the curve is
    clipped there and says so in its label."""
    rng = np.random.default_rng(2)
    w = rng.standard_normal((384, 384)) / np.sqrt(384)
    esd = np.sort(np.linalg.eigvalsh(w.T @ w))
    spec = esd_chart({"esd": esd, "mp_bulk_max": 4.0}, (384, 384))
    bars, curve = spec["panels"][1]["series"][:2]
    top = max(bars["y"])
    assert curve["label"].startswith("Marchenko-Pastur (clipped; it reaches ")
    assert max(curve["y"]) == pytest.approx(1.25 * top, rel=1e-4)
    drawn = _panels(tmp_path, [spec])
    ticks = [float(v) for v in drawn[0][1]["y"]]
    assert max(ticks) >= 0.8 * top and max(ticks) <= 1.5 * top, (ticks, top)
    # a rectangular matrix's curve stays below: drawn whole, named plainly
    tall = rng.standard_normal((384, 96)) / np.sqrt(384)
    spec = esd_chart({"esd": np.sort(np.linalg.eigvalsh(tall.T @ tall))}, (384, 96))
    assert spec["panels"][1]["series"][1]["label"] == "Marchenko-Pastur"


def test_a_single_pairs_heat_map_keeps_its_colour_bar_labels_inside(tmp_path):
    """One pair (one column) of values that differ in the fifth digit: the colour bar's
    labels, as long as their spacing needs, end inside the chart."""
    z = [[0.99987], [0.99991], [0.99999], [0.99994]]
    spec = {"w": 600, "h": 220, "panels": [{"title": "l_subspace_overlap per head", "heat": {
        "rows": [f"model.layers.{i}.self_attn.q_proj.weight" for i in range(4)],
        "cols": ["a -> b"], "z": z}}]}
    panel = _panels(tmp_path, [spec])[0][0]
    assert len(panel["bar"]) == 5 and len(set(panel["bar"])) == 5, panel
    assert 0 < panel["right"] <= panel["width"], panel


BOXES = """<script>
(function () {
  var out = [];
  document.querySelectorAll("svg").forEach(function (svg) {
    var vb = svg.getAttribute("viewBox").split(" ").map(Number), ticks = [], lines = [];
    svg.querySelectorAll("text").forEach(function (t) {
      var b = t.getBoundingClientRect(), s = svg.getBoundingClientRect();
      ticks.push({text: t.firstChild ? t.firstChild.nodeValue : "",
                  cls: t.getAttribute("class") || "", rot: !!t.getAttribute("transform"),
                  x0: b.left - s.left, x1: b.right - s.left, y0: b.top - s.top,
                  y1: b.bottom - s.top, w: s.width, h: s.height});
    });
    svg.querySelectorAll("polyline").forEach(function (p) {
      lines.push({dash: p.getAttribute("stroke-dasharray"),
                  width: p.getAttribute("stroke-width")});
    });
    out.push({ticks: ticks, lines: lines});
  });
  document.body.setAttribute("data-test", JSON.stringify(out));
})();
</script>"""


def _boxes(tmp_path, specs) -> list:
    return _drawn(tmp_path, specs, BOXES)


def test_a_bert_models_layer_ticks_are_distinct_and_drawn_whole(tmp_path):
    """BERT's attention.output.dense and output.dense cut to one label each layer
    (layer.0...output.dense twice); now the cut keeps the dropped words' initials where
    two would read alike, and every label, token_type_embeddings' too, lies inside the
    chart (issue 77.4)."""
    names = ["embeddings.position_embeddings.weight", "embeddings.token_type_embeddings.weight",
             "embeddings.word_embeddings.weight"]
    names += [f"encoder.layer.{i}.{leaf}.weight" for i in range(3) for leaf in (
        "attention.self.query", "attention.self.key", "attention.self.value",
        "attention.output.dense", "intermediate.dense", "output.dense")]
    names.append("pooler.dense.weight")
    cats = viz.short_names(names)
    spec = {"panels": [{"title": "pl_alpha by layer", "cats": cats, "series": [
        {"kind": "line", "marks": True, "x": list(range(len(cats))), "label": "pl_alpha",
         "y": [2 + (i % 3) for i in range(len(cats))]}]}]}
    (chart,) = _boxes(tmp_path, [spec])
    ticks = [t for t in chart["ticks"] if t["cls"] == "tick" and t["rot"]]
    assert len(ticks) == len(cats)
    texts = [t["text"] for t in ticks]
    assert len(set(texts)) == len(texts), texts
    assert "layer.0\u2026a.output.dense" in texts and "layer.0\u2026output.dense" in texts
    for t in chart["ticks"]:
        if t["text"]:  # (an empty axis label has no box)
            assert t["x0"] >= 0 and t["x1"] <= t["w"] and t["y0"] >= 0 and t["y1"] <= t["h"], t


def test_a_flat_runs_alignment_stays_in_0_to_1_and_both_curves_show(tmp_path):
    """A run whose checkpoints barely differ: the overlap (bounded by 1) is drawn on an
    axis that stays within [0, 1], the two curves (with the previous and with the first
    checkpoint) are drawn differently so the one on top does not hide the other, and
    the Movers table lists no interval in which nothing changed (issue 77.4)."""
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    from diffract.cli import main

    torch.manual_seed(0)
    base = {f"l{i}.weight": torch.randn(64, 48) for i in range(3)}
    for step in (1, 2, 3):
        folder = tmp_path / "run" / f"checkpoint-{step}"
        folder.mkdir(parents=True)
        # checkpoint 3 repeats checkpoint 2: an interval in which nothing moved
        state = {k: v + (1e-7 * min(step, 2) if k == "l0.weight" else 0.0)
                 for k, v in base.items()}
        safetensors_torch.save_file(state, str(folder / "model.safetensors"))
    report = tmp_path / "r.html"
    assert main(["track", str(tmp_path / "run"), "--store", str(tmp_path / "s"), "--report",
                 str(report), "-q"]) == 0
    text = report.read_text()
    specs = [json.loads(html.unescape(m)) for m in
             re.findall(r"<div class=chart data-chart='([^']*)'", text)]
    (overlap,) = [s for s in specs if s["panels"][0]["title"].startswith("l_subspace_overlap")]
    (chart,) = _boxes(tmp_path, [overlap])
    y = [float(t["text"]) for t in chart["ticks"] if t["cls"] == "tick y"]
    assert y and min(y) >= 0 and max(y) <= 1, y
    assert len(chart["lines"]) == 2 and chart["lines"][0] != chart["lines"][1], chart["lines"]
    movers = re.search(r'<table[^>]* id="movers">(.*?)</table>', text, re.S)
    rows = [re.findall(r"<td[^>]*>(.*?)</td>", row, re.S) for row in
            re.findall(r"<tr[^>]*>(.*?)</tr>", movers.group(1) if movers else "", re.S)]
    rows = [r for r in rows if r]
    assert all(float(r[-1]) != 0 for r in rows), rows
    assert not [r for r in rows if r[1] == "3"], rows  # 2 -> 3 moved nothing


def test_the_compare_heat_maps_colour_bar_keeps_its_label_inside():
    """A long field name on a heat map of one pair of values near 1: the colour bar's
    label and tick labels end inside the PNG, with no '1e-6+9.99999e-1' offset on top
    (issue 77.4)."""
    pytest.importorskip("matplotlib")
    z = np.array([[0.9999991], [0.9999995], [0.9999999], [0.9999993]])
    rows = [f"encoder.layer.{i}.attention.output.dense.weight" for i in range(4)]
    fig = viz.heatmap_figure(z, rows, ["a -> b"], "avg_max_l_agreement")
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width = fig.bbox.width
    texts = [t for t in fig.findobj(lambda a: hasattr(a, "get_text") and a.get_visible()
                                    and a.get_text())]
    assert any(t.get_text() == "avg_max_l_agreement" and t.get_rotation() == 90 for t in texts)
    for t in texts:
        box = t.get_window_extent(renderer)
        assert box.x0 >= 0 and box.x1 <= width + 0.5, (t.get_text(), box, width)
    assert not [t.get_text() for t in texts if "e-" in t.get_text() or "e\u2212" in
                t.get_text()]
