"""What an accurate spectrum costs: the ESD's routes at LLM shapes, timed on one thread
(as the spectral pack runs each decomposition: one solver per core).

Routes: the Gram matrix's eigenvalues in float32 (``precision="float32"``, the opt-in)
and in float64 (the default), and a values-only SVD of W in float32 and float64 (the
reference; WeightWatcher's route). For each shape it prints the seconds, the ratio to
the float32 Gram route, and the largest relative error of stable_rank and the matrix
entropy against the float64 SVD (on a matrix whose small eigenvalues fall below
float32's noise floor, as MiniLM's position embeddings' do). Correctness at 1e-6:
tests/spectral/test_precision.py (every MiniLM layer, every derived field).

    python benchmarks/bench_esd_precision.py [--shapes 768x3072,4096x4096,11008x4096]
                                             [--no-svd64]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, table  # noqa: E402


def _matrix(shape: tuple[int, int], rng: np.random.Generator) -> np.ndarray:
    """Heavy-tailed top, and a quarter of the spectrum between 1e-3 and 1e-5 of the
    largest singular value (eigenvalues 1e-6 to 1e-10 of the largest)."""
    n, m = shape
    k = min(n, m)
    sigma = np.concatenate([rng.pareto(2.0, k - k // 4) + 1.0,
                            np.geomspace(1e-3, 1e-5, k // 4) * 10])
    u, _ = np.linalg.qr(rng.standard_normal((n, k)).astype(np.float32))
    v, _ = np.linalg.qr(rng.standard_normal((m, k)).astype(np.float32))
    return ((u * sigma.astype(np.float32)) @ v.T).astype(np.float32)


def _stats(ev: np.ndarray) -> tuple[float, float]:
    ev = np.clip(np.asarray(ev, dtype=np.float64), 0.0, None)
    p = ev[ev > 0] / ev.sum()
    return ev.sum() / ev.max(), float(-(p * np.log(p)).sum() / np.log(len(ev)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="768x3072,4096x4096,11008x4096")
    parser.add_argument("--no-svd64", action="store_true",
                        help="skip the float64 SVD (minutes at 11008x4096); errors then "
                             "against the float64 Gram route")
    args = parser.parse_args()
    from scipy.linalg import svd

    from diffract_kernels_spectral import linalg

    header("ESD routes: seconds on one thread, error against a float64 SVD",
           ["numpy", "scipy", "diffractml-kernels-spectral"])

    def svd_values(w: np.ndarray, dtype: type) -> np.ndarray:
        with linalg.one_blas_thread():
            s = svd(w.astype(dtype), compute_uv=False, lapack_driver="gesdd",
                    check_finite=False)
        return np.sort(s.astype(np.float64) ** 2)

    routes = {"gram float32 (opt-in)": lambda w: linalg.esd(w, "float32"),
              "gram float64 (default)": lambda w: linalg.esd(w, "float64"),
              "svd float32": lambda w: svd_values(w, np.float32),
              "svd float64": lambda w: svd_values(w, np.float64)}
    rng = np.random.default_rng(0)
    rows = []
    for text in args.shapes.split(","):
        shape = tuple(int(x) for x in text.split("x"))
        w = _matrix(shape, rng)
        spectra, seconds = {}, {}
        for name, route in routes.items():
            if args.no_svd64 and name == "svd float64":
                continue
            start = time.perf_counter()
            spectra[name] = route(w)
            seconds[name] = time.perf_counter() - start
        ref = _stats(spectra.get("svd float64", spectra["gram float64 (default)"]))
        base = seconds["gram float32 (opt-in)"]
        for name in spectra:
            got = _stats(spectra[name])
            err = max(abs(g - r) / r for g, r in zip(got, ref, strict=True))
            rows.append([text, name, f"{seconds[name]:.2f}", f"{seconds[name] / base:.2f}x",
                         f"{err:.1e}"])
        print(f"# {text} done", flush=True)
    table(["shape", "route", "seconds", "vs float32 gram", "max rel. error"], rows)


if __name__ == "__main__":
    main()
