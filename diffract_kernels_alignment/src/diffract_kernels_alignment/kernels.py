"""Alignment kernels: how a layer's singular directions move from model a to model b.

Every kernel is CROSS_MODEL and binary: it runs once per parameter name shared by the
two models in scope (``session.filter(model_ids=[a, b])``), reading the SVD fields of
both (``weights_lsvs = U [N, k]``, ``weights_svals``, ``weights_rsvs = V^T [k, M]``, from
diffractml-kernels-spectral), and stores ``field@models[a,b]@params[p]``. A parameter
missing from one model or shaped differently is skipped with the reason.

Order of directions. Singular vectors are ordered by *decreasing* singular value
(``U[:, 0]`` is the top direction): that is how LAPACK, torch and WeightWatcher return
them, and it makes "the top k directions" the first k. The original Diffract sorted
them ascending; every mean over all directions (``avg_l_agreement`` ...) is the same
either way, and the per-direction arrays are its arrays reversed.

Degenerate singular values. When singular values (nearly) coincide, the individual
vectors inside that group are not unique: any rotation within the group is an equally
valid SVD. Per-direction metrics (the diagonal agreement, best matches) can then be low
although the layer did not change; the subspace metrics (``l_subspace_overlap``,
``l_principal_angles``) are invariant to such rotations and are the ones to summarise
with.
"""

from __future__ import annotations

import math
from typing import Annotated, Any

import numpy as np

from diffract import FieldUndefined, KernelApplyLevel, Range, kernel

__all__ = ["ALL"]

CROSS = KernelApplyLevel.CROSS_MODEL
SPECTRAL = "diffractml-kernels-spectral"
_HINTS = {"weights_lsvs": SPECTRAL, "weights_svals": SPECTRAL, "weights_rsvs": SPECTRAL}

TopK = Annotated[int, Range(ge=0)]


def _count(available: int, k: int) -> int:
    """The number of directions used: ``k`` when set (> 0), else all available."""
    return min(available, k) if k > 0 else available


def _left(pair: tuple[np.ndarray, np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The first k left singular vectors of a and b, as columns ``[N, k]``."""
    ua, ub = (np.asarray(x, dtype=np.float64) for x in pair)
    n = _count(min(ua.shape[1], ub.shape[1]), k)
    return ua[:, :n], ub[:, :n]


def _right(pair: tuple[np.ndarray, np.ndarray], k: int) -> tuple[np.ndarray, np.ndarray]:
    """The first k right singular vectors of a and b, as columns ``[M, k]`` (stored
    as the rows of ``V^T``)."""
    va, vb = (np.asarray(x, dtype=np.float64) for x in pair)
    n = _count(min(va.shape[0], vb.shape[0]), k)
    return va[:n].T, vb[:n].T


def _directions(vectors: int | None, svals: tuple, shape: tuple, k: int, fields: str,
                kernel: str) -> int:
    """The directions a field over ``k`` directions (all ``min(N, M)``: ``k`` = 0) reads:
    refused when the SVD computed fewer (``svd.top_k``: the top 8 are another field than
    all 200 under one name) or kept the vectors of fewer (``svd.vector_share`` < 1, as
    ``diffract track``; ``vectors`` None: no vectors are read)."""
    directions = _matrix_directions(shape)
    n = min(directions, k) if k > 0 else directions
    _computed(n, directions, svals, fields, kernel,
              "0 (every direction)" if k == 0 else str(n))
    if vectors is not None and n > vectors:
        raise FieldUndefined(
            f"{fields} read the vectors of {'all ' if k == 0 else 'the top '}{n} of "
            f"{directions} directions, and the SVD kept those of {vectors} (svd "
            "vector_share < 1, as diffract track keeps the top tenth): set "
            "svd.vector_share=1, or read the top-tenth forms (avg_max_l_agreement_top, "
            "l_subspace_overlap)")
    return n


def _matrix_directions(shape: tuple) -> int:
    """``min(N, M)`` of the pair's matrices, in the ``[shape[0], prod(shape[1:])]`` view
    the SVD reads (CROSS kernels receive the ``shape`` field as a pair)."""
    return min(min(s[0], math.prod(s[1:])) for s in shape)


def _computed(n: int, directions: int, svals: tuple, fields: str, kernel: str,
              top_k: str) -> None:
    """Refuses ``n`` directions when the SVD computed fewer (``svd.top_k``)."""
    computed = min(len(svals[0]), len(svals[1]))
    if n > computed:
        which = (f"all {n} directions" if n == directions else
                 f"the top {n} of {directions} directions")
        raise FieldUndefined(
            f"{fields} read {which}, and the SVD computed {computed} (svd.top_k="
            f"{computed}): set {kernel}.k={computed} or less, or svd.top_k={top_k}")


# -- overlaps ------------------------------------------------------------------------------
@kernel(apply_level=CROSS, hints=_HINTS)
def l_overlap(weights_lsvs: tuple[np.ndarray, np.ndarray], weights_svals: tuple,
              shape: tuple, *, k: TopK = 0) -> np.ndarray:
    """``O^L = |U_a^T U_b|``, ``[k, k]``: the absolute cosine between left singular
    vector ``i`` of model a and ``j`` of model b (the sign of a singular vector is
    arbitrary, so only the absolute value is a property of the pair). ``k = min(N, M)``,
    every direction, by default; ``k`` > 0 keeps the top ``k`` directions. Undefined
    where the SVD computed fewer directions than it reads (``svd.top_k``: set ``k`` at most
    top_k) or kept the vectors of fewer (``svd.vector_share`` < 1: the top tenth in
    ``diffract track``): the fields read from it (the agreements and their means) have
    one definition wherever they are computed. Rows follow a's directions, columns
    b's, both by decreasing singular value."""
    ua, ub = _left(weights_lsvs, 0)
    n = _directions(min(ua.shape[1], ub.shape[1]), weights_svals, shape, k, "the overlaps",
                    "l_overlap")
    product = ua[:, :n].T @ ub[:, :n]
    return np.abs(product, out=product)  # in place: one k x k array at a time


@kernel(apply_level=CROSS, hints=_HINTS)
def r_overlap(weights_rsvs: tuple[np.ndarray, np.ndarray], weights_svals: tuple,
              shape: tuple, *, k: TopK = 0) -> np.ndarray:
    """``O^R = |V_a^T V_b|``, ``[k, k]``: as ``l_overlap`` for the right singular
    vectors (the input space of ``W``)."""
    va, vb = _right(weights_rsvs, 0)
    n = _directions(min(va.shape[1], vb.shape[1]), weights_svals, shape, k, "the overlaps",
                    "r_overlap")
    product = va[:, :n].T @ vb[:, :n]
    return np.abs(product, out=product)


# -- agreements ----------------------------------------------------------------------------
@kernel(apply_level=CROSS)
def l_agreement(l_overlap: np.ndarray) -> np.ndarray:
    """``a^L_i = O^L_ii`` ``[k]``: is direction ``i`` of a still direction ``i`` of b
    (1: the same up to sign; low: rotated away, or reordered among close singular
    values)."""
    return np.diag(np.asarray(l_overlap)).copy()


@kernel(apply_level=CROSS)
def r_agreement(r_overlap: np.ndarray) -> np.ndarray:
    """``a^R_i = O^R_ii`` ``[k]``: ``l_agreement`` for the right singular vectors."""
    return np.diag(np.asarray(r_overlap)).copy()


@kernel(apply_level=CROSS)
def max_l_agreement(l_overlap: np.ndarray) -> np.ndarray:
    """``m^L_i = max_j O^L_ij`` ``[k]``: how well direction ``i`` of a is matched by its
    best counterpart among b's directions (1 when it survives, in any position)."""
    return np.max(np.abs(np.asarray(l_overlap)), axis=1)


@kernel(apply_level=CROSS)
def max_r_agreement(r_overlap: np.ndarray) -> np.ndarray:
    """``m^R_i = max_j O^R_ij`` ``[k]``: ``max_l_agreement`` for the right vectors."""
    return np.max(np.abs(np.asarray(r_overlap)), axis=1)


def _mean(values: np.ndarray, svals: tuple[np.ndarray, np.ndarray], weighted: bool) -> float:
    values = np.asarray(values, dtype=np.float64)
    if not weighted:
        return float(np.mean(values))
    weights = np.asarray(svals[0], dtype=np.float64)[: len(values)]
    if not weights.sum() > 0:
        raise FieldUndefined("the singular values of model a are all zero: no weights")
    return float(np.sum(weights * values) / np.sum(weights))


_AVG_DOC = """``<{x}>``: the mean of ``{x}`` over the directions; with ``weighted`` the
    mean weighted by model a's singular values, ``sum_i sigma_a,i {x}_i / sum_i
    sigma_a,i`` (the directions that carry the layer count most)."""


@kernel(apply_level=CROSS, hints=_HINTS)
def avg_l_agreement(l_agreement: np.ndarray, weights_svals: tuple, *,
                    weighted: bool = False) -> float:
    return _mean(l_agreement, weights_svals, weighted)


@kernel(apply_level=CROSS, hints=_HINTS)
def avg_r_agreement(r_agreement: np.ndarray, weights_svals: tuple, *,
                    weighted: bool = False) -> float:
    return _mean(r_agreement, weights_svals, weighted)


@kernel(apply_level=CROSS, hints=_HINTS)
def avg_max_l_agreement(max_l_agreement: np.ndarray, weights_svals: tuple, *,
                        weighted: bool = False) -> float:
    return _mean(max_l_agreement, weights_svals, weighted)


@kernel(apply_level=CROSS, hints=_HINTS)
def avg_max_r_agreement(max_r_agreement: np.ndarray, weights_svals: tuple, *,
                        weighted: bool = False) -> float:
    return _mean(max_r_agreement, weights_svals, weighted)


for _fn, _x in ((avg_l_agreement, "l_agreement"), (avg_r_agreement, "r_agreement"),
                (avg_max_l_agreement, "max_l_agreement"), (avg_max_r_agreement, "max_r_agreement")):
    _fn.__doc__ = _AVG_DOC.format(x=_x)


def _best_matches_top(a: np.ndarray, b: np.ndarray, svals: tuple, shape: tuple,
                      k: int, kernel: str) -> float:
    n = _subspace_k(min(a.shape[1], b.shape[1]), svals, shape, k, "the best matches", kernel)
    return float(np.mean(np.max(np.abs(a[:, :n].T @ b[:, :n]), axis=1)))


@kernel(apply_level=CROSS, hints=_HINTS)
def avg_max_l_agreement_top(weights_lsvs: tuple[np.ndarray, np.ndarray], weights_svals: tuple,
                            shape: tuple, *, k: TopK = 0) -> float:
    """``(1 / k) sum_{i <= k} max_{j <= k} |u_a,i . u_b,j|``: how well each of a's top ``k``
    left singular directions is matched among b's top ``k`` (1: the top subspace kept its
    directions, in any order). ``k`` = 0 takes the top tenth of the directions, rounded up
    (``ceil(min(N, M) / 10)``, as ``l_subspace_overlap``): what ``diffract track`` keeps
    the vectors of, so a tracked run and ``diffract compare`` give it the same value.
    ``avg_max_l_agreement`` averages over every direction of a, matched among all of b's:
    another number (the lower directions move more), under another name."""
    ua, ub = _left(weights_lsvs, 0)
    return _best_matches_top(ua, ub, weights_svals, shape, k, "avg_max_l_agreement_top")


@kernel(apply_level=CROSS, hints=_HINTS)
def avg_max_r_agreement_top(weights_rsvs: tuple[np.ndarray, np.ndarray], weights_svals: tuple,
                            shape: tuple, *, k: TopK = 0) -> float:
    """``avg_max_l_agreement_top`` for the right singular vectors (the input space)."""
    va, vb = _right(weights_rsvs, 0)
    return _best_matches_top(va, vb, weights_svals, shape, k, "avg_max_r_agreement_top")


# -- subspaces -----------------------------------------------------------------------------
def _subspace_k(vectors: int, svals: tuple, shape: tuple, k: int, fields: str,
                kernel: str) -> int:
    """The subspace's dimension: ``k``, or the top tenth of the matrix's ``min(N, M)``
    directions, refused when the SVD computed fewer (``svd.top_k``) or kept the vectors
    of fewer (``svd.vector_share``): a top tenth of the top_k directions would be another
    field under the same name."""
    directions = _matrix_directions(shape)
    n = min(directions, k) if k > 0 else max(1, math.ceil(directions / 10))
    _computed(n, directions, svals, fields, kernel, f"{n} or more")
    if n > vectors:
        raise FieldUndefined(
            f"{fields} read the top {n} of {directions} directions, and the SVD kept the "
            f"vectors of {vectors} (svd.vector_share): set svd.vector_share=1 or a smaller "
            f"{kernel}.k")
    return n


def _orthonormal(a: np.ndarray) -> np.ndarray:
    """An orthonormal basis of the span of a's columns, which are orthonormal to their
    rounding already (singular vectors, maybe kept in float16): ``a L^-T`` with ``L L^T =
    a^T a``. This Cholesky QR is exact to float64 rounding for columns this close to
    orthonormal, and is two matrix products (a Householder QR took several times longer
    on 11008 x 410)."""
    chol = np.linalg.cholesky(a.T @ a)
    return a @ np.linalg.inv(chol).T


def _subspace(a: np.ndarray, b: np.ndarray) -> tuple[float, np.ndarray]:
    """The overlap and principal angles of the spans of a's and b's columns. Both are
    orthonormalized first (vectors kept in float32/float16 are orthonormal only to their
    rounding). An angle below pi/4 is taken from its sine (the singular values of
    ``b - a a^T b``), one above from its cosine (those of ``a^T b``): arccos alone is
    blind near 0 (an angle of 1e-8 has cos = 1 - 5e-17, which rounds to 1), so identical
    subspaces gave angles of 1.5e-8 and an overlap 1e-15 short of 1."""
    a, b = _orthonormal(a), _orthonormal(b)
    cross = a.T @ b
    cosines = np.clip(np.linalg.svd(cross, compute_uv=False), 0.0, 1.0)  # descending
    sines = np.clip(np.linalg.svd(b - a @ cross, compute_uv=False), 0.0, 1.0)[::-1]
    small = sines**2 < 0.5  # the i-th smallest sine and the i-th largest cosine: one angle
    angles = np.where(small, np.arcsin(sines), np.arccos(cosines))
    cos2 = np.where(small, 1.0 - sines**2, cosines**2)
    return float(np.mean(cos2)), np.sort(angles)


_SUBSPACE_DOC = """Rotation-invariant comparison of the top-``k`` {side} singular subspaces:
    ``{prefix}_subspace_overlap = ||{M}_a,k^T {M}_b,k||_F^2 / k`` (1: the same subspace,
    ``k / n`` expected for random ones in ``R^n``) and ``{prefix}_principal_angles``,
    ``theta_i = arccos(s_i)`` with ``s_i`` the singular values of ``{M}_a,k^T {M}_b,k``
    (radians, ascending ``[k]``; an angle below pi/4 from its sine, so small ones keep
    their digits). ``k`` = 0 takes the top tenth of the directions,
    rounded up (``ceil(min(N, M) / 10)``: 3 of 25, at least one), undefined where the SVD
    computed fewer directions (``svd.top_k``: set ``k`` at most top_k). Unlike the
    per-direction agreements these do not depend on how (nearly) equal singular values
    split their subspace into vectors."""


@kernel(apply_level=CROSS, produce_fields=("l_subspace_overlap", "l_principal_angles"),
        hints=_HINTS)
def l_subspace(weights_lsvs: tuple[np.ndarray, np.ndarray], weights_svals: tuple,
               shape: tuple, *, k: TopK = 0):
    ua, ub = _left(weights_lsvs, 0)
    n = _subspace_k(ua.shape[1], weights_svals, shape, k, "the subspaces", "l_subspace")
    return _subspace(ua[:, :n], ub[:, :n])


@kernel(apply_level=CROSS, produce_fields=("r_subspace_overlap", "r_principal_angles"),
        hints=_HINTS)
def r_subspace(weights_rsvs: tuple[np.ndarray, np.ndarray], weights_svals: tuple,
               shape: tuple, *, k: TopK = 0):
    va, vb = _right(weights_rsvs, 0)
    n = _subspace_k(va.shape[1], weights_svals, shape, k, "the subspaces", "r_subspace")
    return _subspace(va[:, :n], vb[:, :n])


l_subspace.__doc__ = _SUBSPACE_DOC.format(side="left", prefix="l", M="U")
r_subspace.__doc__ = _SUBSPACE_DOC.format(side="right", prefix="r", M="V")


# -- singular values and intruders ---------------------------------------------------------
@kernel(apply_level=CROSS, hints=_HINTS)
def sval_rel_change(weights_svals: tuple[np.ndarray, np.ndarray], shape: tuple, *,
                    k: TopK = 0) -> float:
    """``||sigma_b - sigma_a||_2 / ||sigma_a||_2``: the relative change of the singular
    values, matched by rank (largest with largest), over all ``min(N, M)`` of them, or the
    top ``k`` (``k`` > 0). Undefined where the SVD computed fewer (``svd.top_k``): the
    change of the top 8 is another number than that of all 200."""
    n = _directions(None, weights_svals, shape, k, "sval_rel_change", "sval_rel_change")
    sa, sb = (np.asarray(x, dtype=np.float64)[:n] for x in weights_svals)
    norm = float(np.linalg.norm(sa))
    if not norm > 0:
        raise FieldUndefined("model a's singular values are all zero")
    return float(np.linalg.norm(sb - sa) / norm)


@kernel(apply_level=CROSS)
def weights_rel_change(weights: tuple[np.ndarray, np.ndarray]) -> float:
    """``||W_b - W_a||_F / ||W_a||_F``: how far model b's weights are from model a's,
    relative to a's (the same shape; a quantized release against its base: the
    quantization error, ``||W_q - W|| / ||W||``)."""
    wa, wb = (np.asarray(x, dtype=np.float64) for x in weights)
    if wa.shape != wb.shape:
        raise FieldUndefined(f"the two weights differ in shape: {wa.shape} and {wb.shape}")
    for which, w in (("a", wa), ("b", wb)):
        if not np.isfinite(w).all():
            raise FieldUndefined(f"model {which}'s weights hold NaN or infinite values "
                                 f"({int((~np.isfinite(w)).sum())} of {w.size})")
    norm = float(np.linalg.norm(wa))  # float64: weights of 1e-20 square to 1e-40, no less
    if not norm > 0:
        raise FieldUndefined("model a's weights are all zero")
    return float(np.linalg.norm(wb - wa) / norm)


@kernel(apply_level=CROSS, hints=_HINTS)
def intruder_dimensions(
    weights_lsvs: tuple[np.ndarray, np.ndarray],
    weights_svals: tuple,
    shape: tuple,
    *,
    k: Annotated[int, Range(ge=1)] = 10,
    threshold: Annotated[float, Range(gt=0.0, lt=1.0)] = 0.5,
) -> int:
    """Intruder dimensions (Shuttleworth et al. 2024, "LoRA vs Full Fine-tuning: An
    Illusion of Equivalence"): how many of model b's top ``k`` left singular vectors have
    no counterpart in model a, ``#{i <= k : max_j |u_b,i . u_a,j| < threshold}`` over all
    of a's directions. Model a is the base (the first in scope), b the fine-tuned one.
    0 when b keeps a's directions; ``k`` when b's top directions are new (e.g. a random
    orthogonal replacement, whose vectors have cosines about ``sqrt(2 ln n / n)`` with
    any basis of ``R^n``). Within a group of (nearly) equal singular values b's vectors
    may rotate without being intruders only when a spans the same group. Undefined where
    the SVD computed fewer of a's directions (``svd.top_k``) or kept the vectors of fewer
    (``svd.vector_share`` < 1, as ``diffract track``): a direction of b matched among a's
    top directions only would be another count under this name."""
    ua, ub = (np.asarray(x, dtype=np.float64) for x in weights_lsvs)
    every = _matrix_directions(shape)
    top_n = min(k, every)
    computed = min(len(weights_svals[0]), len(weights_svals[1]))
    if computed < every:
        raise FieldUndefined(
            f"intruder_dimensions matches b's top {top_n} directions among all {every} of "
            f"model a's directions, and the SVD computed {computed} (svd.top_k="
            f"{computed}): set svd.top_k=0")
    if ua.shape[1] < every or ub.shape[1] < top_n:
        raise FieldUndefined(
            f"intruder_dimensions matches b's top {top_n} directions among all {every} of "
            f"model a's directions, and the SVD kept the vectors of {ua.shape[1]} of a's "
            f"and {ub.shape[1]} of b's (svd.vector_share < 1, as diffract track keeps the "
            "top tenth): set svd.vector_share=1")
    top = ub[:, :top_n]
    best = np.max(np.abs(ua.T @ top), axis=0)
    return int(np.sum(best < threshold))


ALL: tuple[Any, ...] = (
    l_overlap, r_overlap, l_agreement, r_agreement, max_l_agreement, max_r_agreement,
    avg_l_agreement, avg_r_agreement, avg_max_l_agreement, avg_max_r_agreement,
    avg_max_l_agreement_top, avg_max_r_agreement_top, l_subspace, r_subspace,
    sval_rel_change, weights_rel_change, intruder_dimensions,
)
