"""The spectral kernels. Each docstring's first lines hold the field's formula.

Notation: ``W`` is the parameter as a ``N x M`` matrix (more than two dimensions are
reshaped to ``(shape[0], -1)``), ``k = min(N, M)``, ``sigma_i`` its singular values and
``lambda_i = sigma_i^2`` the ESD (eigenvalues of ``W^T W``), ``lambda_max`` the largest.
1-D parameters are skipped (a restriction, with its reason). When a value is undefined
for an input (NaN or Inf weights, an all-zero matrix, too few eigenvalues for a fit)
the field is NaN and the reason is recorded for that parameter.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Annotated, Any, Literal

import numpy as np

from diffract import (
    FieldUndefined,
    KernelExecutionProtocol,
    Range,
    Restriction,
    kernel,
)
from diffract_kernels_spectral import linalg
from diffract_kernels_spectral.errors import FitError

__all__ = ["ALL"]

def _not_a_stack(info: Any) -> bool:
    """Whether a parameter has a matrix view: a stack of matrices (a tensor of three or
    more axes not typed conv: packed MoE experts ``[E, out, in]``, llama.cpp's
    ``ffn_*_exps``) has none (as one matrix it would be ``W.reshape(E, -1)``, whose E
    singular values describe nothing of its experts)."""
    return len(info.shape) < 3 or info.ptype == "conv"


_MATRIX = [Restriction.min_ndim(2), Restriction(
    _not_a_stack, "a stack of matrices (packed experts [E, out, in]) has no spectrum of its "
                  "own; each expert is analysed as a view: views=['experts'] (the command "
                  "line's default for such tensors), whose summary the table shows")]
_ONE_GPU_BATCH = threading.Lock()

#: Decompositions and fits are PARALLEL: on an executor (a process pool, a Dask
#: cluster) once a step's work is worth one, in this process (their batch paths use one
#: thread per core) otherwise. The cheap kernels that read their results stay
#: SEQUENTIAL: shipping an ESD to a worker costs more than computing a norm. The
#: decompositions' batches are thread-safe (``overlap_batches``: two chunks' batches share
#: ``linalg.parallel_map``'s cores; one GPU batch at a time); the fits' are not (Taichi).
PARALLEL = KernelExecutionProtocol.PARALLEL

#: The configuration domains the kernels share (checked by configure_kernel).
FitMethod = Literal["auto", "diffract", "powerlaw", "small_sample", "weightwatcher"]
MinTail = Annotated[int, Range(ge=2)]
TailStart = Literal["pl_xmin", "own"]


def _nonempty(shape: tuple[int, ...]) -> None:
    if math.prod(shape) == 0:
        raise FieldUndefined(f"the matrix has no elements (shape {tuple(shape)})")


def _finite_matrix(weights: np.ndarray) -> np.ndarray:
    return _finite_with_top(weights)[0]


def _finite_with_top(weights: np.ndarray) -> tuple[np.ndarray, float]:
    """The matrix after the NaN/Inf check, and its largest magnitude (linalg.esd's
    ``top``: the two reductions are not taken twice over a large matrix)."""
    w = linalg.as_matrix(weights)
    _nonempty(w.shape)
    # min and max are NaN or infinite exactly when some entry is: two cheap reductions,
    # no temporary array (the full count is taken only when there is something to count)
    low, high = float(w.min()), float(w.max())
    if not (math.isfinite(low) and math.isfinite(high)):
        raise FieldUndefined(f"weights contain {int((~np.isfinite(w)).sum())} NaN or Inf value(s)")
    return w, max(high, -low)


def _finite_tensor(tensor: Any) -> Any:
    """``tensor`` (torch or numpy) after the NaN/Inf check, computed where it lives."""
    if isinstance(tensor, np.ndarray):
        return _finite_matrix(tensor)
    import torch

    _nonempty(tuple(tensor.shape))
    bad = int((~torch.isfinite(tensor)).sum())
    if bad:
        raise FieldUndefined(f"weights contain {bad} NaN or Inf value(s)")
    return tensor


def _positive(esd: np.ndarray, what: str) -> np.ndarray:
    values = np.asarray(esd)
    if values.size == 0 or float(values[-1]) <= 0.0:
        raise FieldUndefined(f"{what} is undefined for an all-zero matrix (every eigenvalue is 0)")
    return values


def _positive_part(esd: np.ndarray) -> np.ndarray:
    values = np.asarray(esd)
    return values[values > 0]


def _fit_call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Run a fitting function; undefined fits become FieldUndefined with the reason.

    FitArgumentError (a bad configuration) and FitUnavailableError (fit_method=
    "diffract" without taichi) are not properties of the data: they propagate as a
    failure of the unit, retried once the cause is fixed.
    """
    try:
        return fn(*args, **kwargs)
    except FitError as exc:
        raise FieldUndefined(str(exc)) from None


# -- decompositions ---------------------------------------------------------------------
def _svd_batch(units: list[dict[str, Any]], **config: Any) -> list[Any]:
    return linalg.parallel_map(lambda u: svd(u["tensor"], **config), units)


def _esd_batch(
    units: list[dict[str, Any]], *, precision: str = "float64", device: str = "auto",
    conv: str = "matrix",
) -> list[Any]:
    positions = [i for i, u in enumerate(units)
                 if conv == "weightwatcher" and np.ndim(u["tensor"]) == 4]
    out = _raw_esd_batch([u for i, u in enumerate(units) if i not in positions], precision,
                         device)
    for i in positions:  # a convolution per kernel position: not one batched matrix
        try:
            out.insert(i, esd(units[i]["tensor"], 1.0, precision=precision, device="cpu",
                              conv=conv))
        except Exception as exc:  # noqa: BLE001 - in place, as invoke_batch wants
            out.insert(i, exc)
    return [v if isinstance(v, BaseException) else _scaled(v, u["esd_scale"])
            for v, u in zip(out, units, strict=True)]


def _scaled(values: np.ndarray, scale: float) -> np.ndarray:
    return values if scale == 1.0 else values * scale


def _by_device(
    units: list[dict[str, Any]],
    device: str,
    on_host: Callable[[Any], Any],
    on_gpu: Callable[[list[Any], str], list[Any]],
) -> list[Any]:
    """One result per unit: ``on_host(tensor)`` for units whose weights resolve to the
    CPU (one solver per core), ``on_gpu(tensors, device)`` once per GPU for the rest
    (same shapes batched there); an exception instance stands for a unit that raised."""
    out: list[Any] = [None] * len(units)
    host, gpu = [], {}
    for i, u in enumerate(units):
        where = linalg.resolve_device(device, u["tensor"])
        (host.append(i) if where == "cpu" else gpu.setdefault(where, []).append(i))
    for i, v in zip(host, linalg.parallel_map(lambda i: on_host(units[i]["tensor"]), host),
                    strict=True):
        out[i] = v
    for where, idx in gpu.items():
        good = []
        for i in idx:
            try:
                good.append((i, _finite_tensor(units[i]["tensor"])))
            except FieldUndefined as exc:
                out[i] = exc
        with _ONE_GPU_BATCH:  # two chunks' batches at once: one on the GPU at a time
            for (i, _), v in zip(good, on_gpu([t for _, t in good], where), strict=True):
                out[i] = v
    return out


def _raw_esd_batch(units: list[dict[str, Any]], precision: str, device: str) -> list[Any]:
    return _by_device(
        units, device, lambda t: esd(t, 1.0, precision=precision, device="cpu"),
        lambda tensors, where: linalg.esd_batched_torch(tensors, precision, where))


def _svals_batch(units: list[dict[str, Any]], *, device: str = "auto",
                 conv: str = "matrix") -> list[Any]:
    if conv == "weightwatcher" and any(np.ndim(u["tensor"]) == 4 for u in units):
        return linalg.parallel_map(lambda u: _or_error(svals, u["tensor"], conv=conv), units)
    return _by_device(units, device, lambda t: svals(t, device="cpu"),
                      linalg.svals_batched_torch)


def _or_error(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - in place, as invoke_batch wants
        return exc


def _positions(tensor: Any) -> list[np.ndarray]:
    """A convolution's kernel-position matrices ``W[:, :, i, j]`` scaled by ``sqrt(1/2)``,
    as WeightWatcher 0.7.7 reads it (``conv="weightwatcher"``)."""
    w = np.asarray(linalg.host_array(tensor), dtype=np.float64) * math.sqrt(0.5)
    return [_finite_matrix(w[:, :, i, j]) for i in range(w.shape[2])
            for j in range(w.shape[3])]


@kernel(
    produce_fields=("weights_lsvs", "weights_svals", "weights_rsvs"),
    restrictions=_MATRIX,
    batch=lambda units, **cfg: _svd_batch(units, **cfg),
    execution_protocol=PARALLEL, overlap_batches=True,
)
def svd(
    tensor: Any,
    *,
    top_k: Annotated[int, Range(ge=0)] = 0,
    device: str = "auto",
    seed: Annotated[int, Range(ge=0)] = 0,
    vectors: Literal["float64", "float32", "float16"] = "float64",
    vector_share: Annotated[float, Range(gt=0.0, le=1.0)] = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Thin SVD ``W = U diag(sigma) V^T`` in float64: ``weights_lsvs = U [N, k]``,
    ``weights_svals = sigma [k]`` (descending), ``weights_rsvs = V^T [k, M]``.

    Directions are ordered by decreasing singular value (as LAPACK, torch and
    WeightWatcher return them; the original Diffract stored them ascending), so the top
    ``k`` directions are the first ``k``. ``top_k`` = 0 keeps all ``k = min(N, M)``;
    ``top_k`` > 0 keeps the largest ``top_k``, computed by a seeded randomized SVD with
    6 power iterations when ``top_k < k / 5`` (exact to rounding when the spectrum has a
    gap after the top ``top_k``; about 1e-6 relative when it decays by 5% per direction;
    unreliable vectors for a flat spectrum), else by truncating the full SVD.
    ``device``: "auto" runs where the weights are (torch on a GPU); "cpu" or a torch
    device forces it. ``vectors`` "float32" keeps U and V^T rounded to float32 (computed
    in float64; half the bytes): the alignment fields computed from them move by about
    float32's epsilon at most (8e-9 measured on small layers, 1.2e-10 on GPT-2-small's),
    and every path rounds the same way. "float16" rounds them to float16 (a quarter of
    the bytes; the subspace overlap moved by 7.1e-7 at most on GPT-2-small and OLMo-2-1B
    shapes, 900x less than bfloat16's rounding of the weights moves it:
    ``benchmarks/bench_alignment.py --precision``).
    ``diffract track`` keeps its vectors in float16 for a run of 16-bit checkpoints and in
    float32 otherwise. The singular values are float64 always.
    ``vector_share`` < 1 keeps the vectors of the top ``ceil(vector_share * k)``
    directions only (U ``[N, ceil(share k)]``, V^T ``[ceil(share k), M]``; every singular
    value stays): ``diffract track`` keeps the top tenth, what its alignment fields read.
    """
    where = linalg.resolve_device(device, tensor)
    if where != "cpu":
        u, s, vt = linalg.svd_torch(_finite_tensor(tensor), where, top_k)
    else:
        u, s, vt = linalg.svd(_finite_matrix(linalg.host_array(tensor)), top_k, seed)
    if vector_share < 1.0:
        kept = math.ceil(vector_share * len(s))
        u, vt = np.ascontiguousarray(u[:, :kept]), vt[:kept].copy()  # not views of all
    if vectors != "float64":
        return u.astype(vectors), s, vt.astype(vectors)
    return u, s, vt


@kernel(restrictions=_MATRIX, batch=lambda units, **cfg: _esd_batch(units, **cfg),
        execution_protocol=PARALLEL, overlap_batches=True)
def esd(
    tensor: Any,
    esd_scale: float,
    *,
    precision: Literal["float32", "float64"] = "float64",
    device: str = "auto",
    conv: Literal["matrix", "weightwatcher"] = "matrix",
) -> np.ndarray:
    """Empirical spectral density ``lambda_i = c sigma_i^2``: eigenvalues of ``c W^T W``
    (``c = esd_scale``, 1 unless the conventions normalise), ascending ``[k]``.

    A convolution ``[out, in, kh, kw]`` is the matrix ``[out, in kh kw]`` by default
    (``conv="matrix"``); ``conv="weightwatcher"`` (its preset) reads it as WeightWatcher
    0.7.7 does: the ``kh kw`` kernel-position matrices ``W[:, :, i, j]`` (``[out, in]``),
    their eigenvalues pooled (``kh kw min(out, in)`` of them), each matrix scaled by
    ``sqrt(1/2)`` as its ``conv2d_norm`` does (``lambda_i = c sigma_i^2 / 2``).

    Values only (no singular vectors). ``precision`` float64 (default: every field
    derived from the spectrum within 1e-6 relative of a float64 SVD's, its smallest
    eigenvalues included) or float32 (opt-in, about 1.5-2x faster; its error on small
    eigenvalues reaches 1e-4 relative on stable_rank, see docs/spectral.md).
    Eigenvalues below ``k * eps * lambda_max`` are stored as 0.
    ``device``: "auto" computes where the weights are: same-shaped matrices on a GPU go
    through one batched torch call there (no copy through the host); on the CPU, one
    single-threaded LAPACK solver per core. "cpu" or a torch device ("cuda", "cuda:1")
    forces the choice.
    """
    if conv == "weightwatcher" and np.ndim(tensor) == 4:
        weights = np.asarray(linalg.host_array(tensor), dtype=np.float64)
        pooled = [esd(weights[:, :, i, j], 0.5, precision=precision, device="cpu")
                  for i in range(weights.shape[2]) for j in range(weights.shape[3])]
        return _scaled(np.sort(np.concatenate(pooled)), esd_scale)
    where = linalg.resolve_device(device, tensor)
    if where != "cpu":
        values = linalg.esd_batched_torch([_finite_tensor(tensor)], precision, where)[0]
    else:
        w, top = _finite_with_top(linalg.host_array(tensor))
        values = linalg.esd(w, precision, top=top)
    return _scaled(values, esd_scale)


@kernel(restrictions=_MATRIX)
def esd_scale(
    shape: tuple[int, ...], *, normalize: Literal["none", "greater_dim"] = "none"
) -> float:
    """``c``, the factor of every ESD: ``lambda_i = c sigma_i^2``. ``normalize="none"``
    (default, as WeightWatcher): ``c = 1``; ``"greater_dim"`` (the original Diffract):
    ``c = 1 / max(N, M)``, so the ESD of a matrix of unit-variance entries has the
    Marchenko-Pastur support ``[(1 - 1/sqrt(Q))^2, (1 + 1/sqrt(Q))^2]`` whatever its
    size. Fits' exponents, ratios and counts do not depend on ``c``; xmins, norms read
    from the ESD and the random-matrix edges scale with it."""
    if normalize == "greater_dim":
        return 1.0 / max(_dims(shape))
    return 1.0


def _dims(shape: tuple[int, ...]) -> tuple[int, int]:
    """``(N, M)`` of the matrix view ``(shape[0], prod(shape[1:]))``."""
    return int(shape[0]), int(math.prod(shape[1:]))


Conv = Literal["matrix", "weightwatcher"]


def view(shape: tuple[int, ...], conv: str = "matrix") -> tuple[int, int, int]:
    """``(rows, cols, matrices)`` a parameter is read as: its matrix view, or under
    ``conv="weightwatcher"`` a convolution's ``kh kw`` kernel-position matrices ``[out,
    in]`` (WeightWatcher 0.7.7's N and M are those matrices')."""
    if conv == "weightwatcher" and len(shape) == 4:
        return int(shape[0]), int(shape[1]), int(shape[2]) * int(shape[3])
    return (*_dims(shape), 1)


@kernel(restrictions=_MATRIX, batch=lambda units, **cfg: _svals_batch(units, **cfg),
        execution_protocol=PARALLEL, overlap_batches=True)
def svals(tensor: Any, *, device: str = "auto", conv: Conv = "matrix") -> np.ndarray:
    """Singular values ``sigma_i`` in float64, descending ``[k]``, values only
    (accurate to ``eps64 * sigma_max``: what rank decisions need). ``device``: "auto"
    computes where the weights are (same-shaped matrices on a GPU in one batched torch
    call), "cpu" or a torch device forces it. ``conv="weightwatcher"`` (its preset): a
    convolution's are its kernel-position matrices' pooled, each scaled by ``sqrt(1/2)``
    as ``esd`` reads it (``sigma_i^2`` are then the ESD's eigenvalues)."""
    if conv == "weightwatcher" and np.ndim(tensor) == 4:
        pooled = [linalg.singular_values(m) for m in _positions(tensor)]
        return np.sort(np.concatenate(pooled))[::-1].copy()
    where = linalg.resolve_device(device, tensor)
    if where != "cpu":
        return linalg.svals_batched_torch([_finite_tensor(tensor)], where)[0]
    return linalg.singular_values(_finite_matrix(linalg.host_array(tensor)))


# -- norms and ranks ----------------------------------------------------------------------
@kernel
def spectral_norm(esd: np.ndarray) -> float:
    """``lambda_max = sigma_max^2``, the squared spectral norm (WeightWatcher's convention)."""
    values = np.asarray(esd)
    if values.size == 0:
        raise FieldUndefined("spectral_norm is undefined for an empty spectrum")
    return float(values[-1])


@kernel
def log_spectral_norm(esd: np.ndarray) -> float:
    """``log10(lambda_max)``."""
    return float(math.log10(_positive(esd, "log_spectral_norm")[-1]))


@kernel
def stable_rank(esd: np.ndarray) -> float:
    """``sum_i lambda_i / lambda_max = ||W||_F^2 / ||W||_2^2``."""
    values = _positive(esd, "stable_rank")
    return float(np.sum(values) / values[-1])


@kernel(aliases={"norm": "squared_frob_norm"})
def squared_frob_norm(esd: np.ndarray) -> float:
    """``sum_i lambda_i = ||W||_F^2``: WeightWatcher's ``norm`` (the square of our
    ``frob_norm``, hence its own name)."""
    return float(np.sum(_positive_part(esd)))


@kernel
def log_norm(esd: np.ndarray) -> float:
    """``log10(sum_i lambda_i) = log10(||W||_F^2)``."""
    return float(math.log10(np.sum(_positive(esd, "log_norm"))))


@kernel
def hard_rank(svals: np.ndarray, *, rtol: Annotated[float, Range(ge=0.0, lt=1.0)] = 1e-5) -> int:
    """``#{i : sigma_i > rtol * sigma_max}``: singular values above ``rtol`` relative to
    the largest (float64 singular values; 0 for an all-zero matrix)."""
    s = np.asarray(svals)
    if s.size == 0 or s[0] <= 0:
        return 0
    return int(np.sum(s > rtol * s[0]))


@kernel(aliases={"entropy": "matrix_entropy"})
def matrix_entropy(esd: np.ndarray) -> float:
    """Normalised spectral entropy ``-sum_i p_i ln p_i / ln k`` with ``p_i = lambda_i /
    sum_j lambda_j`` (1 for a flat spectrum, 0 for rank one; 0 ln 0 = 0)."""
    values = _positive(esd, "matrix_entropy")
    if len(values) < 2:
        raise FieldUndefined("matrix_entropy needs at least two eigenvalues")
    p = values / np.sum(values)
    p = p[p > 0]
    return float(-np.sum(p * np.log(p)) / math.log(len(values)))


@kernel(produce_fields=("mp_bulk_max", "mp_softrank", "num_spikes"))
def marchenko_pastur(esd: np.ndarray, shape: tuple[int, ...], *,
                     bulk: Literal["frobenius", "fitted"] = "frobenius",
                     conv: Conv = "matrix") -> tuple[float, float, int]:
    """Marchenko-Pastur bulk edge ``lambda_+`` and what lies beyond it.

    ``bulk="frobenius"`` (default): the edge of a random matrix of the same size and
    scale, ``mp_bulk_max = lambda_+ = (sum_i lambda_i / k) (1 + sqrt(k / L))^2`` with
    ``L = max(N, M)`` (``s^2 = ||W||_F^2 / (N M)`` estimates the entry variance, so
    ``lambda_+ = L s^2 (1 + sqrt(k / L))^2``); ``mp_softrank = lambda_+ / lambda_max``;
    ``num_spikes = #{i : lambda_i > lambda_+}``, eigenvalues outside the random bulk.

    ``bulk="fitted"`` (set by the weightwatcher preset: WeightWatcher's ``mp_fit=True``):
    the bulk's scale is fitted instead (:func:`fit_mp_sigma`: the ESD rescaled to mean
    1, its linear-kernel density estimate matched to the MP density of ``sigma``), so
    ``lambda_+ = sigma^2 (1 + 1 / sqrt(Q))^2`` in those units (``Q = L / k``), and the
    spikes are counted beyond ``lambda_+ + sqrt(Q^(-1/2) lambda_+^(2/3) k^(-2/3))``, the
    Tracy-Widom allowance WeightWatcher adds. ``mp_bulk_max`` is in the ESD's units.
    ``conv="weightwatcher"`` (its preset): a convolution's ``N`` and ``M`` are its
    kernel-position matrices' (the ESD pools them), as WeightWatcher 0.7.7's.
    """
    values = _positive(esd, "marchenko_pastur")
    n, m, _ = view(shape, conv)  # a convolution's kernel positions: their N and M
    k, big = min(n, m), max(n, m)
    if bulk == "fitted":
        mean = float(np.sum(values)) / len(values)
        scaled = values / mean
        q = big / k
        sigma = fit_mp_sigma(scaled, q)
        edge = (sigma * (1.0 + 1.0 / math.sqrt(q))) ** 2
        allowance = math.sqrt(edge ** (2.0 / 3.0) * k ** (-2.0 / 3.0) / math.sqrt(q))
        return (edge * mean, edge / float(scaled.max()),
                int(np.sum(scaled > edge + allowance)))
    edge = float(np.sum(values) / len(esd) * (1.0 + math.sqrt(k / big)) ** 2)
    return edge, edge / float(values[-1]), int(np.sum(values > edge))


def _density(points: np.ndarray, grid: np.ndarray, bandwidth: float) -> np.ndarray:
    """Linear-kernel density estimate of ``points`` on ``grid`` (triangles of half-width
    ``bandwidth``, each of area ``1 / len(points)``), in blocks of the grid."""
    out = np.empty(len(grid))
    for lo in range(0, len(grid), 256):
        g = grid[lo:lo + 256, None]
        out[lo:lo + 256] = np.clip(1.0 - np.abs(g - points[None, :]) / bandwidth, 0.0,
                                   None).sum(axis=1)
    return out / (len(points) * bandwidth)


def fit_mp_sigma(scaled: np.ndarray, q: float, bandwidth: float = 0.1) -> float:
    """The Marchenko-Pastur scale that best matches an ESD rescaled to mean 1, as
    WeightWatcher's ``mp_fit`` finds it: a linear-kernel density estimate (bandwidth 0.1)
    on 1000 points from 0 to ``max + 0.5`` (of the singular values when ``Q`` = 1, of the
    eigenvalues otherwise), where it exceeds 0.01; the squared distance to the MP density
    of ``sigma`` (the quarter circle when ``Q`` = 1) there, with a penalty where the
    fitted bulk cannot be the data's (its upper edge below the estimate's peak or past
    the grid, its lower edge above the peak); minimised over a grid of ``sigma`` from
    0.05 to 2 times ``sqrt(lambda_max) / (1 + 1 / sqrt(Q))`` in steps of 0.01 times
    that, then polished by Nelder-Mead (``scipy.optimize.brute``'s default finish)."""
    from scipy import optimize

    data = np.sqrt(scaled) if q == 1.0 else scaled
    grid = np.linspace(0.0, float(np.max(data)) + 0.5, 1000)
    density = _density(data, grid, bandwidth)
    keep = density > 0.01
    x, y = grid[keep], density[keep]
    peak = x[np.argmax(y)]

    def misfit(params: np.ndarray) -> float:
        sigma = float(np.ravel(params)[0])
        with np.errstate(divide="ignore", invalid="ignore"):
            if q == 1.0:
                model = np.nan_to_num(np.sqrt(4.0 - x**2) / (np.pi * sigma * sigma))
            else:
                top = (sigma * (1.0 + math.sqrt(1.0 / q))) ** 2
                low = (sigma * (1.0 - math.sqrt(1.0 / q))) ** 2
                if top < peak or top > x.max() or low > peak:
                    return float(len(y)) * 1.0e6
                model = np.nan_to_num(np.sqrt((top - x) * (x - low))
                                      / (2.0 * np.pi * sigma * sigma * x / q))
        return float(np.sum((model - y) ** 2))

    scale = math.sqrt(float(np.max(scaled)) / (1.0 + 1.0 / math.sqrt(q)) ** 2)
    best = optimize.brute(misfit, (slice(0.05 * scale, 2.0 * scale, 0.01 * scale),))
    return float(np.ravel(best)[0])


# -- sizes, singular values, spectrum ends ------------------------------------------------
@kernel(restrictions=_MATRIX, aliases={"N": "greater_dim"})
def greater_dim(shape: tuple[int, ...], *, conv: Conv = "matrix") -> int:
    """``N = max(rows, cols)`` of the matrix view (reads no weights); under
    ``conv="weightwatcher"`` a convolution's ``max(out, in)``, its kernel-position
    matrices'."""
    return max(view(shape, conv)[:2])


@kernel(restrictions=_MATRIX, aliases={"M": "lower_dim"})
def lower_dim(shape: tuple[int, ...], *, conv: Conv = "matrix") -> int:
    """``M = k = min(rows, cols)`` of the matrix view (reads no weights); under
    ``conv="weightwatcher"`` a convolution's ``min(out, in)``."""
    return min(view(shape, conv)[:2])


@kernel(restrictions=_MATRIX)
def num_evals(shape: tuple[int, ...], *, conv: Conv = "matrix") -> int:
    """How many eigenvalues the ESD has: ``M``, or under ``conv="weightwatcher"`` a
    convolution's ``kh kw min(out, in)``, its kernel positions' pooled (reads no
    weights)."""
    rows, cols, matrices = view(shape, conv)
    return matrices * min(rows, cols)


@kernel(aliases={"Q": "aspect_ratio"})
def aspect_ratio(greater_dim: int, lower_dim: int) -> float:
    """``Q = N / M >= 1``."""
    if lower_dim <= 0:
        raise FieldUndefined("aspect_ratio is undefined for a matrix with no columns")
    return greater_dim / lower_dim


@kernel(restrictions=_MATRIX)
def weights_std(weights: np.ndarray) -> float:
    """``std(W)``: standard deviation of the entries (population, float64)."""
    w = _finite_matrix(weights)
    return float(np.std(w, dtype=np.float64))


def _ends(values: np.ndarray, what: str) -> tuple[float, float]:
    """``(first, last)`` of a non-empty spectrum."""
    v = np.asarray(values)
    if v.size == 0:
        raise FieldUndefined(f"the {what} is empty")
    return float(v[0]), float(v[-1])


@kernel(produce_fields=("max_weights_sval", "min_weights_sval"),
        aliases={"l2_norm": "max_weights_sval", "sv_max": "max_weights_sval",
                 "sv_min": "min_weights_sval"})
def sval_extremes(svals: np.ndarray) -> tuple[float, float]:
    """``max_weights_sval = sigma_max`` (alias ``l2_norm``: the spectral norm ``||W||_2``,
    not squared; ``spectral_norm`` is ``sigma_max^2 c``), ``min_weights_sval =
    sigma_min`` (float64)."""
    return _ends(svals, "set of singular values")


@kernel
def nuclear_norm(svals: np.ndarray) -> float:
    """``||W||_* = sum_i sigma_i``, the Schatten-1 norm."""
    return float(np.sum(np.asarray(svals, dtype=np.float64)))


@kernel
def effective_rank(svals: np.ndarray) -> float:
    """Entropy effective rank ``exp(-sum_i p_i ln p_i)`` with ``p_i = sigma_i / sum_j
    sigma_j`` (Roy and Vetterli; ``0 ln 0 = 0``): ``k`` for a flat spectrum, 1 for rank
    one."""
    s = np.asarray(svals, dtype=np.float64)
    total = float(np.sum(s))
    if not total > 0:
        raise FieldUndefined("effective_rank is undefined for an all-zero matrix")
    p = s[s > 0] / total
    return float(math.exp(-np.sum(p * np.log(p))))


@kernel(produce_fields=("esd_max", "esd_min"), aliases={"lambda_max": "esd_max"})
def esd_extremes(esd: np.ndarray) -> tuple[float, float]:
    """``esd_max = lambda_max``, ``esd_min = lambda_min`` (eigenvalues below the ESD's
    noise floor, ``k eps lambda_max``, are 0 in ``esd``, so ``esd_min`` is 0 for a
    matrix that is rank deficient to rounding)."""
    low, high = _ends(esd, "spectrum")
    return high, low


ALL = (
    svd, esd, esd_scale, svals, spectral_norm, log_spectral_norm, stable_rank, log_norm,
    hard_rank, matrix_entropy, marchenko_pastur, squared_frob_norm, greater_dim, lower_dim,
    num_evals, aspect_ratio, weights_std, sval_extremes, nuclear_norm, effective_rank,
    esd_extremes,
)
