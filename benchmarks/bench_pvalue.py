"""The bootstrap's cost: the p-value (xmin fixed, the original Diffract's method, and xmin
searched, CSN's) and the confidence interval of alpha, 100 replicates of a 768-point
spectrum (a Student-t 768 x 3072 matrix's ESD), after a warm-up (Taichi started).

The original Diffract (diffract-core 0.3.1, Python >= 3.12 only) runs in the same run
when ``--original PYTHON`` names an interpreter that has it (with taichi): its
``Fit(esd, "power_law")``, ``fit_params()``, then ``p_value_test()`` with its replicate
count set to ours (it defaults to 2,500), median of the same repeats after a warm-up, on
the same spectrum (handed over as a .npy file). Set it up with:

    python3.12 -m venv /tmp/orig312 && /tmp/orig312/bin/pip install diffract-core==0.3.1 taichi

Correctness: tests/spectral/test_pvalue_fixed.py and tests/spectral/test_estimators.py.

    python benchmarks/bench_pvalue.py [--replicates 100] [--repeats 10] [--original PYTHON]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, median_time, table  # noqa: E402

ORIGINAL = """
import statistics, sys, time
import numpy as np
from diffract.core.compute.extensions.power_law import Fit
esd, replicates, repeats = np.load(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
fit = Fit(esd, "power_law")
fit.fit_params()
fit.p_value_test_iters = replicates
fit.p_value_test()  # warm-up: Taichi compiles
times = []
for _ in range(repeats):
    start = time.perf_counter()
    fit.p_value_test()
    times.append(time.perf_counter() - start)
print(statistics.median(times))
"""


def original_ms(python: str, esd: np.ndarray, replicates: int, repeats: int) -> float | None:
    """The original's fixed-xmin p-value time in ms (None, with the reason, if it fails)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "esd.npy"
        np.save(path, esd)
        done = subprocess.run([python, "-c", ORIGINAL, str(path), str(replicates),
                               str(repeats)], capture_output=True, text=True)
    if done.returncode != 0:
        print(f"# the original did not run ({python}): {done.stderr.strip()[-300:]}")
        return None
    return float(done.stdout.strip().splitlines()[-1]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicates", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--original", metavar="PYTHON",
                        help="a Python with diffract-core 0.3.1 and taichi (see above)")
    args = parser.parse_args()
    from diffract_kernels_spectral import fit_power_law, power_law_alpha_interval, power_law_pvalue

    header("bootstrap p-value and alpha interval, 100 replicates of 768 points",
           ["numpy", "taichi", "diffractml-kernels-spectral"])
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
    theirs = original_ms(args.original, esd, n, args.repeats) if args.original else None
    if theirs is not None:
        rows.append(["original 0.3.1 p_value_test, xmin fixed", f"{theirs:.1f}", ""])
    table(["method", "ms", "vs searched p-value"], rows)
    if theirs is None:
        print("# the original was not run (--original PYTHON)")
    else:
        ours = seconds["p-value, xmin fixed"] * 1e3
        print(f"# fixed-xmin p-value, same run: ours {ours:.2f} ms, the original's {theirs:.2f} "
              f"ms: {theirs / ours:.1f}x faster")


if __name__ == "__main__":
    main()
