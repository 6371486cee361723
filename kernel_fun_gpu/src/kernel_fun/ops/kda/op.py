"""``chunk_kda``: a drop-in for ``fla.ops.kda.chunk_kda`` (fla-core 0.6.0).

Same signature, argument order, defaults and ``(o, final_state)`` return. Calls inside the
supported box run kernel-fun's Triton kernels (forward and backward; DESIGN.md beside this
file); every other call is forwarded to fla with the caller's arguments untouched, so its
result, and any error fla raises for bad input, are fla's. The box:

* no variable-length or context-parallel arguments (``cu_seqlens``, ``cu_seqlens_cpu``,
  ``cp_context``, ``use_graph``, ``max_num_seqs``), no ``return_intermediate_states``,
  chunk size 64 (fla's default); no keyword fla does not document (a new fla flag falls
  back rather than being dropped; ``A_log``, ``dt_bias`` and ``chunk_size`` are fla's);
* ``q, k [B, T, H, K]`` and ``v [B, T, HV, V]`` of one dtype (bfloat16, float16 or
  float32), ``K <= 256``, ``HV`` a multiple of ``H``; ``g [B, T, HV, K]`` and
  ``beta [B, T, HV]`` floating point; a float32 ``initial_state`` in either layout
  (``state_v_first``), ``output_final_state`` either way;
* the in-op options: ``use_qk_l2norm_in_kernel``, ``use_beta_sigmoid_in_kernel`` (with
  ``allow_neg_eigval``), ``use_gate_in_kernel`` from ``A_log`` and ``dt_bias`` including
  the ``lower_bound`` form; ``safe_gate`` changes how fla computes, not what, and is
  accepted; ``disable_recompute=True`` keeps the chunk states from the forward for the
  backward (more memory, one scan fewer), as in fla;
* a CUDA device of compute capability 9.0 or newer (or Triton's interpreter on the CPU
  when ``KERNEL_FUN_INTERPRET=1`` and ``TRITON_INTERPRET=1``, for tests);
* under CUDA-graph capture, only shapes and options that already ran eagerly (forward
  and, when gradients are needed, backward): kernels cannot compile during capture.

:func:`is_supported` returns ``(ok, reason)``; each distinct fallback reason is logged
once at WARNING, the first engaged call logs its shapes once, the versions once.
"""

from __future__ import annotations

import inspect
import logging
import numbers
import time
from collections.abc import Sequence
from typing import Any

import torch

from kernel_fun import _check, _support, _toolchain

__all__ = ["FLA_PARAMETERS", "chunk_kda", "fla_probe", "is_supported", "warmup"]

#: Parameters of fla-core 0.6.0's chunk_kda, in order (the compatibility probe checks them).
FLA_PARAMETERS = (
    "q", "k", "v", "g", "beta", "scale", "initial_state", "output_final_state",
    "use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
    "allow_neg_eigval", "safe_gate", "lower_bound", "disable_recompute",
    "return_intermediate_states", "state_v_first", "cu_seqlens", "cu_seqlens_cpu",
    "cp_context", "use_graph", "max_num_seqs", "kwargs",
)
#: Keywords fla's chunk_kda reads from its **kwargs.
KNOWN_KWARGS = ("A_log", "dt_bias", "chunk_size")
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
_MAX_K = 256
_CHUNK = 64


def _fla_chunk_kda() -> Any:
    """fla's own chunk_kda, even while kernel-fun is installed into fla."""
    from kernel_fun import adopt

    return adopt.original("chunk_kda")


def _shape(x: Any) -> tuple:
    return tuple(x.shape)


def is_supported(
    q: Any,
    k: Any = None,
    v: Any = None,
    g: Any = None,
    beta: Any = None,
    scale: float | None = None,
    initial_state: Any = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: Any = None,
    cu_seqlens_cpu: Any = None,
    cp_context: Any = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs: Any,
) -> tuple[bool, str]:
    """Whether kernel-fun runs this call itself: ``(True, "")`` or ``(False, reason)``."""
    given = {n: value for n, value in locals().items() if n != "kwargs"}
    if "transpose_state_layout" in kwargs:
        return False, ("transpose_state_layout with state_v_first: fla refuses the two "
                       "together (transpose_state_layout is state_v_first's old name).")
    unknown = sorted(set(kwargs) - set(KNOWN_KWARGS))
    if unknown:
        return False, (f"unknown argument(s) {unknown}: fla may have grown a flag kernel-fun "
                       "does not implement, so the call goes to fla.")
    if kwargs.get("chunk_size", _CHUNK) != _CHUNK:
        return False, (f"chunk_size={kwargs['chunk_size']!r}: kernel-fun's kernels use "
                       f"chunks of {_CHUNK}.")
    for name, value in (("cu_seqlens", cu_seqlens), ("cu_seqlens_cpu", cu_seqlens_cpu),
                        ("cp_context", cp_context), ("max_num_seqs", max_num_seqs)):
        if value is not None:
            return False, (f"{name} is given: kernel-fun implements equal-length batches "
                           "without context parallelism.")
    if use_graph:
        return False, "use_graph=True (fla's static variable-length chunk list) is fla's."
    if return_intermediate_states:
        return False, "return_intermediate_states=True (an inference path) is fla's."
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        return False, "allow_neg_eigval=True without use_beta_sigmoid_in_kernel: fla's error."
    A_log, dt_bias = kwargs.get("A_log"), kwargs.get("dt_bias")
    if use_gate_in_kernel:
        if A_log is None and lower_bound is None:
            return False, "use_gate_in_kernel without A_log or lower_bound: fla's error."
        if safe_gate and (lower_bound is None or not -5 <= lower_bound < 0):
            return False, "safe_gate with the in-op gate needs lower_bound in [-5, 0): fla's error."
        if lower_bound is not None and not isinstance(lower_bound, numbers.Real):
            return False, f"lower_bound={lower_bound!r} is not a number."
    if scale is not None and not isinstance(scale, numbers.Real):
        return False, f"scale is {type(scale).__name__}; kernel-fun takes a number or None."
    tensors = (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta))
    for name, value in tensors:
        if not isinstance(value, torch.Tensor):
            return False, f"{name} is not a tensor."
    if q.dim() != 4 or v.dim() != 4:
        return False, (f"q {_shape(q)}, v {_shape(v)}: kernel-fun takes [B, T, H, K] and "
                       "[B, T, HV, V].")
    B, T, H, K = q.shape
    HV = v.shape[2]
    if k.shape != q.shape or v.shape[:2] != q.shape[:2]:
        return False, f"q {_shape(q)}, k {_shape(k)}, v {_shape(v)} do not agree (fla's error)."
    if HV % H:
        return False, f"HV={HV} is not a multiple of H={H} (fla's error)."
    if K > _MAX_K:
        return False, f"K={K}: kernel-fun (like fla) takes K <= {_MAX_K}."
    if g.shape != (B, T, HV, K) or beta.shape != (B, T, HV):
        return False, f"g {_shape(g)} or beta {_shape(beta)} is not [B, T, HV, K] / [B, T, HV]."
    if T * HV * max(K, v.shape[3], 4 * _CHUNK) >= 2**31:
        return False, (f"T={T} x HV={HV} rows of up to {max(K, v.shape[3], 4 * _CHUNK)} "
                       "elements pass 32-bit offsets within one sequence; fla takes it.")
    if 0 in q.shape or 0 in v.shape:
        return False, f"an empty dimension: q {_shape(q)}, v {_shape(v)}."
    if q.dtype not in _DTYPES or k.dtype != q.dtype or v.dtype != q.dtype:
        return False, (f"q, k, v are {q.dtype}, {k.dtype}, {v.dtype}; kernel-fun takes one of "
                       "bfloat16, float16, float32 for all three.")
    if g.dtype not in _DTYPES or beta.dtype not in _DTYPES:
        return False, f"g is {g.dtype}, beta {beta.dtype}: kernel-fun takes floating point."
    state_shape = (B, HV, v.shape[3], K) if state_v_first else (B, HV, K, v.shape[3])
    extra = [("initial_state", initial_state)]
    if initial_state is not None:
        if not isinstance(initial_state, torch.Tensor) or initial_state.dtype != torch.float32:
            return False, "initial_state is not a float32 tensor (fla's error)."
        if initial_state.shape != state_shape:
            return False, (f"initial_state has shape {_shape(initial_state)}; expected "
                           f"{state_shape} (state_v_first={state_v_first}).")
    if use_gate_in_kernel:
        for name, value, numel in (("A_log", A_log, HV), ("dt_bias", dt_bias, HV * K)):
            if value is None:
                continue
            if not isinstance(value, torch.Tensor) or value.numel() != numel \
                    or not value.dtype.is_floating_point:
                return False, f"{name} must be a floating-point tensor of {numel} elements."
            extra.append((name, value))
    reason = _support.device_reason(q)
    if reason is None:  # a toolchain known to compile wrong on this device
        toolchain = _toolchain.current(q.device)
        reason = _toolchain.refusal("chunk_kda", toolchain)
        if reason is None and toolchain.arch is not None:  # configurations it rules out
            from kernel_fun.ops.kda._triton import launch_problem

            problem = launch_problem(K, v.shape[3], toolchain)
            if problem is not None:
                reason = (f"{problem}; this device runs {toolchain.describe()}, so kernel-fun "
                          "uses fla.")
    if reason is not None:
        return False, reason
    for name, value in tensors[1:] + tuple(extra):
        if value is not None and value.device != q.device:
            return False, f"{name} is on {value.device} but q on {q.device}."
    faster = None if torch.is_grad_enabled() else fla_fast_path(given, kwargs)
    if faster is not None:
        return False, (f"fla would run this call with {faster}, faster than kernel-fun's "
                       "Triton forward, so the call goes to fla.")
    if _support.is_capturing():  # last: it only speaks for a call otherwise accepted
        key = warm_key(q, v, g, initial_state, output_final_state, use_gate_in_kernel,
                       lower_bound, A_log, dt_bias, disable_recompute)
        need_bwd = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad
            for t in (q, k, v, g, beta, initial_state, A_log, dt_bias))
        cold_bwd = need_bwd and not _support.is_warm(("bwd", *key))
        if not _support.is_warm(("fwd", *key)) or cold_bwd:
            return False, ("CUDA-graph capture of a shape that has not run eagerly yet (forward"
                           + (" and backward" if need_bwd else "") + "): kernels cannot "
                           "compile during capture, so this call goes to fla. Run one eager "
                           "step first (or kernel_fun.kda.warmup).")
    return True, ""


def fla_fast_path(args: dict[str, Any], extra: dict[str, Any]) -> str | None:
    """The fla backend fla would dispatch this call to instead of its Triton kernels when
    that backend is faster than ours: FlashKDA (fla's fused CUTLASS forward, taken only
    without gradients, when installed and not switched off with ``FLA_FLASH_KDA=0``);
    None otherwise."""
    try:
        from fla.ops.kda.backends.flash_kda import FlashKDABackend
    except ImportError:
        return None
    backend = FlashKDABackend()
    if not (backend.is_available() and backend.is_enabled()):
        return None
    try:
        ok, _ = backend.chunk_kda_verifier(**args, **extra)
    except TypeError:  # an fla whose verifier takes other arguments: not taken for granted
        return None
    return "FlashKDA" if ok else None


def warm_key(q, v, g, initial_state, output_final_state, use_gate, lower_bound, A_log,
             dt_bias, disable_recompute=False) -> tuple:
    """What a warm call is keyed by: shapes, dtypes, device and the options that select
    a different compiled kernel."""
    return ("chunk_kda", tuple(q.shape), tuple(v.shape), q.dtype, g.dtype, str(q.device),
            initial_state is not None, bool(output_final_state), bool(use_gate),
            use_gate and lower_bound is not None, use_gate and A_log is not None,
            use_gate and dt_bias is not None, bool(disable_recompute))


#: chunk_kda's parameters (is_supported mirrors them), bound once per call by run().
_SIGNATURE = inspect.signature(is_supported)


def run(*args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """kernel-fun's own path for a call :func:`is_supported` accepted (arguments as
    chunk_kda takes them: fla's backend dispatch passes them on as the caller gave them)."""
    return _run(True, *args, **kwargs)


def _run(say: bool, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    from kernel_fun.ops.kda._triton import ChunkKDA

    bound = _SIGNATURE.bind(*args, **kwargs)
    bound.apply_defaults()
    a = dict(bound.arguments)
    extra = a.pop("kwargs")
    q, v, g, gate = a["q"], a["v"], a["g"], a["use_gate_in_kernel"]
    A_log = extra.get("A_log") if gate else None
    dt_bias = extra.get("dt_bias") if gate else None
    scale = q.shape[-1] ** -0.5 if a["scale"] is None else a["scale"]
    lower_bound = None if a["lower_bound"] is None else float(a["lower_bound"])
    if say:  # not the self-check's probe
        _support.log_once(("engaged", "chunk_kda"), logging.INFO,
                          "kernel-fun chunk_kda engaged: q %s v %s %s, gate in op %s, "
                          "l2norm %s", tuple(q.shape), tuple(v.shape), q.dtype, gate,
                          a["use_qk_l2norm_in_kernel"])
    return ChunkKDA.apply(
        q, a["k"], v, g, a["beta"], A_log, dt_bias, float(scale), a["initial_state"],
        bool(a["output_final_state"]), bool(a["use_qk_l2norm_in_kernel"]), bool(gate),
        bool(a["use_beta_sigmoid_in_kernel"]), bool(a["allow_neg_eigval"]), lower_bound,
        bool(a["state_v_first"]), bool(a["disable_recompute"]),
        warm_key(q, v, g, a["initial_state"], a["output_final_state"], gate, lower_bound,
                 A_log, dt_bias, a["disable_recompute"]))


@torch.compiler.disable
def chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    safe_gate: bool = False,
    lower_bound: float | None = None,
    disable_recompute: bool = False,
    return_intermediate_states: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context: Any = None,
    use_graph: bool = False,
    max_num_seqs: int | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Kimi Delta Attention over ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, the log-space
    gate ``g [B, T, HV, K]`` and ``beta [B, T, HV]``; returns ``(o, final_state)`` exactly
    as fla's ``chunk_kda`` does (o ``[B, T, HV, V]`` in q's dtype; the final state float32
    ``[B, HV, K, V]``, or ``[B, HV, V, K]`` with ``state_v_first``, or None). Calls outside
    the supported box (module docstring) go to fla unchanged. Wrapped in
    ``torch.compiler.disable``: one graph break at the call. fla 0.6.0's deprecated
    ``transpose_state_layout`` is ``state_v_first``, as fla reads it."""
    if "transpose_state_layout" in kwargs and not state_v_first:  # both given: fla's error
        state_v_first = bool(kwargs.pop("transpose_state_layout"))
    # the parameters by name, as given (locals() holds exactly them at this point)
    args = {name: value for name, value in locals().items() if name != "kwargs"}
    ok, reason = is_supported(**args, **kwargs)
    _support.log_versions()
    if ok and self_check(args, kwargs) is not None:  # logged once by the check
        ok, reason = False, ""
    if not ok:
        if reason:
            _support.log_once(("fallback", "chunk_kda", reason), logging.WARNING,
                              "kernel-fun chunk_kda: %s", reason)
        _support.fla_can_run(q, "chunk_kda")
        return _fla_chunk_kda()(**args, **kwargs)
    return run(**args, **kwargs)


#: fla's tolerances for its chunked KDA against its naive recurrence (RMS ratio): the
#: outputs, and every gradient, by dtype.
TOLERANCE = {torch.float32: (1e-3, 2e-3), torch.float16: (5e-3, 2e-2),
             torch.bfloat16: (5e-3, 2e-2)}
#: The options that select different kernels (a kind of call is checked once).
_KIND = ("use_qk_l2norm_in_kernel", "use_gate_in_kernel", "use_beta_sigmoid_in_kernel",
         "allow_neg_eigval", "output_final_state", "state_v_first", "disable_recompute")


def self_check(args: dict[str, Any], extra: dict[str, Any]) -> str | None:
    """None when kernel-fun's kernels passed the self-check (:mod:`kernel_fun._check`)
    for this kind of call (dtypes, K, V, grouping, kernel options, gradients or not) on
    its device; else why not."""
    q, v, g = args["q"], args["v"], args["g"]
    gate = bool(args["use_gate_in_kernel"])
    leaves = [args[n] for n in ("q", "k", "v", "g", "beta", "initial_state")]
    leaves += [extra.get(n) for n in ("A_log", "dt_bias")] if gate else []
    need_grad = torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in leaves)
    kind = (q.dtype, g.dtype, args["beta"].dtype, q.shape[3], v.shape[3],
            v.shape[2] > q.shape[2], args["initial_state"] is not None,
            *(bool(args[n]) for n in _KIND), gate and args["lower_bound"] is not None,
            gate and extra.get("A_log") is not None, gate and extra.get("dt_bias") is not None,
            need_grad)
    return _check.verdict("chunk_kda", kind, q.device,
                          lambda: _probe(args, extra, kind, need_grad))


def _probe(args: dict[str, Any], extra: dict[str, Any], kind: tuple,
           need_grad: bool) -> str | None:
    """Ours against the float32 step-by-step reference on [1, 80, H, K] (a chunk and a
    tail), with the call's dtypes, K, V, grouping and options."""
    from kernel_fun.ops.kda.reference import reference_chunk_kda

    q = args["q"]
    dtype, gdtype, bdtype, K, V, grouped, state = kind[:7]
    device, HV, T = q.device, 2 if grouped else 1, 80
    gen = torch.Generator().manual_seed(0)

    def rnd(*shape: int, dt: torch.dtype = torch.float32, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=dt)

    gate = bool(args["use_gate_in_kernel"])
    k = torch.nn.functional.normalize(rnd(1, T, 1, K), dim=-1).to(dtype)
    inputs = {"q": rnd(1, T, 1, K, dt=dtype), "k": k, "v": rnd(1, T, HV, V, dt=dtype),
              "g": rnd(1, T, HV, K, dt=gdtype) if gate else torch.nn.functional.logsigmoid(
                  rnd(1, T, HV, K) + 2.0).to(gdtype),
              "beta": torch.rand(1, T, HV, generator=gen).to(device=device, dtype=bdtype)}
    options = {n: args[n] for n in _KIND}
    options["lower_bound"] = args["lower_bound"] if gate else None
    if state:
        h0 = rnd(1, HV, V, K, scale=0.5) if args["state_v_first"] else rnd(1, HV, K, V,
                                                                           scale=0.5)
        inputs["initial_state"] = h0
    if gate:
        for name, numel in (("A_log", HV), ("dt_bias", HV * K)):
            if extra.get(name) is not None:
                inputs[name] = rnd(numel, scale=0.5)
    do = rnd(1, T, HV, V)
    dht = rnd(1, HV, V, K) if args["state_v_first"] else rnd(1, HV, K, V)
    ours: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    with torch.inference_mode(False), torch.enable_grad() if need_grad else torch.no_grad():
        for out, fn in ((ours, _run), (reference, reference_chunk_kda)):
            leaves = {n: t.clone().requires_grad_(need_grad) for n, t in inputs.items()}
            tensors = {n: leaves[n] for n in ("q", "k", "v", "g", "beta")}
            named = {n: leaves[n] for n in ("initial_state", "A_log", "dt_bias") if n in leaves}
            if fn is _run:
                o, ht = _run(False, **tensors, **options, **named)
            else:
                plain = {n: value for n, value in options.items() if n != "disable_recompute"}
                o, ht = reference_chunk_kda(**tensors, **plain, **named)
            out["o"] = o.detach().float()
            if ht is not None:
                out["ht"] = ht.detach()
            if need_grad:
                loss = (o.float() * do).sum() + ((ht * dht).sum() if ht is not None else 0)
                loss.backward()
                out.update((f"d{n}", t.grad) for n, t in leaves.items())
    first, grads = TOLERANCE[dtype]
    return _check.compare(reference, ours, {"o": first, "ht": first, "*": grads})


def fla_probe() -> list[str]:
    """Differences between the installed fla's chunk_kda signature and the one kernel-fun
    mirrors (empty when compatible)."""
    return _support.signature_problems("chunk_kda", _fla_chunk_kda(), FLA_PARAMETERS)


def warmup(
    *,
    B: int,
    T: int,
    H: int = 16,
    HV: int | None = None,
    K: int = 128,
    V: int = 256,
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cuda",
    options: Sequence[dict[str, Any]] = ({},),
) -> float:
    """Compile the forward and backward kernels for one shape and each option set
    (``{"use_gate_in_kernel": True, ...}``, what the model passes); returns seconds.

    Each new combination of shape, dtype and kernel options costs a compilation (seconds
    on the first call): paying it before step 1, and before any CUDA-graph capture, keeps
    the first step from looking like a regression. Runs the fla compatibility probe
    first; raises RuntimeError if a call would fall back to fla (set KERNEL_FUN_DEBUG=1
    and see the 'kernel_fun' logger for why).
    """
    started = time.perf_counter()
    problems = fla_probe()
    if problems:
        raise RuntimeError("kernel-fun warm-up: " + "; ".join(problems))
    HV = H if HV is None else HV
    for opts in options:
        opts = dict(opts)
        q = torch.randn(B, T, H, K, device=device, dtype=dtype, requires_grad=True)
        k = torch.randn(B, T, H, K, device=device, dtype=dtype)
        k = torch.nn.functional.normalize(k, dim=-1).requires_grad_()
        v = torch.randn(B, T, HV, V, device=device, dtype=dtype, requires_grad=True)
        g = torch.nn.functional.logsigmoid(torch.randn(B, T, HV, K, device=device)).requires_grad_()
        beta = torch.rand(B, T, HV, device=device, dtype=dtype, requires_grad=True)
        if opts.get("use_gate_in_kernel"):
            opts.setdefault("A_log", torch.zeros(HV, device=device, requires_grad=True))
            opts.setdefault("dt_bias", torch.zeros(HV * K, device=device, requires_grad=True))
        ok, reason = is_supported(q, k, v, g, beta, **opts)
        if not ok:
            raise RuntimeError(f"kernel-fun warm-up with {sorted(opts)}: the call falls back to "
                               f"fla: {reason} Set KERNEL_FUN_DEBUG=1 to log every decision.")
        args = _SIGNATURE.bind(q, k, v, g, beta, **opts)
        args.apply_defaults()
        named = dict(args.arguments)
        failed = self_check(named, named.pop("kwargs"))
        if failed is not None:
            raise RuntimeError(f"kernel-fun warm-up with {sorted(opts)}: the self-check against "
                               f"the reference failed, so calls of this kind go to fla: {failed}")
        o, ht = chunk_kda(q, k, v, g, beta, **opts)
        o.float().sum().backward()
        key = warm_key(q, v, g, opts.get("initial_state"), opts.get("output_final_state", False),
                       opts.get("use_gate_in_kernel", False), opts.get("lower_bound"),
                       opts.get("A_log"), opts.get("dt_bias"), opts.get("disable_recompute", False))
        missing = [p for p in ("fwd", "bwd") if not _support.is_warm((p, *key))]
        if missing:
            raise RuntimeError(f"kernel-fun warm-up with {sorted(opts)}: the {missing} kernels "
                               "did not run. Set KERNEL_FUN_DEBUG=1 to log every decision.")
    if torch.cuda.is_available() and str(device).startswith("cuda"):
        torch.cuda.synchronize()
    return time.perf_counter() - started
