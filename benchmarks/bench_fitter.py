"""The accelerated power-law fitter against the powerlaw library, same data, same candidates.

Run: ``./dev bench fitter`` (``--large-only``: the 10^6 samples alone, in minutes;
``--load``: the fits quiet and beside two busy loops, ours, ours single-threaded and
powerlaw in the same run, with Taichi's start in fresh processes).
Correctness: tests/spectral/test_fitting.py::TestParityWithPowerlaw.
For each n, both fit the same Pareto sample (alpha 2.3) over the same xmin candidates
(tails of at least 50 points: ``candidate_range`` hands them to powerlaw); the script
checks they agree (xmin equal, alpha within 1e-9) and prints medians and the ratio.
powerlaw is not run at 10^6 points (its search is quadratic: hours). Then more samples
at 10^6: other seeds and an ESD-like mixture.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from _common import header, median_time, table  # noqa: E402

CASES = [  # (n, repeats of ours, repeats of powerlaw; 0: not run, it would take hours)
    (1_000, 30, 3),
    (4_000, 30, 1),
    (16_000, 30, 1),
    (100_000, 9, 1),
    (1_000_000, 5, 0),
]
#: Further samples at 10^6 (other seeds, and an ESD-like mixture): the search's time
#: depends on the data (how many candidates fit almost equally well).
LARGE = 1_000_000


def main() -> None:
    import powerlaw

    from diffract_kernels_spectral import candidate_range, fit_power_law

    header("power-law fit: diffract (Taichi, exact bounded search) vs powerlaw.Fit",
           ["diffractml-kernels-spectral", "powerlaw", "taichi", "numpy"])
    rng = np.random.default_rng(0)
    # start taichi and compile the kernels (1024 points or fewer take the numpy path)
    fit_power_law(rng.pareto(1.3, 5000) + 1, fit_method="diffract")
    large_only = "--large-only" in sys.argv  # the 10^6 samples alone (powerlaw not run)
    rows = []
    for n, ours_reps, lib_reps in CASES:
        if large_only and n != LARGE:
            rng.random(n)  # the same 10^6 sample as a full run
            continue
        x = (1.0 - rng.random(n)) ** (-1.0 / 1.3)
        t_ours, ours = median_time(
            lambda x=x: fit_power_law(x, fit_method="diffract"), ours_reps
        )
        if not lib_reps:
            rows.append([n, ours.n_candidates, f"{t_ours * 1e3:.1f} ms", "not run", "", ""])
            continue
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
    print()
    documented = x  # the 10^6 sample of the table above
    others = [("the table's Pareto sample (documented)", documented)]
    # seeds 1012345, 4, 6: the best xmin at the very bottom (tails of 998,000+ points, the
    # ordinary power-law input) where many candidates nearly tie; 5 just above it
    for seed in (1, 2, 3, 1012345, 4, 5, 6):
        r = np.random.default_rng(seed)
        others.append((f"Pareto alpha 2.3, seed {seed}", (1.0 - r.random(LARGE)) ** (-1.0 / 1.3)))
        if seed <= 3:
            body = r.chisquare(3, LARGE - LARGE // 20) / 3
            others.append((f"ESD-like (chi2 bulk + 5% Pareto tail), seed {seed}",
                           np.r_[body, (1 - r.random(LARGE // 20)) ** (-1 / 1.5) * 4]))
    r = np.random.default_rng(7)  # the best xmin near the top: a lognormal body, 0.1% tail
    others.append(("lognormal body + 0.1% Pareto tail (xmin near the top)",
                   np.r_[r.lognormal(0, 0.5, LARGE - LARGE // 1000),
                         (1 - r.random(LARGE // 1000)) ** (-1 / 1.3) * 20]))

    def fitted(x: np.ndarray) -> tuple[float, int]:
        seconds, fit = median_time(lambda: fit_power_law(x, fit_method="diffract"), 3)
        return seconds, fit.n_tail

    times = [(label, *fitted(x)) for label, x in others]
    base = times[0][1]
    table([f"n = {LARGE:,}", "diffract (median of 3)", "tail", "/ documented (target <= 2)"],
          [[label, f"{t:.2f} s", f"{tail:,}", f"{t / base:.2f}x"] for label, t, tail in times])


def _busy_loops(count: int) -> list[subprocess.Popen]:
    """``count`` processes that spin a core each (what a loaded machine does to us)."""
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]


def under_load() -> None:
    """Each fit quiet, then beside two busy loops (a 2-core machine fully taken): ours as
    it runs, ours single-threaded (every kernel in the calling thread: the reference the
    issue asks us to degrade no worse than) and powerlaw at 16k and 10^5, in one
    process; Taichi's first start in fresh processes."""
    import powerlaw

    from diffract_kernels_spectral import _search, candidate_range, fit_power_law

    header("power-law fits quiet and beside two busy loops",
           ["diffractml-kernels-spectral", "powerlaw", "taichi", "numpy"])
    rng = np.random.default_rng(0)
    fit_power_law(rng.pareto(1.3, 5000) + 1, fit_method="diffract")
    samples = {n: (1.0 - rng.random(n)) ** (-1.0 / 1.3) for n in (16_000, 100_000)}
    samples[LARGE] = (1.0 - np.random.default_rng(4).random(LARGE)) ** (-1.0 / 1.3)
    repeats = {16_000: 16, 100_000: 8, LARGE: 6}
    routing = _search.PARALLEL_FROM

    def ours(x, threads_from):
        _search.PARALLEL_FROM = threads_from
        try:
            fit_power_law(x, fit_method="diffract")
        finally:
            _search.PARALLEL_FROM = routing

    def lib(x):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            powerlaw.Fit(x, xmin=candidate_range(x), verbose=False)

    start = ("import time; t = time.perf_counter(); from diffract_kernels_spectral import "
             "_taichi; _taichi.kernels(); print(time.perf_counter() - t)")
    timings: dict[tuple[str, str], float] = {}
    for label, loops in (("quiet", 0), ("two busy loops", 2)):
        procs = _busy_loops(loops)
        try:
            time.sleep(0.5 if loops else 0)
            for n, x in samples.items():
                # below PARALLEL_FROM ours is the single-threaded fit: one row
                routes = ([("ours", routing), ("ours, single-threaded", float("inf"))]
                          if n >= routing else [("ours (calling thread at this size)", routing)])
                runs: dict[str, list[float]] = {name: [] for name, _ in routes}
                for i in range(repeats[n]):  # alternating, each first in turn: drifts hit both
                    for name, threads_from in routes[i % 2:] + routes[:i % 2]:
                        t = time.perf_counter()
                        ours(x, threads_from)
                        runs[name].append(time.perf_counter() - t)
                for name, values in runs.items():
                    timings[(f"{name}, n={n:,}", label)] = statistics.median(values)
                if n < LARGE:  # one fit each: minutes at 10^5
                    timings[(f"powerlaw, n={n:,}", label)] = median_time(lambda x=x: lib(x), 1)[0]
            firsts = [float(subprocess.run([sys.executable, "-c", start], capture_output=True,
                                           text=True, check=True).stdout.split()[-1])
                      for _ in range(3)]
            timings[("Taichi's first start (fresh process)", label)] = statistics.median(firsts)
        finally:
            for proc in procs:
                proc.kill()
    rows = []
    for name in dict.fromkeys(k for k, _ in timings):
        quiet, loaded = timings[(name, "quiet")], timings[(name, "two busy loops")]
        rows.append([name, f"{quiet * 1e3:.1f} ms", f"{loaded * 1e3:.1f} ms",
                     f"{loaded / quiet:.2f}x"])
    table(["fit (median)", "quiet", "two busy loops", "loaded / quiet"], rows)


if __name__ == "__main__":
    if "--load" in sys.argv:
        under_load()
    else:
        main()
