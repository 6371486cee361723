"""Random-matrix laws the spectral kernels compare spectra with.

* :func:`mp_cdf`: the Marchenko-Pastur distribution of the eigenvalues of ``X^T X / N``
  for an ``N x M`` matrix ``X`` of i.i.d. entries with variance ``sigma^2``, ratio
  ``y = M / N <= 1``: support ``sigma^2 [(1 - sqrt y)^2, (1 + sqrt y)^2]``. The CDF is
  integrated numerically after the substitution ``z = a + (b - a)(1 - cos t) / 2``,
  which turns the density's square-root edges into a smooth integrand, so a cumulative
  trapezoid on a uniform ``t`` grid, interpolated linearly, is accurate to about 1e-7.
* :func:`tracy_widom1_quantile`: quantiles of the Tracy-Widom law for real (beta = 1)
  matrices, the limiting law of the largest eigenvalue at the soft edge. With ``q`` the
  Hastings-McLeod solution of Painleve II (``q'' = s q + 2 q^3``, ``q ~ Ai`` as ``s ->
  inf``), ``F1(s) = exp(-(1/2) int_s^inf q(x) dx - (1/2) int_s^inf (x - s) q(x)^2 dx)``.
  The equation is integrated once per process from ``s = 8`` (Airy start) down to
  ``s = -8`` with the integrals carried as extra state, and quantiles are found by root
  finding on the dense solution.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

__all__ = ["mp_cdf", "tracy_widom1_cdf", "tracy_widom1_quantile"]

_GRID = 4097


@functools.lru_cache(maxsize=64)
def _mp_table(y: float) -> tuple[float, float, np.ndarray]:
    """``(a, b, F(t))`` on a uniform grid of ``t`` in ``[0, pi]`` for ratio ``y``."""
    a, b = (1.0 - math.sqrt(y)) ** 2, (1.0 + math.sqrt(y)) ** 2
    t = np.linspace(0.0, math.pi, _GRID)
    z = a + (b - a) * (1.0 - np.cos(t)) / 2.0
    half = (b - a) / 2.0
    with np.errstate(divide="ignore", invalid="ignore"):
        # density dz = half^2 sin^2 t / (2 pi y z) dt; at y = 1 (a = 0) the t -> 0 limit
        # of sin^2 t / z is 4 / b
        f = half**2 * np.sin(t) ** 2 / (2.0 * math.pi * y * z)
    if a == 0.0:
        f[0] = half**2 * 4.0 / b / (2.0 * math.pi * y)
    cdf = np.concatenate([[0.0], np.cumsum((f[1:] + f[:-1]) / 2.0 * np.diff(t))])
    return a, b, cdf / cdf[-1]


def mp_cdf(x: Any, y: float, sigma: float = 1.0) -> np.ndarray:
    """Marchenko-Pastur CDF at ``x`` for ratio ``y`` in (0, 1] and entry std ``sigma``."""
    if not 0.0 < y <= 1.0:
        raise ValueError(f"the ratio y = M / N must be in (0, 1], got {y}")
    if not sigma > 0:
        raise ValueError(f"sigma must be positive, got {sigma}")
    a, b, table = _mp_table(float(y))
    z = np.asarray(x, dtype=np.float64) / sigma**2
    inside = np.clip((z - a) / (b - a), 0.0, 1.0)
    t = np.arccos(1.0 - 2.0 * inside)
    return np.interp(t, np.linspace(0.0, math.pi, _GRID), table)


@functools.lru_cache(maxsize=1)
def _tw1_solution() -> Any:
    from scipy.integrate import quad, solve_ivp
    from scipy.special import airy

    start, stop = 8.0, -8.0
    ai, aip, _, _ = airy(start)
    ai2 = quad(lambda x: airy(x)[0] ** 2, start, np.inf, epsabs=0, epsrel=1e-13)[0]
    ai1 = quad(lambda x: airy(x)[0], start, np.inf, epsabs=0, epsrel=1e-13)[0]
    moment = quad(lambda x: (x - start) * airy(x)[0] ** 2, start, np.inf,
                  epsabs=0, epsrel=1e-13)[0]

    # state: q, q', Q1 = int_s q, Q2 = int_s q^2, R = int_s (x - s) q^2 (all from s to inf)
    def rhs(s: float, v: np.ndarray) -> list[float]:
        q, dq, _, q2, _ = v
        return [dq, s * q + 2.0 * q**3, -q, -q * q, -q2]

    sol = solve_ivp(rhs, (start, stop), [ai, aip, ai1, ai2, moment], method="DOP853",
                    rtol=1e-12, atol=1e-16, dense_output=True)
    if not sol.success:  # pragma: no cover - a numerical failure of scipy
        raise RuntimeError(f"Painleve II integration failed: {sol.message}")
    return sol


def tracy_widom1_cdf(s: float) -> float:
    """``F1(s)``, the Tracy-Widom (beta = 1) CDF, for ``s`` in [-8, 8]."""
    if not -8.0 <= s <= 8.0:
        raise ValueError(f"s must be in [-8, 8], got {s}")
    _, _, q1, _, r = _tw1_solution().sol(s)
    return float(math.exp(-0.5 * q1 - 0.5 * r))


@functools.lru_cache(maxsize=64)
def tracy_widom1_quantile(p: float) -> float:
    """The ``s`` with ``F1(s) = p``, for ``p`` in ``[1e-12, 1 - 1e-12]`` (cached: every
    parameter of a model asks for the same threshold)."""
    from scipy.optimize import brentq

    if not 1e-12 <= p <= 1.0 - 1e-12:
        raise ValueError(f"p must be in [1e-12, 1 - 1e-12], got {p}")
    return float(brentq(lambda s: tracy_widom1_cdf(s) - p, -8.0, 8.0, xtol=1e-12))
