"""The heads, qkv, experts and conv view rules: views equal numpy's slices, fields on a
view equal the field on the slice, bad geometry is refused with the fix."""

from __future__ import annotations

import json

import numpy as np
import pytest

from diffract import Session
from diffract.errors import InvalidArgumentError, ModelSourceError

pytest.importorskip("diffract_views")
torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

LLAMA = {"num_attention_heads": 8, "num_key_value_heads": 2, "hidden_size": 32}
ATTN = "model.layers.0.self_attn."


def _llama(rng, dim=4):
    """One Llama-style layer with grouped-query attention: 8 heads of 4, 2 kv heads."""
    return {f"{ATTN}q_proj.weight": rng.standard_normal((8 * dim, 32)),
            f"{ATTN}k_proj.weight": rng.standard_normal((2 * dim, 32)),
            f"{ATTN}v_proj.weight": rng.standard_normal((2 * dim, 32)),
            f"{ATTN}o_proj.weight": rng.standard_normal((32, 8 * dim)),
            "model.layers.0.mlp.down_proj.weight": rng.standard_normal((32, 64))}


def _checkpoint(tmp_path, state, config):
    root = tmp_path / "ckpt"
    root.mkdir()
    safetensors_torch.save_file({k: torch.as_tensor(v, dtype=torch.float32).contiguous()
                                 for k, v in state.items()}, str(root / "model.safetensors"))
    (root / "config.json").write_text(json.dumps(config) if isinstance(config, dict)
                                      else config)
    return root


def _views(session, model_id="m"):
    """view name -> numpy weights, for every view of the model."""
    return {p.name: session.store.load_weights(model_id, p.name)
            for p in session.models.params(model_id) if p.parent is not None}


class TestHeads:
    def test_grouped_query_attention_from_config_json(self, rng, tmp_path):
        """q by 8 heads, k and v by their 2, o by input columns; each view is exactly the
        numpy slice, read from the file."""
        state = _llama(rng)
        root = _checkpoint(tmp_path, state, LLAMA)
        with Session() as s:
            s.models.add(root, "m", views=["heads"])
            views = _views(s)
        assert len(views) == 8 + 2 + 2 + 8  # down_proj is no attention weight
        f32 = {k: v.astype(np.float32) for k, v in state.items()}
        for h in range(8):
            np.testing.assert_array_equal(views[f"{ATTN}q_proj.weight[head={h}]"],
                                          f32[f"{ATTN}q_proj.weight"][4 * h:4 * h + 4])
            np.testing.assert_array_equal(views[f"{ATTN}o_proj.weight[head={h}]"],
                                          f32[f"{ATTN}o_proj.weight"][:, 4 * h:4 * h + 4])
        for g in range(2):
            np.testing.assert_array_equal(views[f"{ATTN}k_proj.weight[head={g}]"],
                                          f32[f"{ATTN}k_proj.weight"][4 * g:4 * g + 4])

    def test_gpt2s_transposed_conv1d_and_bert_names(self, rng):
        """GPT-2 stores c_attn [in, 3 out] and c_proj [in, out]: each head's view is the
        slice turned to [out, in]; BERT's query/key/value/attention.output.dense too."""
        c_attn, c_proj = rng.standard_normal((16, 48)), rng.standard_normal((16, 16))
        bert_q, bert_o = rng.standard_normal((16, 16)), rng.standard_normal((16, 16))
        state = {"h.0.attn.c_attn.weight": c_attn, "h.0.attn.c_proj.weight": c_proj,
                 "h.0.mlp.c_proj.weight": rng.standard_normal((64, 16)),
                 "encoder.layer.0.attention.self.query.weight": bert_q,
                 "encoder.layer.0.attention.output.dense.weight": bert_o}
        with Session() as s:
            s.models.add(state, "m", views=["heads"], view_options={"heads": 4})
            views = _views(s)
        assert not any(name.startswith("h.0.mlp.") for name in views)  # not attention
        for part, offset in (("q", 0), ("k", 16), ("v", 32)):
            for h in range(4):
                np.testing.assert_array_equal(
                    views[f"h.0.attn.c_attn.weight[part={part},head={h}]"],
                    c_attn[:, offset + 4 * h:offset + 4 * h + 4].T)
        for h in range(4):
            np.testing.assert_array_equal(views[f"h.0.attn.c_proj.weight[head={h}]"],
                                          c_proj[4 * h:4 * h + 4].T)
            np.testing.assert_array_equal(
                views[f"encoder.layer.0.attention.self.query.weight[head={h}]"],
                bert_q[4 * h:4 * h + 4])
            np.testing.assert_array_equal(
                views[f"encoder.layer.0.attention.output.dense.weight[head={h}]"],
                bert_o[:, 4 * h:4 * h + 4])

    @pytest.mark.parametrize("name, layout", [("qkv_proj", "blocks"),
                                              ("query_key_value", "grouped")])
    def test_fused_qkv_with_grouped_query_attention(self, rng, name, layout):
        """Phi-3's q|k|v blocks and GPT-NeoX/Falcon's per-group layout, 4 heads in 2
        groups of head size 3."""
        w = rng.standard_normal(((4 + 2 * 2) * 3, 10))
        with Session() as s:
            s.models.add({f"a.{name}.weight": w}, "m", views=["heads"],
                         view_options={"heads": 4, "kv_heads": 2, "head_dim": 3})
            views = _views(s)
        if layout == "blocks":
            rows = {"q": [0, 3, 6, 9], "k": [12, 15], "v": [18, 21]}
        else:  # per group: q, q, k, v
            rows = {"q": [0, 3, 12, 15], "k": [6, 18], "v": [9, 21]}
        for part, starts in rows.items():
            for h, start in enumerate(starts):
                np.testing.assert_array_equal(views[f"a.{name}.weight[part={part},head={h}]"],
                                              w[start:start + 3])

    def test_a_fields_value_on_a_view_is_its_value_on_the_slice(self, rng):
        """frob_norm, stable_rank and pl_alpha of a head equal those of its numpy slice
        added as a plain matrix."""
        q = rng.standard_t(3, size=(4 * 96, 200))
        with Session() as s:
            s.models.add({"q_proj.weight": q}, "m", views=["heads"],
                         view_options={"heads": 4})
            s.models.add({f"h{h}": q[96 * h:96 * h + 96] for h in range(4)}, "ref")
            fields = ("frob_norm", "stable_rank", "pl_alpha")
            s.compute.apply(*fields, errors="record")
            got = s.results.export_metrics(*fields)
        for h in range(4):
            assert got["m"][f"q_proj.weight[head={h}]"] == got["ref"][f"h{h}"]

    def test_a_view_reads_only_its_rows_of_the_file(self, rng, tmp_path, monkeypatch):
        """Reading head 5 of q_proj reads rows 20-24 of that tensor, nothing else."""
        from diffract_formats._safetensors import SafetensorsFile

        root = _checkpoint(tmp_path, _llama(rng), LLAMA)
        calls = []
        rows = SafetensorsFile.rows
        monkeypatch.setattr(SafetensorsFile, "rows", lambda self, name, a, b, **kw:
                            calls.append((name, a, b)) or rows(self, name, a, b, **kw))
        with Session() as s:
            s.models.add(root, "m", views=["heads"])
            calls.clear()
            s.store.load_weights("m", f"{ATTN}q_proj.weight[head=5]")
        assert calls == [(f"{ATTN}q_proj.weight", 20, 24)]


class TestOtherRules:
    def test_qkv_parts_and_gate_up(self, rng):
        """The qkv rule: q, k, v of a fused matrix (thirds without geometry; GQA sizes
        with it) and gate/up halves."""
        fused, gqa, gate_up = (rng.standard_normal((36, 8)), rng.standard_normal((16, 8)),
                               rng.standard_normal((20, 8)))
        with Session() as s:
            s.models.add({"a.qkv_proj.weight": fused, "b.mlp.gate_up_proj.weight": gate_up},
                         "m", views=["qkv"])
            s.models.add({"a.qkv_proj.weight": gqa}, "g", views=["qkv"],
                         view_options={"heads": 4, "kv_heads": 2, "head_dim": 2})
            views, gviews = _views(s), _views(s, "g")
        for part, sl in (("q", slice(0, 12)), ("k", slice(12, 24)), ("v", slice(24, 36))):
            np.testing.assert_array_equal(views[f"a.qkv_proj.weight[part={part}]"], fused[sl])
        np.testing.assert_array_equal(views["b.mlp.gate_up_proj.weight[part=up]"],
                                      gate_up[10:])
        np.testing.assert_array_equal(gviews["a.qkv_proj.weight[part=k]"], gqa[8:12])

    @pytest.mark.parametrize("layout", ["out_in", "in_out"])
    def test_experts_of_a_3d_tensor(self, rng, layout):
        """[E, out, in] in E matrices; [E, in, out] turned to [out, in]."""
        w = rng.standard_normal((4, 6, 10))
        with Session() as s:
            s.models.add({"mlp.experts.down_proj": w}, "m", views=["experts"],
                         view_options={"expert_layout": layout})
            views = _views(s)
        for e in range(4):
            want = w[e] if layout == "out_in" else w[e].T
            np.testing.assert_array_equal(views[f"mlp.experts.down_proj[expert={e}]"], want)

    def test_experts_default_layout_without_the_option(self, rng, tmp_path):
        """No expert_layout: [E, out, in] (Mixtral, Qwen3-MoE in transformers 5), unless
        the config's model type is one that stores [E, in, out] (issue 36)."""
        from safetensors.numpy import save_file

        from diffract_views.rules import _IN_OUT_EXPERTS

        w = rng.standard_normal((3, 5, 8))
        with Session() as s:
            s.models.add({"mlp.experts.down_proj": w}, "m", views=["experts"])
            views = _views(s)
        assert len(views) == 3
        for e in range(3):
            np.testing.assert_array_equal(views[f"mlp.experts.down_proj[expert={e}]"], w[e])
        assert _IN_OUT_EXPERTS  # and a model type that stores them turned is turned back
        folder = tmp_path / "moe"
        folder.mkdir()
        save_file({"mlp.experts.down_proj": w}, str(folder / "model.safetensors"))
        (folder / "config.json").write_text(
            json.dumps({"model_type": sorted(_IN_OUT_EXPERTS)[0]}))
        with Session() as s:
            s.models.add(folder, "m", views=["experts"])
            views = _views(s)
        for e in range(3):
            np.testing.assert_array_equal(views[f"mlp.experts.down_proj[expert={e}]"], w[e].T)

    def test_conv_positions(self, rng):
        """[out, in, kh, kw] per position: kh * kw matrices of out x in."""
        w = rng.standard_normal((8, 3, 2, 3))
        with Session() as s:
            s.models.add({"conv.weight": w}, "m", views=["conv"])
            views = _views(s)
        assert len(views) == 6
        np.testing.assert_array_equal(views["conv.weight[pos=1,2]"], w[:, :, 1, 2])


class TestBadInput:
    @pytest.mark.parametrize("state, views, options, message", [
        ({"q_proj.weight": np.ones((10, 4))}, ["heads"], {"heads": 4},
         r"q_proj.weight \(10, 4\): 10 does not divide into 4 heads; pass view_options "
         r"head_dim"),
        ({"q_proj.weight": np.ones((12, 4))}, ["heads"], {"heads": 4, "kv_heads": 3},
         r"num_key_value_heads \(3\) does not divide num_attention_heads \(4\)"),
        ({"q_proj.weight": np.ones((12, 4))}, ["heads"], {"heads": 4, "head_dim": 5},
         r"its output size is 12, not the 20 the head geometry gives"),
        ({"q_proj.weight": np.ones((12, 4))}, ["heads"], {},
         r"the head count is unknown: no config.json beside the checkpoint"),
        ({"experts.w": np.ones((3, 4, 4))}, ["experts"], {"experts": 8},
         r"experts.w \(3, 4, 4\): its first dimension is 3, not the 8 experts"),
        ({"mlp.weight": np.ones((4, 4))}, ["heads"], {"heads": 2},
         r"view rule\(s\) \['heads'\] split none of its 1 parameters"),
    ], ids=["rows", "kv-heads", "head-dim", "no-geometry", "expert-count", "nothing-split"])
    def test_refused_with_the_parameter_the_shapes_and_the_fix(self, state, views, options,
                                                               message):
        with Session() as s:
            with pytest.raises(ModelSourceError, match=message):
                s.models.add(state, "m", views=views, view_options=options)
            assert s.model_ids == []

    @pytest.mark.parametrize("views, options, message", [
        (3, None, r"views=3 names no view rule; name one or more"),
        ([3], None, r"views=\[3\] names no view rule"),
        (["heads"], {"heads": 4, "transposed": "yes"},
         r"view rule 'heads': transposed must be True or False, got 'yes'"),
    ], ids=["an-int", "a-list-of-ints", "transposed-a-string"])
    def test_views_and_options_of_the_wrong_type(self, views, options, message):
        """Not a TypeError from inside ('int' object is not iterable), and no string
        taken as True."""
        with Session() as s:
            with pytest.raises(InvalidArgumentError, match=message):
                s.models.add({"q_proj.weight": np.ones((8, 4))}, "m", views=views,
                             view_options=options)
            assert s.model_ids == []

    def test_a_config_that_is_not_json_and_options_nobody_takes(self, rng, tmp_path):
        """A broken config.json is named when a rule needs it (the model reads without
        views); an option no chosen rule takes is refused."""
        root = _checkpoint(tmp_path, _llama(rng), "{not json")
        with Session() as s:
            with pytest.raises(ModelSourceError, match=r"config.json. is not JSON Diffract can read"):
                s.models.add(root, "m", views=["heads"])
            s.models.add(root, "plain")
            with pytest.raises(InvalidArgumentError, match=r"view_options \['experts'\] are "
                                                           r"taken by none of the rules"):
                s.models.add(root, "m", views=["heads"], view_options={"experts": 4})


def test_views_filter_by_label_and_survive_a_reopen(rng, tmp_path):
    """"*[head=*]" selects every head view; the local store reads them after a reopen."""
    root = _checkpoint(tmp_path, _llama(rng), LLAMA)
    store = tmp_path / "store"
    with Session(profile="local", path=store) as s:
        s.models.add(root, "m", views=["heads"])
        heads = s.filter(param_names="*[head=*]")
        heads.compute.apply("frob_norm")
        assert len(s.results.export_metrics("frob_norm")["m"]) == 20
    with Session(profile="local", path=store) as s:
        s.compute.apply("stable_rank")
        rows = s.results.export_metrics("stable_rank")["m"]
        assert len(rows) == 25 and f"{ATTN}v_proj.weight[head=1]" in rows


def test_a_parameter_and_its_views_read_the_file_once(rng, tmp_path, monkeypatch):
    """Analysing the parameters and their head views reads each tensor's rows once (one
    I/O thread, so that the order is fixed: on several, a view that starts before its
    parent's read may read its own slice); stale() and provenance() take a view's id."""
    from diffract_formats._safetensors import SafetensorsFile

    root = _checkpoint(tmp_path, _llama(rng), LLAMA)
    calls = []
    rows = SafetensorsFile.rows
    monkeypatch.setattr(SafetensorsFile, "rows", lambda self, name, a, b, **kw:
                        calls.append((name, a, b)) or rows(self, name, a, b, **kw))
    config = {"parallel": {"thread_pool": {"max_workers": 1}}}
    with Session(config=config) as s:
        s.models.add(root, "m", views=["heads"])
        calls.clear()
        s.compute.apply("frob_norm")
        names = [name for name, _, _ in calls]
        assert sorted(names) == sorted(set(names)) and len(names) == 5  # each tensor once
        head = f"{ATTN}k_proj.weight[head=1]"
        prov = s.results.provenance("frob_norm", "m", head)
        assert prov["kernel"] == "frob_norm"
        assert s.results.stale("frob_norm") == []
