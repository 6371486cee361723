"""The module the entry point names: hook implementations only."""

from __future__ import annotations

from collections.abc import Iterator

from diffract.plugins import KernelSpec, hookimpl
from diffract_example_pack.kernels import max_row_norm, row_norm_stats


@hookimpl
def diffract_kernels() -> Iterator[KernelSpec]:
    yield KernelSpec.from_function(row_norm_stats)
    yield KernelSpec.from_function(max_row_norm)
