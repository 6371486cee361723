"""The Monitor in a plain loop run by accelerate, logging through accelerate's own
tracker (TensorBoard): the event files, read with TensorBoard's reader, hold the
documented tags at the analysed steps with the values of an analysis of the safetensors
saved at those steps."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
accelerate = pytest.importorskip("accelerate")
pytest.importorskip("tensorboard")
safetensors_torch = pytest.importorskip("safetensors.torch")

from diffract import Session  # noqa: E402
from diffract_training import Monitor  # noqa: E402

METRICS = ("stable_rank", "spectral_norm", "log_norm")


def test_accelerate_tracker_gets_the_values_of_the_saved_steps(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(96, 80), torch.nn.Tanh(), torch.nn.Linear(80, 6))
    accelerator = accelerate.Accelerator(cpu=True, log_with="tensorboard",
                                         project_dir=str(tmp_path / "logs"))
    accelerator.init_trackers("run")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model, opt = accelerator.prepare(model, opt)
    monitor = Monitor(model, every=3, metrics=METRICS, histograms=False, background=False,
                      log=lambda values, step: accelerator.log(values, step=step))
    gen = torch.Generator().manual_seed(0)
    with monitor:
        for step in range(1, 10):
            loss = model(torch.randn(8, 96, generator=gen)).pow(2).mean()
            opt.zero_grad()
            accelerator.backward(loss)
            opt.step()  # accelerate's wrapped optimizer: the monitor's pre-hook still runs
            monitor.step(step)
            if step % 3 == 0:
                safetensors_torch.save_file(
                    {k: v.detach().clone() for k, v in model.state_dict().items()},
                    str(tmp_path / f"s{step}.safetensors"))
    accelerator.end_training()
    assert monitor.analysed == [3, 6, 9]
    runs = [p.parent for p in (tmp_path / "logs").rglob("events.out.tfevents.*")]
    events = EventAccumulator(str(runs[0]), size_guidance={"scalars": 0}).Reload()
    for step in (3, 6, 9):
        with Session() as s:
            s.models.add(tmp_path / f"s{step}.safetensors", "ck")
            s.compute.apply(*METRICS)
            want = s.results.export_metrics(*METRICS)["ck"]
        for param in ("0.weight", "2.weight"):
            for field in METRICS:
                logged = {e.step: e.value for e in events.Scalars(f"diffract/{field}/{param}")}
                assert logged[step] == np.float32(want[param][field]), (step, param, field)
    assert {e.step for e in events.Scalars("diffract/summary/stable_rank_mean")} == {3, 6, 9}
