"""Estimators of the pruning and training-schedule literature: Hill's estimator on the
top of the spectrum (AlphaPruning, TempBalance) and FARMS's aspect-ratio-corrected
alpha. Notation as in :mod:`diffract_kernels_spectral.kernels`.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

import numpy as np

from diffract import FieldUndefined, Range, kernel
from diffract_kernels_spectral import linalg
from diffract_kernels_spectral.errors import FitArgumentError
from diffract_kernels_spectral.fitting import fit_power_law
from diffract_kernels_spectral.kernels import (
    _MATRIX,
    PARALLEL,
    FitMethod,
    MinTail,
    _finite_matrix,
    _fit_call,
    _positive_part,
)

__all__ = ["ALL", "farms_windows", "farms_spectrum"]


@kernel
def pl_alpha_hill(esd: np.ndarray, *, k: Annotated[int, Range(ge=0)] = 0) -> float:
    """Hill's estimator of the tail exponent on the top ``k`` eigenvalues, as AlphaPruning
    and TempBalance compute their ``PL_Alpha_Hill``: with the positive eigenvalues
    ascending ``lambda_1 <= ... <= lambda_n`` and ``lambda_min = lambda_(n-k+1)`` (the
    smallest of the top k), ``alpha = 1 + k / sum_{i > n-k} ln(lambda_i / lambda_min)``.
    ``k`` = 0 (default) takes half the spectrum, ``k = n - floor(n / 2)``; no xmin
    search, so it is defined on spectra too short for ``pl_alpha`` and moves smoothly
    with the weights (what a pruning or learning-rate schedule wants), but it is biased
    where the top half is not a power law. Undefined with fewer than 2 positive
    eigenvalues, or when the top k are all equal."""
    values = _positive_part(esd)
    n = values.size
    top = n - n // 2 if k == 0 else k
    if n < 2 or top < 2:
        raise FieldUndefined(f"Hill's estimator needs at least 2 positive eigenvalues in its "
                             f"top k (k={top}, {n} positive)")
    if top > n:
        raise FieldUndefined(f"k={top} is more than the {n} positive eigenvalues")
    tail = values[n - top:]
    spread = float(np.sum(np.log(tail / tail[0])))
    if not spread > 0:
        raise FieldUndefined(f"the top {top} eigenvalues are all equal: no tail to fit")
    return 1.0 + top / spread


def farms_windows(shape: tuple[int, int], rows: int, aspect: float, per_dim: int,
                  stride: int, placement: str = "paper") -> list[tuple[int, int, int, int]]:
    """The submatrices FARMS reads: ``(row0, col0, r, c)`` with ``r`` rows and ``c`` =
    ``r * aspect`` columns (rounded down with the paper's placement, to nearest with
    ``"even"``), ``r = min(rows, N, M / aspect)`` so a window fits (the paper's code has
    no answer for a smaller matrix). With ``stride`` 0, ``per_dim`` positions along each
    axis, first at 0: ``placement="paper"`` steps by ``floor(room / (per_dim - 1))`` as
    the paper's code does (the last window falls short of the end by up to ``per_dim -
    2``); ``"even"`` spreads them to end flush with the matrix's edge (every row and
    column read). Fewer where the axis is shorter. With ``stride`` > 0, a window every
    ``stride`` rows and columns, plus one flush with the end."""
    if placement not in ("paper", "even"):
        raise FitArgumentError(f"placement must be 'paper' or 'even', got {placement!r}.")
    n, m = shape
    r = int(min(rows, n, math.floor(m / aspect)))
    if r < 2:
        raise FieldUndefined(f"a {n} x {m} matrix holds no window of at least 2 rows at "
                             f"aspect ratio {aspect:g}")
    c = max(1, math.floor(r * aspect) if placement == "paper" else round(r * aspect))

    def starts(size: int, width: int) -> list[int]:
        room = size - width
        if stride > 0:
            out = list(range(0, room + 1, stride))
            return out if out[-1] == room else [*out, room]
        count = min(per_dim, room + 1)
        if count <= 1:
            return [0]
        if placement == "paper":
            step = max(1, room // (per_dim - 1))
            return [min(i * step, room) for i in range(min(per_dim, room // step + 1))]
        return sorted({round(i * room / (count - 1)) for i in range(count)})

    return [(i, j, r, c) for i in starts(n, r) for j in starts(m, c)]


def farms_spectrum(weights: np.ndarray, rows: int = 100, aspect: float = 2.0,
                   per_dim: int = 10, stride: int = 0, placement: str = "paper") -> np.ndarray:
    """The pooled ESD of FARMS's windows (:func:`farms_windows`): every window's
    eigenvalues ``sigma^2`` (float64), all together, ascending."""
    w = np.asarray(weights)
    parts = []
    for i, j, r, c in farms_windows(w.shape, rows, aspect, per_dim, stride, placement):
        parts.append(linalg.esd(w[i:i + r, j:j + c], "float64"))
    return np.sort(np.concatenate(parts))


@kernel(restrictions=_MATRIX, execution_protocol=PARALLEL)
def pl_alpha_farms(
    weights: np.ndarray,
    *,
    window_rows: Annotated[int, Range(ge=2)] = 100,
    aspect: Annotated[float, Range(gt=0.0)] = 2.0,
    windows_per_dim: Annotated[int, Range(ge=1)] = 10,
    stride: Annotated[int, Range(ge=0)] = 0,
    placement: Literal["paper", "even"] = "paper",
    fit: Literal["hill", "power_law"] = "hill",
    fit_method: FitMethod = "auto",
    min_tail: MinTail = 50,
) -> float:
    """FARMS (Fixing the Aspect Ratio by Matrix Subsampling, ICML 2025): the exponent of
    an ESD that does not depend on the matrix's aspect ratio. Submatrices of
    ``window_rows`` rows and ``aspect`` times as many columns (100 x 200 by default, the
    paper's code's defaults) are taken at ``windows_per_dim`` positions along each axis
    (10: up to 100 windows), placed as the paper's code places them (``placement=
    "paper"``: steps of ``floor(room / 9)``, the last short of the edge) or spread to end
    flush with it (``"even"``: every row and column read); ``stride`` > 0 places one
    every ``stride`` rows and columns instead. Their eigenvalues are pooled into one
    averaged ESD, and that
    is fitted: by Hill's estimator on its top half (``fit="hill"``, default, what the
    paper's code fits) or by the CSN power-law fit (``fit="power_law"``, as
    ``pl_alpha``; noisier here: a random matrix's pooled ESD has no power-law tail).
    A 4096 x 512 Gaussian matrix and a 512 x 512 block of it: FARMS alpha 2.702 and
    2.701, Hill's on the whole spectra 4.49 and 2.14, ``pl_alpha`` 10.9 and 5.5."""
    values = farms_spectrum(_finite_matrix(weights), window_rows, aspect, windows_per_dim,
                            stride, placement)
    if fit == "hill":
        return pl_alpha_hill(values)
    positive = _positive_part(values)
    return _fit_call(fit_power_law, positive, fit_method=fit_method, min_tail=min_tail).alpha


ALL = (pl_alpha_hill, pl_alpha_farms)
