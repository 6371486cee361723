"""The accelerated power-law fitter against the powerlaw library, same data, same candidates.

Run: ``./dev bench fitter``. Correctness: tests/spectral/test_fitting.py::TestParityWithPowerlaw.
For each n, both fit the same Pareto sample (alpha 2.3) over the same xmin candidates
(tails of at least 50 points: ``candidate_range`` hands them to powerlaw); the script
checks they agree (xmin equal, alpha within 1e-9) and prints medians and the ratio.
"""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, median_time, table  # noqa: E402

CASES = [  # (n, repeats of ours, repeats of powerlaw)
    (1_000, 30, 3),
    (4_000, 30, 1),
    (16_000, 30, 1),
]


def main() -> None:
    import powerlaw

    from diffract_kernels_spectral import candidate_range, fit_power_law

    header("power-law fit: diffract (Taichi, exact bounded search) vs powerlaw.Fit",
           ["diffract-kernels-spectral", "powerlaw", "taichi", "numpy"])
    rng = np.random.default_rng(0)
    fit_power_law(rng.pareto(1.3, 500) + 1, fit_method="diffract")  # compile the kernels
    rows = []
    for n, ours_reps, lib_reps in CASES:
        x = (1.0 - rng.random(n)) ** (-1.0 / 1.3)
        t_ours, ours = median_time(
            lambda x=x: fit_power_law(x, fit_method="diffract"), ours_reps
        )
        rng_xmin = candidate_range(x)

        def lib(x=x, rng_xmin=rng_xmin):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                return powerlaw.Fit(x, xmin=rng_xmin, verbose=False)

        t_lib, fit = median_time(lib, lib_reps)
        same = ours.xmin == fit.xmin and abs(ours.alpha - fit.alpha) <= 1e-9 * fit.alpha
        rows.append([n, ours.n_candidates, f"{t_ours * 1e3:.1f} ms", f"{t_lib:.2f} s",
                     f"{t_lib / t_ours:.0f}x", "yes" if same else "NO"])
    table(["n", "candidates", "diffract", "powerlaw", "speed-up", "same fit"], rows)


if __name__ == "__main__":
    main()
