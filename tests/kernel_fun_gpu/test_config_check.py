"""The conv autotuners pick one of many configurations per (D, W, B, T): each picked
configuration passes its own self-check before its result stands. A configuration that
computes wrong (here: a pre-hook that corrupts the weight taps only for it, as a
configuration-specific miscompile would) is ruled out, and the call is redone with one
that passes; the op-level probe alone would have missed it."""

from __future__ import annotations

import logging

import pytest
import torch
import triton

from kernel_fun.cconv import causal_conv1d, reference_causal_conv1d
from kernel_fun.ops.cconv import _triton as ct


def _corrupt_taps(nargs):
    nargs["w4"].mul_(1.5)  # the padded copy of a W < 4 weight: this configuration is "wrong"


@pytest.fixture
def two_configs(monkeypatch):
    """Both kernels autotune over a wrong configuration (listed first: the stub
    benchmarker scores all alike, so the first is picked) and a right one."""
    bad = triton.Config({"BT": 16, "BD": 16}, num_warps=1, pre_hook=_corrupt_taps)
    good = triton.Config({"BT": 8, "BD": 16}, num_warps=1)
    for kernel in (ct._fwd_kernel, ct._bwd_kernel):
        monkeypatch.setattr(kernel, "configs", [bad, good])
        monkeypatch.setattr(kernel, "cache", {})
    monkeypatch.setattr(ct, "_RULED_OUT", set())
    return bad, good


def test_a_wrong_configuration_is_ruled_out_and_the_call_redone(two_configs, caplog):
    bad, good = two_configs
    g = torch.Generator().manual_seed(3)
    x = torch.randn(2, 40, 24, generator=g, requires_grad=True)
    w = (torch.randn(24, 3, generator=g) * 0.5).requires_grad_()  # W < 4: the taps are a copy
    dy = torch.randn(2, 40, 24, generator=g)
    with caplog.at_level(logging.INFO, logger="kernel_fun"):
        y, _ = causal_conv1d(x, w, activation="silu")
        y.backward(dy)
    xr, wr = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    want = reference_causal_conv1d(xr, wr)
    want.backward(dy)
    assert torch.allclose(y, want, atol=1e-5)
    assert torch.allclose(x.grad, xr.grad, atol=1e-5) and torch.allclose(w.grad, wr.grad, atol=1e-5)
    for name, kernel in (("_fwd_kernel", ct._fwd_kernel), ("_bwd_kernel", ct._bwd_kernel)):
        assert (name, ct._config_key(bad), "cpu") in ct._RULED_OUT
        assert kernel.best_config is good
    said = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("no longer picks that configuration" in m for m in said), said
    assert any("engaged" in r.getMessage() for r in caplog.records)  # ours, not fla's


def test_the_check_of_a_configuration_compares_with_the_reference(two_configs):
    """The probe itself: the corrupted configuration differs, the other agrees."""
    bad, good = two_configs
    x = torch.randn(1, 8, 24)
    w = torch.randn(24, 3)
    for name in ("_fwd_kernel", "_bwd_kernel"):
        assert "differs from the reference" in ct._config_probe(name, bad, x, w)
        assert ct._config_probe(name, good, x, w) is None


def test_every_configuration_wrong_is_an_error_not_a_wrong_answer(two_configs, monkeypatch):
    bad, _ = two_configs
    monkeypatch.setattr(ct._fwd_kernel, "configs", [bad, bad])
    x, w = torch.randn(1, 8, 24), torch.randn(24, 3)
    with pytest.raises(RuntimeError, match="every configuration of _fwd_kernel failed"):
        ct.forward(x, w)
