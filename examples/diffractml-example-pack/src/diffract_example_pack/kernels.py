"""Kernels of the example pack: plain functions marked with ``@kernel``."""

from __future__ import annotations

import numpy as np

from diffract import FieldUndefined, KernelApplyLevel, Restriction, kernel


@kernel(
    produce_fields=("row_norm_mean", "row_norm_std"),
    restrictions=[Restriction.min_ndim(2)],
)
def row_norm_stats(weights: np.ndarray, *, ord: float = 2.0) -> tuple[float, float]:
    """Mean and standard deviation of the rows' norms: ``r_i = ||W[i, :]||_ord``.

    Parameters of more than two dimensions are reshaped to ``(shape[0], -1)``.
    """
    w = np.asarray(weights, dtype=np.float64).reshape(weights.shape[0], -1)
    if not np.isfinite(w).all():
        raise FieldUndefined("weights contain NaN or Inf")
    rows = np.linalg.norm(w, ord=ord, axis=1)
    return float(rows.mean()), float(rows.std())


@kernel(apply_level=KernelApplyLevel.IN_MODEL)
def max_row_norm(row_norm_mean: tuple[float, ...]) -> float:
    """Largest mean row norm over the model's matrices: ``max_l mean_i r_i``."""
    return float(np.max(row_norm_mean))
