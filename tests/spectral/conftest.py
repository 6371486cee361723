"""Data generators and an exhaustive reference for the spectral tests."""

from __future__ import annotations

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
    reason="needs taichi for fit_method='diffract': pip install 'diffract-kernels-spectral[taichi]'",
)


def pareto(rng: np.random.Generator, n: int, alpha: float, xmin: float = 1.0) -> np.ndarray:
    """n samples of a continuous power law with exponent alpha above xmin."""
    return xmin * (1.0 - rng.random(n)) ** (-1.0 / (alpha - 1.0))


def heavy_esd(rng: np.random.Generator, n: int, m: int, df: float) -> np.ndarray:
    """ESD (float64, by numpy SVD) of an n x m matrix of Student-t entries."""
    w = rng.standard_t(df, size=(n, m))
    return np.sort(np.linalg.svd(w, compute_uv=False) ** 2)


def exhaustive(x: np.ndarray, min_tail: int = 50):
    """Every candidate's (xmin, alpha, D) by the module's definitions, brute force."""
    x = np.sort(x[x > 0])
    values = np.unique(x)[:-1]
    rows = []
    for xmin in values:
        tail = x[x >= xmin]
        if len(tail) < min_tail:
            break
        alpha = 1.0 + len(tail) / np.sum(np.log(tail / xmin))
        u, first = np.unique(tail, return_index=True)
        d = np.max(np.abs(1.0 - (u / xmin) ** (1.0 - alpha) - first / len(tail)))
        rows.append((xmin, alpha, d))
    return np.array(rows)


@pytest.fixture
def rng():
    return np.random.default_rng(20261129)
