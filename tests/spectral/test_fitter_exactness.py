"""The accelerated fitter's pruning never changes the answer: a seeded randomized
comparison with an exhaustive scan, and exponents above 3 against the closed form."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from diffract_kernels_spectral import _search, _taichi, fit_power_law, fitting
from diffract_kernels_spectral._search import _REFINE_ABOVE, _SEEDS
from tests.spectral.conftest import count_candidates, exhaustive, heavy_esd, needs_taichi, pareto

pytestmark = needs_taichi

MIN_TAIL = 50


def _datasets():
    """(label, data): a few hundred seeded data sets of every shape the pruning meets."""
    rng = np.random.default_rng(20261130)
    out = []
    # Candidate counts straddling the two switches of the search: <= 4 * _SEEDS candidates
    # are all scanned exactly; bounds passes repeat while more than _REFINE_ABOVE survive.
    edges = [4 * _SEEDS - 1, 4 * _SEEDS, 4 * _SEEDS + 1, _REFINE_ABOVE - 1, _REFINE_ABOVE,
             _REFINE_ABOVE + 1, _REFINE_ABOVE + 9]
    for c in edges:
        for _ in range(4):
            out.append((f"edge-c{c}", pareto(rng, MIN_TAIL + c, rng.uniform(1.6, 3.5))))
    for _ in range(120):  # pure power laws
        n = int(rng.choice([80, 150, 400, 900, 2000]))
        out.append((f"pareto-n{n}", pareto(rng, n, rng.uniform(1.5, 4.5), rng.uniform(0.1, 10))))
    for _ in range(90):  # a lognormal body under a power-law tail
        n = int(rng.choice([200, 600, 1500, 3000]))
        body = rng.lognormal(0.0, rng.uniform(0.3, 1.5), n // 2)
        out.append((f"mixture-n{n}", np.concatenate([body, pareto(rng, n - n // 2, rng.uniform(1.8, 3.5), 3.0)])))
    for _ in range(40):  # rounded values: many ties
        n = int(rng.choice([300, 1000, 2500]))
        out.append((f"rounded-n{n}", np.round(pareto(rng, n, rng.uniform(1.7, 3.0)), int(rng.integers(1, 3)))))
    for _ in range(30):  # heavy-tailed ESDs
        n = int(rng.choice([100, 200, 300]))
        out.append((f"esd-{n}", heavy_esd(rng, n, 2 * n, rng.uniform(1.5, 3.0))))
    for n in (8000, 20_000):  # large: several bounds passes
        out.append((f"large-n{n}", pareto(rng, n, 2.2)))
        out.append((f"large-mixture-n{n}", np.concatenate([rng.lognormal(0, 1, n // 2), pareto(rng, n // 2, 2.5, 3.0)])))
    return out


@pytest.fixture
def bound_passes(monkeypatch):
    """Counts the bounds passes each fit makes (wraps the Taichi kernel)."""
    real = _taichi.kernels()
    calls = []

    def counted(kernel):
        def ks_lower(*args):
            calls.append(len(args[8]))
            return kernel(*args)
        return ks_lower

    monkeypatch.setattr(_taichi, "kernels", lambda: SimpleNamespace(
        ks_lower=counted(real.ks_lower), ks_exact=real.ks_exact,
        ks_lower_threads=counted(real.ks_lower_threads), ks_exact_threads=real.ks_exact_threads))
    return calls


@pytest.mark.parametrize("path", ["pruned", "shared", "dense"])
def test_search_equals_the_exhaustive_scan_on_hundreds_of_data_sets(bound_passes, monkeypatch,
                                                                   path):
    """On every data set the fitter returns the exhaustive scan's minimum-KS candidate
    (the smallest xmin among exact ties), its alpha and D, and the candidate count an
    independent count gives. ``pruned``: the Taichi search on every set without the
    shared-peak check (the sets exercise every branch of the bounds passes), on Taichi's
    threads; ``shared``: with it, as fits of sets this size run (in the calling thread);
    ``dense``: the numpy pass on the sets it takes."""
    if path in ("pruned", "shared"):
        monkeypatch.setattr(fitting, "DENSE_MAX_POINTS", 0)
    if path == "pruned":
        monkeypatch.setattr(_search, "_SHARED_PEAKS", 0)
        monkeypatch.setattr(_search, "PARALLEL_FROM", 0)
    else:
        monkeypatch.setattr(_taichi, "running", lambda: False)
    datasets = [(label, x) for label, x in _datasets()
                if path != "dense" or len(x) <= fitting.DENSE_MAX_POINTS]
    problems = []
    passes_per_fit = []
    for label, x in datasets:
        before = len(bound_passes)
        fit = fit_power_law(x, fit_method="diffract", min_tail=MIN_TAIL)
        passes_per_fit.append(len(bound_passes) - before)
        rows = exhaustive(x, MIN_TAIL)
        best = int(np.argmin(rows[:, 2]))
        d_min = rows[best, 2]
        chosen = np.flatnonzero(rows[:, 0] == fit.xmin)
        tie = len(chosen) == 1 and rows[chosen[0], 2] <= d_min * (1 + 1e-12) and chosen[0] < best
        if not (fit.xmin == rows[best, 0] or tie):
            problems.append(f"{label}: xmin {fit.xmin} (D={fit.ks_distance:.6g}) but the scan's "
                            f"best is {rows[best, 0]} (D={d_min:.6g})")
        elif not math.isclose(fit.ks_distance, d_min, rel_tol=1e-10, abs_tol=1e-14):
            problems.append(f"{label}: D {fit.ks_distance} vs {d_min}")
        elif not math.isclose(fit.alpha, rows[best, 1], rel_tol=1e-10):
            problems.append(f"{label}: alpha {fit.alpha} vs {rows[best, 1]}")
        if fit.n_candidates != count_candidates(x, MIN_TAIL):
            problems.append(f"{label}: n_candidates {fit.n_candidates} vs {count_candidates(x, MIN_TAIL)}")
        if fit.n_tail != int(np.sum(x >= fit.xmin)):
            problems.append(f"{label}: n_tail {fit.n_tail}")
    assert problems == []
    if path == "dense":
        assert len(datasets) >= 150 and not any(passes_per_fit)
        return
    assert len(passes_per_fit) >= 300
    if path == "shared":  # the check settles what several passes did: fewer of them
        assert max(passes_per_fit) >= 2
        return
    # Every path of the search ran: no bounds pass, one pass, and several passes.
    assert passes_per_fit.count(0) > 20
    assert sum(p == 1 for p in passes_per_fit) > 20
    assert max(passes_per_fit) >= 3


def test_a_batch_of_sets_of_different_sizes_finds_each_sets_exhaustive_winner():
    """Sets of different sizes searched in one batch (as replicates are) each get their
    exhaustive scan's winner: their grids have different strides, and the largest has
    enough candidates for scouts that lend their peaks (indices offset per set)."""
    rng = np.random.default_rng(20261203)
    xs = [np.sort(pareto(rng, 400, 2.6)), np.sort(pareto(rng, 3000, 2.2)),
          np.sort(np.concatenate([rng.lognormal(0, 1, 4500), pareto(rng, 4500, 2.4, 3.0)])),
          np.sort(pareto(rng, 1200, 3.1))]
    assert len(_search._starts(xs[2], MIN_TAIL)) > _search._SCOUTS
    starts_list = [_search._starts(x, MIN_TAIL) for x in xs]
    winners, _ = _search._search_many(xs, starts_list)
    for x, starts, won in zip(xs, starts_list, winners, strict=True):
        rows = exhaustive(x, MIN_TAIL)
        assert x[starts[won]] == rows[int(np.argmin(rows[:, 2])), 0]

@pytest.mark.parametrize("alpha", [3.5, 5.0, 8.0])
def test_exponents_above_three_match_the_closed_form_and_the_scan(alpha):
    """Where powerlaw cannot be the reference (it bounds alpha to 3): the fitted xmin is
    the exhaustive scan's, alpha is the closed form on that tail, and it is near truth."""
    rng = np.random.default_rng(int(alpha * 10))
    x = np.concatenate([rng.uniform(0.2, 1.0, 500), pareto(rng, 4000, alpha)])
    fit = fit_power_law(x, fit_method="diffract")
    rows = exhaustive(x)
    assert fit.xmin == rows[np.argmin(rows[:, 2]), 0]
    tail = np.sort(x)[np.sort(x) >= fit.xmin]
    assert fit.alpha == pytest.approx(1.0 + len(tail) / np.sum(np.log(tail / fit.xmin)), rel=1e-12)
    assert fit.sigma == pytest.approx((fit.alpha - 1.0) / math.sqrt(len(tail)), rel=1e-12)
    assert fit.alpha > 3.0 and abs(fit.alpha - alpha) < 5 * fit.sigma


@pytest.mark.parametrize("n", [70, 400], ids=["all-scanned", "pruned"])
def test_exact_ties_go_to_the_smallest_xmin(monkeypatch, n):
    """When every candidate's KS distance is exactly equal, the fit is the smallest xmin
    (as an ordered scan would pick), on both paths of the search. Real data almost
    never tie exactly, so the rule is checked with distances made equal on purpose."""
    def ks_exact(logx, first, starts, ends, alphas, stride, stops, hints, out):
        out[:] = 0.25

    def ks_lower(logx, first, grid, grid_logx, grid_first, grid_from, grid_to, hints, starts,
                 ends, alphas, stops, lower, where, budget):
        lower[:] = 0.25
        where[:] = starts

    monkeypatch.setattr(_taichi, "kernels", lambda: SimpleNamespace(
        ks_lower=ks_lower, ks_exact=ks_exact, ks_lower_threads=ks_lower,
        ks_exact_threads=ks_exact))
    monkeypatch.setattr(fitting, "DENSE_MAX_POINTS", 0)
    x = pareto(np.random.default_rng(n), n, 2.5)
    fit = fit_power_law(x, fit_method="diffract")
    assert fit.xmin == np.sort(x)[0]


@pytest.mark.parametrize("shared", [False, True], ids=["passes", "shared-peaks"])
def test_every_bound_is_sound_and_every_candidate_left_out_is_beaten(shared):
    """On sets that take several bounds passes, every distance the search computes is
    held to the exhaustive scan: each lower bound at most the candidate's distance, each
    exact scan its distance (or a value above the threshold it stopped at), each
    candidate dropped by the check next to its peak or at its set's shared peaks has a
    distance above the best, and each candidate never scanned exactly has a bound above
    the best distance (one that could win was not left out). The final answer alone
    would miss a lost survivor that happens not to be the winner on these sets."""
    real, real_near_peak = _taichi.kernels(), _search._near_peak
    real_shared = _search._at_shared_peaks
    seen = {"lower": [], "exact": [], "near": []}

    def near_peak(ids, logx, first, starts, *rest):
        kept = real_near_peak(ids, logx, first, starts, *rest)
        seen["near"].extend(starts[np.setdiff1d(ids, kept)].tolist())
        return kept

    def at_shared_peaks(ids, logx, first, starts, *rest):
        kept = real_shared(ids, logx, first, starts, *rest)
        seen["near"].extend(starts[np.setdiff1d(ids, kept)].tolist())
        return kept

    # the check's path in the calling thread, the passes' path on Taichi's threads
    real_lower = real.ks_lower if shared else real.ks_lower_threads
    real_exact = real.ks_exact if shared else real.ks_exact_threads

    def ks_lower(*args):
        real_lower(*args)
        seen["lower"].append((args[8].copy(), args[12].copy()))

    def ks_exact(logx, first, starts, ends, alphas, stride, stops, hints, out):
        real_exact(logx, first, starts, ends, alphas, stride, stops, hints, out)
        seen["exact"].append((starts.copy(), out.copy(), stops.copy()))

    kernels = SimpleNamespace(ks_lower=ks_lower, ks_exact=ks_exact, ks_lower_threads=ks_lower,
                              ks_exact_threads=ks_exact)
    rng = np.random.default_rng(20261201)
    sets = [pareto(rng, 6000, 2.3), pareto(rng, 15_000, 2.0),
            np.concatenate([rng.lognormal(0, 1, 4000), pareto(rng, 6000, 2.5, 3.0)]),
            heavy_esd(rng, 1500, 3000, 2.2)]
    passes, near = [], []
    for x in sets:
        for kind in seen.values():
            kind.clear()
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(_taichi, "kernels", lambda: kernels)
            mp.setattr(_search, "_near_peak", near_peak)
            mp.setattr(_search, "_at_shared_peaks", at_shared_peaks)
            if not shared:
                mp.setattr(_search, "_SHARED_PEAKS", 0)
                mp.setattr(_search, "PARALLEL_FROM", 0)
            mp.setattr(_search, "_REFINE_ABOVE", 16)  # more passes on these small sets
            mp.setattr(fitting, "DENSE_MAX_POINTS", 0)
            fit = fit_power_law(x, fit_method="diffract", min_tail=MIN_TAIL)
        rows = exhaustive(x, MIN_TAIL)
        xs = np.sort(x[x > 0])
        distance = dict(zip(np.searchsorted(xs, rows[:, 0]).tolist(), rows[:, 2], strict=True))
        d_best = rows[:, 2].min()
        assert fit.ks_distance == pytest.approx(d_best, rel=1e-10)
        passes.append(len(seen["lower"]))
        bound = {}
        for starts, lower in seen["lower"]:
            for s, lo in zip(starts.tolist(), lower.tolist(), strict=True):
                assert lo <= distance[s] + 1e-12, f"bound {lo} above the distance {distance[s]}"
                bound[s] = max(bound.get(s, 0.0), lo)
        scanned = set()
        for starts, out, stops in seen["exact"]:
            for s, d, stop in zip(starts.tolist(), out.tolist(), stops.tolist(), strict=True):
                assert d <= distance[s] + 1e-12 and (d >= distance[s] - 1e-12 or d > stop)
                scanned.add(s)
        assert all(distance[s] > d_best for s in seen["near"])
        near.append(len(seen["near"]))
        left_out = [s for s in distance if s not in scanned and s not in seen["near"]
                    and not bound.get(s, 0.0) > d_best]
        assert left_out == [], f"{len(left_out)} candidate(s) neither scanned nor beaten"
    assert min(passes) >= 1 and max(passes) >= (2 if shared else 3)  # scouts, bounds passes
    assert max(near) > 0  # the checks next to the peaks dropped survivors


def test_small_sets_run_in_the_calling_thread_and_large_ones_on_the_threads(monkeypatch):
    """The kernels run on Taichi's threads only for a data set of ``PARALLEL_FROM``
    points or more (below it the threads never paid and a busy machine delays every
    launch, docs/spectral.md); both routes give the same fit, bit for bit."""
    real = _taichi.kernels()
    used = []

    def named(name):
        def kernel(*args):
            used.append(name)
            return getattr(real, name)(*args)
        return kernel

    monkeypatch.setattr(_taichi, "kernels", lambda: SimpleNamespace(**{
        name: named(name) for name in ("ks_lower", "ks_exact", "ks_lower_threads",
                                       "ks_exact_threads")}))
    monkeypatch.setattr(fitting, "DENSE_MAX_POINTS", 0)
    monkeypatch.setattr(_search, "PARALLEL_FROM", 5000)
    fits = {}
    for n in (4999, 5000):
        x = pareto(np.random.default_rng(3), n, 2.3)
        used.clear()
        fit = fit_power_law(x, fit_method="diffract")
        threads = {name.endswith("_threads") for name in used}
        assert threads == {n >= 5000} and "ks_exact" in {u.removesuffix("_threads") for u in used}
        monkeypatch.setattr(_search, "PARALLEL_FROM", n + 1 if n >= 5000 else 0)  # the other route
        other = fit_power_law(x, fit_method="diffract")
        monkeypatch.setattr(_search, "PARALLEL_FROM", 5000)
        fits[n] = (fit, other)
    for fit, other in fits.values():
        assert (fit.xmin, fit.alpha, fit.ks_distance) == (other.xmin, other.alpha,
                                                          other.ks_distance)
