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
from collections.abc import Callable
from typing import Annotated, Any, Literal

import numpy as np

from diffract import (
    FieldUndefined,
    KernelApplyLevel,
    KernelExecutionProtocol,
    Range,
    Restriction,
    kernel,
)
from diffract_kernels_spectral import linalg
from diffract_kernels_spectral.errors import FitArgumentError, FitError
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
TailStart = Literal["pl_xmin", "own"]


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


def _positive_part(esd: np.ndarray) -> np.ndarray:
    values = np.asarray(esd)
    return values[values > 0]


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
    out = _raw_esd_batch(units, precision, device)
    return [v if isinstance(v, BaseException) else _scaled(v, u["esd_scale"])
            for v, u in zip(out, units, strict=True)]


def _scaled(values: np.ndarray, scale: float) -> np.ndarray:
    return values if scale == 1.0 else values * scale


def _by_device(
    units: list[dict[str, Any]],
    device: str,
    on_host: Callable[[Any], Any],
    on_gpu: Callable[[list[Any], str], list[Any]],
) -> list[Any]:
    """One result per unit: ``on_host(tensor)`` for units whose weights resolve to the
    CPU (one solver per core), ``on_gpu(tensors, device)`` once per GPU for the rest
    (same shapes batched there); an exception instance stands for a unit that raised."""
    out: list[Any] = [None] * len(units)
    host, gpu = [], {}
    for i, u in enumerate(units):
        where = linalg.resolve_device(device, u["tensor"])
        (host.append(i) if where == "cpu" else gpu.setdefault(where, []).append(i))
    for i, v in zip(host, linalg.parallel_map(lambda i: on_host(units[i]["tensor"]), host),
                    strict=True):
        out[i] = v
    for where, idx in gpu.items():
        good = []
        for i in idx:
            try:
                good.append((i, _finite_tensor(units[i]["tensor"])))
            except FieldUndefined as exc:
                out[i] = exc
        for (i, _), v in zip(good, on_gpu([t for _, t in good], where), strict=True):
            out[i] = v
    return out


def _raw_esd_batch(units: list[dict[str, Any]], precision: str, device: str) -> list[Any]:
    return _by_device(
        units, device, lambda t: esd(t, 1.0, precision=precision, device="cpu"),
        lambda tensors, where: linalg.esd_batched_torch(tensors, precision, where))


def _svals_batch(units: list[dict[str, Any]], *, device: str = "auto") -> list[Any]:
    return _by_device(units, device, lambda t: svals(t, device="cpu"),
                      linalg.svals_batched_torch)


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
    tensor: Any,
    esd_scale: float,
    *,
    precision: Literal["float32", "float64"] = "float32",
    device: str = "auto",
) -> np.ndarray:
    """Empirical spectral density ``lambda_i = c sigma_i^2``: eigenvalues of ``c W^T W``
    (``c = esd_scale``, 1 unless the conventions normalise), ascending ``[k]``.

    Values only (no singular vectors). ``precision`` float32 (default; about twice as
    fast) or float64. Eigenvalues below ``k * eps * lambda_max`` are stored as 0.
    ``device``: "auto" computes where the weights are: same-shaped matrices on a GPU go
    through one batched torch call there (no copy through the host); on the CPU, one
    single-threaded LAPACK solver per core. "cpu" or a torch device ("cuda", "cuda:1")
    forces the choice.
    """
    where = linalg.resolve_device(device, tensor)
    if where != "cpu":
        values = linalg.esd_batched_torch([_finite_tensor(tensor)], precision, where)[0]
    else:
        values = linalg.esd(_finite_matrix(linalg.host_array(tensor)), precision)
    return _scaled(values, esd_scale)


@kernel(restrictions=_MATRIX)
def esd_scale(
    shape: tuple[int, ...], *, normalize: Literal["none", "greater_dim"] = "none"
) -> float:
    """``c``, the factor of every ESD: ``lambda_i = c sigma_i^2``. ``normalize="none"``
    (default, as WeightWatcher): ``c = 1``; ``"greater_dim"`` (the original Diffract):
    ``c = 1 / max(N, M)``, so the ESD of a matrix of unit-variance entries has the
    Marchenko-Pastur support ``[(1 - 1/sqrt(Q))^2, (1 + 1/sqrt(Q))^2]`` whatever its
    size. Fits' exponents, ratios and counts do not depend on ``c``; xmins, norms read
    from the ESD and the random-matrix edges scale with it."""
    if normalize == "greater_dim":
        return 1.0 / max(_dims(shape))
    return 1.0


def _dims(shape: tuple[int, ...]) -> tuple[int, int]:
    """``(N, M)`` of the matrix view ``(shape[0], prod(shape[1:]))``."""
    return int(shape[0]), int(math.prod(shape[1:]))


@kernel(restrictions=_MATRIX, batch=lambda units, **cfg: _svals_batch(units, **cfg),
        execution_protocol=PARALLEL)
def svals(tensor: Any, *, device: str = "auto") -> np.ndarray:
    """Singular values ``sigma_i`` in float64, descending ``[k]``, values only
    (accurate to ``eps64 * sigma_max``: what rank decisions need). ``device``: "auto"
    computes where the weights are (same-shaped matrices on a GPU in one batched torch
    call), "cpu" or a torch device forces it."""
    where = linalg.resolve_device(device, tensor)
    if where != "cpu":
        return linalg.svals_batched_torch([_finite_tensor(tensor)], where)[0]
    return linalg.singular_values(_finite_matrix(linalg.host_array(tensor)))


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
    aliases={"pl_esd_xmin": "pl_xmin", "pl_ks": "pl_ks_distance"},
    execution_protocol=PARALLEL,
)
def power_law_fit(
    esd: np.ndarray,
    *,
    fit_method: FitMethod = "auto",
    min_tail: MinTail = 50,
    alpha_max: Annotated[float, Range(gt=1.0)] | None = None,
    clip_top: Annotated[int, Range(ge=0)] = 0,
    fix_fingers: Literal["none", "clip_xmax"] = "none",
    max_fingers: Annotated[int, Range(ge=3)] = 10,
    finger_thresh: Annotated[float, Range(gt=0.0)] = 1.0,
):
    """Power law ``p(lambda) ~ lambda^-pl_alpha`` on the ESD tail ``lambda >= pl_xmin``
    (Clauset-Shalizi-Newman: continuous MLE ``alpha = 1 + n / sum ln(lambda_i / xmin)``,
    xmin minimising the KS distance over candidates leaving ``min_tail`` points);
    ``pl_sigma = (alpha - 1) / sqrt(pl_n_tail)``; ``pl_xmax`` the largest eigenvalue
    fitted (``lambda_max`` unless some are clipped). Zero eigenvalues are left out; a
    spectrum whose spread is within ``k * eps32 * lambda_max`` counts as all-equal
    (undefined). ``alpha_max`` leaves out candidates whose exponent exceeds it (the
    original Diffract used 8). ``clip_top`` leaves out the largest ``clip_top``
    eigenvalues (WeightWatcher's integer ``xmax``; at most half the spectrum).
    ``fix_fingers="clip_xmax"`` (WeightWatcher's): refit without the largest 2, 3, ...,
    ``max_fingers - 1`` eigenvalues and keep the first fit whose alpha is more than
    ``finger_thresh`` below the unclipped one, stopping once alpha reaches 2 (the
    unclipped fit stays then); ``num_fingers`` counts what was clipped (WeightWatcher
    reports one fewer than it clips)."""
    values = np.asarray(esd)
    positive = values[values > 0]
    if clip_top:
        if clip_top > positive.size // 2:
            raise FitArgumentError(f"clip_top={clip_top} would remove more than half of the "
                                   f"{positive.size} positive eigenvalues.")
        positive = positive[:-clip_top]
    if positive.size >= min_tail and positive[-1] - positive[0] <= linalg.noise_floor(
        values.size, float(positive[-1]), "float32"
    ):
        raise FieldUndefined(
            "all eigenvalues are equal within rounding (e.g. an orthogonal matrix): "
            "a power law cannot be fitted"
        )
    fit = _fit_call(fit_power_law, positive, fit_method=fit_method, min_tail=min_tail,
                    alpha_max=alpha_max)
    if fix_fingers == "clip_xmax":
        first = fit
        for clipped in range(2, max_fingers):
            try:
                refit = fit_power_law(positive[:-clipped], fit_method=fit_method,
                                      min_tail=min_tail, alpha_max=alpha_max)
            except FitError:
                break
            if refit.alpha + finger_thresh < first.alpha:
                fit = refit
                break
            if refit.alpha <= 2.0:
                break
    return fit.alpha, fit.xmin, fit.xmax, fit.ks_distance, fit.sigma, fit.n_tail


@kernel
def num_fingers(esd: np.ndarray, pl_xmax: float) -> int:
    """``#{i : lambda_i > pl_xmax}``: the largest eigenvalues the power-law fit left out
    (``clip_top`` and ``fix_fingers`` of power_law_fit; 0 otherwise)."""
    return int(np.count_nonzero(np.asarray(esd) > pl_xmax))


@kernel(aliases={"pl_alpha_weighted": "alpha_weighted"})
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


@kernel(produce_fields=("tpl_alpha", "tpl_lambda", "tpl_ks_distance", "tpl_xmin"),
        aliases={"tpl_esd_xmin": "tpl_xmin", "tpl_ks": "tpl_ks_distance"},
        execution_protocol=PARALLEL)
def truncated_power_law_fit(
    esd: np.ndarray,
    pl_xmin: float,
    *,
    fit_method: FitMethod = "auto",
    xmin: TailStart = "pl_xmin",
    min_tail: MinTail = 50,
):
    """Truncated power law ``p(lambda) ~ lambda^-tpl_alpha exp(-tpl_lambda lambda)`` by
    maximum likelihood on the tail ``lambda >= tpl_xmin``: the power law's
    (``xmin="pl_xmin"``, default: the tail the likelihood-ratio tests compare on) or its
    own, the candidate of smallest KS distance for this law (``"own"``, the original
    Diffract's; a few ms per candidate)."""
    method = "powerlaw" if fit_method == "powerlaw" else "diffract"
    start = pl_xmin if xmin == "pl_xmin" else None
    fit = _fit_call(fit_truncated_power_law, _positive_part(esd), xmin=start,
                    fit_method=method, min_tail=min_tail)
    return fit.alpha, fit.lambda_, fit.ks_distance, float(fit.xmin)


@kernel(produce_fields=("exp_lambda", "exp_ks_distance", "exp_xmin"),
        aliases={"expon_lambda": "exp_lambda", "expon_ks": "exp_ks_distance",
                 "expon_esd_xmin": "exp_xmin"},
        execution_protocol=PARALLEL)
def exponential_fit(
    esd: np.ndarray,
    pl_xmin: float,
    *,
    fit_method: FitMethod = "auto",
    xmin: TailStart = "pl_xmin",
    min_tail: MinTail = 50,
):
    """Exponential ``p(lambda) = exp_lambda exp(-exp_lambda (lambda - exp_xmin))``; MLE
    ``exp_lambda = 1 / mean(lambda_i - exp_xmin)`` on the tail ``lambda >= exp_xmin``:
    the power law's (``xmin="pl_xmin"``, default) or its own, the candidate of smallest
    KS distance for this law (``"own"``, the original Diffract's)."""
    method = "powerlaw" if fit_method == "powerlaw" else "diffract"
    start = pl_xmin if xmin == "pl_xmin" else None
    fit = _fit_call(fit_exponential, _positive_part(esd), xmin=start, fit_method=method,
                    min_tail=min_tail)
    return fit.lambda_, fit.ks_distance, float(fit.xmin)


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


@kernel(execution_protocol=PARALLEL, aliases={"pl_p_value": "pl_pvalue"})
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
    xmin: Literal["search", "fixed"] = "search",
    alpha_max: Annotated[float, Range(gt=1.0)] | None = None,
) -> float:
    """Goodness-of-fit p-value of the power law: the fraction of ``n_replicates``
    semi-parametric bootstrap data sets (CSN) whose refitted KS distance is at least
    ``pl_ks_distance``; NaN when the tail has fewer than 50 points. Each replicate is
    refitted with the full xmin search (``xmin="search"``, CSN) or at the fitted xmin
    (``"fixed"``, the original Diffract's: tens of times faster, biased towards high p).
    ``min_tail`` and ``alpha_max`` should be power_law_fit's (the conventions presets
    set both)."""
    from diffract_kernels_spectral._records import PowerLawFit

    values = np.asarray(esd)
    values = values[values > 0]
    if pl_n_tail < 50:
        raise FieldUndefined(f"the fitted tail has {pl_n_tail} points, fewer than 50")
    fit = PowerLawFit(pl_alpha, pl_xmin, pl_ks_distance, math.nan, int(pl_n_tail), len(values),
                      float(values[-1]), 0, fit_method)
    result = _fit_call(power_law_pvalue, values, fit=fit, n_replicates=n_replicates, seed=seed,
                       fit_method=fit_method, min_tail=min_tail, xmin=xmin,
                       alpha_max=alpha_max)
    if math.isnan(result.p):
        raise FieldUndefined("no bootstrap replicate could be refitted")
    return result.p


# -- sizes, singular values, spectrum ends ------------------------------------------------
@kernel(restrictions=_MATRIX)
def greater_dim(shape: tuple[int, ...]) -> int:
    """``N = max(rows, cols)`` of the matrix view (reads no weights)."""
    return max(_dims(shape))


@kernel(restrictions=_MATRIX)
def lower_dim(shape: tuple[int, ...]) -> int:
    """``M = k = min(rows, cols)`` of the matrix view (reads no weights)."""
    return min(_dims(shape))


@kernel
def aspect_ratio(greater_dim: int, lower_dim: int) -> float:
    """``Q = N / M >= 1``."""
    if lower_dim <= 0:
        raise FieldUndefined("aspect_ratio is undefined for a matrix with no columns")
    return greater_dim / lower_dim


@kernel(restrictions=_MATRIX)
def weights_std(weights: np.ndarray) -> float:
    """``std(W)``: standard deviation of the entries (population, float64)."""
    w = _finite_matrix(weights)
    return float(np.std(w, dtype=np.float64))


def _ends(values: np.ndarray, what: str) -> tuple[float, float]:
    """``(first, last)`` of a non-empty spectrum."""
    v = np.asarray(values)
    if v.size == 0:
        raise FieldUndefined(f"the {what} is empty")
    return float(v[0]), float(v[-1])


@kernel(produce_fields=("max_weights_sval", "min_weights_sval"),
        aliases={"l2_norm": "max_weights_sval"})
def sval_extremes(svals: np.ndarray) -> tuple[float, float]:
    """``max_weights_sval = sigma_max`` (alias ``l2_norm``: the spectral norm ``||W||_2``,
    not squared; ``spectral_norm`` is ``sigma_max^2 c``), ``min_weights_sval =
    sigma_min`` (float64)."""
    return _ends(svals, "set of singular values")


@kernel
def nuclear_norm(svals: np.ndarray) -> float:
    """``||W||_* = sum_i sigma_i``, the Schatten-1 norm."""
    return float(np.sum(np.asarray(svals, dtype=np.float64)))


@kernel
def effective_rank(svals: np.ndarray) -> float:
    """Entropy effective rank ``exp(-sum_i p_i ln p_i)`` with ``p_i = sigma_i / sum_j
    sigma_j`` (Roy and Vetterli; ``0 ln 0 = 0``): ``k`` for a flat spectrum, 1 for rank
    one."""
    s = np.asarray(svals, dtype=np.float64)
    total = float(np.sum(s))
    if not total > 0:
        raise FieldUndefined("effective_rank is undefined for an all-zero matrix")
    p = s[s > 0] / total
    return float(math.exp(-np.sum(p * np.log(p))))


@kernel(produce_fields=("esd_max", "esd_min"))
def esd_extremes(esd: np.ndarray) -> tuple[float, float]:
    """``esd_max = lambda_max``, ``esd_min = lambda_min`` (eigenvalues below the float32
    noise floor are 0 in ``esd``, so ``esd_min`` is 0 for a matrix that is rank
    deficient to rounding)."""
    low, high = _ends(esd, "spectrum")
    return high, low


# -- where the fitted tails lie --------------------------------------------------------------
def _concentration(esd: np.ndarray, xmin: float) -> float:
    values = np.asarray(esd)
    if values.size == 0 or math.isnan(xmin):
        raise FieldUndefined("no spectrum or no fitted xmin")
    return float(np.sum(values >= xmin) / values.size)


def _presence(esd_max: float, esd_min: float, xmin: float) -> float:
    width = esd_max - esd_min
    if not width > 0:
        raise FieldUndefined("the spectrum has zero width (all eigenvalues equal)")
    return float((esd_max - xmin) / width)


@kernel
def pl_concentration(esd: np.ndarray, pl_xmin: float) -> float:
    """``#{i : lambda_i >= pl_xmin} / k``: the fraction of eigenvalues in the tail."""
    return _concentration(esd, pl_xmin)


@kernel
def tpl_concentration(esd: np.ndarray, tpl_xmin: float) -> float:
    """``#{i : lambda_i >= tpl_xmin} / k``."""
    return _concentration(esd, tpl_xmin)


@kernel(aliases={"expon_concentration": "exp_concentration"})
def exp_concentration(esd: np.ndarray, exp_xmin: float) -> float:
    """``#{i : lambda_i >= exp_xmin} / k``."""
    return _concentration(esd, exp_xmin)


@kernel
def pl_presence(esd_max: float, esd_min: float, pl_xmin: float) -> float:
    """``(lambda_max - pl_xmin) / (lambda_max - lambda_min)``: the tail's share of the
    spectrum's width."""
    return _presence(esd_max, esd_min, pl_xmin)


@kernel
def tpl_presence(esd_max: float, esd_min: float, tpl_xmin: float) -> float:
    """``(lambda_max - tpl_xmin) / (lambda_max - lambda_min)``."""
    return _presence(esd_max, esd_min, tpl_xmin)


@kernel(aliases={"expon_presence": "exp_presence"})
def exp_presence(esd_max: float, esd_min: float, exp_xmin: float) -> float:
    """``(lambda_max - exp_xmin) / (lambda_max - lambda_min)``."""
    return _presence(esd_max, esd_min, exp_xmin)


@kernel
def tpl_scale(esd_max: float, tpl_lambda: float) -> float:
    """``lambda_max tpl_lambda``: the cutoff rate over the observed range (a power law
    has no rate, so there is no ``pl_scale``)."""
    return float(esd_max * tpl_lambda)


@kernel(aliases={"expon_scale": "exp_scale"})
def exp_scale(esd_max: float, exp_lambda: float) -> float:
    """``lambda_max exp_lambda``."""
    return float(esd_max * exp_lambda)


# -- alpha norms -------------------------------------------------------------------------------
def _alpha_norm(esd: np.ndarray, alpha: float, name: str) -> float:
    values = _positive(esd, name)
    if not math.isfinite(alpha):
        raise FieldUndefined(f"{name}: the exponent is not finite")
    top = float(values[-1])
    log10 = alpha * math.log10(top) + math.log10(float(np.sum((values / top) ** alpha)))
    if log10 > 307.0 or log10 < -307.0:
        raise FieldUndefined(f"{name} = 10^{log10:.1f} is outside float64's range; "
                             "log_alpha_norm holds its log10")
    return float(10.0**log10)


@kernel
def pl_alpha_norm(esd: np.ndarray, pl_alpha: float) -> float:
    """``sum_i lambda_i^pl_alpha`` (``log_alpha_norm`` is its log10)."""
    return _alpha_norm(esd, pl_alpha, "pl_alpha_norm")


@kernel
def tpl_alpha_norm(esd: np.ndarray, tpl_alpha: float) -> float:
    """``sum_i lambda_i^tpl_alpha``."""
    return _alpha_norm(esd, tpl_alpha, "tpl_alpha_norm")


# -- per model ---------------------------------------------------------------------------------
IN_MODEL = KernelApplyLevel.IN_MODEL


def _measurable_log10(values: tuple[float, ...], power: float = 1.0) -> np.ndarray:
    """``log10(v^power)`` of the positive finite values (dead or diverged layers, and
    parameters whose value is undefined, are left out, as in the original Diffract)."""
    v = np.asarray(values, dtype=np.float64)
    v = v[np.isfinite(v) & (v > 0)]
    if v.size == 0:
        raise FieldUndefined("no parameter of the model has a positive finite value")
    return power * np.log10(v)


@kernel(apply_level=IN_MODEL)
def model_pl_alpha_norm(pl_alpha_norm: tuple[float, ...]) -> float:
    """``mean_l log10(sum_i lambda_i^pl_alpha)`` over the model's matrices with a value."""
    return float(np.mean(_measurable_log10(pl_alpha_norm)))


@kernel(apply_level=IN_MODEL)
def model_tpl_alpha_norm(tpl_alpha_norm: tuple[float, ...]) -> float:
    """``mean_l log10(sum_i lambda_i^tpl_alpha)`` over the model's matrices with a value."""
    return float(np.mean(_measurable_log10(tpl_alpha_norm)))


@kernel(apply_level=IN_MODEL)
def log_prod_spectral_norm(max_weights_sval: tuple[float, ...]) -> float:
    """``sum_l log10 ||W_l||_2 = log10 prod_l sigma_max,l`` over the model's matrices."""
    return float(np.sum(_measurable_log10(max_weights_sval)))


@kernel(apply_level=IN_MODEL)
def model_log_spectral_norm(max_weights_sval: tuple[float, ...]) -> float:
    """``mean_l log10 ||W_l||_2^2``: the original Diffract's model-level
    ``log_spectral_norm`` (ours, per parameter, is ``log10 lambda_max``)."""
    return float(np.mean(_measurable_log10(max_weights_sval, 2.0)))


def _frob(svals: np.ndarray) -> float:
    s = np.asarray(svals, dtype=np.float64)
    return float(np.sqrt(np.sum(s * s)))


@kernel(apply_level=IN_MODEL)
def log_prod_frob_norm(svals: tuple[np.ndarray, ...]) -> float:
    """``sum_l log10 ||W_l||_F`` over the model's matrices (``||W||_F^2 = sum_i
    sigma_i^2``; 1-D parameters are not matrices and do not count)."""
    return float(np.sum(_measurable_log10(tuple(_frob(s) for s in svals))))


@kernel(apply_level=IN_MODEL)
def model_log_norm(svals: tuple[np.ndarray, ...]) -> float:
    """``mean_l log10 ||W_l||_F^2`` over the model's matrices: the original Diffract's
    model-level ``log_norm`` (ours, per parameter, is ``log10 sum_i lambda_i``)."""
    return float(np.mean(_measurable_log10(tuple(_frob(s) for s in svals), 2.0)))


ALL = (
    svd, esd, esd_scale, svals, spectral_norm, log_spectral_norm, stable_rank, log_norm,
    hard_rank, matrix_entropy, marchenko_pastur, power_law_fit, alpha_weighted,
    log_alpha_norm, truncated_power_law_fit, exponential_fit, distribution_comparison,
    pl_pvalue, greater_dim, lower_dim, aspect_ratio, weights_std, sval_extremes,
    nuclear_norm, effective_rank, esd_extremes, pl_concentration, tpl_concentration,
    exp_concentration, pl_presence, tpl_presence, exp_presence, tpl_scale, exp_scale,
    num_fingers, pl_alpha_norm, tpl_alpha_norm, model_pl_alpha_norm, model_tpl_alpha_norm,
    log_prod_spectral_norm, model_log_spectral_norm, log_prod_frob_norm, model_log_norm,
)
