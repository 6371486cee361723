"""kernel-fun's causal_conv1d against fla's (and kernel-fun 0.2.0 when available), on a GPU.

Run on a CUDA machine: ``python benchmarks/bench_cconv.py [--peak-gbps N] [--kf020 DIR]``.
Correctness: tests/kernel_fun_gpu/test_cconv.py (run with KERNEL_FUN_TEST_GPU=1 there).

Shapes: B=16, T=8192, D in {2048, 4096}, W=4, bf16, SiLU (what KDA pretraining calls).
For each: forward, backward alone (dx and dw from a retained graph: no forward re-run)
and forward+backward, timed with triton.testing.do_bench (median ms); ratios against
fla; achieved HBM bandwidth from the bytes each pass must move (forward: read x, write
y; backward: read x and dy, write dx) against the card's peak.

kernel-fun 0.2.0 (PyPI ``kernel-fun``, pins fla-core<0.6) shares the import name, so it
runs in a child process with ``--kf020 DIR`` on its path (install it there with
``pip install --no-deps --target DIR kernel-fun==0.2.0``), on the same seeded inputs.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

CASES = [dict(B=16, T=8192, D=d, W=4) for d in (2048, 4096)]
#: Peak HBM bandwidth (GB/s) by device-name fragment; --peak-gbps overrides.
PEAKS = {"H200": 4800.0, "H100": 3350.0, "B200": 8000.0, "B300": 8000.0, "A100": 2039.0}


def _timings(conv, B, T, D, W):
    import torch
    from triton.testing import do_bench

    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
    w = (torch.randn(D, W, device="cuda", dtype=torch.bfloat16, generator=g) * 0.3).requires_grad_()
    dy = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16, generator=g)

    def fwd():
        with torch.no_grad():
            return conv(x, w, activation="silu")[0]

    y = conv(x, w, activation="silu")[0]

    def bwd():
        return torch.autograd.grad(y, (x, w), dy, retain_graph=True)

    def both():
        out = conv(x, w, activation="silu")[0]
        return torch.autograd.grad(out, (x, w), dy)

    for f in (fwd, bwd, both):  # autotune outside the timing
        f()
    torch.cuda.synchronize()
    runs = (("fwd", fwd), ("bwd", bwd), ("fwd+bwd", both))
    return {name: do_bench(f, warmup=50, rep=200) for name, f in runs}


def child_kf020() -> None:
    """In the child process: time kernel-fun 0.2.0 and print JSON."""
    from kernel_fun.cconv import causal_conv1d

    print(json.dumps([_timings(causal_conv1d, **c) for c in CASES]))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--peak-gbps", type=float, default=None)
    parser.add_argument("--kf020", default=None, help="directory holding kernel-fun 0.2.0")
    parser.add_argument("--child-kf020", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child_kf020:
        child_kf020()
        return

    import torch
    from _common import header, table

    from kernel_fun.adopt import original
    from kernel_fun.cconv import causal_conv1d, is_supported

    header("causal_conv1d (bf16, SiLU, W=4): kernel-fun vs fla",
           ["diffractml-kernel-fun-gpu", "fla-core", "triton", "torch"])
    name = torch.cuda.get_device_name()
    peak = args.peak_gbps or next((v for k, v in PEAKS.items() if k in name), None)
    print(f"# device {name}; peak HBM {peak or '?'} GB/s")
    fla_conv = original("causal_conv1d")
    kf020 = None
    if args.kf020:
        path = args.kf020 + os.pathsep + os.environ.get("PYTHONPATH", "")
        env = dict(os.environ, PYTHONPATH=path)
        out = subprocess.run([sys.executable, __file__, "--child-kf020"], env=env,
                             capture_output=True, text=True)
        if out.returncode == 0:
            kf020 = json.loads(out.stdout.strip().splitlines()[-1])
        else:
            print(f"# kernel-fun 0.2.0 failed: {out.stderr.strip().splitlines()[-1:]}")
    rows = []
    for i, case in enumerate(CASES):
        B, T, D, W = case["B"], case["T"], case["D"], case["W"]
        probe = torch.empty(B, T, D, device="cuda", dtype=torch.bfloat16)
        weight = torch.empty(D, W, device="cuda", dtype=torch.bfloat16)
        ok, why = is_supported(probe, weight, activation="silu")
        if not ok:
            print(f"# D={D}: kernel-fun would fall back: {why}")
        ours = _timings(causal_conv1d, **case)
        theirs = _timings(fla_conv, **case)
        elem = B * T * D * 2  # bytes of one bf16 [B, T, D] tensor
        moved = {"fwd": 2 * elem, "bwd": 3 * elem, "fwd+bwd": 5 * elem}
        for phase in ("fwd", "bwd", "fwd+bwd"):
            gbps = moved[phase] / (ours[phase] * 1e-3) / 1e9
            row = [f"D={D}", phase, f"{ours[phase]:.3f}", f"{theirs[phase]:.3f}",
                   f"{theirs[phase] / ours[phase]:.2f}x", f"{gbps:.0f}",
                   f"{100 * gbps / peak:.0f}%" if peak else "?"]
            if kf020:
                row += [f"{kf020[i][phase]:.3f}", f"{kf020[i][phase] / ours[phase]:.2f}x"]
            rows.append(row)
    cols = ["case", "pass", "ours ms", "fla ms", "vs fla", "GB/s", "of peak"]
    if kf020:
        cols += ["0.2.0 ms", "vs 0.2.0"]
    table(cols, rows)


if __name__ == "__main__":
    main()
