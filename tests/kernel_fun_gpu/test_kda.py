"""kernel_fun.kda.chunk_kda against autograd through fla's naive_recurrent_kda (and our own
step-by-step reference): outputs, final state and every gradient, on small odd shapes,
fp32 and fp16 (bf16 on a GPU), with each in-op option; the gate, the fallback with the
caller's arguments untouched, logging, torch.compile and CUDA-graph rules. Triton's
interpreter on the CPU (tests/conftest.py sets the switches)."""

from __future__ import annotations

import logging
import re
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

from kernel_fun import _support, adopt
from kernel_fun.kda import chunk_kda, fla_probe, is_supported, reference_chunk_kda, warmup
from kernel_fun.ops.kda import _triton
from tests.kernel_fun_gpu.conftest import DEVICE, err_ratio

# Relative RMS error allowed (fla's tests allow 0.005 for o and the state, 0.008-0.02 for
# gradients). In the interpreter both sides compute in float32 from the same rounded
# inputs, so ours are far tighter: measured ~4e-7 in fp32 (up to 1.1e-5 for dt_bias, a
# sum over B and T with cancellation) and ~3e-4 in fp16 (the rounding of the fp16 outputs
# and gradients). On a GPU, tl.dot runs fp32 operands as tf32.
if DEVICE == "cpu":
    TOL = {torch.float32: 5e-5, torch.float16: 2e-3}
else:
    TOL = {torch.float32: 5e-3, torch.float16: 5e-3, torch.bfloat16: 1e-2}
DTYPES = [
    pytest.param(torch.float16, id="float16"),
    pytest.param(torch.float32, id="float32"),
    pytest.param(torch.bfloat16, id="bfloat16", marks=pytest.mark.gpu),
]

SHAPES = [  # (B, T, H, HV, K, V)
    (2, 70, 1, 2, 16, 24),    # T not a multiple of the chunk, HV = 2H, K != V, B = 2
    (1, 30, 2, 2, 8, 16),     # T < chunk, K below the smallest tile
    (1, 128, 1, 1, 20, 40),   # two whole chunks, K and V not powers of two
]


def _ids(s):
    return "B{}-T{}-H{}-HV{}-K{}-V{}".format(*s)


def _inputs(B, T, H, HV, K, V, dtype, seed=0, gate=False, state=True):
    gen = torch.Generator().manual_seed(seed)

    def rnd(*shape, dt=dtype):
        return torch.randn(*shape, generator=gen, dtype=torch.float32).to(dt)

    x = {
        "q": rnd(B, T, H, K),
        "k": F.normalize(rnd(B, T, H, K, dt=torch.float32), dim=-1).to(dtype),
        "v": rnd(B, T, HV, V),
        # a precomputed gate: log-decays in (-inf, 0); raw logits for the in-op gate
        "g": rnd(B, T, HV, K, dt=torch.float32) if gate
        else F.logsigmoid(rnd(B, T, HV, K, dt=torch.float32) + 2.0),
        "beta": torch.rand(B, T, HV, generator=gen).to(dtype),
        "A_log": rnd(HV, dt=torch.float32) * 0.5,
        "dt_bias": rnd(HV * K, dt=torch.float32) * 0.5,
    }
    if state:
        x["initial_state"] = rnd(B, HV, K, V, dt=torch.float32) * 0.5
    grads = {"do": rnd(B, T, HV, V), "dht": rnd(B, HV, K, V, dt=torch.float32)}
    return {n: t.to(DEVICE) for n, t in x.items()}, {n: t.to(DEVICE) for n, t in grads.items()}


def _leaves(x, names):
    return {n: (t.detach().clone().requires_grad_() if n in names else t) for n, t in x.items()}


def _fla_reference(x, grads, opts):
    """Autograd through fla's naive_recurrent_kda, the in-op options composed from fla's
    gate references, a plain l2 normalisation and a sigmoid."""
    from fla.ops.kda.gate import naive_kda_gate, naive_kda_lowerbound_gate
    from fla.ops.kda.naive import naive_recurrent_kda

    q, k, g, beta = x["q"], x["k"], x["g"], x["beta"]
    if opts.get("use_qk_l2norm_in_kernel"):
        q, k = F.normalize(q.float(), dim=-1), F.normalize(k.float(), dim=-1)
    if opts.get("use_gate_in_kernel"):
        A_log, bias = opts.get("A_log"), opts.get("dt_bias")
        if opts.get("lower_bound") is None:
            g = naive_kda_gate(g, A_log, bias)
        else:
            g = naive_kda_lowerbound_gate(g, A_log, bias, opts["lower_bound"])
    if opts.get("use_beta_sigmoid_in_kernel"):
        beta = torch.sigmoid(beta.float()) * (2.0 if opts.get("allow_neg_eigval") else 1.0)
    h0 = opts.get("initial_state")
    v_first = opts.get("state_v_first", False)
    o, ht = naive_recurrent_kda(q, k, x["v"], g, beta, scale=opts.get("scale"),
                                initial_state=h0.transpose(-1, -2) if v_first and h0 is not None else h0,
                                output_final_state=True)
    return o, (ht.transpose(-1, -2) if v_first else ht)


def _loss(o, ht, grads, opts):
    loss = (o.float() * grads["do"].float()).sum()
    if opts.get("output_final_state"):
        dht = grads["dht"].transpose(-1, -2) if opts.get("state_v_first") else grads["dht"]
        loss = loss + (ht * dht).sum()
    return loss


def _case(shape, dtype, seed=0, gate=False, strided=False, **opts):
    """Run ours and the reference on the same leaves; the relative RMS errors by name.
    ``strided``: q, k, v, g are [B, H, T, .] tensors seen as [B, T, H, .] (not contiguous)."""
    x, grads = _inputs(*shape, dtype, seed=seed, gate=gate)
    if strided:
        for n in ("q", "k", "v", "g"):
            x[n] = x[n].transpose(1, 2).contiguous().transpose(1, 2)
            assert not x[n].is_contiguous()
    names = ["q", "k", "v", "g", "beta"]
    if "initial_state" in opts:
        opts["initial_state"] = x["initial_state"]
        if opts.get("state_v_first"):
            opts["initial_state"] = x["initial_state"].transpose(-1, -2).contiguous()
        names.append("initial_state")
    if opts.get("use_gate_in_kernel"):
        for n in ("A_log", "dt_bias"):
            if opts.get(n, True) is not None:
                opts[n] = x[n]
                names.append(n)
            else:
                opts.pop(n)
    errors, outputs = {}, []
    for which in ("ours", "reference"):
        leaves = _leaves({**x, **{n: opts[n] for n in ("initial_state", "A_log", "dt_bias") if n in opts}}, names)
        run_opts = {**opts, **{n: leaves[n] for n in ("initial_state", "A_log", "dt_bias") if n in opts}}
        if which == "ours":
            assert is_supported(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"],
                                **run_opts) == (True, "")
            o, ht = chunk_kda(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], **run_opts)
            assert o.dtype == dtype and o.shape == x["v"].shape
            assert (ht is None) == (not opts.get("output_final_state"))
        else:
            o, ht = _fla_reference(leaves, grads, run_opts)
        _loss(o, ht, grads, opts).backward()
        outputs.append((o, ht, {n: leaves[n].grad for n in names}))
    (o, ht, dx), (ro, rht, rdx) = outputs
    errors["o"] = err_ratio(ro, o)
    if ht is not None:
        errors["ht"] = err_ratio(rht, ht)
    for n in names:
        assert dx[n].dtype == leaves[n].dtype and dx[n].shape == leaves[n].shape, n
        errors["d" + n] = err_ratio(rdx[n], dx[n])
    return errors


def _check(errors, dtype):
    bad = {n: f"{e:.2e}" for n, e in errors.items() if not e <= TOL[dtype]}
    assert not bad, f"relative RMS errors above {TOL[dtype]:.0e}: {bad}"


class TestAgainstFlaNaive:
    @pytest.mark.parametrize("dtype", DTYPES)
    @pytest.mark.parametrize("shape", SHAPES, ids=[_ids(s) for s in SHAPES])
    def test_outputs_state_and_gradients(self, shape, dtype):
        """o, the final state and the gradients of q, k, v, g, beta and the initial state."""
        _check(_case(shape, dtype, initial_state=True, output_final_state=True), dtype)

    def test_without_state(self):
        """No initial state, no final state: o and the gradients of q, k, v, g, beta."""
        errors = _case(SHAPES[0], torch.float32)
        assert set(errors) == {"o", "dq", "dk", "dv", "dg", "dbeta"}
        _check(errors, torch.float32)

    def test_strided_inputs_and_a_final_state_from_zero(self):
        """q, k, v, g as strided views (a [B, H, T, K] layout), no initial state but the
        final state asked for."""
        errors = _case((1, 70, 2, 2, 16, 24), torch.float32, strided=True, output_final_state=True)
        assert "ht" in errors and "dinitial_state" not in errors
        _check(errors, torch.float32)

    def test_disable_recompute_keeps_the_states(self, monkeypatch):
        """disable_recompute=True: the forward keeps the chunk states, the backward runs
        no second forward scan, and the numbers are the same."""
        monkeypatch.setenv("KERNEL_FUN_SELF_CHECK", "0")  # its probe launches them too
        scans = []
        real = _triton._launch

        def counting(kernel, *args, **kwargs):
            scans.append(kernel.fn.__name__) if kernel.fn.__name__.startswith("_scan") else None
            return real(kernel, *args, **kwargs)

        monkeypatch.setattr(_triton, "_launch", counting)
        _check(_case(SHAPES[0], torch.float32, initial_state=True, output_final_state=True,
                     disable_recompute=True), torch.float32)
        assert scans == ["_scan_fwd_kernel", "_scan_bwd_kernel"]

    def test_state_v_first_and_a_scale(self):
        """The [V, K] state layout in and out, and a caller's scale."""
        _check(_case(SHAPES[0], torch.float32, initial_state=True, output_final_state=True,
                     state_v_first=True, scale=0.3), torch.float32)

    @pytest.mark.parametrize("dtype", DTYPES)
    def test_l2norm_and_beta_sigmoid_in_the_op(self, dtype):
        """use_qk_l2norm_in_kernel and use_beta_sigmoid_in_kernel (with allow_neg_eigval)."""
        _check(_case(SHAPES[0], dtype, seed=1, initial_state=True, output_final_state=True,
                     use_qk_l2norm_in_kernel=True, use_beta_sigmoid_in_kernel=True,
                     allow_neg_eigval=True), dtype)

    @pytest.mark.parametrize(
        "gate_opts",
        [{}, {"lower_bound": -5.0}, {"lower_bound": -3.0, "A_log": None, "dt_bias": None},
         {"lower_bound": -5.0, "safe_gate": True}],
        ids=["softplus", "lower-bound", "lower-bound-no-A-no-bias", "safe-gate"],
    )
    def test_gate_in_the_op(self, gate_opts):
        """The gate from A_log and dt_bias (both forms), with their gradients."""
        errors = _case(SHAPES[0], torch.float32, seed=2, gate=True, use_gate_in_kernel=True,
                       output_final_state=True, initial_state=True, **gate_opts)
        assert ("dA_log" in errors) == (gate_opts.get("A_log", True) is not None)
        _check(errors, torch.float32)

    def test_strongly_decaying_gates_stay_finite(self):
        """Gates far below zero (exp(G) underflows within a chunk): every exponent the
        kernels take is of a non-positive difference, so nothing overflows."""
        x, _ = _inputs(1, 70, 1, 1, 16, 16, torch.float32)
        g = torch.full_like(x["g"], -30.0)
        o, ht = chunk_kda(x["q"], x["k"], x["v"], g, x["beta"], output_final_state=True)
        ro, rht = reference_chunk_kda(x["q"], x["k"], x["v"], g, x["beta"], output_final_state=True)
        assert torch.isfinite(o).all() and err_ratio(ro, o) < TOL[torch.float32]
        assert err_ratio(rht, ht) < TOL[torch.float32]

    def test_a_decay_one_step_off_is_caught(self, monkeypatch):
        """A kernel whose chunk sums of the gate stop one step short (each step misses
        its own decay) fails these comparisons by far: measured ~0.19-0.27 relative
        error on every output and gradient, against tolerances of 5e-5 (interpreter) and
        5e-3 (GPU). The tests can fail."""
        monkeypatch.setenv("KERNEL_FUN_SELF_CHECK", "0")  # it would send the call to fla
        real = _triton.gate_cumsum

        def one_step_off(g, a_log, dt_bias, lower_bound, gate):
            return real(g, a_log, dt_bias, lower_bound, gate) - g.float()

        monkeypatch.setattr(_triton, "gate_cumsum", one_step_off)
        errors = _case(SHAPES[0], torch.float32, initial_state=True, output_final_state=True)
        assert min(errors.values()) > 20 * TOL[torch.float32], errors
        with pytest.raises(AssertionError, match="relative RMS errors above"):
            _check(errors, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("in_op", [False, True], ids=["precomputed-gate", "gate-and-norm-in-op"])
def test_bf16_against_naive_and_flas_chunk_kda(in_op):
    """On a GPU, in bf16, at a shape with several chunks and a partial last one: output,
    final state and every gradient within fla's own tolerances of the float32 recurrence
    (fla's naive_recurrent_kda), and within twice them of fla's chunk_kda."""
    shape = (2, 1000, 2, 4, 128, 128)
    opts = {"initial_state": True, "output_final_state": True}
    if in_op:
        opts.update(use_gate_in_kernel=True, use_qk_l2norm_in_kernel=True)
    x, grads = _inputs(*shape, torch.bfloat16, gate=in_op)
    names = ["q", "k", "v", "g", "beta", "initial_state"] + (["A_log", "dt_bias"] if in_op else [])
    results = []
    for fn in (chunk_kda, adopt.original("chunk_kda"), None):
        leaves = _leaves(x, names)
        run = {**opts, **{n: leaves[n] for n in names[5:]}}
        if fn is None:
            o, ht = _fla_reference(leaves, grads, run)
        else:
            o, ht = fn(leaves["q"], leaves["k"], leaves["v"], leaves["g"], leaves["beta"], **run)
        _loss(o, ht, grads, opts).backward()
        results.append([o, ht] + [leaves[n].grad for n in names])
    bad = {}
    for n, ours, fla, ref in zip(["o", "ht"] + names, *results, strict=True):
        tol = 0.005 if n in ("o", "ht") else 0.02
        if not (err_ratio(ref, ours) <= tol and err_ratio(fla, ours) <= 2 * tol):
            bad[n] = f"{err_ratio(ref, ours):.2e} vs naive, {err_ratio(fla, ours):.2e} vs fla"
    assert not bad, f"relative RMS errors above fla's tolerances: {bad}"


def test_launch_settings_can_be_changed_for_tuning(monkeypatch):
    """set_launch (and KERNEL_FUN_KDA_LAUNCH) change a kernel's tiles; the results do not
    change; a typo is refused with the known names."""
    monkeypatch.setattr(_triton, "LAUNCH", {k: dict(v) for k, v in _triton.LAUNCH.items()})
    _triton.set_launch({"_scan_fwd_kernel": {"BV": 16}, "_intra_bwd_kernel": {"BK": 16}})
    assert _triton.LAUNCH["_scan_fwd_kernel"]["BV"] == 16
    _check(_case(SHAPES[0], torch.float32, initial_state=True, output_final_state=True),
           torch.float32)
    with pytest.raises(ValueError, match="no kernel '_scan_kernel' in LAUNCH"):
        _triton.set_launch({"_scan_kernel": {"BV": 16}})
    with pytest.raises(ValueError, match=r"takes \['BK', 'num_stages', 'num_warps'\], not \['BV'\]"):
        _triton.set_launch({"_intra_bwd_kernel": {"BV": 16}})
    with pytest.raises(ValueError, match="positive integers"):
        _triton.set_launch({"_intra_bwd_kernel": {"BK": 0}})


def test_our_reference_is_fla_naive():
    """reference_chunk_kda (ours, step by step, with the in-op options) agrees with fla's
    naive recurrence plus fla's gate reference."""
    from fla.ops.kda.gate import naive_kda_gate
    from fla.ops.kda.naive import naive_recurrent_kda

    x, _ = _inputs(2, 20, 1, 2, 8, 12, torch.float32, gate=True)
    o, ht = reference_chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], initial_state=x["initial_state"],
                                output_final_state=True, use_gate_in_kernel=True,
                                A_log=x["A_log"], dt_bias=x["dt_bias"])
    ro, rht = naive_recurrent_kda(x["q"], x["k"], x["v"], naive_kda_gate(x["g"], x["A_log"], x["dt_bias"]),
                                  x["beta"], initial_state=x["initial_state"], output_final_state=True)
    assert err_ratio(ro, o) < 1e-6 and err_ratio(rht, ht) < 1e-6


class TestGate:
    @pytest.mark.parametrize(
        ("kwargs", "reason"),
        [
            ({"cu_seqlens": "C"}, "cu_seqlens is given"),
            ({"cu_seqlens_cpu": "C"}, "cu_seqlens_cpu is given"),
            ({"cp_context": object()}, "cp_context is given"),
            ({"max_num_seqs": 2}, "max_num_seqs is given"),
            ({"use_graph": True}, "use_graph=True"),
            ({"return_intermediate_states": True}, "return_intermediate_states=True"),
            ({"chunk_size": 32}, "chunk_size=32"),
            ({"allow_neg_eigval": True}, "allow_neg_eigval=True without use_beta_sigmoid"),
            ({"use_gate_in_kernel": True}, "without A_log or lower_bound"),
            ({"use_gate_in_kernel": True, "A_log": "A", "safe_gate": True}, "lower_bound in"),
            ({"initial_state": "S16"}, "initial_state is not a float32 tensor"),
            ({"initial_state": "Swrong"}, r"initial_state has shape \(1, 2, 16, 24\)"),
            ({"scale": torch.tensor(0.5)}, "scale is Tensor"),
            ({"transpose_state_layout": True, "state_v_first": True}, "fla refuses the two"),
            ({"a_new_flag": True}, r"unknown argument\(s\) \['a_new_flag'\]"),
        ],
    )
    def test_each_unsupported_argument_has_its_reason(self, kwargs, reason):
        """Every fla argument outside the box forces the fallback, with a log-ready reason."""
        x, _ = _inputs(1, 8, 1, 2, 16, 24, torch.float32, state=False)
        values = {"C": torch.tensor([0, 8]), "A": torch.zeros(2),
                  "S16": torch.zeros(1, 2, 16, 24, dtype=torch.float16),
                  "Swrong": torch.zeros(1, 2, 16, 24)}
        args = {k: values.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
        if kwargs.get("initial_state") == "Swrong":
            args["state_v_first"] = True
        ok, why = is_supported(x["q"], x["k"], x["v"], x["g"], x["beta"], **args)
        assert not ok and re.search(reason, why), why

    def test_shape_and_dtype_reasons(self):
        x, _ = _inputs(1, 8, 2, 2, 16, 24, torch.float32, state=False)
        q, k, v, g, beta = x["q"], x["k"], x["v"], x["g"], x["beta"]
        assert "not a multiple of H=2" in is_supported(q, k, v[:, :, :1], g[:, :, :1], beta[:, :, :1])[1]
        big = torch.zeros(1, 8, 2, 300)
        assert "K=300" in is_supported(big, big, v, torch.zeros(1, 8, 2, 300), beta)[1]
        assert "do not agree" in is_supported(q, k[:, :4], v, g, beta)[1]
        assert "are torch.float32, torch.float16" in is_supported(q, k.half(), v, g, beta)[1]
        assert "g is torch.int32" in is_supported(q, k, v, g.int(), beta)[1]
        assert "is not a tensor" in is_supported(q, k, v, g, 0.5)[1]
        assert "empty dimension" in is_supported(q[:, :0], k[:, :0], v[:, :0], g[:, :0], beta[:, :0])[1]
        # a sequence too long for the kernels' 32-bit offsets within it (meta tensors:
        # no memory is allocated for the 2**31 elements)
        T = 2**31 // (2 * 256) + 1
        mq = torch.empty(1, T, 2, 16, device="meta")
        ok, why = is_supported(mq, mq, torch.empty(1, T, 2, 16, device="meta"),
                               torch.empty(1, T, 2, 16, device="meta"),
                               torch.empty(1, T, 2, device="meta"))
        assert not ok and "32-bit offsets" in why, why

    def test_no_gpu_without_the_interpreter_switch(self, monkeypatch):
        if DEVICE != "cpu":
            pytest.skip("CPU-only behaviour")
        monkeypatch.setenv("KERNEL_FUN_INTERPRET", "0")
        x, _ = _inputs(1, 8, 1, 1, 16, 16, torch.float32, state=False)
        assert is_supported(x["q"], x["k"], x["v"], x["g"], x["beta"]) == (
            False, "CUDA is not available on this machine, so kernel-fun uses fla.")


class TestFallback:
    @pytest.mark.parametrize(
        "kwargs",
        [{"cu_seqlens": "C"}, {"chunk_size": 32}, {"a_new_flag": True},
         {"output_final_state": True, "initial_state": "S16"}],
        ids=["varlen", "chunk32", "unknown", "fp16-state"],
    )
    def test_fla_receives_exactly_the_callers_arguments(self, kwargs, monkeypatch):
        """Outside the box fla's chunk_kda is called with the very objects the caller
        passed (fla's own kernels do not run in the interpreter, so it is a recorder here)."""
        x, _ = _inputs(1, 8, 1, 2, 16, 24, torch.float32, state=False)
        values = {"C": torch.tensor([0, 8]), "S16": torch.zeros(1, 2, 16, 24, dtype=torch.float16)}
        args = {k: values.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
        seen = {}
        sentinel = (object(), object())

        def recorder(**kw):
            seen.update(kw)
            return sentinel

        monkeypatch.setattr(adopt, "original", lambda name: recorder)
        got = chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], **args)
        assert got is sentinel
        for name in ("q", "k", "v", "g", "beta"):
            assert seen.pop(name) is x[name]
        for name, value in args.items():
            assert seen.pop(name) is value
        defaults = {"scale": None, "initial_state": None, "output_final_state": False,
                    "use_qk_l2norm_in_kernel": False, "use_gate_in_kernel": False,
                    "use_beta_sigmoid_in_kernel": False, "allow_neg_eigval": False,
                    "safe_gate": False, "lower_bound": None, "disable_recompute": False,
                    "return_intermediate_states": False, "state_v_first": False,
                    "cu_seqlens": None, "cu_seqlens_cpu": None, "cp_context": None,
                    "use_graph": False, "max_num_seqs": None}
        assert seen == {n: v for n, v in defaults.items() if n not in args}

    def test_bad_input_gets_flas_error(self):
        """A call fla refuses is refused by fla (its message), not silently run."""
        x, _ = _inputs(1, 8, 1, 1, 16, 16, torch.float32, state=False)
        with pytest.raises(ValueError, match="allow_neg_eigval=True` requires"):
            chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], allow_neg_eigval=True)
        with pytest.raises(ValueError, match="`chunk_size` must be either 32 or 64"):
            chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=48)

    def test_reasons_and_shapes_are_logged_once(self, caplog, monkeypatch):
        x, _ = _inputs(1, 8, 1, 1, 16, 16, torch.float32, state=False)
        monkeypatch.setattr(adopt, "original", lambda name: (lambda **kw: (None, None)))
        with caplog.at_level(logging.INFO, logger="kernel_fun"):
            for _ in range(3):
                chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=32)
                chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"])
        warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
        infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
        assert len(warnings) == 1 and "chunk_size=32" in warnings[0]
        assert sum("chunk_kda engaged: q (1, 8, 1, 16)" in m for m in infos) == 1


class TestAdoption:
    def test_register_mode_dispatches_fla_chunk_kda_to_ours(self, monkeypatch):
        """Installed as an fla backend, fla's own chunk_kda runs kernel-fun's path for a
        supported call (counted) and fla's for one the verifier rejects."""
        from fla.ops.kda import chunk_kda as fla_chunk_kda

        import kernel_fun
        from kernel_fun.ops.kda import op

        calls = []
        real = op.run
        monkeypatch.setattr(op, "run", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        x, _ = _inputs(1, 20, 1, 1, 16, 16, torch.float32, state=False)
        with kernel_fun.install() as handle:
            assert handle.mode == "register"
            o, _ = fla_chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"])
        assert calls == [1]
        ro, _ = reference_chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"])
        assert err_ratio(ro, o) < TOL[torch.float32]

    def test_patch_mode_swaps_every_binding(self):
        import fla.ops
        import fla.ops.kda
        import fla.ops.kda.chunk

        import kernel_fun

        before = fla.ops.kda.chunk.chunk_kda
        with kernel_fun.install(mode="patch"):
            for mod in (fla.ops, fla.ops.kda, fla.ops.kda.chunk):
                assert mod.chunk_kda is chunk_kda
            assert adopt.original("chunk_kda") is before
        for mod in (fla.ops, fla.ops.kda, fla.ops.kda.chunk):
            assert mod.chunk_kda is before

    def test_diffract_resolves_chunk_kda(self):
        from diffract import ops
        from diffract.plugins import get_catalog

        spec = next(op for op in get_catalog().ops if op.name == "chunk_kda")
        x, _ = _inputs(1, 8, 1, 1, 16, 16, torch.float32, state=False)
        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
        assert ops.resolve("chunk_kda", *args) is spec.implementation
        assert ops.resolve("chunk_kda", *args, chunk_size=32) is spec.reference

    def test_the_signature_is_flas(self):
        assert fla_probe() == []


class TestCompileAndGraphs:
    def test_torch_compile_sees_one_graph_break(self):
        x, _ = _inputs(1, 8, 1, 1, 16, 16, torch.float32, state=False)

        def f(q, k, v, g, beta):
            o, _ = chunk_kda(q * 2.0, k, v, g, beta)
            return o + 1.0

        args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
        assert torch._dynamo.explain(f)(*args).graph_break_count == 1
        assert torch.equal(torch.compile(f, backend="eager")(*args), f(*args))

    def test_capture_admits_only_warm_calls(self, monkeypatch):
        x, grads = _inputs(1, 8, 1, 1, 16, 16, torch.float32, state=False)
        leaves = _leaves(x, ["q", "k", "v", "g", "beta"])
        args = [leaves[n] for n in ("q", "k", "v", "g", "beta")]
        monkeypatch.setattr(_support, "is_capturing", lambda: True)
        ok, why = is_supported(*args)
        assert not ok and "has not run eagerly yet (forward and backward)" in why
        monkeypatch.setattr(_support, "is_capturing", lambda: False)
        o, _ = chunk_kda(*args)
        monkeypatch.setattr(_support, "is_capturing", lambda: True)
        assert "backward" in is_supported(*args)[1]
        with torch.no_grad():
            assert is_supported(*args) == (True, "")
        assert not is_supported(*args, output_final_state=True)[0]  # another kernel variant
        monkeypatch.setattr(_support, "is_capturing", lambda: False)
        o.backward(grads["do"])
        monkeypatch.setattr(_support, "is_capturing", lambda: True)
        assert is_supported(*args) == (True, "")


class TestWarmup:
    def test_warmup_compiles_forward_and_backward(self):
        dtype = torch.float32 if DEVICE == "cpu" else torch.bfloat16
        seconds = warmup(B=1, T=8, H=1, K=16, V=16, dtype=dtype, device=DEVICE,
                         options=({}, {"use_gate_in_kernel": True, "lower_bound": -5.0}))
        assert isinstance(seconds, float)
        q = torch.empty(1, 8, 1, 16, dtype=dtype, device=DEVICE)
        g = torch.empty(1, 8, 1, 16, device=DEVICE)
        for gate, lb in ((False, None), (True, -5.0)):
            key = op_key(q, q, g, gate, lb)
            assert _support.is_warm(("fwd", *key)) and _support.is_warm(("bwd", *key))

    def test_warmup_raises_when_it_would_fall_back(self, monkeypatch):
        if DEVICE != "cpu":
            pytest.skip("CPU-only behaviour")
        monkeypatch.setenv("KERNEL_FUN_INTERPRET", "0")
        with pytest.raises(RuntimeError, match=r"falls back to fla: CUDA is not available.*KERNEL_FUN_DEBUG=1"):
            warmup(B=1, T=8, H=1, K=16, V=16, dtype=torch.float32, device="cpu")


def op_key(q, v, g, gate, lower_bound):
    from kernel_fun.ops.kda.op import warm_key

    a = torch.zeros(1) if gate else None
    return warm_key(q, v, g, None, False, gate, lower_bound, a, a)


def test_import_is_cheap_and_the_short_path_is_the_op():
    code = ("import sys, kernel_fun, kernel_fun.ops.kda;"
            "print('torch' in sys.modules, 'triton' in sys.modules, 'fla' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False False False"
    import kernel_fun.kda as short
    import kernel_fun.ops.kda as pkg

    for name in ("chunk_kda", "is_supported", "warmup", "reference_chunk_kda"):
        assert getattr(short, name) is getattr(pkg, name)


@pytest.mark.slow
def test_the_benchmark_script_runs():
    """benchmarks/bench_kda.py --dry-run: its inputs and calls for every case, on the CPU
    (a GPU session should not spend its minutes on a broken script)."""
    import os
    from pathlib import Path

    if DEVICE != "cpu":
        pytest.skip("CPU-only behaviour")
    script = Path(__file__).parents[2] / "benchmarks" / "bench_kda.py"
    out = subprocess.run([sys.executable, str(script), "--dry-run"], capture_output=True,
                         text=True, env=dict(os.environ), timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(": ok") == 3, out.stdout


def test_the_deprecated_transpose_state_layout_is_state_v_first(monkeypatch, caplog):
    """fla 0.6.0 reads transpose_state_layout as state_v_first: so does the drop-in (it
    went to fla before, with a warning that fla "may have grown a flag"); both together
    are fla's error, which fla raises (issue 78.5)."""
    from kernel_fun.ops.kda import op

    x, _ = _inputs(*SHAPES[0], torch.float32, state=True)
    args = (x["q"], x["k"], x["v"], x["g"], x["beta"])
    state = x["initial_state"].transpose(-1, -2).contiguous()
    monkeypatch.setattr(op, "_fla_chunk_kda", lambda: (_ for _ in ()).throw(
        AssertionError("fla was called")))
    with caplog.at_level(logging.WARNING, logger="kernel_fun"):
        o1, h1 = chunk_kda(*args, initial_state=state, output_final_state=True,
                           transpose_state_layout=True)
    o2, h2 = chunk_kda(*args, initial_state=state, output_final_state=True, state_v_first=True)
    assert torch.equal(o1, o2) and torch.equal(h1, h2) and h1.shape[-2:] == (
        x["v"].shape[-1], x["q"].shape[-1])
    assert "grown a flag" not in caplog.text
    ok, reason = is_supported(*args, state_v_first=True, transpose_state_layout=True)
    assert not ok and "fla refuses the two together" in reason
