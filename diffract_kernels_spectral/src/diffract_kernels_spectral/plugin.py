"""Hook implementations: the spectral kernels, registered through the ``diffract`` group."""

from __future__ import annotations

from collections.abc import Iterator

from diffract.plugins import Conventions, KernelSpec, hookimpl


@hookimpl
def diffract_kernels() -> Iterator[KernelSpec]:
    from diffract_kernels_spectral.kernels import ALL

    for fn in ALL:
        yield KernelSpec.from_function(fn)


@hookimpl
def diffract_conventions() -> Iterator[Conventions]:
    yield Conventions(
        "csn",
        {"power_law_fit": {"min_tail": 50}, "pl_pvalue": {"min_tail": 50}},
        "The default: a power-law tail needs at least 50 points (the reliability bound of "
        "Clauset, Shalizi and Newman); a layer with a shorter candidate tail is undefined, "
        "with the reason.",
    )
    yield Conventions(
        "weightwatcher",
        {"power_law_fit": {"min_tail": 5}, "pl_pvalue": {"min_tail": 5}},
        "WeightWatcher 0.7.7's analyze(): power-law tails down to 5 points, so small "
        "spectra get an alpha. On all-MiniLM-L6-v2 "
        "pl_alpha then equals WeightWatcher's on all 39 layers (max relative difference "
        "5e-6: float32 vs float64 spectra); with the default tail floor it differs on "
        "about half of them.",
    )
