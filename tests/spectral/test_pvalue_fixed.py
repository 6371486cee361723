"""The fixed-xmin bootstrap p-value (the original Diffract's method) against an
independent computation of the documented procedure with the same seed (issue 26 item
4): the same replicates (tail sizes in one binomial call, then the uniforms of every tail
in one call), fitted at the observed xmin one by one in plain numpy, give the same KS
distances, the same p and the same number of replicates."""

from __future__ import annotations

import numpy as np
import pytest

from diffract_kernels_spectral.fitting import fit_power_law
from diffract_kernels_spectral.significance import power_law_pvalue


def _by_hand(x: np.ndarray, fit, n_replicates: int, seed: int) -> list[float]:
    """Each replicate's KS distance at the fitted xmin (None when it has no tail)."""
    rng = np.random.default_rng(seed)
    n = len(x)
    if np.any(x < fit.xmin):
        sizes = rng.binomial(n, fit.n_tail / n, size=n_replicates)
    else:  # no body: every point from the power law
        sizes = np.full(n_replicates, n)
    uniforms = np.split(rng.random(int(sizes.sum())), np.cumsum(sizes)[:-1])
    out = []
    for u in uniforms:  # the body lies below xmin: a fit at xmin never reads it
        tail = np.sort(fit.xmin * (1.0 - u) ** (-1.0 / (fit.alpha - 1.0)))
        if len(tail) < 2 or tail[0] == tail[-1]:
            out.append(None)
            continue
        a = 1.0 + len(tail) / np.sum(np.log(tail / fit.xmin))
        gap = 0.0
        for u in np.unique(tail):  # model CDF against the share of the tail below u
            below = np.count_nonzero(tail < u) / len(tail)
            gap = max(gap, abs(1.0 - (u / fit.xmin) ** (1.0 - a) - below))
        out.append(gap)
    return out


@pytest.mark.parametrize("seed", [0, 1, 7])
@pytest.mark.parametrize("shape", ["pareto", "student"])
def test_fixed_xmin_pvalue_equals_an_independent_computation(seed, shape, monkeypatch):
    from diffract_kernels_spectral import significance

    rng = np.random.default_rng(100 + seed)
    if shape == "pareto":
        x = rng.pareto(1.7, 700) + 1.0
    else:
        w = rng.standard_t(3, (300, 500)) / 20
        x = np.linalg.eigvalsh(w @ w.T)
    x = x[x > 0]
    fit = fit_power_law(x)
    assert fit.n_tail >= 50
    seen = []
    inner = significance._fixed_xmin_distances
    monkeypatch.setattr(significance, "_fixed_xmin_distances",
                        lambda *args: seen.extend(inner(*args)) or seen)
    got = power_law_pvalue(x, fit=fit, n_replicates=60, seed=seed, xmin="fixed")
    want = [d for d in _by_hand(x, fit, 60, seed) if d is not None]
    np.testing.assert_allclose(seen, want, rtol=1e-12, atol=0)
    hits = sum(d >= fit.ks_distance for d in want)
    assert (got.p, got.replicates) == (hits / len(want), len(want))


_TWO_THREADS = r"""
import threading, numpy as np
from diffract_kernels_spectral.fitting import fit_power_law
from diffract_kernels_spectral.significance import power_law_pvalue

rng = np.random.default_rng(0)
spectra = [np.linalg.eigvalsh((lambda w: w @ w.T)(rng.standard_t(3, (384, 512))))
           for _ in range(2)]
fits = [fit_power_law(x, fit_method="powerlaw") for x in spectra]  # Taichi not started
gate, results = threading.Barrier(2), []

def run(i):
    gate.wait()
    try:
        results.append(power_law_pvalue(spectra[i], fit=fits[i], n_replicates=8).replicates)
    except Exception as exc:
        results.append(repr(exc))

threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
for t in threads: t.start()
for t in threads: t.join()
print(results)
"""


def test_taichi_started_by_two_threads_at_once_on_a_fresh_cache(tmp_path):
    """Two solver threads starting Taichi and compiling its kernels side by side (a
    fresh offline cache, so they compile) crashed one fit with Taichi's main-thread
    assertion; the kernels are now compiled once, under the start-up lock."""
    import os
    import subprocess
    import sys

    pytest.importorskip("taichi")
    env = dict(os.environ, TI_OFFLINE_CACHE_FILE_PATH=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", _TWO_THREADS], capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip().splitlines()[-1] == "[8, 8]", done.stdout
