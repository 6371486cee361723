"""The core's elementary kernels (numpy only)."""

from diffract.core.compute.kernels.elementary import (
    ELEMENTARY,
    frob_norm,
    numel,
    param_norm,
    total_numel,
)

__all__ = ["ELEMENTARY", "frob_norm", "numel", "param_norm", "total_numel"]
