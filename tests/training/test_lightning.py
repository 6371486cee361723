"""DiffractLightningCallback in a real Lightning Trainer with its TensorBoard logger: the
documented tags at the analysed steps (TensorBoard's own reader), the values of an
analysis of the weights saved at those steps; a run resumed with ``ckpt_path`` adds no
step twice; nothing is left running."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
L = pytest.importorskip("lightning.pytorch")
pytest.importorskip("tensorboard")
safetensors_torch = pytest.importorskip("safetensors.torch")

from diffract import Session  # noqa: E402
from diffract_training import DiffractLightningCallback  # noqa: E402

METRICS = ("stable_rank", "log_norm")


class _Net(L.LightningModule):
    def __init__(self, save_to: Path | None = None) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(40, 64), torch.nn.Tanh(),
                                       torch.nn.Linear(64, 4))
        self.save_to = save_to

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.save_to is not None and self.global_step % 4 == 0:
            safetensors_torch.save_file(self.state_dict(),
                                        str(self.save_to / f"s{self.global_step}.safetensors"))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        x = torch.randn(256, 40, generator=torch.Generator().manual_seed(0))
        return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x), batch_size=8)


def _fit(tmp_path: Path, steps: int, ckpt: str | None = None, save: bool = False):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import TensorBoardLogger

    cb = DiffractLightningCallback(every=4, metrics=METRICS, store=tmp_path / "run.diffract",
                                   background=False)
    trainer = L.Trainer(max_steps=steps, accelerator="cpu", devices=1,
                        logger=TensorBoardLogger(str(tmp_path / "logs"), name="", version=0),
                        callbacks=[cb, ModelCheckpoint(dirpath=tmp_path / "ck", save_top_k=-1,
                                                       every_n_train_steps=4)],
                        enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(_Net(tmp_path if save else None), ckpt_path=ckpt)
    return cb


def test_lightning_logs_the_documented_tags_with_the_saved_weights_values(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    cb = _fit(tmp_path, 8, save=True)
    assert cb.monitor.closed and cb.monitor.analysed == [4, 8]
    assert not [t for t in threading.enumerate() if t.name.startswith("diffract-monitor")]
    events = EventAccumulator(str(tmp_path / "logs" / "version_0"),
                              size_guidance={"scalars": 0, "histograms": 0}).Reload()
    tag = "diffract/stable_rank/net.0.weight"
    assert tag in events.Tags()["scalars"]
    assert "diffract/esd/net.2.weight" in events.Tags()["histograms"]
    logged = {e.step: e.value for e in events.Scalars(tag)}
    assert sorted(logged) == [4, 8]
    for step in (4, 8):
        with Session() as s:
            s.models.add(tmp_path / f"s{step}.safetensors", "ck")
            s.compute.apply(*METRICS)
            want = s.results.export_metrics(*METRICS)["ck"]
        assert logged[step] == np.float32(want["net.0.weight"]["stable_rank"])
        with Session("local", path=str(tmp_path / "run.diffract")) as s:
            stored = s.results.export_metrics(*METRICS)[f"step-{step}"]
        assert sorted(stored) == ["net.0.weight", "net.2.weight"]
        assert all(stored[p] == want[p] for p in stored)


def test_a_run_resumed_with_ckpt_path_adds_no_step_twice(tmp_path):
    _fit(tmp_path, 8)
    cb = _fit(tmp_path, 12, ckpt=str(tmp_path / "ck" / "epoch=0-step=4.ckpt"))
    assert cb.monitor.analysed == [12]
    with Session("local", path=str(tmp_path / "run.diffract")) as s:
        assert sorted(s.models.steps()[m]["step"] for m in s.model_ids) == [4, 8, 12]
