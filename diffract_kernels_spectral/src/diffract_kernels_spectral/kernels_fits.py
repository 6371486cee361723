"""The spectral kernels that fit the ESD's tail (power law, truncated power law,
exponential; comparisons and the bootstrap p-value) and what is read off the fits: where
the tails lie, alpha-weighted norms, model-level products. Notation as in
:mod:`diffract_kernels_spectral.kernels`.
"""

from __future__ import annotations

import math
from typing import Annotated, Any, Literal

import numpy as np

from diffract import FieldUndefined, KernelApplyLevel, Range, kernel
from diffract_kernels_spectral import _taichi, linalg
from diffract_kernels_spectral._search import _too_few
from diffract_kernels_spectral.errors import FitArgumentError, FitError
from diffract_kernels_spectral.fitting import (
    DENSE_MAX_POINTS,
    fit_exponential,
    fit_power_law,
    fit_truncated_power_law,
    resolve_fit_method,
)
from diffract_kernels_spectral.kernels import (
    PARALLEL,
    FitMethod,
    MinTail,
    TailStart,
    _fit_call,
    _positive,
    _positive_part,
)
from diffract_kernels_spectral.significance import (
    compare_distributions,
    power_law_alpha_interval,
    power_law_pvalue,
)

__all__ = ["ALL"]

IN_MODEL = KernelApplyLevel.IN_MODEL


# -- fits ------------------------------------------------------------------------------------
#: Spectra of fewer points are fitted here, one after another, even by the dense scan: its
#: blocks of a small spectrum are short numpy calls that hold the GIL, and two threads
#: took 1.1-1.3x the time of one at 384-640 points (0.7-0.8x at 768-1024; 24 spectra a
#: size, 2-core VM: the figures are in the commit that set it).
THREADED_MIN_POINTS = 700


def _power_law_fits(units: list[dict[str, Any]], **config: Any) -> list[Any]:
    """:func:`power_law_fit` of many spectra: those the dense numpy scan fits (at most
    DENSE_MAX_POINTS points, Taichi not started) and large enough to pay for it
    (THREADED_MIN_POINTS) on one thread per core (numpy releases the GIL in its long
    loops), the rest here in order (Taichi's kernels, and the powerlaw library's warning
    filters, are not for threads)."""
    def fit(unit: dict[str, Any]) -> Any:
        try:
            return power_law_fit(unit["esd"], **config)
        except Exception as exc:  # noqa: BLE001 - returned in place, as invoke_batch wants
            return exc

    def threads_pay(unit: dict[str, Any]) -> bool:
        n = int(np.count_nonzero(np.asarray(unit["esd"]) > 0))
        return (THREADED_MIN_POINTS <= n <= DENSE_MAX_POINTS and not _taichi.running()
                and resolve_fit_method(config.get("fit_method", "auto"), n) == "diffract")

    threaded = [i for i, unit in enumerate(units) if threads_pay(unit)]
    out: list[Any] = [None] * len(units)
    for i, result in zip(threaded, linalg.parallel_map(lambda i: fit(units[i]), threaded),
                         strict=True):
        out[i] = result
    return [fit(unit) if result is None else result
            for unit, result in zip(units, out, strict=True)]


@kernel(
    produce_fields=("pl_alpha", "pl_xmin", "pl_xmax", "pl_ks_distance", "pl_sigma", "pl_n_tail",
                    "pl_bounded"),
    aliases={"pl_esd_xmin": "pl_xmin", "pl_ks": "pl_ks_distance", "alpha": "pl_alpha",
             "xmin": "pl_xmin", "xmax": "pl_xmax", "D": "pl_ks_distance", "sigma": "pl_sigma"},
    execution_protocol=PARALLEL,
    batch=lambda units, **cfg: _power_law_fits(units, **cfg),
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
    xmin minimising the KS distance over candidates leaving ``min_tail`` points, by the
    exact search at every size: ``fit_method="auto"``);
    ``pl_sigma = (alpha - 1) / sqrt(pl_n_tail)``; ``pl_xmax`` the largest eigenvalue
    fitted (``lambda_max`` unless some are clipped). ``fit_method="powerlaw"`` is the
    powerlaw library's fit, whose search admits alpha <= 3 only: ``pl_bounded`` is 1 where
    that bound constrained it (a candidate above 3 that would have won was left out), 0
    otherwise; ``"small_sample"`` is WeightWatcher's small-sample fit (bias-corrected
    ``alpha = 1 + (n - 1) / sum ln(lambda_i / xmin)``, xmin by the smallest
    ``D - 0.868 / sqrt(n)``), for heads and experts of few rows; ``"weightwatcher"``
    WeightWatcher 0.7.7's own choice (that fit, keeping the smallest ``D`` as 0.7.7 does,
    below 20 eigenvalues; nothing below 8). Zero eigenvalues are left out; a
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
    flat = _all_equal(values, positive, min_tail)
    if flat is not None:
        raise FieldUndefined(flat)
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
    return (fit.alpha, fit.xmin, fit.xmax, fit.ks_distance, fit.sigma, fit.n_tail,
            int(fit.bounded))


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


@kernel(produce_fields=("warning",))
def training_warning(
    pl_alpha: float,
    *,
    over_trained: Annotated[float, Range(gt=1.0)] = 2.0,
    under_trained: Annotated[float, Range(gt=1.0)] = 6.0,
) -> str:
    """WeightWatcher's per-layer flag: ``warning = "over-trained"`` when ``pl_alpha <
    over_trained`` (2), ``"under-trained"`` when ``pl_alpha > under_trained`` (6), else
    ``""`` (the thresholds of WeightWatcher 0.7.7; an undefined alpha leaves it
    undefined)."""
    if over_trained >= under_trained:
        raise FitArgumentError(f"over_trained ({over_trained}) must be below under_trained "
                               f"({under_trained}).")
    if pl_alpha < over_trained:
        return "over-trained"
    return "under-trained" if pl_alpha > under_trained else ""


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


def _all_equal(values: np.ndarray, positive: np.ndarray, min_tail: int) -> str | None:
    """Why a spectrum of enough positive eigenvalues has no power law, when they are all
    equal within rounding; None otherwise."""
    if positive.size >= min_tail and positive[-1] - positive[0] <= linalg.noise_floor(
            values.size, float(positive[-1]), "float32"):
        return ("all eigenvalues are equal within rounding (e.g. an orthogonal matrix): "
                "a power law cannot be fitted")
    return None


def _why_no_fit(esd: object, min_tail: int) -> str:
    """Why power_law_fit is undefined, from the spectrum, in the words the fit used (the
    checks are the fit's own: ``_all_equal`` and the fitter's ``_too_few``)."""
    values = np.asarray(esd, dtype=np.float64)
    if values.ndim != 1:
        return "the spectrum is undefined (the weights are empty, NaN or not a matrix)"
    positive = values[values > 0]
    if positive.size < min_tail:  # an all-zero matrix too: "only 0 positive point(s)"
        return _too_few(positive, min_tail)
    return _all_equal(values, positive, min_tail) or (
        "no xmin candidate meets the fit's constraints (min_tail, alpha_max); "
        "export_notes() has the fit's own reason")


@kernel(produce_fields=("pl_fit_quality", "pl_fit_quality_reason"), undefined_inputs=True,
        optional_inputs=("pl_pvalue",))
def pl_fit_quality(
    esd: np.ndarray,
    pl_alpha: float,
    pl_n_tail: float,
    pl_ks_distance: float,
    pl_pvalue: float,
    *,
    min_tail: MinTail = 50,
    alpha_max: Annotated[float, Range(gt=1.0)] | None = None,
    short_tail: Annotated[int, Range(ge=2)] = 50,
    max_ks: Annotated[float, Range(gt=0.0, le=1.0)] | None = None,
    p_min: Annotated[float, Range(ge=0.0, le=1.0)] = 0.1,
) -> tuple[str, str]:
    """How far to trust ``pl_alpha``: ``pl_fit_quality`` is ``"ok"``, ``"poor"`` or
    ``"failed"``, ``pl_fit_quality_reason`` says why (empty when ok; reasons joined by
    "; "). ``failed``: no power law was fitted (too few positive eigenvalues, all equal,
    no candidate within the constraints, an undefined spectrum). ``poor`` when any of:
    the tail has fewer than ``short_tail`` points (50: the reliability bound of
    Clauset, Shalizi and Newman; the weightwatcher preset fits tails down to 5); xmin is
    the largest candidate the search may take (the tail has exactly ``min_tail`` points:
    the minimum sat on its bound); alpha is within 1% of ``alpha_max``; the KS distance
    exceeds ``max_ks``, by default ``1.36 / sqrt(pl_n_tail)``, the 5% critical value of
    the KS statistic for a sample of the tail's size (a rough bound: the xmin search
    lowers D; ``pl_pvalue`` is the test); the bootstrap p-value is below ``p_min`` (0.1,
    CSN's threshold for ruling the power law out), where ``pl_pvalue`` is stored: it is
    an optional input, read when computed (ask for both, or apply pl_pvalue and then
    ``recompute="stale"``), never computed for this. Runs also where the fit is
    undefined (it reads the NaN).
    ``min_tail`` and ``alpha_max`` should be power_law_fit's (the presets set both)."""
    if not (isinstance(pl_alpha, float | int) and math.isfinite(pl_alpha)):
        return "failed", _why_no_fit(esd, min_tail)
    reasons = []
    n_tail = int(pl_n_tail)
    if n_tail < short_tail:
        reasons.append(f"the tail has {n_tail} points, fewer than {short_tail}")
    positive = int(np.count_nonzero(np.asarray(esd) > 0))
    if n_tail == min_tail and positive > min_tail:
        reasons.append(f"xmin is at the top of its range (the tail has exactly min_tail="
                       f"{min_tail} points)")
    if alpha_max is not None and pl_alpha >= 0.99 * alpha_max:
        reasons.append(f"alpha {pl_alpha:.3g} is at its bound alpha_max={alpha_max:g}")
    bound = 1.36 / math.sqrt(n_tail) if max_ks is None else max_ks
    if pl_ks_distance > bound:
        what = f"max_ks={max_ks:g}" if max_ks is not None else (
            f"1.36 / sqrt({n_tail}) = {bound:.3f}, the 5% critical value")
        reasons.append(f"KS distance {pl_ks_distance:.3f} is above {what}")
    if isinstance(pl_pvalue, float | int) and pl_pvalue < p_min:  # NaN: not computed
        reasons.append(f"the bootstrap p-value {pl_pvalue:.2f} is below p_min={p_min:g}: "
                       "the power law is ruled out")
    return ("poor", "; ".join(reasons)) if reasons else ("ok", "")


@kernel(produce_fields=("pl_alpha_ci_low", "pl_alpha_ci_high"), execution_protocol=PARALLEL)
def pl_alpha_ci(
    esd: np.ndarray,
    pl_alpha: float,
    pl_xmin: float,
    pl_ks_distance: float,
    pl_n_tail: int,
    *,
    level: Annotated[float, Range(gt=0.0, lt=1.0)] = 0.9,
    n_replicates: Annotated[int, Range(ge=10)] = 100,
    seed: Annotated[int, Range(ge=0)] = 0,
    fit_method: FitMethod = "auto",
    min_tail: MinTail = 50,
    alpha_max: Annotated[float, Range(gt=1.0)] | None = None,
) -> tuple[float, float]:
    """Bootstrap confidence interval of ``pl_alpha`` at ``level`` (0.9: the 5% and 95%
    quantiles): ``n_replicates`` semi-parametric bootstrap data sets of the fit (CSN's,
    the p-value's generator: with the same seed, the same data sets), each refitted with
    its own xmin search, and the quantiles of their exponents. Calibrated: on 200
    power-law samples of 200 points the 90% interval holds the true exponent 91.5% of
    the time. NaN when the tail has fewer than 50 points. ``min_tail`` and ``alpha_max``
    should be power_law_fit's (the conventions presets set both)."""
    from diffract_kernels_spectral._records import PowerLawFit

    values = _positive_part(esd)
    if pl_n_tail < 50:
        raise FieldUndefined(f"the fitted tail has {pl_n_tail} points, fewer than 50")
    fit = PowerLawFit(pl_alpha, pl_xmin, pl_ks_distance, math.nan, int(pl_n_tail), len(values),
                      float(values[-1]), 0, fit_method)
    ci = _fit_call(power_law_alpha_interval, values, fit=fit, level=level,
                   n_replicates=n_replicates, seed=seed, fit_method=fit_method,
                   min_tail=min_tail, alpha_max=alpha_max)
    if math.isnan(ci.low):
        raise FieldUndefined(f"only {ci.replicates} of {n_replicates} bootstrap replicates "
                             "could be refitted")
    return ci.low, ci.high


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
    power_law_fit, pl_fit_quality, pl_alpha_ci, alpha_weighted,
    training_warning, log_alpha_norm, truncated_power_law_fit,
    exponential_fit, distribution_comparison, pl_pvalue, pl_concentration, tpl_concentration,
    exp_concentration, pl_presence, tpl_presence, exp_presence, tpl_scale, exp_scale,
    num_fingers, pl_alpha_norm, tpl_alpha_norm, model_pl_alpha_norm, model_tpl_alpha_norm,
    log_prod_spectral_norm, model_log_spectral_norm, log_prod_frob_norm, model_log_norm,
)
