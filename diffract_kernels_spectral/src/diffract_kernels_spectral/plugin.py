"""Hook implementations: the spectral kernels, registered through the ``diffract`` group."""

from __future__ import annotations

from collections.abc import Iterator

from diffract.plugins import Conventions, KernelSpec, hookimpl


@hookimpl
def diffract_kernels() -> Iterator[KernelSpec]:
    from diffract_kernels_spectral import (
        kernels,
        kernels_fits,
        kernels_pruning,
        kernels_rmt,
        kernels_ww,
    )

    for fn in (*kernels.ALL, *kernels_fits.ALL, *kernels_rmt.ALL, *kernels_ww.ALL,
               *kernels_pruning.ALL):
        yield KernelSpec.from_function(fn)


def _preset(*, min_tail: int, alpha_max: float | None, normalize: str, pvalue_xmin: str,
            alternatives_xmin: str, bulk: str = "frobenius", fit_method: str = "auto",
            conv: str = "matrix", replicas: str = "one") -> dict[str, dict[str, object]]:
    """Every setting a preset's numbers depend on (the fit's method too: an earlier
    configure_kernel of it in the process changed a preset's numbers), so that switching
    presets leaves nothing behind."""
    fit = {"min_tail": min_tail, "alpha_max": alpha_max}
    fitted = {**fit, "fit_method": fit_method}
    alternatives = {"min_tail": min_tail, "xmin": alternatives_xmin, "fit_method": "auto"}
    # every kernel that reads a convolution's shape or weights reads it as esd does
    views = dict.fromkeys(("svals", "greater_dim", "lower_dim", "num_evals", "matrix_rank",
                           "marchenko_pastur_fit", "mp_ks", "tw_esd_bound"), {"conv": conv})
    return {
        "esd_scale": {"normalize": normalize},
        "esd": {"conv": conv},
        **views,
        "esd_rand": {"replicas": replicas, "conv": conv},
        "marchenko_pastur": {"bulk": bulk, "conv": conv},
        "num_traps": {"bulk": bulk, "conv": conv},
        "power_law_fit": fitted,
        "pl_pvalue": {**fitted, "xmin": pvalue_xmin},
        "pl_alpha_ci": fitted,
        "pl_fit_quality": fit,
        "truncated_power_law_fit": alternatives,
        "exponential_fit": alternatives,
    }


@hookimpl
def diffract_conventions() -> Iterator[Conventions]:
    yield Conventions(
        "csn",
        _preset(min_tail=50, alpha_max=None, normalize="none", pvalue_xmin="search",
                alternatives_xmin="pl_xmin"),
        "The default: a power-law tail needs at least 50 points (the reliability bound of "
        "Clauset, Shalizi and Newman), every exponent is accepted, the ESD is sigma^2 "
        "(as WeightWatcher), and the bootstrap p-value refits xmin for every replicate; "
        "a layer with a shorter candidate tail is undefined, with the reason.",
    )
    yield Conventions(
        "weightwatcher",
        _preset(min_tail=5, alpha_max=None, normalize="none", pvalue_xmin="search",
                alternatives_xmin="pl_xmin", bulk="fitted", fit_method="weightwatcher",
                conv="weightwatcher", replicas="weightwatcher"),
        "WeightWatcher 0.7.7's analyze(): power-law tails down to 5 points, so small "
        "spectra get an alpha, below 20 eigenvalues its small-sample fit, no fit below 8, "
        "a convolution read per kernel position in every field (its eigenvalues pooled, "
        "halved; N, M and Q the positions'), "
        "num_traps from 5 pooled shuffles of a matrix of fewer than 100 eigenvalues, "
        "and the Marchenko-Pastur bulk is fitted as its mp_fit=True does (mp_softrank, "
        "num_spikes). On all-MiniLM-L6-v2 pl_alpha then equals WeightWatcher's on all 39 "
        "layers (max relative difference 4e-14); with the default tail floor it differs "
        "on about half of them.",
    )
    yield Conventions(
        "diffract-0.3",
        _preset(min_tail=50, alpha_max=8.0, normalize="greater_dim", pvalue_xmin="fixed",
                alternatives_xmin="own"),
        "The original Diffract (diffract-core 0.3.1): the ESD is sigma^2 / N (N the larger "
        "dimension), so xmins, esd_min/esd_max, spectral_norm, log_norm and the "
        "random-matrix edges are ours divided by N (exponents, ratios and counts do not "
        "change); power-law candidates with alpha above 8 are left out (where the best "
        "candidate's alpha exceeds 8, another xmin wins); the truncated power law and the "
        "exponential choose their own xmin; the bootstrap p-value refits with xmin held "
        "fixed (faster, biased towards high p).",
    )
