"""kernel-fun's chunk_kda against fla's, on a GPU: totals, then time per stage.

Run on a CUDA machine: ``python benchmarks/bench_kda.py [--quick] [--kf020 DIR]
[--launch JSON]`` (``--launch`` tries other tiles for our kernels, e.g.
``'{"_scan_fwd_kernel": {"BV": 64, "num_warps": 4}}'``; see LAUNCH in the op's _triton.py).
Correctness: tests/kernel_fun_gpu/test_kda.py (run with KERNEL_FUN_TEST_GPU=1 there).

Cases (bf16 q, k, v; fp32 g): the production shape of the issue, B=16, T=8192,
H=HV=16, K=128, V=256, with the gate and the q/k norm computed in the op and with a
precomputed gate; and smaller K=V=128 shapes at T 2048/4096/8192 (the shapes fla's op
benchmarks sweep); and fla's own benchmark configuration (in-op gate, ``safe_gate=True``,
``lower_bound=-5``), with the fla backend its dispatch picks printed per case (FlashKDA,
when installed, takes calls without gradients: kernel-fun's gate then defers to it).
For each: forward (no autograd) and forward+backward, timed with
triton.testing.do_bench (median ms), and the ratio fla / ours (above 1: ours faster).

Then one profiled forward+backward per implementation at the production shape: GPU time
per kernel, grouped by kernel name, so a stage that fla runs faster is visible and can be
delegated to fla's kernel at its stage boundary (DESIGN.md in kernel_fun/ops/kda lists
our stages and their boundaries). ``--kf020 DIR`` adds kernel-fun 0.2.0 (Blackwell-only
CuTe KDA; on Hopper it falls back to fla, so expect fla's numbers) in a child process.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

PRODUCTION = dict(B=16, T=8192, H=16, HV=16, K=128, V=256)
CASES = [
    ("production, gate+norm in op", PRODUCTION, True),
    ("production, precomputed gate", PRODUCTION, False),
    *[(f"T={t}, K=V=128", dict(B=8, T=t, H=16, HV=16, K=128, V=128), True)
      for t in (2048, 4096, 8192)],
]
QUICK = [("small, gate+norm in op", dict(B=2, T=1024, H=4, HV=4, K=128, V=128), True)]
#: fla's own benchmark registry runs chunk_kda with the in-op gate, safe_gate=True and
#: lower_bound=-5: the configuration fla is tuned for, timed the same way for both.
CASES.append(("fla's config: safe_gate, lower_bound=-5", dict(B=8, T=4096, H=16, HV=16, K=128,
                                                              V=128), "fla"))


def _inputs(B, T, H, HV, K, V, in_op, device="cuda", dtype=None):
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device=device).manual_seed(0)
    io = dtype or torch.bfloat16

    def rnd(*shape, dtype=io):
        return torch.randn(*shape, device=device, dtype=dtype, generator=gen)

    x = {"q": rnd(B, T, H, K), "k": rnd(B, T, H, K), "v": rnd(B, T, HV, V),
         "beta": torch.rand(B, T, HV, device=device, generator=gen).to(io)}
    if in_op:
        x["g"] = rnd(B, T, HV, K, dtype=torch.float32)
        opts = {"use_qk_l2norm_in_kernel": True, "use_gate_in_kernel": True,
                "A_log": rnd(HV, dtype=torch.float32) * 0.5,
                "dt_bias": rnd(HV * K, dtype=torch.float32) * 0.5}
        if in_op == "fla":
            opts.update(safe_gate=True, lower_bound=-5.0)
    else:
        x["k"] = F.normalize(x["k"].float(), dim=-1).to(io)
        x["g"] = F.logsigmoid(rnd(B, T, HV, K, dtype=torch.float32) + 3.0)
        opts = {}
    for name in ("q", "k", "v", "g", "beta"):
        x[name].requires_grad_()
    for name in ("A_log", "dt_bias"):
        if name in opts:
            opts[name].requires_grad_()
    do = rnd(B, T, HV, V)
    return x, opts, do


def dry_run() -> None:
    """Each case's inputs and calls, ours only, once, at a tiny shape on the CPU in
    Triton's interpreter (what tests/kernel_fun_gpu runs to keep this script working)."""
    import torch

    from kernel_fun.kda import chunk_kda, is_supported

    for label, _, in_op in [*CASES[:2], CASES[-1]]:  # the rest differ by shape only
        shape = dict(B=1, T=70, H=1, HV=2, K=16, V=16)
        x, opts, do = _inputs(**shape, in_op=in_op, device="cpu", dtype=torch.float32)
        args = [x[n] for n in ("q", "k", "v", "g", "beta")]
        assert is_supported(*args, **opts) == (True, ""), label
        leaves = args + [opts[n] for n in ("A_log", "dt_bias") if n in opts]
        o, _ = chunk_kda(*args, **opts)
        grads = torch.autograd.grad(o, leaves, do)
        assert all(torch.isfinite(g).all() for g in grads), label
        backend = fla_backend(shape, in_op, False, device="cpu", dtype=torch.float32)
        print(f"{label}: ok (fla would dispatch to {backend})")


def fla_backend(shape, in_op, grad: bool, **where) -> str:
    """The backend fla's dispatch picks for this case (its first available, enabled backend
    whose verifier accepts the call), or its Triton kernels."""
    import contextlib

    import torch

    try:
        from fla.backends import _load_operation_registry  # fla-core 0.6's registry

        registry = _load_operation_registry("kda")
    except (ImportError, AttributeError) as exc:
        return f"unknown ({type(exc).__name__})"
    x, opts, _ = _inputs(**shape, in_op=in_op, **where)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    with contextlib.nullcontext() if grad else torch.no_grad():
        for backend in registry._get_sorted_backends():
            if not (backend.is_available() and backend.is_enabled()):
                continue
            accepted, _ = backend.verify("chunk_kda", *args, **opts)
            if accepted:
                return backend.backend_type
    return "triton (fla's own)"


def _timings(kda, shape, in_op):
    import torch
    from triton.testing import do_bench

    x, opts, do = _inputs(**shape, in_op=in_op)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    leaves = args + [opts[n] for n in ("A_log", "dt_bias") if n in opts]

    def fwd():
        with torch.no_grad():
            return kda(*args, **opts)[0]

    def both():
        o, _ = kda(*args, **opts)
        return torch.autograd.grad(o, leaves, do)

    for f in (fwd, both):  # compile and autotune outside the timing
        f()
    torch.cuda.synchronize()
    return {"fwd": do_bench(fwd, warmup=10, rep=100), "fwd+bwd": do_bench(both, warmup=10, rep=100)}


def _stages(kda, shape, in_op) -> dict[str, float]:
    """GPU milliseconds per kernel name over one forward+backward."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x, opts, do = _inputs(**shape, in_op=in_op)
    args = [x[n] for n in ("q", "k", "v", "g", "beta")]
    leaves = args + [opts[n] for n in ("A_log", "dt_bias") if n in opts]
    o, _ = kda(*args, **opts)
    torch.autograd.grad(o, leaves, do)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        o, _ = kda(*args, **opts)
        torch.autograd.grad(o, leaves, do)
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None) or getattr(ev, "cuda_time_total", 0)
        if t > 0 and ev.key and not ev.key.startswith(("ProfilerStep", "cuda")):
            out[ev.key[:60]] = out.get(ev.key[:60], 0.0) + t / 1000.0
    return out


def child_kf020(quick: bool) -> None:
    from kernel_fun.kda import chunk_kda  # kernel-fun 0.2.0 on the path

    print(json.dumps([_timings(chunk_kda, s, g) for _, s, g in (QUICK if quick else CASES)]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true", help="one small case (a smoke run)")
    parser.add_argument("--kf020", default=None, help="directory holding kernel-fun 0.2.0")
    parser.add_argument("--no-stages", action="store_true", help="skip the profiled run")
    parser.add_argument("--launch", default=None, metavar="JSON",
                        help="other tiles for our kernels (see the module docstring)")
    parser.add_argument("--child-kf020", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dry-run", action="store_true",
                        help="no GPU: run each case's calls once, tiny, in the interpreter")
    args = parser.parse_args()
    if args.dry_run:
        dry_run()
        return
    if args.child_kf020:
        child_kf020(args.quick)
        return

    import torch
    from _common import header, table

    from kernel_fun.adopt import original
    from kernel_fun.kda import chunk_kda, is_supported

    header("chunk_kda (bf16 q/k/v, fp32 g): kernel-fun vs fla",
           ["diffractml-kernel-fun-gpu", "fla-core", "triton", "torch"])
    print(f"# device {torch.cuda.get_device_name()}")
    if args.launch:
        from kernel_fun.ops.kda._triton import LAUNCH, set_launch

        set_launch(json.loads(args.launch))
        print(f"# launch settings: {json.dumps(LAUNCH)}")
    fla_kda = original("chunk_kda")
    cases = QUICK if args.quick else CASES
    kf020 = None
    if args.kf020:
        path = args.kf020 + os.pathsep + os.environ.get("PYTHONPATH", "")
        env = dict(os.environ, PYTHONPATH=path)
        cmd = [sys.executable, __file__, "--child-kf020"] + (["--quick"] if args.quick else [])
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode == 0:
            kf020 = json.loads(out.stdout.strip().splitlines()[-1])
        else:
            print(f"# kernel-fun 0.2.0 failed: {out.stderr.strip().splitlines()[-1:]}")
    rows = []
    for i, (label, shape, in_op) in enumerate(cases):
        x, opts, _ = _inputs(**shape, in_op=in_op)
        ok, why = is_supported(*(x[n] for n in ("q", "k", "v", "g", "beta")), **opts)
        del x, opts
        if not ok:
            print(f"# {label}: kernel-fun would fall back: {why}")
        print(f"# {label}: fla dispatches to {fla_backend(shape, in_op, False)} (forward, no "
              f"gradients), {fla_backend(shape, in_op, True)} (with gradients)")
        ours = _timings(chunk_kda, shape, in_op)
        theirs = _timings(fla_kda, shape, in_op)
        torch.cuda.empty_cache()
        for phase in ("fwd", "fwd+bwd"):
            row = [label, phase, f"{ours[phase]:.2f}", f"{theirs[phase]:.2f}",
                   f"{theirs[phase] / ours[phase]:.2f}x"]
            if kf020:
                row += [f"{kf020[i][phase]:.2f}", f"{kf020[i][phase] / ours[phase]:.2f}x"]
            rows.append(row)
            print("# " + " | ".join(row), flush=True)  # as it comes: a timeout keeps it
    cols = ["case", "pass", "ours ms", "fla ms", "fla/ours"]
    if kf020:
        cols += ["0.2.0 ms", "0.2.0/ours"]
    table(cols, rows)
    print("# targets on H100/H200 (issue 11): fwd+bwd >= 1.5x fla, fwd >= 1.25x fla")
    if args.no_stages:
        return
    label, shape, in_op = cases[0]
    for name, fn in (("kernel-fun", chunk_kda), ("fla", fla_kda)):
        stages = _stages(fn, shape, in_op)
        total = sum(stages.values())
        print(f"\n# {name}: GPU time per kernel over one forward+backward ({label}): "
              f"{total:.2f} ms in all")
        table(["kernel", "ms", "share"],
              [[k, f"{v:.3f}", f"{100 * v / total:.0f}%"]
               for k, v in sorted(stages.items(), key=lambda kv: -kv[1])])
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
