"""--views on the command line: analyze splits and summarises, compare ranks heads by how
much they moved, the report draws them; a rule that applies to nothing exits 2."""

from __future__ import annotations

import csv
import html
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("diffract_views")
pytest.importorskip("diffract_kernels_alignment")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

CONFIG = {"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}


def _cli(*args, cwd):
    env = {k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"}
    return subprocess.run([sys.executable, "-m", "diffract.cli", *args], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=300)


def _save(root, state):
    root.mkdir()
    safetensors_torch.save_file({k: torch.tensor(v, dtype=torch.float32) for k, v in
                                 state.items()}, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(CONFIG))
    return root


@pytest.fixture
def pair(tmp_path):
    """Two checkpoints of a 2-layer model; in the second, head 2 of layer 1's q_proj is
    rotated (its rows mixed by an orthogonal matrix), nothing else changes."""
    rng = np.random.default_rng(3)
    state = {}
    for layer in range(2):
        a = f"model.layers.{layer}.self_attn."
        state[a + "q_proj.weight"] = rng.standard_t(3, (64, 64))
        state[a + "k_proj.weight"] = rng.standard_t(3, (32, 64))
        state[a + "v_proj.weight"] = rng.standard_t(3, (32, 64))
        state[a + "o_proj.weight"] = rng.standard_t(3, (64, 64))
    tuned = dict(state)
    q = state["model.layers.1.self_attn.q_proj.weight"].copy()
    rotation, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    q[32:48] = rotation @ q[32:48]
    tuned["model.layers.1.self_attn.q_proj.weight"] = q
    return _save(tmp_path / "base", state), _save(tmp_path / "tuned", tuned)


def test_compare_ranks_the_moved_head_first(pair, tmp_path):
    """The rotated head tops the ranking (terminal and heads.csv); the unchanged heads
    have an overlap of 1."""
    base, tuned = pair
    run = _cli("compare", str(base), str(tuned), "--views", "heads", "--out",
               str(tmp_path / "out"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert "heads ranked by change, base -> tuned" in run.stdout
    rows = list(csv.DictReader((tmp_path / "out" / "heads.csv").open()))
    assert len(rows) == 2 * (4 + 2 + 2 + 4)
    assert rows[0]["head"] == "model.layers.1.self_attn.q_proj.weight[head=2]"
    assert float(rows[0]["change (1 - min(l, r))"]) > 0.3
    assert all(float(r["l_subspace_overlap"]) == pytest.approx(1.0, abs=1e-9) for r in rows[1:])
    assert "intruder_dimensions" in rows[0]


def test_compare_with_views_leads_with_the_heads(pair, tmp_path):
    """The head ranking comes first and the per-layer tables stay behind --tables; with
    it they follow the ranking, the matrices only unless --tables all (a bias's row has
    no subspace: its values are NaN)."""
    base, tuned = pair
    extra = {"model.layers.1.self_attn.o_proj.bias": np.ones(64)}
    for root in pair:
        tensors = safetensors_torch.load_file(str(root / "model.safetensors"))
        tensors.update({k: torch.tensor(v, dtype=torch.float32) for k, v in extra.items()})
        safetensors_torch.save_file(tensors, str(root / "model.safetensors"))
    run = _cli("compare", str(base), str(tuned), "--views", "heads", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.lstrip().splitlines()[0].startswith("heads ranked by change")
    assert "(layer x pair)" not in run.stdout
    assert "per-layer tables: --tables matrices" in run.stdout
    run = _cli("compare", str(base), str(tuned), "--views", "heads", "--tables", "matrices",
               cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    assert out.index("heads ranked by change") < out.index("l_subspace_overlap (layer x pair)")
    assert "o_proj.weight" in out and "o_proj.bias" not in out
    run = _cli("compare", str(base), str(tuned), "--tables", "all", cwd=tmp_path)
    assert "model.layers.1.self_attn.o_proj.bias" in run.stdout


def test_analyze_splits_summarises_and_reports_views(pair, tmp_path):
    """The table lists the parameters; a line says what the rule split; a table gives
    the field over each parameter's views; JSON holds every view with its parent; the
    report draws the heads as a heat map and keeps views out of the layer table."""
    base, _ = pair
    run = _cli("analyze", str(base), "--views", "heads", "--metrics", "stable_rank",
               "--report", str(tmp_path / "r.html"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert ("base: heads split 8 of 8 parameters into 24 views "
            "(model.layers.*.self_attn.k_proj.weight") in run.stdout
    assert "base: median [min <view>, max <view>] over each parameter's views" in run.stdout
    dump = _cli("analyze", str(base), "--views", "heads", "--metrics", "stable_rank",
                "--format", "json", cwd=tmp_path)
    records = {r["param"]: r for r in json.loads(dump.stdout)}
    assert len(records) == 8 + 24
    assert records["model.layers.0.self_attn.o_proj.weight[head=3]"]["meta.view_of"] == \
        "model.layers.0.self_attn.o_proj.weight"
    text = (tmp_path / "r.html").read_text()
    charts = [json.loads(html.unescape(m)) for m in
              re.findall(r"<div class=chart data-chart='([^']*)'", text)]
    grid = next(c for c in charts if c["panels"][0].get("title") == "stable_rank per head")
    assert len(grid["panels"][0]["heat"]["rows"]) == 8 and grid["panels"][0]["heat"]["cols"] \
        == [0, 1, 2, 3]
    table = re.search(r'<table[^>]* id="metrics-base">(.*?)</table>', text).group(1)
    assert "[head=" not in table


def test_a_rule_that_applies_to_nothing_exits_2(tmp_path):
    """--views experts on a model without 3-D tensors: the rule and why, exit 2."""
    root = _save(tmp_path / "m", {"a.weight": np.ones((4, 4))})
    run = _cli("analyze", str(root), "--views", "experts", cwd=tmp_path)
    assert run.returncode == 2
    assert "view rule(s) ['experts'] split none of its 1 parameters" in run.stderr
    bad = _cli("analyze", str(root), "--views", "heads", "--view-option", "heads", cwd=tmp_path)
    assert bad.returncode == 2 and "expected KEY=VALUE" in bad.stderr


def test_the_report_tables_experts(tmp_path):
    """An MoE model's report: a parameter x expert table of the first metric."""
    rng = np.random.default_rng(0)
    root = _save(tmp_path / "moe", {"mlp.experts.down_proj": rng.standard_t(3, (3, 40, 30)),
                                    "attn.weight": rng.standard_normal((40, 30))})
    run = _cli("analyze", str(root), "--views", "experts", "--metrics", "stable_rank",
               "--report", str(tmp_path / "r.html"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    text = (tmp_path / "r.html").read_text()
    table = re.search(r'<table[^>]* id="experts-moe-stable_rank">(.*?)</table>', text).group(1)
    assert "<th>0</th><th>1</th><th>2</th>" in table and "mlp.experts.down_proj" in table


@pytest.fixture
def input_rotated(tmp_path):
    """Issue 64 item 1: two query heads of layer 1 whose input side is rotated
    (W_h -> W_h Q, Q orthogonal: what they attend to changes, their own output space
    does not), and one key head perturbed by noise of its own scale."""
    rng = np.random.default_rng(5)
    state = {}
    for layer in range(2):
        a = f"model.layers.{layer}.self_attn."
        state[a + "q_proj.weight"] = rng.standard_t(3, (64, 64))
        state[a + "k_proj.weight"] = rng.standard_t(3, (32, 64))
        state[a + "v_proj.weight"] = rng.standard_t(3, (32, 64))
        state[a + "o_proj.weight"] = rng.standard_t(3, (64, 64))
    tuned = {k: v.copy() for k, v in state.items()}
    q = tuned["model.layers.1.self_attn.q_proj.weight"]
    for head in (0, 3):
        rotation, _ = np.linalg.qr(rng.standard_normal((64, 64)))
        q[16 * head:16 * head + 16] = q[16 * head:16 * head + 16] @ rotation
    k = tuned["model.layers.0.self_attn.k_proj.weight"]
    k[16:32] += rng.standard_normal((16, 64)) * k[16:32].std()
    return _save(tmp_path / "base", state), _save(tmp_path / "tuned", tuned)


def test_a_head_whose_input_side_moved_ranks_first(input_rotated, tmp_path):
    """Ranked by 1 - min(l, r): the two input-rotated query heads first (their output
    overlap stays 1, their input overlap drops), then the noisy key head; both sides are
    in the table, the unchanged heads at change 0."""
    base, tuned = input_rotated
    run = _cli("compare", str(base), str(tuned), "--views", "heads", "--out",
               str(tmp_path / "out"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    rows = list(csv.DictReader((tmp_path / "out" / "heads.csv").open()))
    q = "model.layers.1.self_attn.q_proj.weight"
    assert {r["head"] for r in rows[:2]} == {f"{q}[head=0]", f"{q}[head=3]"}
    assert rows[2]["head"] == "model.layers.0.self_attn.k_proj.weight[head=1]"
    for r in rows[:2]:
        assert float(r["l_subspace_overlap"]) == pytest.approx(1.0, abs=1e-9)
        assert float(r["r_subspace_overlap"]) < 0.6
        change = float(r["change (1 - min(l, r))"])
        assert change == pytest.approx(1 - float(r["r_subspace_overlap"]))
    assert float(rows[2]["change (1 - min(l, r))"]) > 0.2
    assert all(float(r["change (1 - min(l, r))"]) < 1e-9 for r in rows[3:])
    assert "r_subspace_overlap" in run.stdout and "change (1 - min(l, r))" in run.stdout


def test_the_views_table_lists_what_was_asked_and_names_the_extremes(pair, tmp_path):
    """--layers keeps the views of the layers it keeps (no row of `undefined` for the
    others); each cell names the views at its min and max; --view-rows lists every view
    with the values the JSON export holds."""
    base, _ = pair
    args = ("analyze", str(base), "--views", "heads", "--metrics", "stable_rank",
            "--layers", r"layers\.0\.")
    run = _cli(*args, "--view-rows", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    dump = _cli(*args, "--format", "json", cwd=tmp_path)
    records = {r["param"]: r["stable_rank"] for r in json.loads(dump.stdout)}
    views = {n: v for n, v in records.items() if "[" in n}
    assert len(views) == 12 and all(".layers.0." in n for n in views)
    out = run.stdout
    summary = out[out.index("over each parameter's views"):out.index("every view")]
    assert "layers.1" not in summary and "undefined" not in summary
    q = "model.layers.0.self_attn.q_proj.weight"
    heads = {n[len(q) + 1:-1]: v for n, v in views.items() if n.startswith(q)}
    low, high = min(heads, key=heads.get), max(heads, key=heads.get)
    row = next(line for line in summary.splitlines() if line.startswith(q))
    assert re.search(rf"\[[0-9.]+ {low}, [0-9.]+ {high}\]", row), row
    listed = out[out.index("every view"):]
    for name, value in views.items():
        line = next(x for x in listed.splitlines() if x.startswith(name + " "))
        assert float(line.split()[-1]) == pytest.approx(value, rel=1e-3), line


def test_the_compare_report_has_no_empty_per_model_sections(pair, tmp_path):
    """A comparison computes nothing per model: the report holds the comparison's
    sections, not a heading per model over an empty Layers table or 'nothing to show'
    lines (with views, too)."""
    base, tuned = pair
    run = _cli("compare", str(base), str(tuned), "--views", "heads", "--report",
               str(tmp_path / "c.html"), cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    text = (tmp_path / "c.html").read_text()
    assert "<h3>Layers</h3>" not in text and "nothing to show" not in text
    assert "id='model-0'" not in text and re.search(r"<h2[^>]*>l_subspace_overlap</h2>", text)


def test_the_report_draws_the_esd_of_the_heads_at_the_ends(pair, tmp_path):
    """With --views heads, the report draws the ESDs of the model's lowest and highest
    head in the first view metric (pl_alpha_hill), named, and the views tables name the
    head at each parameter's min and max."""
    base, _ = pair
    run = _cli("analyze", str(base), "--views", "heads", "--report", str(tmp_path / "r.html"),
               cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    dump = _cli("analyze", str(base), "--views", "heads", "--format", "json", cwd=tmp_path)
    alphas = {r["param"]: r["pl_alpha_hill"] for r in json.loads(dump.stdout)
              if "[" in r["param"] and r["pl_alpha_hill"] is not None}
    low, high = min(alphas, key=alphas.get), max(alphas, key=alphas.get)
    text = html.unescape((tmp_path / "r.html").read_text())
    assert "ESD of the views at the ends of pl_alpha_hill" in text
    figures = re.findall(r"<figcaption>([^<]*)</figcaption><div class=chart data-chart='([^']*)'",
                         (tmp_path / "r.html").read_text())
    ends = {html.unescape(c).split(":")[0]: json.loads(html.unescape(spec))
            for c, spec in figures if "of the model's views" in html.unescape(c)}
    assert set(ends) == {low, high}
    assert all(spec["panels"][0]["title"] == "log-log ESD" for spec in ends.values())
    table = re.search(r'id="views-base-pl_alpha_hill">(.*?)</table>', text, re.S).group(1)
    assert "min at" in table and "max at" in table and "head=" in table


def test_a_terminal_keeps_the_brackets_of_titles_and_cells():
    """On a terminal (rich), '[min <view>, max <view>]' in a title and '[head=0]' in a
    name are text, not markup that rich would eat."""
    from rich.console import Console

    from diffract_report._output import print_table

    console = Console(width=120, force_terminal=True, color_system=None, record=True)
    print_table("m: median [min <view>, max <view>] over each parameter's views",
                ["parameter", "views", "stable_rank"],
                [["q.weight[head=0]", "4", "2.1 [1.0 head=3, 3.0 head=1]"]], console)
    text = console.export_text()
    assert "median [min <view>, max <view>] over" in text
    assert "q.weight[head=0]" in text and "2.1 [1.0 head=3, 3.0 head=1]" in text


def test_the_views_table_asks_which_fits_were_bounded_once(pair, monkeypatch, capsys):
    """Which pl_alpha fits the library's bound constrained is one export of every
    parameter: the views table asks once, not once per parameter (it asked per parameter:
    an OLMo-2-1B-shaped model's 1024 head views with --layers kept `analyze` busy for
    minutes after the analysis itself had ended)."""
    from diffract.cli import main
    from diffract_report import _output

    calls, real = [], _output.bounded
    monkeypatch.setattr(_output, "bounded", lambda *a: calls.append(a) or real(*a))
    base, _ = pair
    assert main(["analyze", str(base), "--views", "heads", "--metrics", "pl_alpha",
                 "--layers", r"layers\.0\.", "--executor", "sequential", "-q"]) == 0
    assert "over each parameter's views" in capsys.readouterr().out
    assert len(calls) == 2  # the parameters' table and the views table, once each
