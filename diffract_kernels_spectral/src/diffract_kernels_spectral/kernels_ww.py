"""WeightWatcher's per-layer diagnostics under its column names (semantics of
WeightWatcher 0.7.7's analyze(); notation as in :mod:`diffract_kernels_spectral.kernels`).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np

from diffract import FieldUndefined, Range, kernel
from diffract_kernels_spectral.kernels import _MATRIX, Conv, marchenko_pastur, view

__all__ = ["ALL"]


@kernel(restrictions=_MATRIX)
def matrix_rank(svals: np.ndarray, shape: tuple[int, ...], *, conv: Conv = "matrix") -> int:
    """``#{i : sigma_i > sigma_max N eps}`` with ``eps`` float64's machine epsilon:
    ``numpy.linalg.matrix_rank``'s default rule, on the float64 singular values (under
    ``conv="weightwatcher"`` a convolution's pooled over its kernel positions, ``N`` theirs,
    as WeightWatcher 0.7.7 counts them)."""
    s = np.asarray(svals, dtype=np.float64)
    if s.size == 0 or not s[0] > 0:
        return 0
    big = max(view(shape, conv)[:2])
    return int(np.count_nonzero(s > s[0] * big * np.finfo(np.float64).eps))


@kernel
def rank_loss(matrix_rank: int, num_evals: int) -> int:
    """``num_evals - matrix_rank``: directions the matrix has lost to rounding."""
    return int(num_evals - matrix_rank)


@kernel
def weak_rank_loss(svals: np.ndarray, esd_scale: float, *,
                   tolerance: Annotated[float, Range(ge=0.0)] = 1e-6) -> int:
    """``#{i : c sigma_i^2 < tolerance}``: eigenvalues below ``tolerance`` (WeightWatcher's
    default 1e-6), from the float64 singular values (an ``esd`` computed with the
    float32 opt-in zeroes eigenvalues below its noise floor, which would count them
    all)."""
    s = np.asarray(svals, dtype=np.float64)
    return int(np.count_nonzero(esd_scale * s * s < tolerance))


@kernel
def num_pl_spikes(esd: np.ndarray, pl_xmin: float) -> int:
    """``#{i : lambda_i >= pl_xmin}``: eigenvalues in the power-law tail, counting those
    a finger fix left out of the fit (``pl_n_tail`` does not count them)."""
    return int(np.count_nonzero(np.asarray(esd) >= pl_xmin))


@kernel
def rand_distance(esd: np.ndarray, esd_rand: np.ndarray) -> float:
    """Jensen-Shannon distance between the sorted ESD and the sorted randomized ESD, each
    normalised to sum 1 (WeightWatcher's comparison of the two vectors): ``sqrt((KL(p ||
    m) + KL(q || m)) / 2)``, ``m = (p + q) / 2``, natural logarithms; 0 when shuffling
    changes nothing, at most ``sqrt(ln 2)``."""
    p = np.asarray(esd, dtype=np.float64)
    q = np.asarray(esd_rand, dtype=np.float64)
    if p.shape != q.shape or p.size == 0:
        raise FieldUndefined("the ESD and the randomized ESD differ in length or are empty")
    if not (p.sum() > 0 and q.sum() > 0):
        raise FieldUndefined("rand_distance is undefined for an all-zero matrix")
    p, q = p / p.sum(), q / q.sum()
    m = (p + q) / 2.0

    def kl(a: np.ndarray) -> float:
        nz = a > 0
        return float(np.sum(a[nz] * np.log(a[nz] / m[nz])))

    return float(math.sqrt(max((kl(p) + kl(q)) / 2.0, 0.0)))


@kernel
def ww_softrank(esd_rand_max: float, esd_max: float) -> float:
    """``lambda_rand_max / lambda_max``: the randomized spectrum's top against the
    trained one's."""
    if not esd_max > 0:
        raise FieldUndefined("ww_softrank is undefined for an all-zero matrix")
    return float(esd_rand_max / esd_max)


@kernel
def ww_maxdist(esd_max: float, esd_rand_max: float) -> float:
    """``lambda_max - lambda_rand_max``."""
    return float(esd_max - esd_rand_max)


@kernel(produce_fields=("detX_num", "detX_val"), aliases={"num_ERG_spikes": "detX_num"})
def detx(esd: np.ndarray) -> tuple[int, float]:
    """The ERG (``det X = 1``) tail: with the ESD rescaled to mean 1 (``x_i = k lambda_i /
    sum_j lambda_j``), ``detX_num`` is the number of largest eigenvalues taken, from the
    top down, when their product first falls below 1 (``k`` if it never does);
    ``detX_val`` the smallest eigenvalue taken (unscaled; at index 1 when the product
    never falls below 1, as WeightWatcher)."""
    values = np.asarray(esd, dtype=np.float64)
    k = values.size
    if k < 2 or not values[0] < values[-1]:
        raise FieldUndefined("detX needs at least two distinct eigenvalues")
    x = values * (k / values.sum())
    with np.errstate(divide="ignore"):
        partial = np.cumsum(np.log(x[:0:-1]))  # log prod of x[i:] for i = k-1 .. 1
    below = np.flatnonzero(partial < 0.0)
    if below.size == 0:
        return k, float(values[1])
    idx = k - 1 - int(below[0])
    return k - idx, float(values[idx])


@kernel
def ERG_gap(detX_num: int, num_pl_spikes: int) -> int:  # noqa: N802 - WeightWatcher's name
    """``detX_num - num_pl_spikes``: the ERG tail's size against the power-law tail's."""
    return int(detX_num - num_pl_spikes)


@kernel(restrictions=_MATRIX)
def num_traps(esd_rand: np.ndarray, shape: tuple[int, ...], *,
              bulk: Literal["frobenius", "fitted"] = "frobenius",
              conv: Conv = "matrix") -> int:
    """Correlation traps (WeightWatcher 0.7.7's ``num_traps``): the eigenvalues of the
    randomized ESD (``esd_rand``: the entries shuffled, so only outlier entries, not
    correlations, can stand out) beyond its Marchenko-Pastur bulk, counted as
    ``num_spikes`` counts the ESD's (``marchenko_pastur``; ``bulk="fitted"``, set by the
    weightwatcher preset, is WeightWatcher's ``mp_fit``). 0 for a matrix of iid entries;
    each large outlier entry adds one."""
    return int(marchenko_pastur(esd_rand, shape, bulk=bulk, conv=conv)[2])


LAWS = ("power_law", "truncated_power_law", "exponential", "lognormal")


@kernel
def best_fit(
    lr_tpl_R: float,  # noqa: N803 - field names
    lr_tpl_p: float,
    lr_exp_R: float,  # noqa: N803
    lr_exp_p: float,
    lr_lognormal_R: float,  # noqa: N803
    lr_lognormal_p: float,
    *,
    p_threshold: Annotated[float, Range(gt=0.0, lt=1.0)] = 0.1,
) -> str:
    """The law that describes the tail best, from the likelihood-ratio tests against the
    power law (``R > 0`` favours it): ``"power_law"`` unless some alternative is
    significantly better (``R < 0`` with ``p < p_threshold``), then the alternative with
    the most negative ``R`` (``"truncated_power_law"``, ``"exponential"``,
    ``"lognormal"``)."""
    tests = ((lr_tpl_R, lr_tpl_p), (lr_exp_R, lr_exp_p), (lr_lognormal_R, lr_lognormal_p))
    if all(math.isnan(r) for r, _ in tests):
        raise FieldUndefined("no likelihood-ratio test could be computed")
    better = [(r, law) for (r, p), law in zip(tests, LAWS[1:], strict=True)
              if r < 0 and p < p_threshold]
    return min(better)[1] if better else LAWS[0]


ALL: tuple[Any, ...] = (matrix_rank, rank_loss, weak_rank_loss, num_pl_spikes, rand_distance,
                        ww_softrank, ww_maxdist, detx, ERG_gap, num_traps, best_fit)
