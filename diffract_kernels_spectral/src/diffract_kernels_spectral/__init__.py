"""Spectral kernels for Diffract and fitting functions for any 1-D array.

``fit_power_law``, ``fit_truncated_power_law``, ``fit_exponential``,
``power_law_pvalue``, ``power_law_alpha_interval`` and ``compare_distributions`` work on
spectra computed anywhere;
the kernels (see :mod:`diffract_kernels_spectral.kernels`) call them.
``sparsity_schedule(session, "alphapruning", 0.7)`` turns a stored alpha into per-layer
pruning ratios.
"""

from diffract_kernels_spectral._records import (
    AlphaInterval,
    Comparison,
    ExponentialFit,
    PowerLawFit,
    PValue,
    TruncatedPowerLawFit,
)
from diffract_kernels_spectral.errors import FitArgumentError, FitError, FitUnavailableError
from diffract_kernels_spectral.fitting import (
    candidate_range,
    fit_exponential,
    fit_power_law,
    fit_truncated_power_law,
)
from diffract_kernels_spectral.schedule import sparsity_schedule
from diffract_kernels_spectral.significance import (
    compare_distributions,
    power_law_alpha_interval,
    power_law_pvalue,
)

__version__ = "0.2.0"

__all__ = [
    "AlphaInterval",
    "Comparison",
    "ExponentialFit",
    "FitArgumentError",
    "FitError",
    "FitUnavailableError",
    "PValue",
    "PowerLawFit",
    "TruncatedPowerLawFit",
    "candidate_range",
    "compare_distributions",
    "fit_exponential",
    "fit_power_law",
    "fit_truncated_power_law",
    "power_law_alpha_interval",
    "power_law_pvalue",
    "sparsity_schedule",
]
