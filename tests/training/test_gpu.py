"""The monitor on a GPU (skipped without CUDA): the spectra of the live parameters are
computed on their device, by the spectral pack's torch route, and the values equal an
analysis of the checkpoint saved at the same step (on the CPU, LAPACK) within the
tolerance docs/spectral.md states for that route (1e-10 relative on the spectrum in
float64). benchmarks/gpu_check.sh runs it when a device is lent."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device", allow_module_level=True)

import diffract_kernels_spectral.linalg as linalg  # noqa: E402
from diffract import Session  # noqa: E402
from diffract_training import Monitor  # noqa: E402

METRICS = ("stable_rank", "log_norm", "spectral_norm", "pl_alpha")


def test_values_on_the_device_equal_the_saved_checkpoints_on_the_cpu(tmp_path, monkeypatch):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.Tanh(),
                                torch.nn.Linear(200, 180), torch.nn.Tanh(),
                                torch.nn.Linear(180, 8)).cuda()
    devices: list[str] = []
    real = linalg.esd_batched_torch

    def counted(matrices, precision="float64", device="cuda"):
        devices.append(str(device))
        return real(matrices, precision, device)

    monkeypatch.setattr(linalg, "esd_batched_torch", counted)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    logged: dict[int, dict[str, float]] = {}
    with Monitor(model, every=5, metrics=METRICS,
                 log=lambda values, step: logged.setdefault(step, values)) as monitor:
        for step in range(1, 11):
            loss = model(torch.randn(32, 300, device="cuda")).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if step % 5 == 0:
                safetensors_torch.save_file({k: v.detach().cpu() for k, v in
                                             model.state_dict().items()},
                                            str(tmp_path / f"s{step}.safetensors"))
            monitor.step(step)
    assert monitor.analysed == [5, 10] and devices and all(d.startswith("cuda") for d in devices)
    for step in (5, 10):
        with Session() as s:
            s.models.add(tmp_path / f"s{step}.safetensors", "ck")
            s.compute.apply(*METRICS, errors="record")
            want = s.results.export_metrics(*METRICS)["ck"]
        for param, row in want.items():
            for field in ("stable_rank", "log_norm", "spectral_norm"):
                got = logged[step][f"diffract/{field}/{param}"]
                assert got == pytest.approx(row[field], rel=1e-10), (step, param, field)
            if np.isfinite(row["pl_alpha"]):  # the same tail chosen from the same spectrum
                assert logged[step][f"diffract/pl_alpha/{param}"] == pytest.approx(
                    row["pl_alpha"], rel=1e-8), (step, param)
