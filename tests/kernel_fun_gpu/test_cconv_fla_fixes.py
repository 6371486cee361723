"""fla's 2026 causal_conv1d fixes, held by kernel-fun's drop-in: every case against a
float64 computation written from the definition (not against fla's kernel, which may be
the wrong one), the output and every gradient, widths 2 to 4.

* fla #871, #1139: a non-contiguous ``dy`` or non-contiguous inputs;
* fla #1141: sequences shorter than the kernel width minus one;
* fla #955 (open upstream): ``cu_seqlens`` with a batch larger than one row;
* fla-core 0.6.0's backward drops the gradient of ``final_state[..., 0]`` (found here):
  the drop-in computes those calls in plain PyTorch, and a test shows fla's answer wrong.
"""

from __future__ import annotations

import itertools
import logging

import pytest
import torch

from kernel_fun.cconv import causal_conv1d
from tests.kernel_fun_gpu.conftest import fla_conv


def by_definition(x, w, *, bias=None, residual=None, h0=None, cu=None, activation=None):
    """float64 ``(y [L, D], final [N, D, W])`` of packed sequences ``x [L, D]`` split at
    ``cu``: each sequence is read after its ``W`` previous inputs (``h0[n].T``, or zeros),
    ``y[t] = act(sum_j w[:, j] * x[t - (W - 1) + j] + bias) + residual[t]``, and its final
    state is the last ``W`` rows of ``[h0[n].T; x[lo:hi]]``."""
    x, w = x.double(), w.double()
    L, D = x.shape
    W = w.shape[1]
    cu = [0, L] if cu is None else cu
    y = torch.zeros(L, D, dtype=torch.float64)
    finals = []
    for n, (lo, hi) in enumerate(itertools.pairwise(cu)):
        before = torch.zeros(W, D, dtype=torch.float64) if h0 is None else h0[n].double().T
        padded = torch.cat([before, x[lo:hi]])  # row W + k is x[lo + k]
        for t in range(lo, hi):
            for j in range(W):
                y[t] = y[t] + w[:, j] * padded[W + (t - lo) - (W - 1) + j]
        finals.append(padded[-W:].T)
    if bias is not None:
        y = y + bias.double()
    if activation in ("silu", "swish"):
        y = torch.nn.functional.silu(y)
    if residual is not None:
        y = y + residual.double().reshape(L, D)
    return y, torch.stack(finals)


def _leaf(t, device, double=False):
    t = t.detach().clone()
    return (t.double() if double else t.to(device)).requires_grad_()


def _check(got, want, what, tol=1e-5):
    assert got.shape == want.shape, (what, got.shape, want.shape)
    err = (got.detach().double().cpu() - want.detach()).abs().max().item()
    assert err <= tol * (1 + want.detach().abs().max().item()), f"{what}: off by {err:.3g}"


def _case(width, B, T, D, *, cu=None, bias=False, residual=False, h0=False,
          final=False, activation="silu", strided_x=False, strided_dy=False, seed=0):
    """Inputs of one call: (tensors by name, the upstream gradients)."""
    g = torch.Generator().manual_seed(seed * 10 + width)
    if strided_x:  # a [B, T, D] view of a [B, D, T + 3] tensor
        x = torch.randn(B, D, T + 3, generator=g)[..., 1:T + 1].transpose(1, 2)
    else:
        x = torch.randn(B, T, D, generator=g)
    N = B if cu is None else len(cu) - 1
    named = {
        "x": x, "weight": torch.randn(D, width, generator=g) * 0.5,
        "bias": torch.randn(D, generator=g) if bias else None,
        "residual": torch.randn(B, T, D, generator=g) if residual else None,
        "initial_state": torch.randn(N, D, width, generator=g) if h0 else None,
    }
    dy = torch.randn(B, D, T, generator=g).transpose(1, 2) if strided_dy else (
        torch.randn(B, T, D, generator=g))
    dfinal = torch.randn(N, D, width, generator=g) if final else None
    return named, dy, dfinal


def _both(fn, named, dy, dfinal, device, *, cu=None, final=False, activation="silu"):
    """Run ``fn`` (the drop-in or fla) and the float64 definition on the same inputs:
    {name: (got, want)} for the outputs and the gradient of every given tensor."""
    ours = {k: None if v is None else _leaf(v, device) for k, v in named.items()}
    if named["x"].stride(-1) != 1:  # keep the caller's layout on the device too
        ours["x"] = named["x"].transpose(1, 2).contiguous().to(device).transpose(1, 2)
        ours["x"].requires_grad_()
    cu_t = None if cu is None else torch.tensor(cu, dtype=torch.int32, device=device)
    y, fin = fn(ours["x"], ours["weight"], bias=ours["bias"], residual=ours["residual"],
                initial_state=ours["initial_state"], output_final_state=final,
                activation=activation, cu_seqlens=cu_t)
    loss = (y * dy.to(device)).sum()
    if final:
        loss = loss + (fin * dfinal.to(device)).sum()
    loss.backward()
    ref = {k: None if v is None else _leaf(v, device, double=True) for k, v in named.items()}
    B, T, D = named["x"].shape
    cu_ref = [B * T * n // B for n in range(B + 1)] if cu is None else cu
    want_y, want_fin = by_definition(ref["x"].reshape(B * T, D), ref["weight"],
                                     bias=ref["bias"], residual=ref["residual"],
                                     h0=ref["initial_state"], cu=cu_ref, activation=activation)
    rloss = (want_y * dy.double().reshape(B * T, D)).sum()
    if final:
        rloss = rloss + (want_fin * dfinal.double()).sum()
    rloss.backward()
    pairs = {"y": (y.reshape(B * T, D), want_y)}
    if final:
        pairs["final_state"] = (fin, want_fin)
    for k, v in ours.items():
        if v is not None:
            pairs[f"d{k}"] = (v.grad, ref[k].grad)
    return pairs


WIDTHS = [2, 3, 4]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("strided", ["dy", "x-and-dy"])
def test_non_contiguous_dy_and_inputs(width, strided, device, caplog):
    """fla #871, #1139: a non-contiguous dy (and x), on kernel-fun's own kernels."""
    named, dy, _ = _case(width, 2, 21, 12, strided_dy=True, strided_x=strided == "x-and-dy")
    assert dy.stride(-1) != 1
    with caplog.at_level(logging.INFO, logger="kernel_fun"):
        got = _both(causal_conv1d, named, dy, None, device)
    _ours_ran(caplog)
    for what, (g, want) in got.items():
        _check(g, want, what)


def _ours_ran(caplog):
    """The call ran kernel-fun's kernels: engaged, and neither the gate nor the self-check
    sent it to fla (which would hide a wrong kernel behind fla's right answer)."""
    said = [r.getMessage() for r in caplog.records]
    assert any("engaged" in m for m in said), said
    assert not [m for r, m in zip(caplog.records, said, strict=True)
                if r.levelno >= logging.WARNING], said


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("T", [1, 2])
@pytest.mark.parametrize("states", [False, True])
def test_sequences_shorter_than_the_width(width, T, states, device, caplog):
    """fla #1141: T < W - 1 (and T = 1), on kernel-fun's kernels and, with an initial
    and a final state, on the path that takes them."""
    named, dy, dfinal = _case(width, 2, T, 8, h0=states, final=states)
    with caplog.at_level(logging.INFO, logger="kernel_fun"):
        got = _both(causal_conv1d, named, dy, dfinal, device, final=states)
    if not states:
        _ours_ran(caplog)
    for what, (g, want) in got.items():
        _check(g, want, what)


FEATURES = {  # what a call adds to x and weight
    "bias-no-activation": {"bias": True, "activation": None},
    "bias-silu-residual": {"bias": True, "residual": True},
    "initial-state": {"h0": True},
    "final-state": {"final": True, "bias": True},
    "both-states-residual": {"h0": True, "final": True, "residual": True},
}


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("feature", [
    # fla's initial-state forward kernel does not run in Triton's interpreter ("mask has
    # unsupported dtype"): that call goes to fla, so it is checked on a GPU only
    pytest.param(f, marks=pytest.mark.gpu) if f == "initial-state" else f for f in FEATURES])
def test_every_argument_against_the_definition(width, feature, device):
    """Bias, activation, residual, initial and final states, forward and every gradient
    (the upstream gradient reaches the final state too)."""
    f = dict(FEATURES[feature])
    activation = f.pop("activation", "silu")
    named, dy, dfinal = _case(width, 2, 13, 8, **f, activation=activation)
    got = _both(causal_conv1d, named, dy, dfinal, device, final=f.get("final", False),
                activation=activation)
    for what, (g, want) in got.items():
        _check(g, want, what)


#: sequences of lengths 5, 0, 1, 9, 9 packed over rows of 12 (a zero-length and a length-1)
PACKED = [0, 5, 5, 6, 15, 24]


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("rows", [1, 2])
@pytest.mark.parametrize("states", [False, True])
def test_packed_sequences(width, rows, states, device):
    """cu_seqlens with zero-length and length-1 sequences, over one row or (fla #955, open
    upstream: fla 0.6.0's dweight sums partials of which only row 0's are written) two,
    with bias, and with initial and final states."""
    named, dy, dfinal = _case(width, rows, 24 // rows, 16, cu=PACKED, bias=True, h0=states,
                              final=states)
    got = _both(causal_conv1d, named, dy, dfinal, device, cu=PACKED, final=states)
    for what, (g, want) in got.items():
        _check(g, want, what)


def test_fla_drops_the_final_state_gradient_and_the_drop_in_does_not(device):
    """Why the final-state calls with gradients do not go to fla: fla-core 0.6.0 loses the
    gradient that reaches x[T - W] through final_state[..., 0]. If this starts failing, fla
    has fixed it and kernel_fun.ops.cconv.exact.why_exact can hand those calls back."""
    named, _, dfinal = _case(4, 1, 10, 4, final=True)
    dy = torch.zeros(1, 10, 4)  # only the final state's gradient flows
    fla = _both(fla_conv(), named, dy, dfinal, device, final=True)
    ours = _both(causal_conv1d, named, dy, dfinal, device, final=True)
    got, want = fla["dx"]
    assert torch.equal(got[0, 10 - 4].cpu(), torch.zeros(4))  # fla: nothing reaches x[T-W]
    assert want[0, 10 - 4].abs().min() > 0
    _check(*ours["dx"], "ours dx")


def test_registered_as_fla_backend_the_final_state_gradient_is_right(device):
    """Registered as fla's backend, kernel-fun takes fla's backward when a final-state
    gradient is given (fla's own kernel drops part of it), with initial state and bias."""
    import kernel_fun

    named, dy, dfinal = _case(3, 2, 9, 8, bias=True, h0=True, final=True)
    with kernel_fun.install(mode="register"):
        got = _both(fla_conv(), named, dy, dfinal, device, final=True)
    for what, (g, want) in got.items():
        _check(g, want, what)
