"""MoE experts as transformers 5 holds them (issue 32 item 5): one 3-D ``gate_up_proj``
and one ``down_proj`` per layer. ``--views experts`` gives every expert, and its gate and
up projections apart, equal to numpy slices of the packed tensors and to what the
library's own forward multiplies by. Models are built from a config (no download)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("diffract_views")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from safetensors.torch import save_file  # noqa: E402

from diffract import Session  # noqa: E402

E, H, FFN = 3, 32, 24  # experts, hidden size, expert intermediate size


def _qwen3_moe():
    config = transformers.Qwen3MoeConfig(
        vocab_size=64, hidden_size=H, intermediate_size=48, moe_intermediate_size=FFN,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
        num_experts=E, num_experts_per_tok=2)
    torch.manual_seed(0)
    return transformers.Qwen3MoeForCausalLM(config).eval()


def _gpt_oss():
    config = transformers.GptOssConfig(
        vocab_size=64, hidden_size=H, intermediate_size=FFN, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_local_experts=E,
        num_experts_per_tok=2, layer_types=["full_attention"])
    torch.manual_seed(0)
    model = transformers.GptOssForCausalLM(config).eval()
    with torch.no_grad():  # some experts' weights start at zero: give them values
        for p in model.parameters():
            p.normal_()
    return model


def _packed_checkpoint(model, folder):
    """The state dict as training loops save it (accelerate's save_state, a plain
    safetensors save: packed), with its config.json. save_pretrained would write the
    per-expert layout back (transformers 5 converts it on save)."""
    folder.mkdir()
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()
             if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"))
    model.config.to_json_file(str(folder / "config.json"))
    return folder, {k: v.float().numpy() for k, v in state.items()}


def _views(session, model_id="m"):
    return {p.name: np.asarray(session.store.load_weights(model_id, p.name))
            for p in session.models.params(model_id) if p.parent is not None}


def test_the_layout_is_the_librarys(tmp_path):
    """What the library's forward multiplies by: chunk(2) of linear(x, gate_up[e])
    (Qwen3-MoE, Mixtral); x @ gate_up[e] with gate at ::2 (GPT-OSS). Our views give the
    same products."""
    qwen = _qwen3_moe().model.layers[0].mlp.experts
    assert tuple(qwen.gate_up_proj.shape) == (E, 2 * FFN, H)
    assert tuple(qwen.down_proj.shape) == (E, H, FFN)
    oss = _gpt_oss().model.layers[0].mlp.experts
    assert tuple(oss.gate_up_proj.shape) == (E, H, 2 * FFN)
    assert tuple(oss.down_proj.shape) == (E, FFN, H)
    x = torch.randn(5, H, dtype=torch.float64)
    for model, name in ((_qwen3_moe(), "qwen"), (_gpt_oss(), "oss")):
        folder, _ = _packed_checkpoint(model, tmp_path / name)
        experts = model.model.layers[0].mlp.experts
        with Session() as s:
            s.models.add(folder, "m", views=["experts"])
            views = _views(s)
        prefix = "model.layers.0.mlp.experts."
        for e in range(E):
            packed = experts.gate_up_proj[e].detach().double()
            if name == "qwen":
                gate, up = torch.nn.functional.linear(x, packed).chunk(2, dim=-1)
                down = torch.nn.functional.linear(gate, experts.down_proj[e].detach().double())
            else:
                both = x @ packed
                gate, up = both[..., ::2], both[..., 1::2]
                down = gate @ experts.down_proj[e].detach().double()
            for part, want in (("gate", gate), ("up", up)):
                w = views[f"{prefix}gate_up_proj[expert={e},part={part}]"]
                assert w.shape == (FFN, H)  # [out, in], as every matrix is reported
                np.testing.assert_allclose(x.numpy() @ w.T.astype(np.float64), want.numpy(),
                                           rtol=1e-12, atol=1e-12)
            w = views[f"{prefix}down_proj[expert={e}]"]
            assert w.shape == (H, FFN)
            np.testing.assert_allclose(gate.numpy() @ w.T.astype(np.float64), down.numpy(),
                                       rtol=1e-12, atol=1e-12)


def test_views_equal_numpy_slices_of_the_packed_tensors(tmp_path):
    folder, state = _packed_checkpoint(_qwen3_moe(), tmp_path / "ckpt")
    with Session() as s:
        s.models.add(folder, "m", views=["experts"])
        views = _views(s)
    assert len(views) == 2 * (2 * E + E)  # two layers: gate, up and down per expert
    for layer in range(2):
        a = f"model.layers.{layer}.mlp.experts."
        gate_up, down = state[a + "gate_up_proj"], state[a + "down_proj"]
        for e in range(E):
            np.testing.assert_array_equal(views[f"{a}gate_up_proj[expert={e},part=gate]"],
                                          gate_up[e, :FFN, :])
            np.testing.assert_array_equal(views[f"{a}gate_up_proj[expert={e},part=up]"],
                                          gate_up[e, FFN:, :])
            np.testing.assert_array_equal(views[f"{a}down_proj[expert={e}]"], down[e])


def test_an_in_memory_module_splits_the_same(tmp_path):
    """A model handed over in Python (as inside a training loop) has the same views."""
    model = _qwen3_moe()
    folder, _ = _packed_checkpoint(model, tmp_path / "ckpt")
    with Session() as s:
        s.models.add(folder, "file", views=["experts"])
        s.models.add(model, "module", views=["experts"])
        from_file, from_module = _views(s, "file"), _views(s, "module")
    assert sorted(from_module) == sorted(from_file)
    for name, w in from_file.items():
        np.testing.assert_array_equal(from_module[name], w)


def test_the_command_line_tables_each_expert(tmp_path):
    """analyze --views experts: every expert's gate, up and down in the CSV with the
    view metrics, and a parameter x expert table in the report."""
    folder, _ = _packed_checkpoint(_qwen3_moe(), tmp_path / "ckpt")
    env = {k: v for k, v in os.environ.items() if k != "DIFFRACT_STRICT_PLUGINS"}
    run = subprocess.run([sys.executable, "-m", "diffract.cli", "analyze", str(folder),
                          "--views", "experts", "--out", str(tmp_path / "out"),
                          "--report", str(tmp_path / "r.html")], cwd=tmp_path,
                         capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "experts split 4 of" in run.stdout
    rows = {r["param"]: r for r in csv.DictReader((tmp_path / "out" / "metrics.csv").open())}
    parts = [n for n in rows if "[expert=" in n]
    assert len(parts) == 2 * 3 * E
    assert all(np.isfinite(float(rows[n]["stable_rank"])) for n in parts)
    text = (tmp_path / "r.html").read_text()
    table = re.search(r'<table[^>]* id="experts-ckpt-pl_alpha_hill">(.*?)</table>', text,
                      re.S).group(1)
    assert "model.layers.0.mlp.experts.down_proj" in table
    assert "model.layers.1.mlp.experts.gate_up_proj[part=up]" in table and "<th>2</th>" in table


@pytest.mark.parametrize("options, message", [
    ({"gate_up": "thirds"}, "gate_up must be 'halves' or 'interleaved'"),
    ({"expert_layout": "rows"}, "expert_layout must be 'out_in' or 'in_out'")])
def test_bad_options_are_refused_before_anything_is_added(tmp_path, options, message):
    from diffract.errors import InvalidArgumentError

    folder, _ = _packed_checkpoint(_qwen3_moe(), tmp_path / "ckpt")
    with Session() as s:
        with pytest.raises(InvalidArgumentError, match=message):
            s.models.add(folder, "m", views={"experts": options})
        assert s.models.model_ids == []


def test_an_expert_count_other_than_the_configs_is_refused(tmp_path):
    """config.json says 4 experts, the tensors hold 3: refused naming both, nothing added
    (the count is read from the configuration, not only from view options)."""
    from diffract.errors import ModelSourceError

    folder, _ = _packed_checkpoint(_qwen3_moe(), tmp_path / "ckpt")
    config = json.loads((folder / "config.json").read_text())
    config["num_local_experts"] = E + 1  # what Qwen3MoeConfig writes for num_experts
    (folder / "config.json").write_text(json.dumps(config))
    with Session() as s:
        with pytest.raises(ModelSourceError, match=f"its first dimension is {E}, not the "
                                                   f"{E + 1} experts the configuration"):
            s.models.add(folder, "m", views=["experts"])
        assert s.models.model_ids == []
