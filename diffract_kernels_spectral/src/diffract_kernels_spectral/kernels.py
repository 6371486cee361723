"""The spectral kernels. Each docstring's first lines hold the field's formula.

Notation: ``W`` is the parameter as a ``N x M`` matrix (more than two dimensions are
reshaped to ``(shape[0], -1)``), ``k = min(N, M)``, ``sigma_i`` its singular values and
``lambda_i = sigma_i^2`` the ESD (eigenvalues of ``W^T W``), ``lambda_max`` the largest.
1-D parameters are skipped (a restriction, with its reason). When a value is undefined
for an input (NaN or Inf weights, an all-zero matrix, too few eigenvalues for a fit)
the field is NaN and the reason is recorded for that parameter.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np

from diffract import FieldUndefined, KernelExecutionProtocol, Range, Restriction, kernel
from diffract_kernels_spectral import linalg
from diffract_kernels_spectral.errors import FitError
from diffract_kernels_spectral.fitting import (
    compare_distributions,
    fit_exponential,
    fit_power_law,
    fit_truncated_power_law,
    power_law_pvalue,
)

__all__ = ["ALL"]

_MATRIX = [Restriction.min_ndim(2)]

#: Decompositions and fits are PARALLEL: on an executor (a process pool, a Dask
#: cluster) once a step's work is worth one, in this process (their batch paths use one
#: thread per core) otherwise. The cheap kernels that read their results stay
#: SEQUENTIAL: shipping an ESD to a worker costs more than computing a norm.
PARALLEL = KernelExecutionProtocol.PARALLEL

#: The configuration domains the kernels share (checked by configure_kernel).
FitMethod = Literal["auto", "diffract", "powerlaw"]
MinTail = Annotated[int, Range(ge=2)]


def _nonempty(shape: tuple[int, ...]) -> None:
    if math.prod(shape) == 0:
        raise FieldUndefined(f"the matrix has no elements (shape {tuple(shape)})")


def _finite_matrix(weights: np.ndarray) -> np.ndarray:
    w = linalg.as_matrix(weights)
    _nonempty(w.shape)
    # min and max are NaN or infinite exactly when some entry is: two cheap reductions,
    # no temporary array (the full count is taken only when there is something to count)
    if not (np.isfinite(w.min()) and np.isfinite(w.max())):
        raise FieldUndefined(f"weights contain {int((~np.isfinite(w)).sum())} NaN or Inf value(s)")
    return w


def _finite_tensor(tensor: Any) -> Any:
    """``tensor`` (torch or numpy) after the NaN/Inf check, computed where it lives."""
    if isinstance(tensor, np.ndarray):
        return _finite_matrix(tensor)
    import torch

    _nonempty(tuple(tensor.shape))
    bad = int((~torch.isfinite(tensor)).sum())
    if bad:
        raise FieldUndefined(f"weights contain {bad} NaN or Inf value(s)")
    return tensor


def _positive(esd: np.ndarray, what: str) -> np.ndarray:
    values = np.asarray(esd)
    if values.size == 0 or float(values[-1]) <= 0.0:
        raise FieldUndefined(f"{what} is undefined for an all-zero matrix (every eigenvalue is 0)")
    return values


def _fit_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a fitting function; undefined fits become FieldUndefined with the reason.

    FitArgumentError (a bad configuration) and FitUnavailableError (fit_method=
    "diffract" without taichi) are not properties of the data: they propagate as a
    failure of the unit, retried once the cause is fixed.
    """
    try:
        return fn(*args, **kwargs)
    except FitError as exc:
        raise FieldUndefined(str(exc)) from None


# -- decompositions ---------------------------------------------------------------------
def _svd_batch(units: list[dict[str, Any]], **config: Any) -> list[Any]:
    return linalg.parallel_map(lambda u: svd(u["tensor"], **config), units)


def _esd_batch(
    units: list[dict[str, Any]], *, precision: str = "float32", device: str = "auto"
) -> list[Any]:
    out: list[Any] = [None] * len(units)
    on_host, on_gpu = [], {}
    for i, u in enumerate(units):
        where = linalg.resolve_device(device, u["tensor"])
        (on_host.append(i) if where == "cpu" else on_gpu.setdefault(where, []).append(i))
    host = linalg.parallel_map(lambda i: esd(units[i]["tensor"], precision=precision, device="cpu"),
                               on_host)
    for i, v in zip(on_host, host, strict=True):
        out[i] = v
    for where, idx in on_gpu.items():  # one batched call per device and shape
        good = []
        for i in idx:
            try:
                good.append((i, _finite_tensor(units[i]["tensor"])))
            except FieldUndefined as exc:
                out[i] = exc
        values = linalg.esd_batched_torch([t for _, t in good], precision, where)
        for (i, _), v in zip(good, values, strict=True):
            out[i] = v
    return out


def _svals_batch(units: list[dict[str, Any]]) -> list[Any]:
    return linalg.parallel_map(lambda u: svals(u["weights"]), units)


@kernel(
    produce_fields=("weights_lsvs", "weights_svals", "weights_rsvs"),
    restrictions=_MATRIX,
    batch=lambda units, **cfg: _svd_batch(units, **cfg),
    execution_protocol=PARALLEL,
)
def svd(
    tensor: Any,
    *,
    top_k: Annotated[int, Range(ge=0)] = 0,
    device: str = "auto",
    seed: Annotated[int, Range(ge=0)] = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD ``W = U diag(sigma) V^T`` in float64: ``weights_lsvs = U [N, k]``,
    ``weights_svals = sigma [k]`` (descending), ``weights_rsvs = V^T [k, M]``.

    Directions are ordered by decreasing singular value (as LAPACK, torch and
    WeightWatcher return them; the original Diffract stored them ascending), so the top
    ``k`` directions are the first ``k``. ``top_k`` = 0 keeps all ``k = min(N, M)``;
    ``top_k`` > 0 keeps the largest ``top_k``, computed by a seeded randomized SVD with
    6 power iterations when ``top_k < k / 5`` (exact to rounding when the spectrum has a
    gap after the top ``top_k``; about 1e-6 relative when it decays by 5% per direction;
    unreliable vectors for a flat spectrum), else by truncating the full SVD.
    ``device``: "auto" runs where the weights are (torch on a GPU); "cpu" or a torch
    device forces it.
    """
    where = linalg.resolve_device(device, tensor)
    if where != "cpu":
        return linalg.svd_torch(_finite_tensor(tensor), where, top_k)
    return linalg.svd(_finite_matrix(linalg.host_array(tensor)), top_k, seed)


@kernel(restrictions=_MATRIX, batch=lambda units, **cfg: _esd_batch(units, **cfg),
        execution_protocol=PARALLEL)
def esd(
    tensor: Any, *, precision: Literal["float32", "float64"] = "float32", device: str = "auto"
) -> np.ndarray:
    """Empirical spectral density ``lambda_i``: eigenvalues of ``W^T W``, ascending ``[k]``.

    Values only (no singular vectors). ``precision`` float32 (default; about twice as
    fast) or float64. Eigenvalues below ``k * eps * lambda_max`` are stored as 0.
    ``device``: "auto" computes where the weights are: same-shaped matrices on a GPU go
    through one batched torch call there (no copy through the host); on the CPU, one
    single-threaded LAPACK solver per core. "cpu" or a torch device ("cuda", "cuda:1")
    forces the choice.
    """
    where = linalg.resolve_device(device, tensor)
    if where != "cpu":
        return linalg.esd_batched_torch([_finite_tensor(tensor)], precision, where)[0]
    return linalg.esd(_finite_matrix(linalg.host_array(tensor)), precision)


@kernel(restrictions=_MATRIX, batch=lambda units: _svals_batch(units),
        execution_protocol=PARALLEL)
def svals(weights: np.ndarray) -> np.ndarray:
    """Singular values ``sigma_i`` in float64, descending ``[k]``, values only
    (accurate to ``eps64 * sigma_max``: what rank decisions need)."""
    return linalg.singular_values(_finite_matrix(weights))


# -- norms and ranks ----------------------------------------------------------------------
@kernel
def spectral_norm(esd: np.ndarray) -> float:
    """``lambda_max = sigma_max^2``, the squared spectral norm (WeightWatcher's convention)."""
    values = np.asarray(esd)
    if values.size == 0:
        raise FieldUndefined("spectral_norm is undefined for an empty spectrum")
    return float(values[-1])


@kernel
def log_spectral_norm(esd: np.ndarray) -> float:
    """``log10(lambda_max)``."""
    return float(math.log10(_positive(esd, "log_spectral_norm")[-1]))


@kernel
def stable_rank(esd: np.ndarray) -> float:
    """``sum_i lambda_i / lambda_max = ||W||_F^2 / ||W||_2^2``."""
    values = _positive(esd, "stable_rank")
    return float(np.sum(values) / values[-1])


@kernel
def log_norm(esd: np.ndarray) -> float:
    """``log10(sum_i lambda_i) = log10(||W||_F^2)``."""
    return float(math.log10(np.sum(_positive(esd, "log_norm"))))


@kernel
def hard_rank(svals: np.ndarray, *, rtol: Annotated[float, Range(ge=0.0, lt=1.0)] = 1e-5) -> int:
    """``#{i : sigma_i > rtol * sigma_max}``: singular values above ``rtol`` relative to
    the largest (float64 singular values; 0 for an all-zero matrix)."""
    s = np.asarray(svals)
    if s.size == 0 or s[0] <= 0:
        return 0
    return int(np.sum(s > rtol * s[0]))


@kernel
def matrix_entropy(esd: np.ndarray) -> float:
    """Normalised spectral entropy ``-sum_i p_i ln p_i / ln k`` with ``p_i = lambda_i /
    sum_j lambda_j`` (1 for a flat spectrum, 0 for rank one; 0 ln 0 = 0)."""
    values = _positive(esd, "matrix_entropy")
    if len(values) < 2:
        raise FieldUndefined("matrix_entropy needs at least two eigenvalues")
    p = values / np.sum(values)
    p = p[p > 0]
    return float(-np.sum(p * np.log(p)) / math.log(len(values)))


@kernel(produce_fields=("mp_bulk_max", "mp_softrank", "num_spikes"))
def marchenko_pastur(esd: np.ndarray, shape: tuple[int, ...]) -> tuple[float, float, int]:
    """Marchenko-Pastur bulk edge of a random matrix of the same size and scale:
    ``mp_bulk_max = lambda_+ = (sum_i lambda_i / k) (1 + sqrt(k / L))^2`` with
    ``L = max(N, M)`` (``s^2 = ||W||_F^2 / (N M)`` estimates the entry variance, so
    ``lambda_+ = L s^2 (1 + sqrt(k / L))^2``); ``mp_softrank = lambda_+ / lambda_max``;
    ``num_spikes = #{i : lambda_i > lambda_+}``, eigenvalues outside the random bulk.
    """
    values = _positive(esd, "marchenko_pastur")
    n = int(shape[0])
    m = int(np.prod(shape[1:]))
    k, big = min(n, m), max(n, m)
    edge = float(np.sum(values) / k * (1.0 + math.sqrt(k / big)) ** 2)
    return edge, edge / float(values[-1]), int(np.sum(values > edge))


# -- fits ------------------------------------------------------------------------------------
@kernel(
    produce_fields=("pl_alpha", "pl_xmin", "pl_xmax", "pl_ks_distance", "pl_sigma", "pl_n_tail"),
    execution_protocol=PARALLEL,
)
def power_law_fit(esd: np.ndarray, *, fit_method: FitMethod = "auto", min_tail: MinTail = 50):
    """Power law ``p(lambda) ~ lambda^-pl_alpha`` on the ESD tail ``lambda >= pl_xmin``
    (Clauset-Shalizi-Newman: continuous MLE ``alpha = 1 + n / sum ln(lambda_i / xmin)``,
    xmin minimising the KS distance over candidates leaving ``min_tail`` points);
    ``pl_sigma = (alpha - 1) / sqrt(pl_n_tail)``; ``pl_xmax = lambda_max``. Zero
    eigenvalues are left out; a spectrum whose spread is within ``k * eps32 *
    lambda_max`` counts as all-equal (undefined)."""
    values = np.asarray(esd)
    positive = values[values > 0]
    if positive.size >= min_tail and positive[-1] - positive[0] <= linalg.noise_floor(
        values.size, float(positive[-1]), "float32"
    ):
        raise FieldUndefined(
            "all eigenvalues are equal within rounding (e.g. an orthogonal matrix): "
            "a power law cannot be fitted"
        )
    fit = _fit_call(fit_power_law, positive, fit_method=fit_method, min_tail=min_tail)
    return fit.alpha, fit.xmin, fit.xmax, fit.ks_distance, fit.sigma, fit.n_tail


@kernel
def alpha_weighted(pl_alpha: float, spectral_norm: float) -> float:
    """``pl_alpha * log10(lambda_max)``."""
    if not spectral_norm > 0:
        raise FieldUndefined("alpha_weighted is undefined for an all-zero matrix")
    return float(pl_alpha * math.log10(spectral_norm))


@kernel
def log_alpha_norm(pl_alpha: float, esd: np.ndarray) -> float:
    """``log10(sum_i lambda_i^pl_alpha)``, the log of the Schatten ``2 alpha``-norm to the
    power ``2 alpha`` (computed as ``alpha log10 lambda_max + log10 sum (lambda_i /
    lambda_max)^alpha`` to avoid overflow)."""
    values = _positive(esd, "log_alpha_norm")
    top = float(values[-1])
    return float(pl_alpha * math.log10(top) + math.log10(np.sum((values / top) ** pl_alpha)))


@kernel(produce_fields=("tpl_alpha", "tpl_lambda", "tpl_ks_distance"),
        execution_protocol=PARALLEL)
def truncated_power_law_fit(esd: np.ndarray, pl_xmin: float, *, fit_method: FitMethod = "auto"):
    """Truncated power law ``p(lambda) ~ lambda^-tpl_alpha exp(-tpl_lambda lambda)`` by
    maximum likelihood on the power law's tail ``lambda >= pl_xmin``."""
    method = "powerlaw" if fit_method == "powerlaw" else "diffract"
    fit = _fit_call(fit_truncated_power_law, esd, xmin=pl_xmin, fit_method=method)
    return fit.alpha, fit.lambda_, fit.ks_distance


@kernel(produce_fields=("exp_lambda", "exp_ks_distance"), execution_protocol=PARALLEL)
def exponential_fit(esd: np.ndarray, pl_xmin: float, *, fit_method: FitMethod = "auto"):
    """Exponential ``p(lambda) = exp_lambda exp(-exp_lambda (lambda - xmin))`` on the power
    law's tail; MLE ``exp_lambda = 1 / mean(lambda_i - xmin)``."""
    method = "powerlaw" if fit_method == "powerlaw" else "diffract"
    fit = _fit_call(fit_exponential, esd, xmin=pl_xmin, fit_method=method)
    return fit.lambda_, fit.ks_distance


@kernel(
    produce_fields=(
        "lr_tpl_R", "lr_tpl_p", "lr_exp_R", "lr_exp_p", "lr_lognormal_R", "lr_lognormal_p"
    ),
    execution_protocol=PARALLEL,
)
def distribution_comparison(esd: np.ndarray, pl_xmin: float, pl_alpha: float):
    """Log-likelihood ratios ``R = sum_i (ln p_pl(lambda_i) - ln p_alt(lambda_i))`` on the
    power law's tail (``R > 0`` favours the power law) with their p-values: truncated
    power law (nested: ``p = chi2_1.sf(2|R|)``), exponential and lognormal (Vuong:
    ``p = erfc(|R| / (sqrt(2n) s))``)."""
    out = _fit_call(compare_distributions, esd, xmin=pl_xmin, alpha=pl_alpha)
    tpl, exp, logn = out["truncated_power_law"], out["exponential"], out["lognormal"]
    return tpl.R, tpl.p, exp.R, exp.p, logn.R, logn.p


@kernel(execution_protocol=PARALLEL)
def pl_pvalue(
    esd: np.ndarray,
    pl_alpha: float,
    pl_xmin: float,
    pl_ks_distance: float,
    pl_n_tail: int,
    *,
    n_replicates: Annotated[int, Range(ge=1)] = 100,
    seed: Annotated[int, Range(ge=0)] = 0,
    fit_method: FitMethod = "auto",
    min_tail: MinTail = 50,
) -> float:
    """Goodness-of-fit p-value of the power law: the fraction of ``n_replicates``
    semi-parametric bootstrap data sets (CSN) whose refitted KS distance is at least
    ``pl_ks_distance``; NaN when the tail has fewer than 50 points."""
    from diffract_kernels_spectral._records import PowerLawFit

    values = np.asarray(esd)
    values = values[values > 0]
    if pl_n_tail < 50:
        raise FieldUndefined(f"the fitted tail has {pl_n_tail} points, fewer than 50")
    fit = PowerLawFit(pl_alpha, pl_xmin, pl_ks_distance, math.nan, int(pl_n_tail), len(values),
                      float(values[-1]), 0, fit_method)
    result = _fit_call(power_law_pvalue, values, fit=fit, n_replicates=n_replicates, seed=seed,
                       fit_method=fit_method, min_tail=min_tail)
    if math.isnan(result.p):
        raise FieldUndefined("no bootstrap replicate could be refitted")
    return result.p


ALL = (
    svd, esd, svals, spectral_norm, log_spectral_norm, stable_rank, log_norm, hard_rank,
    matrix_entropy, marchenko_pastur, power_law_fit, alpha_weighted, log_alpha_norm,
    truncated_power_law_fit, exponential_fit, distribution_comparison, pl_pvalue,
)
