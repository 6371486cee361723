"""The bootstrap's cost: the p-value (xmin fixed, the original Diffract's method, and xmin
searched, CSN's) and the confidence interval of alpha, 100 replicates of a 768-point
spectrum (a Student-t 768 x 3072 matrix's ESD), after a warm-up (Taichi started).

The original Diffract (diffract-core 0.3.1, Python >= 3.12 only, so not run here) takes
3.8 ms for the fixed-xmin p-value of such a spectrum (measured for issue 26 on this kind
of machine); the line "original (issue 26)" prints that number beside ours. Correctness:
tests/spectral/test_pvalue_fixed.py and tests/spectral/test_estimators.py.

    python benchmarks/bench_pvalue.py [--replicates 100] [--repeats 10]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, median_time, table  # noqa: E402

ORIGINAL_FIXED_MS = 3.8


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    from diffract_kernels_spectral import fit_power_law, power_law_alpha_interval, power_law_pvalue

    header("bootstrap p-value and alpha interval, 100 replicates of 768 points",
           ["numpy", "taichi", "diffract-kernels-spectral"])
    rng = np.random.default_rng(0)
    w = rng.standard_t(4, (768, 3072)) / 30
    esd = np.linalg.eigvalsh(w @ w.T)
    fit = fit_power_law(esd)
    n = args.replicates
    runs = {
        "p-value, xmin fixed": lambda: power_law_pvalue(esd, fit=fit, n_replicates=n,
                                                        xmin="fixed"),
        "p-value, xmin searched": lambda: power_law_pvalue(esd, fit=fit, n_replicates=n),
        "alpha interval (xmin searched)": lambda: power_law_alpha_interval(
            esd, fit=fit, n_replicates=n),
    }
    for run in runs.values():  # warm-up: Taichi's start-up, caches
        run()
    seconds = {name: median_time(run, args.repeats)[0] for name, run in runs.items()}
    searched = seconds["p-value, xmin searched"]
    rows = [[name, f"{s * 1e3:.1f}", f"{s / searched:.2f}x"] for name, s in seconds.items()]
    rows.append(["original (issue 26), xmin fixed", f"{ORIGINAL_FIXED_MS:.1f}", ""])
    table(["method", "ms", "vs searched p-value"], rows)
    print(f"# fixed-xmin p-value: ours / the original's = "
          f"{seconds['p-value, xmin fixed'] * 1e3 / ORIGINAL_FIXED_MS:.2f}")


if __name__ == "__main__":
    main()
