"""The spectral pack's GPU routes against its numpy path, on one device: esd, svals, svd
and esd_rand of same-shaped matrices batched on the device (``device="auto"`` with the
weights there) against LAPACK on the host, with the largest relative difference and
both times. Run on a lent GPU by ``benchmarks/gpu_check.sh``; ``--device cpu:0`` runs
the same torch code on the CPU (what the tests do).

    python benchmarks/gpu_spectral_check.py [--device cuda] [--matrices 8]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402

SHAPES = [(768, 768), (768, 3072), (1024, 4096)]


def _checks(host: list, dev: list, device: str) -> dict:
    """Field -> (the device route, the numpy route) over the same matrices."""
    from diffract_kernels_spectral import kernels, kernels_rmt, linalg

    units = [{"tensor": t, "esd_scale": 1.0} for t in dev]
    return {
        "esd": (lambda: kernels._esd_batch(units, device=device),
                lambda: [kernels.esd(w, 1.0, device="cpu") for w in host]),
        "svals": (lambda: kernels._svals_batch(units, device=device),
                  lambda: [kernels.svals(w, device="cpu") for w in host]),
        "svd": (lambda: [linalg.svd_torch(t, device)[1] for t in dev],
                lambda: [kernels.svd(w, device="cpu")[1] for w in host]),
        "esd_rand": (lambda: [kernels_rmt.esd_rand(t, 1.0, device=device) for t in dev],
                     lambda: [kernels_rmt.esd_rand(w, 1.0, device="cpu") for w in host]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--matrices", type=int, default=8)
    args = parser.parse_args()
    import torch

    header(f"spectral GPU routes on {args.device} vs numpy", ["torch", "numpy"])
    rng = np.random.default_rng(0)
    rows = []
    worst = 0.0
    for shape in SHAPES:
        host = [rng.standard_t(4, size=shape).astype(np.float32) for _ in range(args.matrices)]
        dev = [torch.from_numpy(w).to(args.device) for w in host]
        checks = _checks(host, dev, args.device)
        for name, (on_device, on_host) in checks.items():
            on_device()  # warm-up (kernels, cuSOLVER handles)
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            got = on_device()
            t_dev = time.perf_counter() - start
            start = time.perf_counter()
            ref = on_host()
            t_host = time.perf_counter() - start
            diff = max(float(np.max(np.abs(np.asarray(g) - r)) / np.max(np.abs(r)))
                       for g, r in zip(got, ref, strict=True))
            worst = max(worst, diff)
            rows.append([name, f"{shape[0]}x{shape[1]}", f"{t_dev * 1e3:.1f} ms",
                         f"{t_host * 1e3:.1f} ms", f"{t_host / t_dev:.1f}x", f"{diff:.1e}"])
    table(["field", "shape", args.device, "numpy", "speed-up", "max rel. diff"], rows)
    print(f"worst relative difference {worst:.1e} (float32 spectra: expect <= 1e-5)")
    sys.exit(0 if worst <= 1e-4 else 1)


if __name__ == "__main__":
    main()
