"""Elementary kernels every installation has: sizes and norms, numpy only."""

from __future__ import annotations

import numpy as np

from diffract.core.compute._enums import KernelApplyLevel
from diffract.core.compute.spec import kernel
from diffract.errors import FieldUndefined

__all__ = ["ELEMENTARY", "frob_norm", "numel", "param_norm", "total_numel"]


#: Elements squared and summed at a time: bounds the float64 temporaries of frob_norm.
_BLOCK = 1 << 20


@kernel
def frob_norm(weights: np.ndarray) -> float:
    """Frobenius norm of the parameter: ``sqrt(sum_ij W_ij^2)``, accumulated in float64."""
    flat = np.asarray(weights).reshape(-1)
    total, nan, inf = 0.0, 0, 0
    for start in range(0, flat.size, _BLOCK):  # blocks: no full-size float64 copy
        block = flat[start:start + _BLOCK]
        finite = np.isfinite(block)
        if not finite.all():
            n = int(np.isnan(block).sum())
            nan, inf = nan + n, inf + block.size - int(finite.sum()) - n
            continue
        b64 = block.astype(np.float64)
        total += float(np.sum(np.square(b64)))  # pairwise: not BLAS's thread-split dot
    if nan or inf:
        raise FieldUndefined(f"weights contain {nan} NaN and {inf} Inf value(s)")
    return float(np.sqrt(total))


@kernel
def numel(shape: tuple[int, ...]) -> int:
    """Number of elements of the parameter: ``prod(shape)`` (reads no weights)."""
    return int(np.prod(shape, dtype=np.int64))


@kernel(apply_level=KernelApplyLevel.IN_MODEL)
def param_norm(frob_norm: tuple[float, ...]) -> float:
    """Squared Frobenius norm of the whole model: ``sum_l ||W_l||_F^2`` over its parameters."""
    return float(np.sum(np.square(np.asarray(frob_norm, dtype=np.float64))))


@kernel(apply_level=KernelApplyLevel.IN_MODEL)
def total_numel(numel: tuple[int, ...]) -> int:
    """Number of floating-point parameters of the model: ``sum_l numel_l``."""
    return int(sum(numel))


ELEMENTARY = (frob_norm, numel, param_norm, total_numel)
