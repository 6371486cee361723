"""Heads across a training run (issue 32 item 4): a tiny Llama trained in the test, one
head rotated at one step; `diffract track --views heads` ranks that head at that step
first in the terminal, in head_moves.csv and in the report, whose heads x steps heat maps
hold the stored changes."""

from __future__ import annotations

import csv
import html
import json
import re

import numpy as np
import pytest

pytest.importorskip("diffract_views")
pytest.importorskip("diffract_kernels_alignment")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from diffract.cli import main  # noqa: E402

MOVED = "model.layers.1.self_attn.q_proj.weight[head=2]"
EVENT = 30


def _train(root, steps=(10, 20, 30, 40, 50)):
    """SGD on random tokens, a checkpoint every 10 steps; just before the one at EVENT,
    head 2 of layer 1's q projection is rotated (its 16 rows mixed by an orthogonal
    matrix): the same spectrum, another subspace."""
    config = transformers.LlamaConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    optimiser = torch.optim.SGD(model.parameters(), lr=1e-2)
    tokens = torch.randint(0, 64, (8, 16))
    step = 0
    for checkpoint in steps:
        while step < checkpoint:
            loss = model(input_ids=tokens, labels=tokens).loss
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            step += 1
        if checkpoint == EVENT:
            with torch.no_grad():
                q = model.model.layers[1].self_attn.q_proj.weight
                rotation, _ = torch.linalg.qr(torch.randn(16, 16))
                q[32:48] = rotation @ q[32:48]
        model.save_pretrained(root / f"checkpoint-{checkpoint}")


def test_the_rotated_head_ranks_first_everywhere(tmp_path, capsys):
    _train(tmp_path / "run")
    report, out = tmp_path / "run.html", tmp_path / "out"
    assert main(["track", str(tmp_path / "run"), "--store", str(tmp_path / "store"),
                 "--views", "heads", "--executor", "sequential", "--out", str(out),
                 "--report", str(report)]) == 0
    said = capsys.readouterr().out.splitlines()
    start = said.index("heads that moved most (1 - the smaller of the output and input "
                       "subspace overlaps with the previous checkpoint):")
    first = said[start + 1].split()
    assert first[:5] == ["step", "20", "->", "30", MOVED], said[start:start + 3]
    runner_up = float(said[start + 2].split()[-1])
    assert float(first[-1]) > 0.2 > runner_up  # well apart from training's own movement

    rows = list(csv.DictReader((out / "head_moves.csv").open()))
    assert (rows[0]["step"], rows[0]["head"]) == ("30", MOVED)
    assert len(rows) == 4 * 24  # four intervals, 2 layers x (4 + 2 + 2 + 4) heads
    change = {(r["step"], r["head"]): float(r["change"]) for r in rows}
    from diffract import Session

    with Session(profile="local", path=str(tmp_path / "store")) as s:  # both sides read
        sides = {}
        for r in s.results.export_aggregates("l_subspace_overlap", "r_subspace_overlap",
                                             export_format="list"):
            sides.setdefault((r["models"], r["param"]), {})[r["field"]] = r["value"]
        for r in rows:
            pair = sides[(f"checkpoint-{r['from_step']},checkpoint-{r['step']}", r["head"])]
            assert float(r["change"]) == pytest.approx(1 - min(pair.values()), abs=1e-12)
            assert len(pair) == 2, r

    text = report.read_text()
    table = text[text.index('id="head-moves"'):]
    first_row = table[table.index("<tbody><tr"):table.index("</tr>", table.index("<tbody"))]
    assert ">30<" in first_row and html.escape(MOVED) in first_row
    charts = [json.loads(html.unescape(c))
              for c in re.findall(r"<div class=chart data-chart='([^']*)'", text)]
    heat = next(p["heat"] for c in charts for p in c["panels"] if p.get("title") ==
                "model.layers.1.self_attn.q_proj.weight: change (1 - min(l, r) subspace "
                "overlap) since the previous checkpoint")
    assert heat["cols"] == ["20", "30", "40", "50"] and heat["rows"] == [
        f"head={h}" for h in range(4)]
    for h, values in enumerate(heat["z"]):
        want = [change[(s, f"model.layers.1.self_attn.q_proj.weight[head={h}]")]
                for s in heat["cols"]]
        np.testing.assert_allclose(values, want, rtol=5e-5)  # 5 significant digits
    assert np.nanargmax(np.asarray(heat["z"], dtype=float)) == 2 * 4 + 1  # head 2, step 30
    assert any(p.get("title") == "model.layers.1.self_attn.q_proj.weight: pl_alpha_hill per "
               "head and step" for c in charts for p in c["panels"])
