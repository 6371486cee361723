"""A stack of experts is not a matrix (issue 64 item 6): transformers 5 packs a MoE
layer's experts into one 3-D tensor ([E, 2I, H], [E, H, I]). The command line analyses it
per expert by default, its row giving the median over its experts; a stack is never
reshaped into one E x (out * in) matrix (without views its spectral values are
undefined, saying why); a plain model gets no views; a real convolution keeps its own
convention."""

from __future__ import annotations

import json
import math
import warnings

import numpy as np
import pytest

pytest.importorskip("diffract_views")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from diffract import Session  # noqa: E402
from diffract.cli import main  # noqa: E402

UP = "model.layers.0.mlp.experts.gate_up_proj"
DOWN = "model.layers.0.mlp.experts.down_proj"


@pytest.fixture(scope="module")
def mixtral(tmp_path_factory):
    """A tiny Mixtral (8 experts) as transformers 5 holds it, saved as training loops save
    its state dict (a plain safetensors save: packed [8, 256, 64] and [8, 64, 128]; its
    save_pretrained writes the per-expert layout back), with its config.json."""
    from safetensors.torch import save_file

    cfg = transformers.MixtralConfig(
        vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
        num_attention_heads=4, num_key_value_heads=2, num_local_experts=8,
        num_experts_per_tok=2, max_position_embeddings=32)
    torch.manual_seed(0)
    model = transformers.MixtralForCausalLM(cfg)
    folder = tmp_path_factory.mktemp("mixtral") / "m"
    folder.mkdir()
    save_file({k: v.detach().contiguous() for k, v in model.state_dict().items()
               if k != "lm_head.weight"}, str(folder / "model.safetensors"))
    cfg.to_json_file(str(folder / "config.json"))
    return folder


def _expert_values(folder, field):
    """``field`` of each expert matrix, computed alone as a plain matrix: down_proj's
    experts, and gate_up_proj's gate and up halves (the views transformers' forward
    multiplies by), keyed by the view's name."""
    from safetensors.torch import load_file

    state = load_file(str(folder / "model.safetensors"))
    mats = {}
    for e in range(8):
        mats[f"{DOWN}[expert={e}]"] = state[DOWN][e].float().numpy()
        mats[f"{UP}[expert={e},part=gate]"] = state[UP][e][:128].float().numpy()
        mats[f"{UP}[expert={e},part=up]"] = state[UP][e][128:].float().numpy()
    with Session() as s:
        s.models.add({k.replace("[", "(").replace("]", ")"): v for k, v in mats.items()},
                     "ref")
        s.compute.apply(field)
        rows = s.results.export_metrics(field)["ref"]
    return {k: rows[k.replace("[", "(").replace("]", ")")][field] for k in mats}


def test_analyze_splits_stacks_by_default_and_shows_their_median(mixtral, capsys):
    want = _expert_values(mixtral, "stable_rank")
    assert main(["analyze", str(mixtral), "--metrics", "stable_rank", "--format", "json",
                 "--executor", "sequential"]) == 0
    rows = {r["param"]: r for r in json.loads(capsys.readouterr().out)}
    for view, value in want.items():
        assert rows[view]["stable_rank"] == pytest.approx(value, rel=1e-9), view
    for name in (UP, DOWN):
        assert rows.get(name, {}).get("stable_rank") is None or math.isnan(
            rows[name]["stable_rank"])
    assert main(["analyze", str(mixtral), "--metrics", "stable_rank", "--executor",
                 "sequential"]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(DOWN + " "))
    value = line.split()[-1]
    down = [v for k, v in want.items() if k.startswith(DOWN)]
    assert value.endswith("~") and float(value[:-1]) == pytest.approx(
        float(np.median(down)), rel=1e-3)
    assert "~ the median over the tensor's experts" in out
    assert "median [min <view>, max <view>] over each parameter's views" in out


def test_without_views_a_stack_is_undefined_never_reshaped(mixtral):
    """The Python API adds no views unless asked: the stack's spectral fields are
    undefined with the reason (it printed stable_rank 7.68 of W.reshape(E, -1) before);
    its experts, asked for, are the plain matrices' values."""
    with Session() as s, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        s.models.add(mixtral, "m")
        s.compute.apply("stable_rank", errors="record")
        rows = s.results.export_metrics("stable_rank")["m"]
        notes = {n["unit"]: n["reason"] for n in s.results.export_notes()}
    assert UP not in rows or rows[UP]["stable_rank"] is None or math.isnan(
        rows[UP]["stable_rank"])
    assert "a stack of matrices (packed experts [E, out, in]) has no spectrum" in \
        notes[f"m/{UP}"]
    assert rows["model.layers.0.self_attn.q_proj.weight"]["stable_rank"] > 1


def test_a_model_without_experts_gets_no_views_and_a_conv_keeps_its_own(tmp_path, capsys):
    """No stack: nothing split by default. A Conv2d weight [out, in, kh, kw] is typed
    conv and keeps its convention (one matrix [out, in * kh * kw])."""
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3), torch.nn.Flatten(),
                              torch.nn.Linear(16, 4))
    from safetensors.torch import save_file

    save_file({k: v.contiguous() for k, v in net.state_dict().items()},
              str(tmp_path / "c.safetensors"))
    assert main(["analyze", str(tmp_path / "c.safetensors"), "--metrics", "stable_rank",
                 "--format", "json", "--executor", "sequential"]) == 0
    rows = {r["param"]: r for r in json.loads(capsys.readouterr().out)}
    assert sorted(rows) == ["0.weight", "2.weight"]
    w = net[0].weight.detach().double().numpy().reshape(16, -1)
    s = np.linalg.svd(w, compute_uv=False)
    assert rows["0.weight"]["stable_rank"] == pytest.approx((s ** 2).sum() / s[0] ** 2,
                                                            rel=1e-6)


def test_a_gguf_stack_of_experts_is_split_too(tmp_path, capsys):
    """llama.cpp's packed ffn_*_exps [E, out, in]: per expert by default, equal to the
    plain matrices."""
    gguf = pytest.importorskip("gguf")
    rng = np.random.default_rng(0)
    exps = rng.standard_normal((4, 48, 32)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "m.gguf"), "llama")
    writer.add_tensor("blk.0.ffn_up_exps.weight", exps)
    writer.add_tensor("blk.0.attn_q.weight", rng.standard_normal((32, 32)).astype(np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert main(["analyze", str(tmp_path / "m.gguf"), "--metrics", "stable_rank", "--format",
                 "json", "--executor", "sequential"]) == 0
    rows = {r["param"]: r["stable_rank"] for r in json.loads(capsys.readouterr().out)}
    for e in range(4):
        s = np.linalg.svd(exps[e].astype(np.float64), compute_uv=False)
        assert rows[f"blk.0.ffn_up_exps.weight[expert={e}]"] == pytest.approx(
            (s ** 2).sum() / s[0] ** 2, rel=1e-6)
