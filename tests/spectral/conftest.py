"""Data generators and an exhaustive reference for the spectral tests."""

from __future__ import annotations

from collections import Counter
from importlib.util import find_spec

import numpy as np
import pytest

#: Tests that compare with the powerlaw library, or run the Taichi fitter, need those
#: optional packages; without them they show as skipped with the reason (the rest of
#: the spectral tests still run).
needs_powerlaw = pytest.mark.skipif(
    find_spec("powerlaw") is None,
    reason="needs the powerlaw library, the reference: pip install powerlaw",
)
needs_taichi = pytest.mark.skipif(
    find_spec("taichi") is None,
    reason="needs taichi for fit_method='diffract': pip install 'diffractml-kernels-spectral[taichi]'",
)


def pareto(rng: np.random.Generator, n: int, alpha: float, xmin: float = 1.0) -> np.ndarray:
    """n samples of a continuous power law with exponent alpha above xmin."""
    return xmin * (1.0 - rng.random(n)) ** (-1.0 / (alpha - 1.0))


def heavy_esd(rng: np.random.Generator, n: int, m: int, df: float) -> np.ndarray:
    """ESD (float64, by numpy SVD) of an n x m matrix of Student-t entries."""
    w = rng.standard_t(df, size=(n, m))
    return np.sort(np.linalg.svd(w, compute_uv=False) ** 2)


def exhaustive(x: np.ndarray, min_tail: int = 50) -> np.ndarray:
    """Every candidate's (xmin, alpha, D) by the module's definitions, brute force.

    Written apart from the fitter on purpose: candidates are the distinct positive values
    but the largest that leave at least ``min_tail`` points at or above them; alpha is
    the closed-form MLE on that tail; D the largest gap between the fitted CDF and the
    empirical CDF just below each distinct tail value. Rows in increasing xmin.
    """
    x = np.sort(np.asarray(x, dtype=np.float64))
    x = x[x > 0]
    n = len(x)
    values, first = np.unique(x, return_index=True)
    logs = np.log(x)
    rows = []
    for i in range(len(values) - 1):  # the largest distinct value is never a candidate
        s = first[i]
        m = n - s
        if m < min_tail:
            break
        xmin = values[i]
        alpha = 1.0 + m / np.sum(logs[s:] - np.log(xmin))
        fitted = 1.0 - (values[i:] / xmin) ** (1.0 - alpha)
        empirical = (first[i:] - s) / m
        rows.append((xmin, alpha, np.max(np.abs(fitted - empirical))))
    return np.array(rows).reshape(-1, 3)


def count_candidates(x: np.ndarray, min_tail: int = 50) -> int:
    """How many xmin candidates the data have, by counting (independent of the fitter)."""
    counts = Counter(float(v) for v in np.asarray(x).ravel() if v > 0)
    largest = max(counts)
    candidates, at_or_above = 0, 0
    for value in sorted(counts, reverse=True):
        at_or_above += counts[value]
        candidates += value != largest and at_or_above >= min_tail
    return candidates


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)
