"""`diffract analyze --views heads` with no other option says something about every head
(issue 32 item 2): the views get metrics defined on a head's few dozen eigenvalues, on
MiniLM's 32-row, GPT-2's 64-row (fused c_attn) and Llama's 128-row GQA heads; the table
says why a value is undefined; the report's heat maps hold the stored numbers with a
scale on their colour bar, or say in words why there is nothing to draw."""

from __future__ import annotations

import csv
import html
import json
import math
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("diffract_views")
pytest.importorskip("diffract_kernels_spectral")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

from diffract_report._inputs import VIEW_METRICS  # noqa: E402


def _cli(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"}
    return subprocess.run([sys.executable, "-m", "diffract.cli", *args], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=300)


def _minilm(rng):
    """BERT names and MiniLM's geometry: 12 heads of 32 rows, hidden 384."""
    out = {}
    for part in ("self.query", "self.key", "self.value", "output.dense"):
        out[f"encoder.layer.0.attention.{part}.weight"] = rng.standard_t(4, (384, 384))
    return out, {"num_attention_heads": 12, "hidden_size": 384}, 12 * 4


def _gpt2(rng):
    """GPT-2's Conv1D layout: c_attn [in, 3 x out] fused, c_proj [in, out]; 12 x 64."""
    return ({"h.0.attn.c_attn.weight": rng.standard_t(4, (768, 2304)),
             "h.0.attn.c_proj.weight": rng.standard_t(4, (768, 768))},
            {"n_head": 12, "n_embd": 768}, 12 * 4)


def _llama(rng):
    """Grouped-query attention with 128-row heads: 4 query heads, 2 key-value heads."""
    a = "model.layers.0.self_attn."
    return ({a + "q_proj.weight": rng.standard_t(4, (512, 512)),
             a + "k_proj.weight": rng.standard_t(4, (256, 512)),
             a + "v_proj.weight": rng.standard_t(4, (256, 512)),
             a + "o_proj.weight": rng.standard_t(4, (512, 512))},
            {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 512,
             "head_dim": 128}, 4 + 2 + 2 + 4)


def _write(folder, state, config):
    folder.mkdir()
    safetensors_torch.save_file({k: torch.tensor(v, dtype=torch.float32)
                                 for k, v in state.items()}, str(folder / "model.safetensors"))
    (folder / "config.json").write_text(json.dumps(config))
    return folder / "model.safetensors"


@pytest.mark.parametrize("build", [_minilm, _gpt2, _llama], ids=["32-row", "64-row", "128-row"])
def test_every_head_has_every_default_view_metric(tmp_path, build):
    """A single file with its config.json beside it, `--views heads` and nothing else:
    each head view holds a finite value in every view metric (the CSV), the parameters
    keep the default table, and the views table shows no undefined cell."""
    state, config, heads = build(np.random.default_rng(0))
    path = _write(tmp_path / "ckpt", state, config)
    run = _cli("analyze", str(path), "--views", "heads", "--out", str(tmp_path / "out"),
               cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    rows = list(csv.DictReader((tmp_path / "out" / "metrics.csv").open()))
    views = [r for r in rows if "[" in r["param"]]
    assert len(views) == heads
    for field in VIEW_METRICS:
        bad = [r["param"] for r in views if not math.isfinite(float(r[field] or "nan"))]
        assert bad == [], (field, bad)
    assert all(r["pl_alpha"] == "" for r in views)  # the parents' fit is not asked of heads
    parents = [r for r in rows if "[" not in r["param"]]
    assert all(math.isfinite(float(r["stable_rank"])) for r in parents)
    table = run.stdout.split("median [min <view>, max <view>] over each parameter's views", 1)[1]
    assert "undefined" not in table.split("\n\n", 1)[0]
    assert all(f in table for f in VIEW_METRICS)


def test_a_metric_undefined_on_heads_says_why_grouped(tmp_path):
    """Asked for pl_alpha on 32-row heads: every head is undefined, and the table says
    why once, with a count, not once per head and not with each head's name."""
    state, config, heads = _minilm(np.random.default_rng(1))
    path = _write(tmp_path / "ckpt", state, config)
    run = _cli("analyze", str(path), "--views", "heads", "--metrics", "pl_alpha,stable_rank",
               cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"ckpt: pl_alpha undefined on {heads} view(s):" in run.stdout
    reason = re.search(r"pl_alpha undefined on \d+ view\(s\):\n  (\d+) x (.*)", run.stdout)
    assert reason and int(reason.group(1)) == heads, run.stdout
    assert "fewer than min_tail=50" in reason.group(2) and "[head=" not in reason.group(2)
    assert "stable_rank undefined" not in run.stdout


def _charts(text):
    return [json.loads(html.unescape(m)) for m in
            re.findall(r"<div class=chart data-chart='([^']*)'", text)]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    """A report of MiniLM-shaped heads with the view defaults, and the values stored."""
    tmp = tmp_path_factory.mktemp("heads-report")
    state, config, _ = _minilm(np.random.default_rng(2))
    path = _write(tmp / "ckpt", state, config)
    run = _cli("analyze", str(path), "--views", "heads", "--report", str(tmp / "r.html"),
               "--out", str(tmp / "out"), cwd=tmp)
    assert run.returncode == 0, run.stderr
    rows = {r["param"]: r for r in csv.DictReader((tmp / "out" / "metrics.csv").open())}
    return tmp / "r.html", rows


def test_the_heat_maps_hold_the_stored_numbers(report):
    """One heat map per view metric; each cell is the value the CSV holds for that head."""
    path, rows = report
    charts = {c["panels"][0]["title"]: c["panels"][0]["heat"] for c in _charts(path.read_text())
              if c["panels"][0].get("heat")}
    assert sorted(charts) == sorted(f"{f} per head" for f in VIEW_METRICS)
    for field in VIEW_METRICS:
        heat = charts[f"{field} per head"]
        assert len(heat["rows"]) == 4 and heat["cols"] == list(range(12))
        for parent, values in zip(heat["rows"], heat["z"], strict=True):
            want = [float(rows[f"{parent}[head={h}]"][field]) for h in heat["cols"]]
            np.testing.assert_allclose(values, want, rtol=5e-5)  # 5 significant digits


def test_a_heat_map_with_nothing_to_draw_says_why(tmp_path):
    """pl_alpha on 32-row heads: no blank grey box, a sentence with the reason."""
    state, config, heads = _minilm(np.random.default_rng(3))
    path = _write(tmp_path / "ckpt", state, config)
    run = _cli("analyze", str(path), "--views", "heads", "--metrics", "pl_alpha",
               "--report", str(tmp_path / "r.html"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    text = (tmp_path / "r.html").read_text()
    assert not any(c["panels"][0].get("title") == "pl_alpha per head" for c in _charts(text))
    said = re.search(r"<p class=nothing><b>pl_alpha per head</b>: nothing to show, no head "
                     r"has a value: (\d+) &times; ([^<]*)</p>", text)
    assert said and int(said.group(1)) == heads and "fewer than min_tail=50" in said.group(2)


@pytest.mark.skipif(shutil.which("chromium") is None,
                    reason="no chromium on PATH (Debian: apt-get install chromium)")
def test_the_rendered_heat_map_has_a_scale_and_the_values(report, tmp_path):
    """In Chromium: every heat map's colour bar carries five labels from its minimum to
    its maximum, and each cell's tooltip the head's value."""
    path, rows = report
    probe = tmp_path / "probe.html"
    probe.write_text(path.read_text().replace("</body>", """<script>
document.body.setAttribute("data-test", JSON.stringify(Array.from(
  document.querySelectorAll("svg")).filter(function (s) {
    return s.querySelector("text.cbar"); }).map(function (s) {
    return {ticks: Array.from(s.querySelectorAll("text.cbar")).map(function (t) {
              return t.textContent; }),
            cells: Array.from(s.querySelectorAll("rect > title")).map(function (t) {
              return t.textContent; })}; })));
</script></body>""", 1))
    dom = subprocess.run(["chromium", "--headless=new", "--no-sandbox", "--disable-gpu",
                          "--dump-dom", probe.as_uri()], capture_output=True, text=True,
                         timeout=120).stdout
    found = re.search(r'data-test="([^"]+)"', dom)
    assert found, dom[-500:]
    maps = json.loads(html.unescape(found.group(1)))
    assert len(maps) == len(VIEW_METRICS)  # in the order of VIEW_METRICS
    for field, drawn in zip(VIEW_METRICS, maps, strict=True):
        assert len(drawn["cells"]) == 4 * 12 and len(drawn["ticks"]) == 5
        shown = {}
        for cell in drawn["cells"]:
            parent, head, value = re.fullmatch(r"(.*) \[head=(\d+)\]: (.*)", cell).groups()
            shown[f"{parent}[head={head}]"] = float(value)
        stored = {name: float(rows[name][field]) for name in shown}
        for name, value in shown.items():  # three significant digits on the page
            assert value == pytest.approx(stored[name], rel=5e-3), (field, name)
        ticks = [float(t) for t in drawn["ticks"]]
        assert ticks[0] == pytest.approx(min(stored.values()), rel=5e-3)
        assert ticks[-1] == pytest.approx(max(stored.values()), rel=5e-3)
        assert ticks == sorted(ticks)


def test_the_two_passes_read_each_tensor_once(tmp_path, monkeypatch, capsys):
    """The views' metrics (on parents and views) then the parents' defaults: the second
    pass works from the stored spectra, so each tensor's bytes are read once in all."""
    from diffract.cli import main
    from diffract_formats._safetensors import SafetensorsFile

    state, config, _ = _llama(np.random.default_rng(4))
    path = _write(tmp_path / "ckpt", state, config)
    (tmp_path / "one-reader.toml").write_text("[parallel.thread_pool]\nmax_workers = 1\n")
    monkeypatch.setenv("DIFFRACT_CONFIG", str(tmp_path / "one-reader.toml"))
    calls = []
    rows = SafetensorsFile.rows
    monkeypatch.setattr(SafetensorsFile, "rows", lambda self, name, a, b, **kw:
                        calls.append(name) or rows(self, name, a, b, **kw))
    assert main(["analyze", str(path), "--views", "heads"]) == 0, capsys.readouterr().err
    assert sorted(calls) == sorted(state), calls
