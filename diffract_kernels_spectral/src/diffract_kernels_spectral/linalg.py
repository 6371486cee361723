"""Spectra of weight matrices: the ESD (values only), singular values, the full SVD.

A parameter of more than two dimensions (a convolution kernel ``[out, in, k...]``) is
reshaped to ``(out, -1)``; 1-D parameters have no spectrum (the kernels skip them).
The ESD of a ``N x M`` matrix ``W`` is the ``k = min(N, M)`` eigenvalues of the smaller
Gram matrix (``W^T W`` or ``W W^T``: their nonzero eigenvalues coincide), ascending.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import numpy as np

from . import _lapack

__all__ = [
    "as_matrix",
    "device_of",
    "esd",
    "host_array",
    "esd_batched_torch",
    "noise_floor",
    "parallel_map",
    "resolve_device",
    "singular_values",
    "svd",
]

T = TypeVar("T")

#: Entries beyond 2**40 (or below 2**-40) are rescaled by a power of two before the Gram
#: product, so float32 products neither overflow nor underflow (exact: powers of two).
_SAFE_EXPONENT = 40

_PRECISIONS = {"float32": np.float32, "float64": np.float64}


_ONE_THREAD_LOCK = threading.Lock()
_one_thread_users = 0
_one_thread_limiter: Any = None


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """BLAS and LAPACK on one thread while any caller is inside (process-wide, nestable,
    thread-safe: the first entrant sets the limit, the last one restores it).

    A float32 Gram product and the eigensolver give different bits with one thread and
    with two (the work is split differently), so every decomposition here runs on one:
    a value must not depend on which path (batched or not, first apply or later)
    computed it. The batch paths keep the cores busy with one solver per core.
    """
    global _one_thread_users, _one_thread_limiter
    with _ONE_THREAD_LOCK:
        if _one_thread_users == 0:
            _one_thread_limiter = _limit_to_one_thread()
        _one_thread_users += 1
    try:
        yield
    finally:
        with _ONE_THREAD_LOCK:
            _one_thread_users -= 1
            if _one_thread_users == 0:
                _one_thread_limiter()
                _one_thread_limiter = None


def _limit_to_one_thread() -> Callable[[], None]:
    """Every BLAS our decompositions use on one thread; returns what restores them.
    Where numpy's bundled OpenBLAS does all of it (:mod:`._lapack`), only its count is
    set; elsewhere threadpoolctl limits every library loaded, scipy's included."""
    bundled = _lapack.library()
    if bundled is not None:
        before = bundled.get_threads()
        bundled.set_threads(1)
        return lambda: bundled.set_threads(before)
    from scipy import linalg as _  # noqa: F401 - load scipy's BLAS before limiting
    from threadpoolctl import ThreadpoolController

    return ThreadpoolController().limit(limits=1).restore_original_limits


def as_matrix(weights: np.ndarray) -> np.ndarray:
    """``weights`` as a 2-D matrix: as is, or ``(shape[0], -1)`` for more dimensions."""
    w = np.asarray(weights)
    if w.ndim < 2:
        raise ValueError(f"a spectrum needs a matrix, got shape {w.shape}")
    return w if w.ndim == 2 else w.reshape(w.shape[0], math.prod(w.shape[1:]))


def noise_floor(k: int, lambda_max: float, precision: str) -> float:
    """Eigenvalues at or below ``k * eps(precision) * lambda_max`` are rounding noise."""
    return k * float(np.finfo(_PRECISIONS[precision]).eps) * lambda_max


#: Bytes of the widest block of a matrix converted at a time for its Gram product.
GRAM_BLOCK_BYTES = 64 << 20


def _gram(w: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The smaller Gram matrix (``W W^T`` or ``W^T W``) in ``dtype``. A matrix whose
    converted copy would exceed GRAM_BLOCK_BYTES is converted block by block along its
    long side and the blocks' products summed: an embedding of 100,352 x 2048 float32
    values would otherwise need a 1.6 GB float64 copy. The blocks depend on the shape
    only, so a matrix always gets the same bits."""
    a = w if w.shape[0] <= w.shape[1] else w.T  # short x long
    short, long = a.shape
    if a.dtype == dtype or short * long * dtype.itemsize <= GRAM_BLOCK_BYTES:
        a = a.astype(dtype, copy=False)
        return a @ a.T
    step = max(1, GRAM_BLOCK_BYTES // (short * dtype.itemsize))
    gram = np.zeros((short, short), dtype=dtype)
    for start in range(0, long, step):
        block = a[:, start:start + step].astype(dtype)
        gram += block @ block.T
    return gram


def esd(weights: np.ndarray, precision: str = "float64", *,
        top: float | None = None) -> np.ndarray:
    """Eigenvalues of the smaller Gram matrix, ascending, float64; noise set to 0.

    ``precision`` is the arithmetic of the Gram product and the eigensolver. float64
    (default): absolute error about ``k * eps64 * lambda_max``, so sums, norms, entropy
    and tails agree with a float64 SVD to about 1e-12 relative. float32 is 1.5-2x
    faster, but its absolute error is about ``k * eps32 * lambda_max``: eigenvalues
    below :func:`noise_floor` (about ``1e-4 lambda_max`` for k = 768) are stored as
    exactly 0 and the relative error of the others is ``~eps32 lambda_max / lambda``
    (on MiniLM, up to 2e-4 on stable_rank and 7e-4 on the entropy). ``top``: the largest
    magnitude of an entry, when the caller has it (taken here otherwise).
    """
    if precision not in _PRECISIONS:
        raise ValueError(f"precision must be one of {sorted(_PRECISIONS)}, got {precision!r}")
    w = as_matrix(weights)
    if top is None:
        top = max(float(w.max()), -float(w.min())) if w.size else 0.0
    if top == 0.0:
        return np.zeros(min(w.shape))
    exponent = int(np.frexp(top)[1])
    scale = 1.0
    if abs(exponent) > _SAFE_EXPONENT:  # rescale exactly by a power of two
        # ldexp in the stored type: 2**128 itself is no float32 (w / 2**128 divided by inf)
        scale = float(np.ldexp(1.0, exponent))
        w = np.ldexp(w, -exponent)
    with one_blas_thread():
        gram = _gram(w, np.dtype(_PRECISIONS[precision]))
        values = _eigvalsh(gram)
    values = np.sort(values.astype(np.float64)) * scale**2
    top = float(values[-1]) if len(values) else 0.0
    values[values <= noise_floor(len(values), max(top, 0.0), precision)] = 0.0
    return values


def _eigvalsh(gram: np.ndarray) -> np.ndarray:
    """All eigenvalues of a Gram matrix by LAPACK's ``?syevr``: numpy's bundled library
    when there is one (no scipy import, the GIL released), else scipy's; same bits."""
    if _lapack.library() is not None:
        return _lapack.eigvalsh(gram)
    from scipy.linalg import eigh

    return eigh(gram, eigvals_only=True, driver="evr", check_finite=False, overwrite_a=True)


def singular_values(weights: np.ndarray) -> np.ndarray:
    """Singular values in float64, descending, values only (no singular vectors)."""
    with one_blas_thread():
        return np.linalg.svd(as_matrix(weights).astype(np.float64), compute_uv=False)


def svd(weights: np.ndarray, top_k: int = 0, seed: int = 0) -> tuple[np.ndarray, ...]:
    """Thin SVD in float64: ``U [N, k]``, ``s [k]`` descending, ``Vt [k, M]``.

    ``top_k`` > 0 keeps the ``top_k`` largest triplets, by :func:`randomized_svd` when
    that is cheaper than the full decomposition (``top_k`` under a fifth of
    ``min(N, M)``), else by truncating the full one.
    """
    w = as_matrix(weights).astype(np.float64)
    k = min(w.shape)
    with one_blas_thread():
        if 0 < top_k < k / 5:
            return randomized_svd(w, top_k, seed=seed)
        u, s, vt = np.linalg.svd(w, full_matrices=False)
    if 0 < top_k < k:
        return u[:, :top_k], s[:top_k], vt[:top_k]
    return u, s, vt


#: Extra sketch columns and power iterations of the randomized SVD (Halko, Martinsson
#: and Tropp 2011, algorithms 4.4 and 5.1). Accuracy depends on the spectrum after the
#: top k, measured for k = 8 of a 300 x 200 matrix: with a gap after the top k, exact
#: to rounding (1e-15); with singular values decaying 5% per direction, 2.5e-6 relative
#: error in the values and 1 - |cos| of 5e-6 for the vectors; with a flat spectrum the
#: top-k subspace is not defined and the vectors are arbitrary (values within 2%): use
#: the full SVD there (tests/alignment/test_alignment.py::TestWeightedAndTopK).
OVERSAMPLE = 10
POWER_ITERATIONS = 6


def randomized_svd(w: np.ndarray, k: int, *, seed: int = 0) -> tuple[np.ndarray, ...]:
    """The ``k`` largest singular triplets of ``w`` by a seeded randomized range finder
    with power iterations (re-orthonormalised by QR each time): ``U [N, k]``, ``s [k]``
    descending, ``Vt [k, M]``. Costs ``O(N M (k + p))`` instead of the full SVD's
    ``O(N M min(N, M))``."""
    w = np.asarray(w, dtype=np.float64)
    p = min(k + OVERSAMPLE, min(w.shape))
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(w @ rng.standard_normal((w.shape[1], p)))
    for _ in range(POWER_ITERATIONS):
        z, _ = np.linalg.qr(w.T @ q)
        q, _ = np.linalg.qr(w @ z)
    ub, s, vt = np.linalg.svd(q.T @ w, full_matrices=False)
    return (q @ ub)[:, :k], s[:k], vt[:k]


def svd_torch(tensor: Any, device: str, top_k: int = 0) -> tuple[np.ndarray, ...]:
    """:func:`svd` with torch on ``device`` (a GPU when the weights are there), float64;
    results come back as numpy (top_k > 0: the full SVD truncated, torch's randomized
    ``svd_lowrank`` being less accurate than ours)."""
    import torch

    t = torch.as_tensor(tensor) if isinstance(tensor, np.ndarray) else tensor.detach()
    if t.dim() < 2:
        raise ValueError(f"an SVD needs a matrix, got shape {tuple(t.shape)}")
    t = t if t.dim() == 2 else t.reshape(t.shape[0], math.prod(t.shape[1:]))
    u, s, vt = torch.linalg.svd(t.to(device=device, dtype=torch.float64), full_matrices=False)
    if 0 < top_k < s.shape[0]:
        u, s, vt = u[:, :top_k], s[:top_k], vt[:top_k]
    return u.cpu().numpy(), s.cpu().numpy(), vt.cpu().numpy()


def _stacks_by_shape(matrices: Sequence[Any], device: str,
                     what: str) -> list[tuple[list[int], Any]]:
    """The matrices (numpy arrays or tensors; higher ranks flattened to ``[rows, -1]``)
    grouped by shape and stacked as float64 tensors on ``device``: ``[(indices, stack)]``.
    ``what`` names the result in the error for a non-matrix."""
    import torch

    mats = []
    for m in matrices:
        t = torch.as_tensor(m) if isinstance(m, np.ndarray) else m.detach()
        if t.dim() < 2:
            raise ValueError(f"{what} needs a matrix, got shape {tuple(t.shape)}")
        mats.append(t if t.dim() == 2 else t.reshape(t.shape[0], math.prod(t.shape[1:])))
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, t in enumerate(mats):
        groups.setdefault(tuple(t.shape), []).append(i)
    return [(idx, torch.stack([mats[i].to(device=device, dtype=torch.float64) for i in idx]))
            for idx in groups.values()]


def svals_batched_torch(matrices: Sequence[Any], device: str = "cuda") -> list[np.ndarray]:
    """:func:`singular_values` of many matrices with torch on ``device`` in float64,
    same shapes stacked into one batched ``torch.linalg.svdvals`` call; descending
    float64 numpy arrays."""
    import torch

    out: list[np.ndarray | None] = [None] * len(matrices)
    for idx, stack in _stacks_by_shape(matrices, device, "an SVD"):
        values = torch.linalg.svdvals(stack).cpu().numpy()
        for i, v in zip(idx, values, strict=True):
            out[i] = v
    return out  # type: ignore[return-value]


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover
        return os.cpu_count() or 1


#: One permit per CPU: calls of ``parallel_map`` that overlap (the runner starts a
#: chunk's batch while the last one's final units run) share the cores, never
#: oversubscribe them (each call's memory stays that of one item per core).
_CORES = threading.BoundedSemaphore(_cpus())
_HOLDS = threading.local()  # whether this thread holds a permit


def parallel_map(fn: Callable[[Any], T], items: Sequence[Any]) -> list[T | Exception]:
    """``fn`` over ``items`` on one thread per CPU, each LAPACK call single-threaded.

    On these 2-core machines, two single-threaded eigensolvers side by side run about
    three times faster than one after another with a two-threaded BLAS (the
    tridiagonal reduction is memory-bound and scales badly). An item whose call raises
    yields the exception instance, in place. Across concurrent calls at most one item
    per CPU runs at a time (see ``_CORES``).
    """
    def safe(item: Any) -> T | Exception:
        held = getattr(_HOLDS, "held", False)
        if not held:
            _CORES.acquire()
            _HOLDS.held = True
        try:
            return fn(item)
        except Exception as exc:  # noqa: BLE001 - returned in place, per item
            return exc
        finally:
            if not held:
                _HOLDS.held = False
                _CORES.release()

    # called from an item (it holds a core): its items run here, on that core
    workers = 1 if getattr(_HOLDS, "held", False) else min(len(items), _cpus())
    if workers <= 1:
        return [safe(item) for item in items]
    from diffract.plugins import one_openmp_thread

    with one_blas_thread(), ThreadPoolExecutor(workers, initializer=one_openmp_thread) as pool:
        return list(pool.map(safe, items))


def device_of(tensor: Any) -> str | None:
    """The CUDA device a torch tensor lives on, or None (numpy arrays, CPU tensors)."""
    dev = getattr(tensor, "device", None)
    return str(dev) if dev is not None and getattr(dev, "type", None) == "cuda" else None


def host_array(tensor: Any) -> np.ndarray:
    """A numpy view or copy of ``tensor`` (torch half types as float32)."""
    if isinstance(tensor, np.ndarray):
        return tensor
    t = tensor.detach()
    if t.dtype.is_floating_point and t.element_size() < 4:
        t = t.float()
    return t.cpu().numpy()


def resolve_device(device: str, tensor: Any = None) -> str:
    """``"auto"``: the GPU ``tensor`` is on, else ``"cpu"``; anything else as given."""
    if device != "auto":
        return device
    return device_of(tensor) or "cpu"


def esd_batched_torch(
    matrices: Sequence[Any], precision: str = "float64", device: str = "cuda"
) -> list[np.ndarray]:
    """:func:`esd` of many matrices (torch tensors or numpy arrays) with torch on
    ``device``, same shapes in one batched call.

    Matrices are grouped by shape; each group is stacked on the device (tensors already
    there are not copied through the host), scaled per matrix by a power of two when its
    entries are extreme (as :func:`esd` does), multiplied into Gram matrices and handed
    to one batched ``torch.linalg.eigvalsh``. Results come back as float64 numpy arrays
    with the same noise floor as :func:`esd`.
    """
    import torch

    dtype = {"float32": torch.float32, "float64": torch.float64}[precision]
    out: list[np.ndarray | None] = [None] * len(matrices)
    for idx, batch in _stacks_by_shape(matrices, device, "a spectrum"):
        shape = tuple(batch.shape[1:])
        top = batch.abs().amax(dim=(1, 2)).to(torch.float64)
        exponent = torch.frexp(top.clamp_min(torch.finfo(torch.float64).tiny))[1]
        one = torch.ones_like(top)
        # the scale in float64: 2**128 is no float32, and a float32 division by it is 0
        scale = torch.where(exponent.abs() > _SAFE_EXPONENT, torch.ldexp(one, exponent), one)
        if bool((scale != 1).any()):
            a = (batch.to(torch.float64) / scale[:, None, None]).to(dtype)
        else:
            a = batch.to(dtype)
        if shape[0] > shape[1]:
            a = a.transpose(1, 2)
        values = torch.linalg.eigvalsh(a @ a.transpose(1, 2)).to(torch.float64)
        values = values * (scale**2)[:, None]
        values = values.sort(dim=1).values.cpu().numpy()
        empty = (top == 0).cpu().numpy()
        for row, i, zero in zip(values, idx, empty, strict=True):
            row = np.zeros_like(row) if zero else row.copy()
            lam_max = max(float(row[-1]), 0.0) if row.size else 0.0
            row[row <= noise_floor(len(row), lam_max, precision)] = 0.0
            out[i] = row
    return out  # type: ignore[return-value]
