"""Random-matrix baselines: the randomized ESD, the Marchenko-Pastur fit, the
Tracy-Widom edge (as the original Diffract defines them).

Notation as in :mod:`diffract_kernels_spectral.kernels`; ``N >= M`` are the greater and
lower dimensions, ``Q = N / M``, ``c`` the ESD's factor (``esd_scale``) and ``s`` an
entry standard deviation. A matrix of i.i.d. entries of variance ``s^2`` has its ESD
(``c sigma_i^2``) in ``c N s^2 [(1 - 1/sqrt(Q))^2, (1 + 1/sqrt(Q))^2]`` (Marchenko and
Pastur); the kernels below compare a trained matrix with that bulk, estimated from the
matrix with its entries shuffled (which keeps their distribution and destroys their
correlations).
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np

from diffract import FieldUndefined, Range, kernel
from diffract_kernels_spectral import linalg
from diffract_kernels_spectral._rmt import mp_cdf, tracy_widom1_quantile
from diffract_kernels_spectral.kernels import (
    _MATRIX,
    PARALLEL,
    Conv,
    _dims,
    _ends,
    _finite_matrix,
    _finite_tensor,
    _positions,
    _positive,
    _scaled,
    view,
)

__all__ = ["ALL"]

Seed = Annotated[int, Range(ge=0)]


def _permuted(weights: np.ndarray, seed: int) -> np.ndarray:
    """The entries of ``weights`` in the order of a seeded uniform permutation, same shape."""
    w = np.asarray(weights)
    order = np.random.default_rng(seed).permutation(w.size)
    return w.reshape(-1)[order].reshape(w.shape)


# -- randomized baseline -----------------------------------------------------------------------
@kernel(restrictions=_MATRIX)
def weights_rand(weights: np.ndarray, *, seed: Seed = 42) -> np.ndarray:
    """``W_rand``: the entries of ``W`` (its ``N x M`` matrix view) shuffled by a uniform
    permutation drawn from
    ``numpy.random.default_rng(seed)`` (same multiset of values, correlations destroyed;
    the original Diffract's permutation for the same seed). As large as the weights:
    ``esd_rand`` does not need it stored."""
    return _permuted(_finite_matrix(weights), seed)


#: WeightWatcher 0.7.7 pools the ESDs of 5 shuffles of a layer with fewer than this many
#: eigenvalues (its random_eigenvalues: num_replicas = 5 when n_comp < 100).
WW_FEW_EVALS, WW_REPLICAS = 100, 5


@kernel(restrictions=_MATRIX, execution_protocol=PARALLEL)
def esd_rand(tensor: Any, esd_scale: float, *, seed: Seed = 42,
             precision: Literal["float32", "float64"] = "float64",
             device: str = "auto",
             replicas: Literal["one", "weightwatcher"] = "one",
             conv: Conv = "matrix") -> np.ndarray:
    """ESD of ``W_rand`` (the permutation ``weights_rand`` makes for the same ``seed``),
    ``c sigma_i(W_rand)^2`` ascending, computed as ``esd`` is: ``device="auto"`` shuffles
    and decomposes on the GPU that holds the weights (the permutation is drawn by numpy,
    so it is the same everywhere). ``replicas="weightwatcher"`` (its preset) pools, as
    WeightWatcher 0.7.7 does for a matrix of fewer than 100 eigenvalues, the ESDs of 5
    shuffles (seeds ``seed`` to ``seed + 4``): ``5 k`` eigenvalues. ``conv=
    "weightwatcher"`` (its preset): a convolution's kernel-position matrices each
    shuffled on its own (one generator of the seed drawing their permutations in turn)
    and their ESDs pooled, scaled as ``esd`` scales them (the 100 eigenvalues counted
    over the positions, as WeightWatcher's ``n_comp``)."""
    rows, cols, matrices = view(np.shape(tensor), conv)
    if replicas == "weightwatcher" and matrices * min(rows, cols) < WW_FEW_EVALS:
        pooled = [esd_rand(tensor, esd_scale, seed=seed + r, precision=precision,
                           device=device, conv=conv) for r in range(WW_REPLICAS)]
        return np.sort(np.concatenate(pooled))
    if conv == "weightwatcher" and np.ndim(tensor) == 4:
        rng = np.random.default_rng(seed)
        pooled = [linalg.esd(m.reshape(-1)[rng.permutation(m.size)].reshape(m.shape),
                             precision) for m in _positions(tensor)]
        return _scaled(np.sort(np.concatenate(pooled)), esd_scale)
    where = linalg.resolve_device(device, tensor)
    if where != "cpu":
        import torch

        t = _finite_tensor(tensor)
        t = t.reshape(t.shape[0], math.prod(t.shape[1:]))
        order = torch.from_numpy(np.random.default_rng(seed).permutation(t.numel()))
        shuffled = t.reshape(-1)[order.to(t.device)].reshape(t.shape)
        values = linalg.esd_batched_torch([shuffled], precision, where)[0]
    else:
        w = _finite_matrix(linalg.host_array(tensor))
        values = linalg.esd(linalg.as_matrix(_permuted(w, seed)), precision)
    return _scaled(values, esd_scale)


@kernel(produce_fields=("esd_rand_max", "esd_rand_min"))
def esd_rand_extremes(esd_rand: np.ndarray) -> tuple[float, float]:
    """``esd_rand_max``, ``esd_rand_min``: the randomized ESD's largest and smallest
    eigenvalues."""
    low, high = _ends(esd_rand, "spectrum")
    return high, low


@kernel
def w1_rand_distance(esd: np.ndarray, esd_rand: np.ndarray) -> float:
    """``W1(ESD, ESD_rand) / mean(lambda)``: the earth mover's distance between the
    spectrum and its randomized baseline in units of the mean eigenvalue (0 when
    shuffling changes nothing; scale free)."""
    from scipy.stats import wasserstein_distance

    values = _positive(esd, "w1_rand_distance")
    return float(wasserstein_distance(values, np.asarray(esd_rand)) / np.mean(values))


# -- Marchenko-Pastur ----------------------------------------------------------------------------
def _unit(shape: tuple[int, ...], esd_scale: float, conv: str
          ) -> tuple[float, float, int, int]:
    """``(c N, Q, N, M)``: the ESD value of one unit of entry variance, and the sizes."""
    if conv == "weightwatcher" and len(shape) == 4:
        raise FieldUndefined(
            "the original Diffract's Marchenko-Pastur fit reads a convolution as one "
            "[out, in*kh*kw] matrix, and under conv='weightwatcher' (its preset) the ESD "
            "pools the kernel positions' matrices: mp_softrank and num_spikes are "
            "WeightWatcher's fit of that ESD")
    n, m = _dims(shape)
    big, small = max(n, m), min(n, m)
    return esd_scale * big, big / small, big, small


@kernel(produce_fields=("mp_esd_max", "mp_esd_min", "mp_bulk_std"), restrictions=_MATRIX)
def marchenko_pastur_fit(
    esd_rand: np.ndarray, esd_max: float, weights_std: float, shape: tuple[int, ...],
    esd_scale: float, *, conv: Conv = "matrix",
) -> tuple[float, float, float]:
    """Marchenko-Pastur bulk of the randomized ESD. With ``s = weights_std``, the edge
    ``e = c N s^2 (1 + 1/sqrt(Q))^2``; when randomized eigenvalues lie above it, ``s`` is
    re-estimated from those at or below it, ``s^2 = sum lambda_rand / (c N M)``, and
    ``e`` recomputed. ``mp_esd_max = min(e, lambda_max)``, ``mp_esd_min = c N s^2 (1 -
    1/sqrt(Q))^2``, ``mp_bulk_std = s`` (an entry standard deviation, whatever ``c``)."""
    unit, q, _, m = _unit(shape, esd_scale, conv)
    rand = np.asarray(esd_rand, dtype=np.float64)
    var = float(weights_std) ** 2
    if not var > 0:
        raise FieldUndefined("weights_std is 0: the matrix is constant")
    upper = (1.0 + 1.0 / math.sqrt(q)) ** 2
    edge = unit * var * upper
    if np.any(rand > edge):  # spikes bleed out of the bulk: fit the rest
        var = float(np.sum(rand[rand <= edge])) / (unit * m)
        edge = unit * var * upper
    low = unit * var * (1.0 - 1.0 / math.sqrt(q)) ** 2
    return float(min(edge, esd_max)), float(low), float(math.sqrt(var))


@kernel(restrictions=_MATRIX)
def mp_ks(esd: np.ndarray, mp_esd_min: float, mp_esd_max: float, mp_bulk_std: float,
          shape: tuple[int, ...], esd_scale: float, *, conv: Conv = "matrix") -> float:
    """KS distance between the eigenvalues inside ``(mp_esd_min, mp_esd_max)`` and the
    Marchenko-Pastur law of entry std ``mp_bulk_std`` restricted to that window (CDF
    renormalised on it): ``max_i max(i/n - F_i, F_i - (i-1)/n)``. 1 when no eigenvalue
    or no probability lies in the window."""
    unit, q, _, _ = _unit(shape, esd_scale, conv)
    values = np.asarray(esd, dtype=np.float64)
    inside = np.sort(values[(values > mp_esd_min) & (values < mp_esd_max)])
    if inside.size == 0 or not mp_bulk_std > 0:
        return 1.0
    sigma = math.sqrt(unit) * mp_bulk_std  # the law of lambda = c N s^2 z
    lo, hi = mp_cdf(np.array([mp_esd_min, mp_esd_max]), 1.0 / q, sigma)
    if hi - lo <= 1e-12:
        return 1.0
    cdf = (mp_cdf(inside, 1.0 / q, sigma) - lo) / (hi - lo)
    ranks = np.arange(1, inside.size + 1) / inside.size
    return float(max(np.max(ranks - cdf), np.max(cdf - (ranks - 1.0 / inside.size))))


@kernel
def mp_concentration(esd: np.ndarray, mp_esd_min: float, mp_esd_max: float) -> float:
    """``#{i : mp_esd_min <= lambda_i <= mp_esd_max} / k``: the bulk's share of the
    eigenvalues."""
    values = np.asarray(esd)
    if values.size == 0:
        raise FieldUndefined("the spectrum is empty")
    return float(np.sum((values >= mp_esd_min) & (values <= mp_esd_max)) / values.size)


@kernel
def mp_presence(esd_max: float, esd_min: float, mp_esd_max: float, mp_esd_min: float) -> float:
    """``clip((mp_esd_max - mp_esd_min) / (lambda_max - lambda_min), 0, 1)``: the bulk's
    share of the spectrum's width."""
    width = esd_max - esd_min
    if not width > 0:
        raise FieldUndefined("the spectrum has zero width (all eigenvalues equal)")
    return float(np.clip((mp_esd_max - mp_esd_min) / width, 0.0, 1.0))


@kernel
def mp_soft_rank(mp_esd_max: float, esd_max: float) -> float:
    """``mp_esd_max / lambda_max`` (the fitted randomized bulk's edge; ``mp_softrank`` is
    the same ratio for the Frobenius-norm edge of the ESD itself, ``mp_bulk_max``)."""
    if not esd_max > 0:
        raise FieldUndefined("mp_soft_rank is undefined for an all-zero matrix")
    return float(mp_esd_max / esd_max)


@kernel
def mp_num_spikes(esd: np.ndarray, mp_esd_max: float) -> int:
    """``#{i : lambda_i > mp_esd_max}`` (``num_spikes`` counts above ``mp_bulk_max``)."""
    return int(np.sum(np.asarray(esd) > mp_esd_max))


@kernel
def mp_sval_max(mp_esd_max: float, esd_scale: float) -> float:
    """``sqrt(mp_esd_max / c)``: the singular value at the bulk's edge."""
    return float(math.sqrt(mp_esd_max / esd_scale))


# -- Tracy-Widom -----------------------------------------------------------------------------------
@kernel(restrictions=_MATRIX)
def tw_esd_bound(
    shape: tuple[int, ...],
    mp_bulk_std: float,
    esd_scale: float,
    *,
    p_value_threshold: Annotated[float, Range(gt=0.0, lt=1.0)] = 0.005,
    conv: Conv = "matrix",
) -> float:
    """Eigenvalue above which a spike is significant at ``p_value_threshold``: ``mu +
    t sigma`` with ``t`` the ``1 - p`` quantile of Tracy-Widom (beta = 1) and Johnstone's
    centring and scaling ``mu = c s^2 (sqrt(N - 1) + sqrt(M))^2``, ``sigma = c s^2
    (sqrt(N - 1) + sqrt(M)) (1/sqrt(N - 1) + 1/sqrt(M))^(1/3)``, ``s = mp_bulk_std``."""
    _, _, n, m = _unit(shape, esd_scale, conv)
    if n < 2:
        raise FieldUndefined("the Tracy-Widom edge needs N >= 2")
    a, b = math.sqrt(n - 1), math.sqrt(m)
    var = esd_scale * mp_bulk_std**2
    mu = var * (a + b) ** 2
    sigma = var * (a + b) * (1.0 / a + 1.0 / b) ** (1.0 / 3.0)
    return float(mu + tracy_widom1_quantile(1.0 - p_value_threshold) * sigma)


@kernel
def tw_num_spikes(esd: np.ndarray, tw_esd_bound: float) -> int:
    """``#{i : lambda_i > tw_esd_bound}``: eigenvalues above the Tracy-Widom edge."""
    return int(np.sum(np.asarray(esd) > tw_esd_bound))


ALL: tuple[Any, ...] = (
    weights_rand, esd_rand, esd_rand_extremes, w1_rand_distance, marchenko_pastur_fit,
    mp_ks, mp_concentration, mp_presence, mp_soft_rank, mp_num_spikes, mp_sval_max,
    tw_esd_bound, tw_num_spikes,
)
