"""Training, second pass (issue 65 items 2, 3, 5): the final weights are always analysed
(plain loop, Lightning), the latest values per module are handed to the loop with a hook
on the training thread, and parameters carry the names a checkpoint of the unwrapped
model carries (torch.compile, activation checkpointing, DDP)."""

from __future__ import annotations

import logging

import pytest

torch = pytest.importorskip("torch")

from diffract import Session  # noqa: E402
from diffract_training import Monitor  # noqa: E402
from tests.resources.lightning import module as lightning_module  # noqa: E402

METRICS = ["stable_rank"]


def _net(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(40, 30), torch.nn.Tanh(), torch.nn.Linear(30, 8))


def _loop(model, monitor, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(0)
    for step in range(1, steps + 1):
        loss = model(torch.randn(8, 40, generator=gen)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        monitor.step(step)


def _analysis(model) -> dict:
    with Session() as s:
        s.models.add({k: v.detach().clone() for k, v in model.named_parameters()}, "m")
        s.compute.apply(*METRICS)
        return s.results.export_metrics(*METRICS)["m"]


@pytest.mark.parametrize("final", [True, False])
def test_a_plain_loop_analyses_its_final_weights(final):
    """every=50 over 120 steps: 50, 100 and, at close(), 120 (the final weights, logged
    at 120 with their own values); final=False: 50 and 100 only. Inline (background=False):
    in the background a busy machine may still analyse 50 at step 100 and skip it."""
    model, logged = _net(), []
    monitor = Monitor(model, every=50, metrics=METRICS, final=final, histograms=False,
                      background=False, log=lambda values, step: logged.append(step))
    _loop(model, monitor, 120)
    monitor.close()
    assert monitor.analysed == ([50, 100, 120] if final else [50, 100])
    assert logged == monitor.analysed
    if final:
        latest = monitor.latest("stable_rank")
        assert {s for s, _ in latest.values()} == {120}
        want = _analysis(model)
        assert {n: v for n, (_, v) in latest.items()} == {
            n: row["stable_rank"] for n, row in want.items()}


def test_latest_values_and_a_hook_on_the_training_thread():
    """latest(field) -> {name: (step, value)}; on_values(hook) is called on the thread
    that calls step(), once per analysed step, with field -> name -> value; a hook that
    raises is logged once and training goes on."""
    import threading

    model, calls = _net(), []
    monitor = Monitor(model, every=2, metrics=METRICS, background=False, histograms=False)
    monitor.on_values(lambda step, values: calls.append(
        (step, threading.current_thread() is threading.main_thread(), values)))
    monitor.on_values(lambda step, values: 1 / 0)
    assert monitor.latest("stable_rank") == {}
    _loop(model, monitor, 4)
    monitor.close()
    assert [(s, main) for s, main, _ in calls] == [(2, True), (4, True)]
    assert set(calls[-1][2]["stable_rank"]) == {"0.weight", "2.weight"}
    assert monitor.latest("stable_rank") == {
        n: (4, v) for n, v in calls[-1][2]["stable_rank"].items()}


def test_lightning_analyses_the_final_step():
    """max_steps=6, every=4: 4 and, at the end of fit, 6."""
    L = pytest.importorskip("lightning.pytorch")
    from diffract_training import DiffractLightningCallback

    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(
        torch.randn(64, 40, generator=torch.Generator().manual_seed(0))), batch_size=8)
    logged = []
    cb = DiffractLightningCallback(every=4, metrics=METRICS, histograms=False,
                                   log=lambda values, step: logged.append(step))
    net = lightning_module(_net())
    L.Trainer(max_steps=6, accelerator="cpu", devices=1, logger=False, callbacks=[cb],
              enable_progress_bar=False, enable_model_summary=False,
              enable_checkpointing=False).fit(net, data)
    assert cb.monitor.analysed == [4, 6] and logged == [4, 6]
    final = {n: v for n, (s, v) in cb.monitor.latest("stable_rank").items()}
    want = {n.removeprefix("net."): r["stable_rank"] for n, r in _analysis(net).items()}
    assert {n.removeprefix("net."): v for n, v in final.items()} == want


def _names(monitor) -> list[str]:
    return list(monitor._named())


class TestNamesAsCheckpointsName:
    def test_torch_compile(self):
        model = _net()
        compiled = torch.compile(model)
        assert list(dict(compiled.named_parameters()))[0] == "_orig_mod.0.weight"
        with Monitor(compiled, every=1, metrics=METRICS, background=False) as m:
            m.step(1)
            stored = sorted(m.session.results.export_metrics(*METRICS)["step-1"])
        assert stored == sorted(n for n, p in model.state_dict().items() if p.dim() == 2)

    def test_activation_checkpointing(self):
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
            checkpoint_wrapper,
        )

        model = _net()
        wrapped = torch.nn.Sequential(checkpoint_wrapper(model[0]), model[1], model[2])
        assert "0._checkpoint_wrapped_module.weight" in dict(wrapped.named_parameters())
        with Monitor(wrapped, every=1, metrics=METRICS) as m:
            assert sorted(_names(m)) == ["0.bias", "0.weight", "2.bias", "2.weight"]

    def test_ddp_module_prefix(self, tmp_path, monkeypatch):
        import torch.distributed as dist

        monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
        store = dist.FileStore(str(tmp_path / "store"), 1)
        dist.init_process_group("gloo", store=store, rank=0, world_size=1)
        try:
            model = _net()
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            assert "module.0.weight" in dict(ddp.named_parameters())
            with Monitor(ddp, every=1, metrics=METRICS) as m:
                assert sorted(_names(m)) == ["0.bias", "0.weight", "2.bias", "2.weight"]
        finally:
            dist.destroy_process_group()
        logging.getLogger("torch.distributed").handlers.clear()

    def test_a_submodule_named_module_is_kept_outside_ddp(self):
        class Holder(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.module = torch.nn.Linear(4, 3)

        with Monitor(Holder(), every=1, metrics=METRICS) as m:
            assert _names(m) == ["module.weight", "module.bias"]


def _llava():
    transformers = pytest.importorskip("transformers")
    vision = transformers.CLIPVisionConfig(hidden_size=32, intermediate_size=64,
                                           num_hidden_layers=1, num_attention_heads=2,
                                           image_size=8, patch_size=4, projection_dim=32)
    text = transformers.LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128,
                                    num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2)
    torch.manual_seed(0)
    return transformers.LlavaForConditionalGeneration(transformers.LlavaConfig(
        vision_config=vision, text_config=text, image_token_index=5))


def test_a_llava_monitor_names_each_parameter_as_its_saved_checkpoint(tmp_path):
    """transformers saves LLaVA's live ``model.language_model.*`` as
    ``language_model.model.*``: the monitor's store names every matrix as the folder
    ``save_pretrained`` wrote at that step does, so ``diffract track`` of the saved
    checkpoints and the monitor's store line up, value for value; a schedule finds its
    alphas under those names."""
    from diffract_training import TempBalance

    model = _llava()
    assert any(n.startswith("model.language_model.") for n, _ in model.named_parameters())
    monitor = Monitor(model, every=1, metrics=METRICS, store=tmp_path / "run",
                      background=False)
    monitor.step(1)
    model.save_pretrained(tmp_path / "saved")
    monitor.close()
    with Session() as s:
        s.models.add(tmp_path / "saved", "ck")
        s.compute.apply(*METRICS, errors="record")
        want = s.results.export_metrics(*METRICS)["ck"]
    with Session("local", path=str(tmp_path / "run")) as s:
        got = s.results.export_metrics(*METRICS)["step-1"]
    assert "language_model.model.layers.0.self_attn.q_proj.weight" in got
    assert got == want and len(got) >= 20
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with TempBalance(model, opt, every=1, background=False, min_eigenvalues=0) as tb:
        assert len(tb.alphas) == len(tb.analysed) and len(set(tb.factors.values())) > 2
