"""The HTML report: what a person expects to find in it, checked in the file and, where a
`chromium` binary is installed (Debian: `apt-get install chromium`), in the browser."""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from diffract import Session

pytest.importorskip("diffract_kernels_spectral")
pytest.importorskip("diffract_report")

from diffract_report.report import write_html  # noqa: E402

METRICS = ["pl_alpha", "alpha_weighted", "stable_rank", "warning"]


def _session(rng, models=("m",)):
    s = Session()
    for i, model_id in enumerate(models):
        s.models.add({
            "enc.0.attn.q.weight": rng.standard_t(3 + i, size=(240, 160)),
            "enc.0.mlp.up.weight": rng.standard_normal((320, 160)),
            "enc.1.attn.q.weight": rng.standard_t(4 + i, size=(240, 160)),
            "head.weight": np.eye(160) + 1e-3 * rng.standard_normal((160, 160)),
        }, model_id=model_id)
    s.compute.configure_kernel("training_warning", over_trained=2.5)
    s.compute.apply(*METRICS, "esd", "mp_bulk_max", errors="record")
    return s


@pytest.fixture
def report(rng, tmp_path) -> Path:
    with _session(rng, ("step1", "step2")) as s:
        path = write_html(s, tmp_path / "r.html", metrics=METRICS, seconds=1.5, command="x")
        s.registry.reset_configuration()
    return path


def _data(path: Path) -> list[dict]:
    return [json.loads(html.unescape(m))
            for m in re.findall(r"<div class=chart data-chart='([^']*)'", path.read_text())]


class TestContent:
    def test_contents_links_and_every_layer_row_links_to_its_esd_plot(self, report):
        """A table of contents of the sections; each layer row's name is a link to an
        anchor that exists and holds that layer's ESD chart."""
        text = report.read_text()
        toc = re.search(r"<nav class=toc>(.*?)</nav>", text).group(1)
        for target in re.findall(r"href='#([^']+)'", toc):
            assert f"id='{target}'" in text, target
        assert [t for t in re.findall(r">([^<]+)</a></li>", toc)] == [
            "Summary", "step1", "step2", "Provenance"]
        rows = re.findall(r"<td data-v=\"([^\"]+)\"><a href='#(esd-[^']+)'>", text)
        assert len(rows) == 8  # 4 layers x 2 models
        for name, anchor in rows:
            figure = re.search(rf"<figure id='{anchor}'><figcaption>([^<]+)</figcaption>", text)
            assert figure and figure.group(1) == name

    def test_charts_hold_the_stored_numbers(self, report):
        """The depth chart's alphas are the stored ones, in model order, layers named; the
        histogram counts every defined alpha; alpha per checkpoint has one line per layer
        and the mean."""
        charts = _data(report)
        with _session(np.random.default_rng(1234), ("step1", "step2")) as s:
            stored = s.results.export_metrics("pl_alpha")
            s.registry.reset_configuration()
        depth = next(c for c in charts if c["panels"][0]["title"] == "pl_alpha by layer")
        (line,) = [x for x in depth["panels"][0]["series"] if x["kind"] == "line"]
        assert line["names"] == list(stored["step1"])
        assert depth["panels"][0]["cats"] == ["enc.0.attn.q", "enc.0.mlp.up", "enc.1.attn.q",
                                              "head"]  # names, no common prefix here
        for got, want in zip(line["y"], stored["step1"].values(), strict=True):
            assert got == pytest.approx(want["pl_alpha"], rel=1e-4)
        histogram = next(c for c in charts if c["panels"][0]["title"] == "alpha of the layers")
        bars = histogram["panels"][0]["series"][0]
        assert sum(bars["y"]) == sum(np.isfinite(r["pl_alpha"]) for r in stored["step1"].values())
        trend = next(c for c in charts if c["panels"][0]["cats"] == ["step1", "step2"])
        lines = trend["panels"][0]["series"]
        assert len(lines) == 1 + sum(np.isfinite(r["pl_alpha"]) for r in stored["step1"].values())
        mean = lines[-1]["y"]
        assert mean[0] == pytest.approx(np.nanmean([r["pl_alpha"] for r in stored["step1"].values()]),
                                        rel=1e-4)

    def test_summary_in_percent_flags_highlighted_provenance_with_versions_and_hashes(
            self, rng, tmp_path):
        """Shares as percent; flagged layers highlighted; torch and numpy versions and each
        input file's header hash in the provenance."""
        torch = pytest.importorskip("torch")
        from safetensors.torch import save_file

        path = tmp_path / "m.safetensors"
        save_file({"w": torch.randn(240, 160), "v": torch.randn(240, 160) ** 3}, str(path))
        with Session() as s:
            s.models.add(path, model_id="m")
            s.compute.apply("pl_alpha")
            top = max(r["pl_alpha"] for r in s.results.export_metrics("pl_alpha")["m"].values())
            s.compute.configure_kernel("training_warning", over_trained=top + 1,
                                       under_trained=top + 2)  # both layers flagged
            s.compute.apply(*METRICS, errors="record")
            out = write_html(s, tmp_path / "r.html", metrics=METRICS, plots=False)
            digest = s.store.source("m").files[0].header_sha256[:16]
            s.registry.reset_configuration()
        text = html.unescape(out.read_text())
        summary = re.search(r"<table[^>]* id=\"summary\">(.*?)</table>", text).group(1)
        assert len(re.findall(r'data-v="\d+%">\d+%</td>', summary)) == 2  # both shares
        assert text.count("<tr class=bad>") == 2
        provenance = re.search(r"<table[^>]* id=\"provenance\">(.*?)</table>", text).group(1)
        assert f">{np.__version__}<" in provenance and f">{torch.__version__.split('+')[0]}" \
            in provenance
        assert f"m.safetensors {digest}" in text

    def test_layer_names_on_axes_lose_their_common_prefix(self):
        from diffract_report.viz import short_names as _short_names

        names = ["encoder.layer.0.attn.q.weight", "encoder.layer.0.mlp.weight",
                 "encoder.layer.1.attn.q.weight"]
        # the prefix ends at the layer index: its word stays (issue 33 item 8)
        assert _short_names(names) == ["layer.0.attn.q", "layer.0.mlp", "layer.1.attn.q"]
        assert _short_names(["blocks.attn.q.weight", "blocks.mlp.weight"]) == ["attn.q", "mlp"]

    def test_the_table_fits_a_1280_pixel_window(self, report):
        """Headers may wrap at their underscores (<wbr>), never cells; the page is capped
        at a width that fits 1280 pixels."""
        text = report.read_text()
        assert "<th>alpha_<wbr>weighted</th>" in text and "max-width:1220px" in text


def test_the_png_plots_report_their_progress(rng, tmp_path):
    """--plot's files: one progress call per ESD plot, ending at the total."""
    pytest.importorskip("matplotlib")
    from diffract_report.viz import plot_model

    calls = []
    with _session(rng) as s:
        written = plot_model(s, "m", tmp_path, lambda done, total: calls.append((done, total)))
        s.registry.reset_configuration()
    assert calls == [(i, 4) for i in range(1, 5)] and len(written) == 5  # 4 ESDs + depth


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="no chromium on PATH (Debian: apt-get install chromium)")
class TestInTheBrowser:
    HARNESS = """<script>
(function () {
  var t = document.querySelector("table[id^=metrics-]");
  t.tHead.rows[0].cells[2].click();
  var vals = Array.from(t.tBodies[0].rows).map(function (r) {
    return parseFloat(r.cells[2].dataset.v); }).filter(function (v) { return !isNaN(v); });
  document.body.setAttribute("data-test", JSON.stringify({
    errors: window.__errors, sorted: vals.every(function (v, i) {
      return i === 0 || vals[i - 1] <= v; }),
    rows: vals.length, svgs: document.querySelectorAll("svg").length,
    charts: document.querySelectorAll("[data-chart]").length}));
})();
</script>"""
    CATCH = ("<script>window.__errors=[];window.addEventListener('error',function(e){"
             "window.__errors.push(String(e.message))});var __e=console.error;"
             "console.error=function(){window.__errors.push([].join.call(arguments,' '));"
             "__e.apply(console,arguments)};</script>")

    def _chromium(self, *args):
        return subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                               "--hide-scrollbars", *args], capture_output=True, text=True,
                              timeout=120)

    def test_it_renders_without_errors_draws_every_chart_and_sorts(self, report, tmp_path):
        """No console error; every chart drawn as SVG; a click on a header sorts; a
        screenshot has content."""
        text = report.read_text()
        probe = tmp_path / "probe.html"
        probe.write_text(text.replace("<head>", "<head>" + self.CATCH, 1)
                         .replace("</body>", self.HARNESS + "</body>", 1))
        dom = self._chromium("--dump-dom", probe.as_uri()).stdout
        found = re.search(r'data-test="([^"]+)"', dom)
        assert found, dom[-500:]
        result = json.loads(html.unescape(found.group(1)))
        assert result["errors"] == []
        assert result["sorted"] and result["rows"] >= 3
        assert result["svgs"] == result["charts"] > 10
        shot = tmp_path / "shot.png"
        self._chromium("--window-size=1280,2000", f"--screenshot={shot}", report.as_uri())
        from PIL import Image

        pixels = np.asarray(Image.open(shot).convert("L"))
        assert pixels.shape == (2000, 1280) and pixels.std() > 10  # not a blank page
