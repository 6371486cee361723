"""Frozen result records of the public fitting functions."""

from __future__ import annotations

import attrs

__all__ = [
    "AlphaInterval",
    "Comparison",
    "ExponentialFit",
    "PowerLawFit",
    "PValue",
    "TruncatedPowerLawFit",
]


@attrs.frozen
class PowerLawFit:
    """A continuous power law ``p(x) ~ x^-alpha`` fitted to the tail ``x >= xmin``.

    ``alpha``: the maximum-likelihood exponent ``1 + n_tail / sum(ln(x_i / xmin))``;
    ``xmin``: the start of the tail; ``ks_distance``: the Kolmogorov-Smirnov distance of
    the fit (see :mod:`diffract_kernels_spectral.fitting` for its exact definition);
    ``sigma``: the standard error ``(alpha - 1) / sqrt(n_tail)``; ``n_tail``: points in
    the tail; ``n``: points considered; ``xmax``: the largest point;
    ``n_candidates``: xmin candidates searched (0 when xmin was fixed);
    ``method``: "diffract", "powerlaw" or "small_sample"; ``bounded``: the powerlaw
    library's bound (alpha <= 3) constrained its xmin search (a candidate above 3 that
    would have won was left out).
    """

    alpha: float
    xmin: float
    ks_distance: float
    sigma: float
    n_tail: int
    n: int
    xmax: float
    n_candidates: int
    method: str
    bounded: bool = False


@attrs.frozen
class TruncatedPowerLawFit:
    """``p(x) ~ x^-alpha exp(-lambda x)`` on ``x >= xmin``, by maximum likelihood."""

    alpha: float
    lambda_: float
    xmin: float
    ks_distance: float
    loglikelihood: float
    n_tail: int
    method: str


@attrs.frozen
class ExponentialFit:
    """``p(x) = lambda exp(-lambda (x - xmin))`` on ``x >= xmin``, by maximum likelihood."""

    lambda_: float
    xmin: float
    ks_distance: float
    loglikelihood: float
    n_tail: int
    method: str


@attrs.frozen
class Comparison:
    """A log-likelihood-ratio test of the power law against one alternative on one tail.

    ``R > 0`` favours the power law; ``p`` is the significance of the sign of ``R``
    (Wilks' chi-squared for nested pairs, Vuong's normal test otherwise).
    """

    alternative: str
    R: float
    p: float
    nested: bool


@attrs.frozen
class PValue:
    """The Clauset-Shalizi-Newman bootstrap goodness-of-fit p-value of a power-law fit.

    ``p``: fraction of synthetic data sets whose refitted KS distance is at least the
    observed one; ``replicates``: replicates that could be refitted; ``seed``.
    """

    p: float
    ks_distance: float
    replicates: int
    seed: int


@attrs.frozen
class AlphaInterval:
    """A bootstrap confidence interval of a power law's exponent.

    ``low``, ``high``: the ``(1 - level) / 2`` and ``(1 + level) / 2`` quantiles of the
    exponents refitted to semi-parametric bootstrap replicates of the fit (each with its
    own xmin search); ``alpha``: the fitted exponent; ``replicates``: replicates that
    could be refitted; ``level``; ``seed``.
    """

    low: float
    high: float
    alpha: float
    level: float
    replicates: int
    seed: int
