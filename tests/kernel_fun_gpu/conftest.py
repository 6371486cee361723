"""kernel-fun test fixtures: the device, a stub benchmarker for fla's autotuners."""

from __future__ import annotations

import os

import pytest
import torch

DEVICE = "cuda" if os.environ.get("KERNEL_FUN_TEST_GPU") == "1" else "cpu"


@pytest.fixture(autouse=True)
def _stub_autotune_benchmark(monkeypatch):
    """Under the interpreter fla's autotuners cannot benchmark (no GPU): every config
    scores the same, so the first runs. Our own kernels have one config there."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        return
    from triton.runtime.autotuner import Autotuner

    monkeypatch.setattr(Autotuner, "do_bench",
                        property(lambda self: (lambda fn, quantiles=None, **kw: [1.0, 1.0, 1.0])),
                        raising=False)


@pytest.fixture(autouse=True)
def _fresh_support_state():
    from kernel_fun import _check, _support, _toolchain

    for module in (_support, _toolchain, _check):
        module.reset_for_tests()
    yield
    for module in (_support, _toolchain, _check):
        module.reset_for_tests()


@pytest.fixture
def device():
    return DEVICE


def fla_conv():
    from kernel_fun.adopt import original

    return original("causal_conv1d")


def err_ratio(ref: torch.Tensor, got: torch.Tensor) -> float:
    """fla's style: RMS of the difference over RMS of the reference."""
    ref, got = ref.detach().double(), got.detach().double()
    return float((ref - got).pow(2).mean().sqrt() / ref.pow(2).mean().sqrt().clamp_min(1e-30))
