"""Elementary kernels every installation has: sizes and norms, numpy only."""

from __future__ import annotations

import numpy as np

from diffract.core.compute._enums import KernelApplyLevel
from diffract.core.compute.spec import kernel
from diffract.errors import FieldUndefined

__all__ = ["ELEMENTARY", "frob_norm", "numel", "param_norm", "total_numel"]


@kernel
def frob_norm(weights: np.ndarray) -> float:
    """Frobenius norm of the parameter: ``sqrt(sum_ij W_ij^2)``, accumulated in float64."""
    w = np.asarray(weights)
    finite = np.isfinite(w)
    if not finite.all():
        nan = int(np.isnan(w).sum())
        raise FieldUndefined(
            f"weights contain {nan} NaN and {w.size - int(finite.sum()) - nan} Inf value(s)"
        )
    return float(np.sqrt(np.sum(np.square(w, dtype=np.float64))))


@kernel
def numel(weights: np.ndarray) -> int:
    """Number of elements of the parameter: ``prod(shape)``."""
    return int(np.asarray(weights).size)


@kernel(apply_level=KernelApplyLevel.IN_MODEL)
def param_norm(frob_norm: tuple[float, ...]) -> float:
    """Squared Frobenius norm of the whole model: ``sum_l ||W_l||_F^2`` over its parameters."""
    return float(np.sum(np.square(np.asarray(frob_norm, dtype=np.float64))))


@kernel(apply_level=KernelApplyLevel.IN_MODEL)
def total_numel(numel: tuple[int, ...]) -> int:
    """Number of floating-point parameters of the model: ``sum_l numel_l``."""
    return int(sum(numel))


ELEMENTARY = (frob_norm, numel, param_norm, total_numel)
