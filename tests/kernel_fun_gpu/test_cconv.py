"""kernel_fun.cconv.causal_conv1d against fla and a PyTorch reference, the gate, the
fallback, logging, torch.compile and CUDA-graph rules (Triton's interpreter on CPU)."""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys

import pytest
import torch

from kernel_fun import _support
from kernel_fun.cconv import causal_conv1d, is_supported, reference_causal_conv1d, warmup
from tests.kernel_fun_gpu.conftest import err_ratio, fla_conv

TOL = {torch.float16: 1e-3, torch.float32: 1e-6,  # measured in the interpreter: ~2e-4, ~1e-7
       torch.bfloat16: 8e-3}  # bf16 keeps 8 bits: ~4x fp16's rounding error per output
# The interpreter has no bf16 arithmetic: the bf16 cases are marked gpu and show as
# skipped, with the reason, everywhere else.
DTYPES = [
    pytest.param(torch.float16, id="float16"),
    pytest.param(torch.float32, id="float32"),
    pytest.param(torch.bfloat16, id="bfloat16", marks=pytest.mark.gpu),
]

SHAPES = [  # (B, T, D, W, non_contiguous)
    (2, 37, 24, 4, False),   # T not a multiple of the block, D not a power of two
    (1, 3, 16, 4, False),    # T < W
    (2, 20, 10, 1, False),
    (2, 20, 10, 2, True),    # x a strided view
    (1, 33, 20, 3, True),
    (3, 100, 8, 4, False),   # several tiles per backward strip
]


def _inputs(B, T, D, W, non_contiguous, dtype, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    if non_contiguous:  # [B, T, D] view of a [B, D, T + 5] tensor: strides (D*(T+5), 1, T+5)
        base = torch.randn(B, D, T + 5, generator=g, dtype=dtype)[..., 2:T + 2]
        x = base.transpose(1, 2).to(device)
    else:
        x = torch.randn(B, T, D, generator=g, dtype=dtype).to(device)
    w = (torch.randn(D, W, generator=g, dtype=dtype) * 0.5).to(device)
    dy = torch.randn(B, T, D, generator=g, dtype=dtype).to(device)
    return x.requires_grad_(), w.requires_grad_(), dy


def _run(fn, x, w, dy):
    x.grad = w.grad = None
    y, state = fn(x, w, activation="silu")
    y.backward(dy)
    return y.detach(), x.grad.detach(), w.grad.detach(), state


def _ids(p):
    B, T, D, W, nc = p
    return f"B{B}-T{T}-D{D}-W{W}" + ("-strided" if nc else "")


class TestAgainstReferences:
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("shape", SHAPES, ids=[_ids(s) for s in SHAPES])
    def test_forward_and_gradients(self, shape, dtype, device):
        """y, dx and dw match fla's causal_conv1d and a float32 PyTorch reference."""
        B, T, D, W, nc = shape
        x, w, dy = _inputs(B, T, D, W, nc, dtype, device)
        assert is_supported(x, w, activation="silu") == (True, "")
        y, dx, dw, state = _run(causal_conv1d, x, w, dy)
        assert state is None and y.shape == (B, T, D) and y.dtype == dtype and dw.dtype == dtype
        assert _support.is_warm(("fwd", (B, T, D), x.stride(), dtype, dtype, str(x.device)))
        fy, fdx, fdw, _ = _run(fla_conv(), x, w, dy)
        xr = x.detach().float().requires_grad_()
        wr = w.detach().float().requires_grad_()
        ry = reference_causal_conv1d(xr, wr)
        ry.backward(dy.float())
        tol = TOL[dtype]
        for name, ours, fla, ref in (("y", y, fy, ry), ("dx", dx, fdx, xr.grad), ("dw", dw, fdw, wr.grad)):
            assert err_ratio(ref, ours) <= tol, f"{name} vs reference: {err_ratio(ref, ours):.2e}"
            assert err_ratio(fla, ours) <= 2 * tol, f"{name} vs fla: {err_ratio(fla, ours):.2e}"

    def test_a_wrong_kernel_would_be_caught(self, device):
        """The tolerance separates a one-tap shift from the right answer (the test can fail)."""
        x, w, dy = _inputs(2, 37, 24, 4, False, torch.float16, device)
        y, *_ = _run(causal_conv1d, x, w, dy)
        shifted = reference_causal_conv1d(x.detach().float(), torch.roll(w.detach().float(), 1, dims=1))
        assert err_ratio(shifted, y) > 50 * TOL[torch.float16]


class TestGate:
    @pytest.mark.parametrize(
        ("kwargs", "reason"),
        [
            ({"activation": None}, "activation=None: kernel-fun implements silu/swish only"),
            ({"bias": "B"}, "bias is given"),
            ({"residual": "X"}, "residual is given"),
            ({"initial_state": "S"}, "initial_state is given"),
            ({"output_final_state": True}, "output_final_state=True"),
            ({"backend": "cuda"}, "backend='cuda'"),
            ({"cu_seqlens": "C"}, "cu_seqlens is given"),
            ({"cp_context": object()}, "cp_context is given"),
            ({"seq_idx": 3}, r"unknown argument\(s\) \['seq_idx'\]: fla may have grown a flag"),
        ],
        ids=["activation", "bias", "residual", "state", "final-state", "backend", "varlen", "cp", "unknown"],
    )
    def test_each_unsupported_argument_has_its_reason(self, kwargs, reason, device):
        """Every fla argument outside the box forces the fallback, with a log-ready reason."""
        x, w, _ = _inputs(1, 8, 16, 4, False, torch.float16, device)
        values = {"B": torch.zeros(16), "X": torch.zeros_like(x), "S": torch.zeros(1, 16, 4),
                  "C": torch.tensor([0, 8])}
        args = {"activation": "silu", **{k: values.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}}
        ok, why = is_supported(x, w, **args)
        assert not ok
        import re

        assert re.search(reason, why), why

    def test_shape_dtype_and_width_reasons(self, device):
        """W > 4, wrong weight shape, 2-D x and integer x are refused with their reasons."""
        x, w, _ = _inputs(1, 8, 16, 4, False, torch.float16, device)
        assert "W=5" in is_supported(x, torch.zeros(16, 5, dtype=torch.float16), activation="silu")[1]
        assert "weight has shape (8, 4)" in is_supported(x, torch.zeros(8, 4), activation="silu")[1]
        assert "takes [B, T, D]" in is_supported(x[0], w, activation="silu")[1]
        xi = torch.zeros(1, 8, 16, dtype=torch.int32)
        assert "torch.int32" in is_supported(xi, w, activation="silu")[1]

    def test_no_gpu_without_the_interpreter_switch(self, monkeypatch, device):
        """On a machine without CUDA and without the switch, the reason says so."""
        if device != "cpu":
            pytest.skip("CPU-only behaviour")
        monkeypatch.setenv("KERNEL_FUN_INTERPRET", "0")
        x, w, _ = _inputs(1, 8, 16, 4, False, torch.float16, device)
        assert is_supported(x, w, activation="silu") == (
            False, "CUDA is not available on this machine, so kernel-fun uses fla.")


class TestFallback:
    @pytest.mark.parametrize("case", ["bias", "no-activation", "final-state"])
    def test_fallback_is_bit_identical_to_fla(self, case, device):
        """Outside the box the caller's arguments go to fla untouched: equal bit for bit
        (a final state without gradients: inference, where fla's answer is right)."""
        x, w, _ = _inputs(2, 19, 16, 4, False, torch.float32, device)
        kwargs = {"bias": {"bias": torch.randn(16, device=device), "activation": "silu"},
                  "no-activation": {},
                  "final-state": {"activation": "silu", "output_final_state": True}}[case]
        with torch.no_grad() if case == "final-state" else contextlib.nullcontext():
            ours = causal_conv1d(x, w, **kwargs)
            theirs = fla_conv()(x, w, **kwargs)
        assert torch.equal(ours[0], theirs[0])
        assert (ours[1] is None) == (theirs[1] is None)
        if ours[1] is not None:
            assert torch.equal(ours[1], theirs[1])

    def test_reasons_and_shapes_are_logged_once(self, caplog, device):
        """Each distinct fallback reason: one WARNING; the engaged call's shapes: one INFO."""
        x, w, _ = _inputs(1, 8, 16, 4, False, torch.float32, device)
        with caplog.at_level(logging.INFO, logger="kernel_fun"):
            for _ in range(3):
                causal_conv1d(x, w)                       # activation None -> fla
                causal_conv1d(x, w, activation="silu")    # engaged
            causal_conv1d(x, w, activation="silu", output_final_state=True)
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert len(warnings) == 2
        assert "activation=None" in warnings[0] and "output_final_state=True" in warnings[1]
        assert sum("engaged: x (1, 8, 16) torch.float32" in m for m in infos) == 1
        assert sum("kernel-fun running with torch" in m for m in infos) == 1


class TestCompileAndGraphs:
    def test_torch_compile_sees_one_graph_break(self, device):
        """Under torch.compile the op is opaque: one graph break, same values as eager."""
        x, w, _ = _inputs(1, 8, 16, 4, False, torch.float32, device)

        def f(x, w):
            y, _ = causal_conv1d(x * 2.0, w, activation="silu")
            return y + 1.0

        explanation = torch._dynamo.explain(f)(x.detach(), w.detach())
        assert explanation.graph_break_count == 1
        compiled = torch.compile(f, backend="eager")
        assert torch.equal(compiled(x.detach(), w.detach()), f(x.detach(), w.detach()))

    def test_capture_admits_only_warm_shapes(self, monkeypatch, device):
        """During CUDA-graph capture, a shape runs here only after an eager forward (and
        backward when gradients are needed); otherwise it falls back, saying why."""
        x, w, dy = _inputs(1, 8, 16, 4, False, torch.float32, device)
        monkeypatch.setattr(_support, "is_capturing", lambda: True)
        ok, why = is_supported(x, w, activation="silu")
        assert not ok and "has not run eagerly yet (forward and backward)" in why
        monkeypatch.setattr(_support, "is_capturing", lambda: False)
        y, _ = causal_conv1d(x, w, activation="silu")
        monkeypatch.setattr(_support, "is_capturing", lambda: True)
        assert "backward" in is_supported(x, w, activation="silu")[1]
        with torch.no_grad():
            assert is_supported(x, w, activation="silu") == (True, "")
        monkeypatch.setattr(_support, "is_capturing", lambda: False)
        y.backward(dy)
        monkeypatch.setattr(_support, "is_capturing", lambda: True)
        assert is_supported(x, w, activation="silu") == (True, "")


class TestWarmup:
    def test_warmup_runs_both_kernels(self, device):
        """warmup runs forward and backward for each D (both become warm) and returns
        the seconds it took."""
        dtype = torch.float32 if device == "cpu" else torch.bfloat16
        for D in (16, 24):
            for kind in ("fwd", "bwd"):
                assert not _support.is_warm((kind, (1, 8, D), (8 * D, D, 1), dtype, dtype, device))
        seconds = warmup(B=1, T=8, D=(16, 24), W=4, dtype=dtype, device=device)
        assert isinstance(seconds, float)
        for D in (16, 24):
            for kind in ("fwd", "bwd"):
                assert _support.is_warm((kind, (1, 8, D), (8 * D, D, 1), dtype, dtype, device))

    def test_warmup_raises_when_it_would_fall_back(self, monkeypatch, device):
        """A warm-up that would run fla says so and names the debug switch."""
        monkeypatch.setenv("KERNEL_FUN_INTERPRET", "0")
        if device != "cpu":
            pytest.skip("CPU-only behaviour")
        with pytest.raises(RuntimeError, match=r"falls back to fla: CUDA is not available.*KERNEL_FUN_DEBUG=1"):
            warmup(B=1, T=8, D=16, dtype=torch.float32, device="cpu")


def test_import_is_cheap():
    """import kernel_fun, its op records, an op's package and the Diffract plugin import
    neither torch, triton nor fla."""
    code = ("import sys, kernel_fun, kernel_fun.ops, kernel_fun.ops.cconv, kernel_fun._diffract;"
            "print('torch' in sys.modules, 'triton' in sys.modules, 'fla' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False False"


def test_the_old_import_path_is_the_op():
    """`from kernel_fun.cconv import causal_conv1d` is the op of kernel_fun.ops.cconv."""
    import kernel_fun.cconv as old
    import kernel_fun.ops.cconv as new

    for name in ("causal_conv1d", "is_supported", "warmup", "reference_causal_conv1d"):
        assert getattr(old, name) is getattr(new, name)


def test_a_cpu_call_fla_cannot_run_says_so_before_reaching_fla(monkeypatch):
    """Outside Triton's interpreter a CPU tensor runs neither kernel-fun nor fla (whose
    kernels are Triton kernels too): the call that would go to fla says so, and how to
    run both on a CPU, instead of dying inside Triton with '0 active drivers'."""
    import kernel_fun.ops.cconv.op as cconv_op
    import kernel_fun.ops.kda.op as kda_op

    def never():
        raise AssertionError("fla was called")

    monkeypatch.setattr(cconv_op, "_fla_causal_conv1d", never)
    monkeypatch.setattr(kda_op, "_fla_chunk_kda", never)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    said = r"goes to fla, whose kernels .* need a CUDA GPU.*TRITON_INTERPRET=1 and " \
        r"KERNEL_FUN_INTERPRET=1"
    x, w = torch.randn(1, 8, 16), torch.randn(16, 4)
    with pytest.raises(RuntimeError, match=r"kernel-fun causal_conv1d: this call " + said):
        cconv_op.causal_conv1d(x, w, activation=None)
    from kernel_fun.kda import chunk_kda

    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(RuntimeError, match=r"kernel-fun chunk_kda: this call " + said):
        chunk_kda(q, q, q, -torch.rand(1, 8, 2, 16), torch.rand(1, 8, 2))
