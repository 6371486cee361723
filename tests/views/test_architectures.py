"""Heads of real architectures, each built tiny from its transformers config (no
download): every head view equals the rows (or columns) the model's own attention code
gives that head, read by feeding the projection the identity (biases zeroed, so the
output is the weight itself, bit for bit). And the parameter types of those models agree
between the module and its state dict."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from diffract import Session
from diffract.errors import ModelSourceError

pytest.importorskip("diffract_views")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)

HIDDEN, HEADS = 32, 4
DIM = HIDDEN // HEADS


def _build(cls, config):
    torch.manual_seed(0)
    model = cls(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.zero_()
    return model


def _views(model, model_id="m", **add):
    with Session() as s:
        s.models.add(model, model_id, views=["heads"], **add)
        return {p.name: s.store.load_weights(model_id, p.name)
                for p in s.models.params(model_id) if p.parent is not None}


def _identity_through(linear) -> torch.Tensor:
    """The projection's output for each unit input: [in, out], the weight turned."""
    with torch.no_grad():
        return linear(torch.eye(HIDDEN)[None])


def _same_where_both(module: dict, state: dict) -> None:
    """The module's types are its state dict's (which also lists tied weights again)."""
    assert len(set(module) & set(state)) >= 0.9 * len(state)
    assert {n: module[n] for n in state if n in module} == {
        n: t for n, t in state.items() if n in module}


@pytest.mark.parametrize("new_arch, kv", [(False, 1), (True, 2)])
def test_falcon_multi_query_and_new_decoder_heads_are_falcons_own(new_arch, kv):
    """Falcon-7B's multi-query layout (q heads, then one k, one v; transformers writes
    num_kv_heads equal to the heads there) and Falcon-40B's grouped one (per key-value
    group its query heads, then its k and its v), split here as FalconAttention splits its
    fused output (a private helper in some transformers releases, inline in others)."""
    config = transformers.FalconConfig(
        num_hidden_layers=1, hidden_size=HIDDEN, num_attention_heads=HEADS, vocab_size=50,
        new_decoder_architecture=new_arch, num_kv_heads=kv if new_arch else None)
    model = _build(transformers.FalconForCausalLM, config)
    attn = model.transformer.h[0].self_attention
    fused = _identity_through(attn.query_key_value)[0].view(HIDDEN, -1, attn.head_dim)
    if new_arch:
        grouped = fused.view(HIDDEN, kv, -1, attn.head_dim)
        q, k, v = grouped[:, :, :-2].flatten(1, 2), grouped[:, :, -2], grouped[:, :, -1]
    else:
        q, k, v = fused.split([HEADS, 1, 1], dim=1)
    views = _views(model)
    name = "transformer.h.0.self_attention.query_key_value.weight"
    assert len([n for n in views if n.startswith(name)]) == HEADS + 2 * kv
    for part, rows in (("q", q), ("k", k), ("v", v)):
        assert rows.shape[1] == (HEADS if part == "q" else kv)
        for h in range(rows.shape[1]):
            np.testing.assert_array_equal(views[f"{name}[part={part},head={h}]"],
                                          rows[:, h].numpy().T)


@pytest.mark.parametrize("multi_query", [True, False])
def test_gpt_bigcodes_linear_c_attn_is_not_gpt2s_conv1d(multi_query):
    """StarCoder's c_attn is a plain [out, in] linear layer (GPT-2's is Conv1D, [in,
    out]): multi-query q | k | v, or q, k, v per head, as GPTBigCodeAttention splits it;
    c_proj by input columns."""
    config = transformers.GPTBigCodeConfig(n_layer=1, n_embd=HIDDEN, n_head=HEADS,
                                           vocab_size=50, n_positions=16,
                                           multi_query=multi_query)
    model = _build(transformers.GPTBigCodeForCausalLM, config)
    attn = model.transformer.h[0].attn
    out = _identity_through(attn.c_attn)[0]
    if multi_query:
        q, k, v = out.split((HIDDEN, DIM, DIM), dim=-1)
        q, k, v = q.view(HIDDEN, HEADS, DIM), k[:, None], v[:, None]
    else:
        q, k, v = out.view(HIDDEN, HEADS, 3 * DIM).split(3 * [DIM], dim=-1)
    views = _views(model)
    name = "transformer.h.0.attn.c_attn.weight"
    kv = 1 if multi_query else HEADS
    assert len([n for n in views if n.startswith(name)]) == HEADS + 2 * kv
    for part, heads in (("q", q), ("k", k), ("v", v)):
        for h in range(heads.shape[1]):
            np.testing.assert_array_equal(views[f"{name}[part={part},head={h}]"],
                                          heads[:, h].numpy().T)
    proj = attn.c_proj.weight.detach().numpy()
    for h in range(HEADS):
        np.testing.assert_array_equal(views[f"transformer.h.0.attn.c_proj.weight[head={h}]"],
                                      proj[:, h * DIM:(h + 1) * DIM])


def test_t5s_attention_has_heads_and_its_feed_forward_wo_has_none():
    """T5's SelfAttention/EncDecAttention q, k, v, o (d_kv per head) are split; the
    feed-forward's wo, which Meta's naming would call an attention output, is not (it
    made the whole model fail: its input size fits no head geometry)."""
    config = transformers.T5Config(num_layers=1, d_model=HIDDEN, d_ff=64, num_heads=HEADS,
                                   d_kv=6, vocab_size=50)
    model = _build(transformers.T5Model, config)
    views = _views(model)
    assert not any("DenseReluDense" in n for n in views)
    for block in ("encoder.block.0.layer.0.SelfAttention",
                  "decoder.block.0.layer.1.EncDecAttention"):
        attn = model.get_submodule(block)
        q = _identity_through(attn.q)[0].view(HIDDEN, HEADS, 6)
        o = attn.o.weight.detach().numpy()
        for h in range(HEADS):
            np.testing.assert_array_equal(views[f"{block}.q.weight[head={h}]"], q[:, h].numpy().T)
            np.testing.assert_array_equal(views[f"{block}.o.weight[head={h}]"],
                                          o[:, h * 6:(h + 1) * 6])
    assert len(views) == 3 * 4 * HEADS  # encoder self, decoder self and cross: q, k, v, o


def test_mamba_has_no_heads_and_its_mixer_is_dense():
    """Mamba's mixer.out_proj is no attention output: heads splits nothing (an error
    saying so), and the mixer's projections are dense, the module and its state dict
    alike (its conv1d stays conv)."""
    model = _build(transformers.MambaForCausalLM,
                   transformers.MambaConfig(num_hidden_layers=1, hidden_size=HIDDEN,
                                            vocab_size=50))
    with pytest.raises(ModelSourceError, match=r"view rule\(s\) \['heads'\] split none"):
        _views(model)
    with Session() as s:
        s.models.add(model, "m")
        s.models.add(dict(model.state_dict()), "sd")
        types = {p.name: p.ptype for p in s.models.params("m")}
        _same_where_both(types, {p.name: p.ptype for p in s.models.params("sd")})
    mixer = "backbone.layers.0.mixer."
    assert types[mixer + "out_proj.weight"] == types[mixer + "in_proj.weight"] == "dense"
    assert types[mixer + "conv1d.weight"] == "conv"


@pytest.mark.parametrize("arch", ["t5", "mixtral"])
def test_types_of_t5_and_packed_experts_agree_with_their_state_dicts(arch):
    """T5: q, k, v, o are attention, the feed-forward's wi and wo dense; Mixtral's packed
    experts (3-D gate_up_proj, down_proj) are dense, not convolutions."""
    if arch == "t5":
        model = _build(transformers.T5Model, transformers.T5Config(
            num_layers=1, d_model=HIDDEN, d_ff=64, num_heads=HEADS, d_kv=DIM, vocab_size=50))
    else:
        model = _build(transformers.MixtralForCausalLM, transformers.MixtralConfig(
            num_hidden_layers=1, hidden_size=HIDDEN, intermediate_size=64,
            num_attention_heads=HEADS, num_key_value_heads=2, num_local_experts=4,
            vocab_size=50))
    with Session() as s:
        s.models.add(model, "m")
        s.models.add(dict(model.state_dict()), "sd")
        types = {p.name: p.ptype for p in s.models.params("m")}
        _same_where_both(types, {p.name: p.ptype for p in s.models.params("sd")})
    if arch == "t5":
        layer = "encoder.block.0.layer."
        for part in "qkvo":
            assert types[f"{layer}0.SelfAttention.{part}.weight"] == "attention"
        assert types[f"{layer}1.DenseReluDense.wi.weight"] == "dense"
        assert types[f"{layer}1.DenseReluDense.wo.weight"] == "dense"
    else:
        packed = [n for n in types if ".experts." in n]
        assert packed and all(types[n] == "dense" for n in packed), packed
        assert "conv" not in types.values()


def test_encoder_and_decoder_head_counts_of_bart():
    """BART's config names encoder_attention_heads and decoder_attention_heads (no
    num_attention_heads: heads failed the whole model); here they differ, 4 and 2, and
    the decoder's cross-attention takes the decoder's."""
    config = transformers.BartConfig(
        encoder_layers=1, decoder_layers=1, d_model=HIDDEN, encoder_attention_heads=4,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=60,
        max_position_embeddings=16)
    model = _build(transformers.BartModel, config)
    views = _views(model)
    for block, heads in (("encoder.layers.0.self_attn", 4), ("decoder.layers.0.self_attn", 2),
                         ("decoder.layers.0.encoder_attn", 2)):
        dim = HIDDEN // heads
        attn = model.get_submodule(block)
        for part in ("q_proj", "k_proj", "v_proj", "out_proj"):
            names = [n for n in views if n.startswith(f"{block}.{part}.weight[")]
            assert len(names) == heads, (block, part, names)
        q = attn.q_proj.weight.detach().numpy()
        o = attn.out_proj.weight.detach().numpy()
        for h in range(heads):
            np.testing.assert_array_equal(views[f"{block}.q_proj.weight[head={h}]"],
                                          q[h * dim:(h + 1) * dim])
            np.testing.assert_array_equal(views[f"{block}.out_proj.weight[head={h}]"],
                                          o[:, h * dim:(h + 1) * dim])


def test_a_multimodal_models_towers_take_their_own_configs():
    """LLaVA: the CLIP vision tower's 2 heads from vision_config, the Llama language
    model's 4 heads over 2 key-value heads from text_config (the top-level config has
    neither: heads failed the whole model)."""
    config = transformers.LlavaConfig(
        vision_config=transformers.CLIPVisionConfig(
            num_hidden_layers=1, hidden_size=HIDDEN, intermediate_size=64,
            num_attention_heads=2, image_size=16, patch_size=8),
        text_config=transformers.LlamaConfig(
            num_hidden_layers=1, hidden_size=HIDDEN, intermediate_size=64,
            num_attention_heads=HEADS, num_key_value_heads=2, vocab_size=60))
    model = _build(transformers.LlavaForConditionalGeneration, config)
    views = _views(model)
    vision = [n for n in views if ".vision_tower." in n]
    text = [n for n in views if ".language_model." in n]
    assert len(vision) == 4 * 2 and len(text) == HEADS + 2 + 2 + HEADS
    assert len(views) == len(vision) + len(text)
    k = next(n for n in model.state_dict() if "vision_tower" in n and "k_proj.weight" in n)
    weight = model.state_dict()[k].numpy()
    for h in range(2):
        np.testing.assert_array_equal(views[f"{k}[head={h}]"], weight[h * 16:(h + 1) * 16])


@pytest.mark.parametrize("q_lora_rank", [16, None])
def test_multi_head_latent_attention_of_deepseek_v3(q_lora_rank):
    """DeepSeek-V3's MLA (Kimi K2's too): q_b_proj (or q_proj) by heads of k_nope + k_rope
    rows, kv_b_proj by head into its k_nope and its v rows, o_proj by heads of v_head_dim
    columns, as DeepseekV3Attention views them; the latent down-projections have no
    heads. Before, o_proj fitted no head geometry and failed the whole model."""
    config = transformers.DeepseekV3Config(
        num_hidden_layers=1, hidden_size=HIDDEN, intermediate_size=64, moe_intermediate_size=16,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, q_lora_rank=q_lora_rank,
        kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6,
        n_routed_experts=4, num_experts_per_tok=2, n_shared_experts=1,
        first_k_dense_replace=1, vocab_size=50)
    model = _build(transformers.DeepseekV3ForCausalLM, config)
    attn = model.model.layers[0].self_attn
    views = _views(model)
    base = "model.layers.0.self_attn."
    q_name = "q_b_proj" if q_lora_rank else "q_proj"
    q_proj = getattr(attn, q_name)
    with torch.no_grad():
        q = q_proj(torch.eye(q_proj.in_features)).view(q_proj.in_features, HEADS, -1)
        kv = attn.kv_b_proj(torch.eye(8)).view(8, HEADS, -1)
    k_nope, v = torch.split(kv, [8, 6], dim=-1)
    o = attn.o_proj.weight.detach().numpy()
    assert q.shape[-1] == 12 and sorted(views) == sorted(
        [f"{base}{q_name}.weight[head={h}]" for h in range(HEADS)]
        + [f"{base}kv_b_proj.weight[part={p},head={h}]" for p in "kv" for h in range(HEADS)]
        + [f"{base}o_proj.weight[head={h}]" for h in range(HEADS)])
    for h in range(HEADS):
        np.testing.assert_array_equal(views[f"{base}{q_name}.weight[head={h}]"], q[:, h].numpy().T)
        np.testing.assert_array_equal(views[f"{base}kv_b_proj.weight[part=k,head={h}]"],
                                      k_nope[:, h].numpy().T)
        np.testing.assert_array_equal(views[f"{base}kv_b_proj.weight[part=v,head={h}]"],
                                      v[:, h].numpy().T)
        np.testing.assert_array_equal(views[f"{base}o_proj.weight[head={h}]"],
                                      o[:, h * 6:(h + 1) * 6])


def test_kimi_linears_kda_layers_have_their_own_heads_and_its_mla_layers_theirs():
    """A hybrid model's layer_types pick each layer's geometry: Kimi Linear's KDA
    (linear-attention) layers split by linear_num_heads of linear_head_dim, as
    KimiDeltaAttention views q, k, v and o; its full-attention layers are latent
    attention (DeepSeek-V3's)."""
    config = transformers.KimiLinearConfig(
        num_hidden_layers=2, hidden_size=HIDDEN, intermediate_size=64, moe_intermediate_size=16,
        num_attention_heads=HEADS, num_key_value_heads=HEADS, kv_lora_rank=8, q_lora_rank=None,
        qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=6, linear_num_heads=2,
        linear_head_dim=16, layer_types=["linear_attention", "full_attention"],
        mlp_layer_types=["dense", "dense"], vocab_size=60, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)
    model = _build(transformers.KimiLinearForCausalLM, config)
    views = _views(model)
    kda = model.model.layers[0].self_attn
    base = "model.layers.0.self_attn."
    for part in ("q_proj", "k_proj", "v_proj"):
        out = _identity_through(getattr(kda, part))[0].view(HIDDEN, 2, 16)  # as KDA views it
        for h in range(2):
            np.testing.assert_array_equal(views[f"{base}{part}.weight[head={h}]"],
                                          out[:, h].numpy().T)
    o = kda.o_proj.weight.detach().numpy()
    for h in range(2):
        np.testing.assert_array_equal(views[f"{base}o_proj.weight[head={h}]"],
                                      o[:, h * 16:(h + 1) * 16])
    assert len([n for n in views if n.startswith(base)]) == 4 * 2  # nothing else in a KDA layer
    full = "model.layers.1.self_attn."
    assert {n.split("[")[0] for n in views if n.startswith(full)} == {
        f"{full}q_proj.weight", f"{full}kv_b_proj.weight", f"{full}o_proj.weight"}


def test_qwen3_nexts_gated_queries_and_layers_without_heads():
    """Qwen3-Next: a full-attention q_proj holds per head its query rows then its output
    gate's (as Qwen3NextAttention chunks it); its Gated DeltaNet layers, and LFM2's
    short-convolution blocks, are left whole (their out_proj fitted no geometry or was
    split as if it were attention)."""
    config = transformers.Qwen3NextConfig(
        num_hidden_layers=2, hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=HEADS,
        num_key_value_heads=2, head_dim=DIM, linear_num_value_heads=4, linear_num_key_heads=2,
        linear_key_head_dim=8, linear_value_head_dim=8, moe_intermediate_size=16,
        shared_expert_intermediate_size=16, num_experts=4, num_experts_per_tok=2,
        vocab_size=60, layer_types=["linear_attention", "full_attention"])
    model = _build(transformers.Qwen3NextForCausalLM, config)
    views = _views(model)
    assert not any(".layers.0." in n for n in views)
    attn = model.model.layers[1].self_attn
    q, gate = torch.chunk(_identity_through(attn.q_proj)[0].view(HIDDEN, HEADS, 2 * DIM), 2, -1)
    base = "model.layers.1.self_attn.q_proj.weight"
    for h in range(HEADS):
        np.testing.assert_array_equal(views[f"{base}[part=q,head={h}]"], q[:, h].numpy().T)
        np.testing.assert_array_equal(views[f"{base}[part=gate,head={h}]"], gate[:, h].numpy().T)
    with Session() as s:
        s.models.add(model, "m")
        types = {p.name: p.ptype for p in s.models.params("m")}
    assert types["model.layers.0.mlp.shared_expert.up_proj.weight"] == "dense"  # not 'shared'
    assert types["model.embed_tokens.weight"] == "embedding"

    lfm2 = _build(transformers.Lfm2ForCausalLM, transformers.Lfm2Config(
        num_hidden_layers=2, hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=HEADS,
        num_key_value_heads=2, vocab_size=60, layer_types=["conv", "full_attention"]))
    views = _views(lfm2)
    assert views and not any(".layers.0." in n for n in views)


def test_codegens_sharded_qkv_mpts_n_heads_and_debertas_query_proj():
    """CodeGen's qkv_proj is four model-parallel blocks of q | v | k (CodeGenAttention
    splits it so; read as q|k|v blocks its heads were other rows); MPT names its head
    count n_heads (heads failed the model); DeBERTa-v2's query_proj/key_proj/value_proj
    are split like BERT's query/key/value (they were left whole)."""
    codegen = _build(transformers.CodeGenForCausalLM, transformers.CodeGenConfig(
        n_layer=1, n_embd=HIDDEN, n_head=HEADS * 2, vocab_size=60, rotary_dim=2))
    attn = codegen.transformer.h[0].attn
    heads, dim = HEADS * 2, HIDDEN // (HEADS * 2)
    local = HIDDEN // attn.mp_num
    out = _identity_through(attn.qkv_proj)[0].view(HIDDEN, attn.mp_num, 3 * local)
    q, v, k = (t.reshape(HIDDEN, heads, dim) for t in out.split(local, dim=-1))
    views = _views(codegen)
    name = "transformer.h.0.attn.qkv_proj.weight"
    for part, rows in (("q", q), ("k", k), ("v", v)):
        for h in range(heads):
            np.testing.assert_array_equal(views[f"{name}[part={part},head={h}]"],
                                          rows[:, h].numpy().T)
    with Session() as s, pytest.raises(ModelSourceError, match=r"in the codegen layout the "
                                                               r"rows of q are not contiguous"):
        s.models.add(codegen, "m", views=["qkv"])

    mpt = _build(transformers.MptForCausalLM, transformers.MptConfig(
        n_layers=1, d_model=HIDDEN, n_heads=HEADS, vocab_size=60))
    attn = mpt.transformer.blocks[0].attn
    q, k, v = (t.view(HIDDEN, HEADS, DIM) for t in _identity_through(attn.Wqkv)[0].chunk(3, -1))
    views = _views(mpt)
    for part, rows in (("q", q), ("k", k), ("v", v)):
        for h in range(HEADS):
            np.testing.assert_array_equal(
                views[f"transformer.blocks.0.attn.Wqkv.weight[part={part},head={h}]"],
                rows[:, h].numpy().T)

    deberta = _build(transformers.DebertaV2Model, transformers.DebertaV2Config(
        num_hidden_layers=1, hidden_size=HIDDEN, intermediate_size=64, num_attention_heads=HEADS,
        vocab_size=60))
    views = _views(deberta)
    base = "encoder.layer.0.attention.self."
    assert {n.split("[")[0] for n in views} == {
        f"{base}query_proj.weight", f"{base}key_proj.weight", f"{base}value_proj.weight",
        "encoder.layer.0.attention.output.dense.weight"}
    weight = deberta.encoder.layer[0].attention.self.key_proj.weight.detach().numpy()
    for h in range(HEADS):
        np.testing.assert_array_equal(views[f"{base}key_proj.weight[head={h}]"],
                                      weight[h * DIM:(h + 1) * DIM])


def test_blooms_query_key_value_is_q_k_v_per_head():
    """BLOOM's fused query_key_value holds, per head, its q, k and v rows (kv heads =
    heads in the grouped layout), as BloomAttention views its output: [heads, 3, dim]."""
    model = _build(transformers.BloomForCausalLM, transformers.BloomConfig(
        n_layer=1, hidden_size=HIDDEN, n_head=HEADS, vocab_size=60))
    attn = model.transformer.h[0].self_attention
    fused = _identity_through(attn.query_key_value)[0].view(HIDDEN, HEADS, 3, DIM)
    q, k, v = (fused[:, :, i].numpy() for i in range(3))
    views = _views(model)
    name = "transformer.h.0.self_attention.query_key_value.weight"
    for part, rows in (("q", q), ("k", k), ("v", v)):
        for h in range(HEADS):
            np.testing.assert_array_equal(views[f"{name}[part={part},head={h}]"], rows[:, h].T)


def test_falcon_7bs_hub_config_without_a_kv_head_count_is_multi_query(tmp_path):
    """The Hub's Falcon-7B config.json says ``multi_query: true`` and no key-value head
    count at all (transformers' own config now adds num_key_value_heads = 1; an old one
    does not): the fused query_key_value still holds one k and one v head."""
    import json

    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    fused = rng.standard_normal(((HEADS + 2) * DIM, HIDDEN)).astype(np.float32)
    save_file({"transformer.h.0.self_attention.query_key_value.weight": fused},
              str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "falcon", "multi_query": True, "new_decoder_architecture": False,
        "n_head": HEADS, "hidden_size": HIDDEN}))
    with Session() as s:
        s.models.add(str(tmp_path), "m", views=["heads"])
        views = {p.name: s.store.load_weights("m", p.name) for p in s.models.params("m")
                 if p.parent is not None}
    name = "transformer.h.0.self_attention.query_key_value.weight"
    assert sorted(views) == sorted([f"{name}[part=q,head={h}]" for h in range(HEADS)]
                                   + [f"{name}[part=k,head=0]", f"{name}[part=v,head=0]"])
    np.testing.assert_array_equal(views[f"{name}[part=k,head=0]"],
                                  fused[HEADS * DIM:(HEADS + 1) * DIM])
