"""The monitor's head views are those ``models.add`` gives the same model's saved folder,
bit for bit, on every architecture ``tests/views/test_architectures.py`` builds: the view
rules see the model's whole configuration (model_type, multi_query, kv_lora_rank,
layer_types, the towers' own configs), not only its head counts (issue 58)."""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

import numpy as np
import pytest

from diffract import Session

pytest.importorskip("diffract_views")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
logging.getLogger("transformers").setLevel(logging.ERROR)


from diffract_training import Monitor  # noqa: E402

H, N = 32, 4  # hidden size, heads (the architecture tests' tiny shapes)


def _configs() -> dict[str, tuple[str, object]]:
    t = transformers
    llama = {"num_hidden_layers": 1, "hidden_size": H, "intermediate_size": 64,
             "num_attention_heads": N, "num_key_value_heads": 2, "vocab_size": 60}
    mla = {"hidden_size": H, "intermediate_size": 64, "moe_intermediate_size": 16,
           "num_attention_heads": N, "num_key_value_heads": N, "kv_lora_rank": 8,
           "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 6}
    return {
        "falcon-7b": ("FalconForCausalLM", t.FalconConfig(
            num_hidden_layers=1, hidden_size=H, num_attention_heads=N, vocab_size=50)),
        "falcon-40b": ("FalconForCausalLM", t.FalconConfig(
            num_hidden_layers=1, hidden_size=H, num_attention_heads=N, vocab_size=50,
            new_decoder_architecture=True, num_kv_heads=2)),
        "bigcode-mqa": ("GPTBigCodeForCausalLM", t.GPTBigCodeConfig(
            n_layer=1, n_embd=H, n_head=N, vocab_size=50, n_positions=16, multi_query=True)),
        "bigcode-mha": ("GPTBigCodeForCausalLM", t.GPTBigCodeConfig(
            n_layer=1, n_embd=H, n_head=N, vocab_size=50, n_positions=16, multi_query=False)),
        "t5": ("T5Model", t.T5Config(num_layers=1, d_model=H, d_ff=64, num_heads=N, d_kv=6,
                                     vocab_size=50)),
        "mixtral": ("MixtralForCausalLM", t.MixtralConfig(
            num_hidden_layers=1, hidden_size=H, intermediate_size=64, num_attention_heads=N,
            num_key_value_heads=2, num_local_experts=4, vocab_size=50)),
        "bart": ("BartModel", t.BartConfig(
            encoder_layers=1, decoder_layers=1, d_model=H, encoder_attention_heads=4,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, vocab_size=60,
            max_position_embeddings=16)),
        "llava": ("LlavaForConditionalGeneration", t.LlavaConfig(
            vision_config=t.CLIPVisionConfig(num_hidden_layers=1, hidden_size=H,
                                             intermediate_size=64, num_attention_heads=2,
                                             image_size=16, patch_size=8),
            text_config=t.LlamaConfig(**llama))),
        "deepseek-v3-q-lora": ("DeepseekV3ForCausalLM", t.DeepseekV3Config(
            num_hidden_layers=1, q_lora_rank=16, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1, vocab_size=50, **mla)),
        "deepseek-v3": ("DeepseekV3ForCausalLM", t.DeepseekV3Config(
            num_hidden_layers=1, q_lora_rank=None, n_routed_experts=4, num_experts_per_tok=2,
            n_shared_experts=1, first_k_dense_replace=1, vocab_size=50, **mla)),
        "kimi-linear": ("KimiLinearForCausalLM", t.KimiLinearConfig(
            num_hidden_layers=2, q_lora_rank=None, linear_num_heads=2, linear_head_dim=16,
            layer_types=["linear_attention", "full_attention"],
            mlp_layer_types=["dense", "dense"], vocab_size=60, pad_token_id=0,
            bos_token_id=1, eos_token_id=2, **mla)),
        "qwen3-next": ("Qwen3NextForCausalLM", t.Qwen3NextConfig(
            num_hidden_layers=2, hidden_size=H, intermediate_size=64, num_attention_heads=N,
            num_key_value_heads=2, head_dim=H // N, linear_num_value_heads=4,
            linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
            moe_intermediate_size=16, shared_expert_intermediate_size=16, num_experts=4,
            num_experts_per_tok=2, vocab_size=60,
            layer_types=["linear_attention", "full_attention"])),
        "lfm2": ("Lfm2ForCausalLM", t.Lfm2Config(
            num_hidden_layers=2, hidden_size=H, intermediate_size=64, num_attention_heads=N,
            num_key_value_heads=2, vocab_size=60, layer_types=["conv", "full_attention"])),
        "codegen": ("CodeGenForCausalLM", t.CodeGenConfig(
            n_layer=1, n_embd=H, n_head=N * 2, vocab_size=60, rotary_dim=2)),
        "mpt": ("MptForCausalLM", t.MptConfig(n_layers=1, d_model=H, n_heads=N,
                                              vocab_size=60)),
        "deberta-v2": ("DebertaV2Model", t.DebertaV2Config(
            num_hidden_layers=1, hidden_size=H, intermediate_size=64, num_attention_heads=N,
            vocab_size=60)),
        "bloom": ("BloomForCausalLM", t.BloomConfig(n_layer=1, hidden_size=H, n_head=N,
                                                    vocab_size=60)),
    }


def _identity(weights) -> float:
    """A view's bytes as a number: two views are equal bit for bit iff these are (up to a
    hash collision), and a view of other rows, or turned, gives another."""
    data = np.ascontiguousarray(weights)
    digest = hashlib.blake2b(data.tobytes() + str(data.shape).encode(), digest_size=6)
    return float(int.from_bytes(digest.digest(), "big"))


@pytest.fixture
def identity_kernel():
    with Session() as s:  # the process's registry (reset for each test)
        s.compute.kernel(name="t_identity")(_identity)
    return "t_identity"


def test_the_table_covers_every_architecture_the_view_tests_build():
    source = (Path(__file__).parents[1] / "views" / "test_architectures.py").read_text()
    built = set(re.findall(r"_build\(\s*transformers\.(\w+)", source))
    assert built - {"MambaForCausalLM"} <= {cls for cls, _ in _configs().values()}


@pytest.mark.parametrize("arch", sorted(_configs()))
def test_the_monitors_head_views_are_those_of_the_saved_folder(arch, tmp_path,
                                                               identity_kernel):
    cls, config = _configs()[arch]
    torch.manual_seed(0)
    model = getattr(transformers, cls)(config)
    # The folder save_pretrained writes (LLaVA's parameters under its legacy names, as
    # the monitor names them too) with the model's config.json.
    model.save_pretrained(tmp_path / "saved")
    with Session() as s:
        s.models.add(str(tmp_path / "saved"), "saved", views=["heads"])
        s.compute.apply(identity_kernel)
        want = {n: row[identity_kernel] for n, row in
                s.results.export_metrics(identity_kernel)["saved"].items() if "[" in n}
    assert want
    monitor = Monitor(model, every=1, metrics=[identity_kernel], views=["heads"],
                      view_metrics=[identity_kernel], histograms=False, background=False)
    with monitor:
        monitor.step(1)
    got = {n: v for n, (_, v) in monitor.latest(identity_kernel).items() if "[" in n}
    assert got == want


def test_a_ddp_models_config_is_found_under_its_wrapper(identity_kernel, tmp_path,
                                                      monkeypatch):
    """DDP holds the model (and its config) as ``module`` and has no config of its own:
    the views are those of the model itself."""
    import torch.distributed as dist

    cls, config = _configs()["codegen"]
    torch.manual_seed(0)
    model = getattr(transformers, cls)(config)
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1),
                            rank=0, world_size=1)
    values = []
    try:
        for watched in (model, torch.nn.parallel.DistributedDataParallel(model)):
            with Monitor(watched, every=1, metrics=[identity_kernel], views=["heads"],
                         view_metrics=[identity_kernel], histograms=False,
                         background=False) as monitor:
                monitor.step(1)
            values.append(dict(monitor.latest(identity_kernel)))
    finally:
        dist.destroy_process_group()
        logging.getLogger("torch.distributed").handlers.clear()
    assert values[0] == values[1] and sum("[part=q" in n for n in values[0]) == 8
