"""Spectra of weight matrices: the ESD (values only), singular values, the full SVD.

A parameter of more than two dimensions (a convolution kernel ``[out, in, k...]``) is
reshaped to ``(out, -1)``; 1-D parameters have no spectrum (the kernels skip them).
The ESD of a ``N x M`` matrix ``W`` is the ``k = min(N, M)`` eigenvalues of the smaller
Gram matrix (``W^T W`` or ``W W^T``: their nonzero eigenvalues coincide), ascending.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

__all__ = ["as_matrix", "esd", "noise_floor", "parallel_map", "singular_values", "svd"]

T = TypeVar("T")

#: Entries beyond 2**40 (or below 2**-40) are rescaled by a power of two before the Gram
#: product, so float32 products neither overflow nor underflow (exact: powers of two).
_SAFE_EXPONENT = 40

_PRECISIONS = {"float32": np.float32, "float64": np.float64}


def as_matrix(weights: np.ndarray) -> np.ndarray:
    """``weights`` as a 2-D matrix: as is, or ``(shape[0], -1)`` for more dimensions."""
    w = np.asarray(weights)
    if w.ndim < 2:
        raise ValueError(f"a spectrum needs a matrix, got shape {w.shape}")
    return w if w.ndim == 2 else w.reshape(w.shape[0], -1)


def noise_floor(k: int, lambda_max: float, precision: str) -> float:
    """Eigenvalues at or below ``k * eps(precision) * lambda_max`` are rounding noise."""
    return k * float(np.finfo(_PRECISIONS[precision]).eps) * lambda_max


def esd(weights: np.ndarray, precision: str = "float32") -> np.ndarray:
    """Eigenvalues of the smaller Gram matrix, ascending, float64; noise set to 0.

    ``precision`` is the arithmetic of the Gram product and the eigensolver. float32 is
    about twice as fast; its absolute error is about ``k * eps32 * lambda_max``, so
    eigenvalues below :func:`noise_floor` (about ``1e-4 lambda_max`` for k = 768) are
    stored as exactly 0 and the relative error of the others is ``~eps32 lambda_max /
    lambda``: fine for tails, norms and sums, not for small singular values (use
    ``singular_values`` for ranks).
    """
    from scipy.linalg import eigh

    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, got {precision!r}")
    w = as_matrix(weights)
    top = max(float(w.max()), -float(w.min())) if w.size else 0.0
    if top == 0.0:
        return np.zeros(min(w.shape))
    exponent = int(np.frexp(top)[1])
    scale = 1.0
    if abs(exponent) > _SAFE_EXPONENT:  # rescale exactly by a power of two
        scale = float(np.ldexp(1.0, exponent))
        w = w / scale
    w = w.astype(_PRECISIONS[precision], copy=False)
    a = w if w.shape[0] <= w.shape[1] else w.T
    gram = a @ a.T
    values = eigh(gram, eigvals_only=True, driver="evr", check_finite=False, overwrite_a=True)
    values = np.sort(values.astype(np.float64)) * scale**2
    top = float(values[-1]) if len(values) else 0.0
    values[values <= noise_floor(len(values), max(top, 0.0), precision)] = 0.0
    return values


def singular_values(weights: np.ndarray) -> np.ndarray:
    """Singular values in float64, descending, values only (no singular vectors)."""
    return np.linalg.svd(as_matrix(weights).astype(np.float64), compute_uv=False)


def svd(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD in float64: ``U [N, k]``, ``s [k]`` descending, ``Vt [k, M]``."""
    return np.linalg.svd(as_matrix(weights).astype(np.float64), full_matrices=False)


def parallel_map(fn: Callable[[Any], T], items: Sequence[Any]) -> list[T | Exception]:
    """``fn`` over ``items`` on one thread per CPU, each LAPACK call single-threaded.

    On these 2-core machines, two single-threaded eigensolvers side by side run about
    three times faster than one after another with a two-threaded BLAS (the
    tridiagonal reduction is memory-bound and scales badly). An item whose call raises
    yields the exception instance, in place.
    """
    from threadpoolctl import threadpool_limits

    def safe(item: Any) -> T | Exception:
        try:
            return fn(item)
        except Exception as exc:  # noqa: BLE001 - returned in place, per item
            return exc

    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        cpus = os.cpu_count() or 1
    workers = min(len(items), cpus)
    if workers <= 1:
        return [safe(item) for item in items]
    with threadpool_limits(limits=1), ThreadPoolExecutor(workers) as pool:
        return list(pool.map(safe, items))
