"""Triton kernels of chunked Kimi Delta Attention, forward and backward (imported on first use).

The stages, what each computes and saves, and why, are in DESIGN.md beside this file.
Notation per (batch, value head) and chunk of ``BT = 64`` steps, rows ``t`` of the chunk:

* ``G[t] = sum_{s <= t} g[s]`` (per key dimension, in the chunk), ``C`` the chunk's last row;
* ``Aqk[i, j] = scale * sum_d q[i,d] k[j,d] exp(G[i,d] - G[j,d])`` for ``j <= i``;
* ``L[i, j] = sum_d k[i,d] k[j,d] exp(G[i,d] - G[j,d])`` for ``j < i``;
* ``X = (I + diag(beta) L)^-1``, ``w = X diag(beta) (k * exp(G))``, ``u = X diag(beta) v``;
* with ``S`` the state entering the chunk: ``delta = u - w S``,
  ``o = (scale q * exp(G)) S + Aqk delta``,
  ``S' = exp(G[C]) * S + (k * exp(G[C] - G))^T delta``.

Every ``exp`` of a difference of cumulative gates is taken of a non-positive number
(a later row minus an earlier one, through a reference row in between), so nothing
overflows whatever the gates are; masked entries go through ``where(..., -inf)`` before
the ``exp``.

Layout of this module: constants, kernels (forward, then backward), launchers, the
autograd Function.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

import torch
import triton
import triton.language as tl

from kernel_fun import _support, _toolchain

# -- constants ------------------------------------------------------------------------------
#: Chunk length (fla's default for chunk_kda).
BT = 64
#: Sub-block of the intra-chunk matrices: off-diagonal sub-blocks are matrix products
#: through a reference row, diagonal ones are summed element by element.
BC = 16


def _pow2(n: int, least: int = 16) -> int:
    return max(least, triton.next_power_of_2(n))


# -- forward kernels ------------------------------------------------------------------------
@triton.jit
def _rows(base, rows, cols, stride, mask):
    """``base[rows, cols]`` of a row-major tile with row ``stride``, float32, 0 if masked."""
    p = base + rows[:, None] * stride + cols[None, :]
    return tl.load(p, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def _raw(base, rows, cols, stride, mask):
    """As _rows, in the tensor's own dtype."""
    return tl.load(base + rows[:, None] * stride + cols[None, :], mask=mask, other=0.0)


@triton.jit
def _gate_value(x, a, lower_bound, HAS_A: tl.constexpr, LOWER: tl.constexpr):
    """The in-op gate of ``x = g + dt_bias``: ``-exp(a) softplus(x)``, or with a lower
    bound ``lb * sigmoid(exp(a) x)`` (``lb * sigmoid(x)`` without ``A_log``)."""
    if LOWER:
        if HAS_A:
            x = tl.exp(a) * x
        y = lower_bound * tl.sigmoid(x)
    else:
        sp = tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(tl.minimum(x, 20.0))))
        y = -tl.exp(a) * sp
    return y


@triton.jit
def _gate_cumsum_kernel(g, a_log, dt_bias, G, lower_bound, T,
                        HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                        GATE: tl.constexpr, HAS_A: tl.constexpr, HAS_BIAS: tl.constexpr,
                        LOWER: tl.constexpr):
    """Stage F0: the gate (in-op or given) summed within each chunk -> G (fp32)."""
    i_n, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    o_t = i_n * BT + tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m = (o_t[:, None] < T) & (o_k[None, :] < K)
    off = (i_b.to(tl.int64) * T * HV + i_hv) * K + o_t[:, None] * (HV * K) + o_k[None, :]
    x = tl.load(g + off, mask=m, other=0.0).to(tl.float32)
    if GATE:
        if HAS_BIAS:
            x += tl.load(dt_bias + i_hv * K + o_k, mask=o_k < K, other=0.0).to(tl.float32)[None, :]
        a = 0.0
        if HAS_A:
            a = tl.load(a_log + i_hv).to(tl.float32)
        x = tl.where(m, _gate_value(x, a, lower_bound, HAS_A, LOWER), 0.0)
    tl.store(G + off, tl.cumsum(x, 0), mask=m)


@triton.jit
def _intra_fwd_kernel(q, k, G, Aqk, L, scale, T,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                      BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """Stage F1: rows ``[r0, r0 + BC)`` of Aqk (scaled, diagonal included) and L (strict)."""
    i_n, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    r0 = i_n * BT + i_c * BC
    if r0 >= T:
        return
    o_i = r0 + tl.arange(0, BC)
    o_j = i_n * BT + tl.arange(0, BT)
    m_i = o_i < T
    qk = (i_b.to(tl.int64) * T * H + i_h) * K
    gb = (i_b.to(tl.int64) * T * HV + i_hv) * K
    a_qk = tl.zeros([BC, BT], dtype=tl.float32)
    a_kk = tl.zeros([BC, BT], dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        mi = m_i[:, None] & m_k[None, :]
        q_i = _rows(q + qk, o_i, o_k, H * K, mi)
        k_i = _rows(k + qk, o_i, o_k, H * K, mi)
        g_i = _rows(G + gb, o_i, o_k, HV * K, mi)
        g_r = tl.load(G + gb + r0 * (HV * K) + o_k, mask=m_k, other=0.0)
        # columns before the block, through the reference row r0: both factors <= 1
        before = (o_j < r0)[:, None] & m_k[None, :]
        k_j = _rows(k + qk, o_j, o_k, H * K, before)
        g_j = _rows(G + gb, o_j, o_k, HV * K, before)
        k_j = k_j * tl.exp(tl.where(before, g_r[None, :] - g_j, float("-inf")))
        e_i = tl.exp(tl.where(mi, g_i - g_r[None, :], float("-inf")))
        a_qk += tl.dot(q_i * e_i, tl.trans(k_j))
        a_kk += tl.dot(k_i * e_i, tl.trans(k_j))
        # the diagonal block, one column at a time
        for jj in range(BC):
            j = r0 + jj
            ok = m_k & ((o_k * 0 + j) < T)  # (a scalar mask does not broadcast in the interpreter)
            k_c = tl.load(k + qk + j * (H * K) + o_k, mask=ok, other=0.0).to(tl.float32)
            g_c = tl.load(G + gb + j * (HV * K) + o_k, mask=ok, other=0.0)
            e = tl.exp(tl.where(mi & (o_i >= j)[:, None], g_i - g_c[None, :], float("-inf")))
            ke = k_c[None, :] * e
            col = (o_j == j)[None, :]
            a_qk += tl.where(col, tl.sum(q_i * ke, 1)[:, None], 0.0)
            a_kk += tl.where(col & (o_i > j)[:, None], tl.sum(k_i * ke, 1)[:, None], 0.0)
    ab = (i_b.to(tl.int64) * T * HV + i_hv) * BT
    p = ab + o_i[:, None] * (HV * BT) + tl.arange(0, BT)[None, :]
    tl.store(Aqk + p, a_qk * scale, mask=m_i[:, None])
    tl.store(L + p, a_kk, mask=m_i[:, None])


@triton.jit
def _dot(a, b):
    """A small fp32 product kept in full precision (not tf32): the inverse's blocks."""
    return tl.dot(a, b, input_precision="ieee")


@triton.jit
def _m_block(L, beta, ab, bb, r0, bi: tl.constexpr, bj: tl.constexpr, T,
             HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    """Block (bi, bj) of M = diag(beta) L of the chunk starting at row r0 (0 past T)."""
    rows = r0 + bi * BC + tl.arange(0, BC)
    ok = rows < T
    b = tl.load(beta + bb + rows * HV, mask=ok, other=0.0)
    p = ab + rows[:, None] * (HV * BT) + bj * BC + tl.arange(0, BC)[None, :]
    return b[:, None] * tl.load(L + p, mask=ok[:, None], other=0.0)


@triton.jit
def _inv_unit_lower(M, BC: tl.constexpr):
    """(I + M)^-1 for a strictly lower-triangular [BC, BC] M, by forward substitution:
    row i of the inverse is e_i - M[i, :] X."""
    o = tl.arange(0, BC)
    x = tl.where(o[:, None] == o[None, :], 1.0, 0.0)
    for i in range(1, BC):
        m_row = tl.sum(tl.where(o[:, None] == i, M, 0.0), 0)
        row = tl.where(o == i, 1.0, 0.0) - tl.sum(m_row[:, None] * x, 0)
        x = tl.where(o[:, None] == i, row[None, :], x)
    return x


@triton.jit
def _store_block(X, ab, r0, bi: tl.constexpr, bj: tl.constexpr, val, T,
                 HV: tl.constexpr, BT: tl.constexpr, BC: tl.constexpr):
    rows = r0 + bi * BC + tl.arange(0, BC)
    p = ab + rows[:, None] * (HV * BT) + bj * BC + tl.arange(0, BC)[None, :]
    tl.store(X + p, val, mask=(rows < T)[:, None])


@triton.jit
def _beta_kg(k, G, beta, r0, bi: tl.constexpr, o_k, T, sk, sg, HV: tl.constexpr,
             K: tl.constexpr, BC: tl.constexpr):
    """beta * k * exp(G) for the rows of block ``bi`` (0 past T)."""
    rows = r0 + bi * BC + tl.arange(0, BC)
    m = (rows < T)[:, None] & (o_k < K)[None, :]
    b = tl.load(beta + rows * HV, mask=rows < T, other=0.0)
    return b[:, None] * _rows(k, rows, o_k, sk, m) * tl.exp(_rows(G, rows, o_k, sg, m))


@triton.jit
def _beta_v(v, beta, r0, bi: tl.constexpr, o_v, T, sv, HV: tl.constexpr, V: tl.constexpr,
            BC: tl.constexpr):
    """beta * v for the rows of block ``bi`` (0 past T)."""
    rows = r0 + bi * BC + tl.arange(0, BC)
    m = (rows < T)[:, None] & (o_v < V)[None, :]
    b = tl.load(beta + rows * HV, mask=rows < T, other=0.0)
    return b[:, None] * _rows(v, rows, o_v, sv, m)


@triton.jit
def _store_rows(ptr, r0, bi: tl.constexpr, cols, val, T, stride, N: tl.constexpr,
                BC: tl.constexpr):
    rows = r0 + bi * BC + tl.arange(0, BC)
    m = (rows < T)[:, None] & (cols < N)[None, :]
    tl.store(ptr + rows[:, None] * stride + cols[None, :], val.to(ptr.dtype.element_ty), mask=m)


@triton.jit
def _solve_fwd_kernel(q, k, v, G, beta, L, X, w, u, qg, kd, gc, scale, T, NT,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                      BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Stage F2: X = (I + diag(beta) L)^-1 by 16x16 blocks; the WY form w and u;
    and what the state scans multiply by, so that they take no exponentials: q exp(G)
    (scaled), k exp(G[C] - G) and exp(G[C]). w, u, qg, kd in the operands' dtype."""
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    o_t = i_n * BT + tl.arange(0, BT)
    m_t = o_t < T
    last = tl.minimum(T, i_n * BT + BT) - 1
    bb = i_b.to(tl.int64) * T * HV + i_hv
    ab = (i_b.to(tl.int64) * T * HV + i_hv) * BT
    tl.static_assert(BT == 4 * BC, "the inverse is written for four sub-blocks")
    # X by 16x16 blocks: the diagonal ones by forward substitution, the others by
    # products, X_ij = -X_ii sum_{j <= m < i} M_im X_mj.
    r0 = i_n * BT
    x00 = _inv_unit_lower(_m_block(L, beta, ab, bb, r0, 0, 0, T, HV, BT, BC), BC)
    x11 = _inv_unit_lower(_m_block(L, beta, ab, bb, r0, 1, 1, T, HV, BT, BC), BC)
    x22 = _inv_unit_lower(_m_block(L, beta, ab, bb, r0, 2, 2, T, HV, BT, BC), BC)
    x33 = _inv_unit_lower(_m_block(L, beta, ab, bb, r0, 3, 3, T, HV, BT, BC), BC)
    m10 = _m_block(L, beta, ab, bb, r0, 1, 0, T, HV, BT, BC)
    m20 = _m_block(L, beta, ab, bb, r0, 2, 0, T, HV, BT, BC)
    m21 = _m_block(L, beta, ab, bb, r0, 2, 1, T, HV, BT, BC)
    m30 = _m_block(L, beta, ab, bb, r0, 3, 0, T, HV, BT, BC)
    m31 = _m_block(L, beta, ab, bb, r0, 3, 1, T, HV, BT, BC)
    m32 = _m_block(L, beta, ab, bb, r0, 3, 2, T, HV, BT, BC)
    x10 = -_dot(x11, _dot(m10, x00))
    x21 = -_dot(x22, _dot(m21, x11))
    x32 = -_dot(x33, _dot(m32, x22))
    x20 = -_dot(x22, _dot(m20, x00) + _dot(m21, x10))
    x31 = -_dot(x33, _dot(m31, x11) + _dot(m32, x21))
    x30 = -_dot(x33, _dot(m30, x00) + _dot(m31, x10) + _dot(m32, x20))
    zero = tl.zeros([BC, BC], dtype=tl.float32)
    _store_block(X, ab, r0, 0, 0, x00, T, HV, BT, BC)
    _store_block(X, ab, r0, 0, 1, zero, T, HV, BT, BC)
    _store_block(X, ab, r0, 0, 2, zero, T, HV, BT, BC)
    _store_block(X, ab, r0, 0, 3, zero, T, HV, BT, BC)
    _store_block(X, ab, r0, 1, 0, x10, T, HV, BT, BC)
    _store_block(X, ab, r0, 1, 1, x11, T, HV, BT, BC)
    _store_block(X, ab, r0, 1, 2, zero, T, HV, BT, BC)
    _store_block(X, ab, r0, 1, 3, zero, T, HV, BT, BC)
    _store_block(X, ab, r0, 2, 0, x20, T, HV, BT, BC)
    _store_block(X, ab, r0, 2, 1, x21, T, HV, BT, BC)
    _store_block(X, ab, r0, 2, 2, x22, T, HV, BT, BC)
    _store_block(X, ab, r0, 2, 3, zero, T, HV, BT, BC)
    _store_block(X, ab, r0, 3, 0, x30, T, HV, BT, BC)
    _store_block(X, ab, r0, 3, 1, x31, T, HV, BT, BC)
    _store_block(X, ab, r0, 3, 2, x32, T, HV, BT, BC)
    _store_block(X, ab, r0, 3, 3, x33, T, HV, BT, BC)
    # w = X diag(beta) (k exp(G)) and u = X diag(beta) v by row blocks, from the blocks
    # of X in registers (X itself is written for the backward only)
    qk = (i_b.to(tl.int64) * T * H + i_h) * K
    gb = (i_b.to(tl.int64) * T * HV + i_hv) * K
    cb = ((i_b.to(tl.int64) * NT + i_n) * HV + i_hv) * K
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        m = m_t[:, None] & m_k[None, :]
        k_t = _rows(k + qk, o_t, o_k, H * K, m)
        q_t = _rows(q + qk, o_t, o_k, H * K, m)
        g_t = _rows(G + gb, o_t, o_k, HV * K, m)
        g_c = tl.load(G + gb + last * (HV * K) + o_k, mask=m_k, other=0.0)
        p = gb + o_t[:, None] * (HV * K) + o_k[None, :]
        tl.store(qg + p, (q_t * scale * tl.exp(g_t)).to(qg.dtype.element_ty), mask=m)
        e_d = tl.exp(tl.where(m, g_c[None, :] - g_t, float("-inf")))
        tl.store(kd + p, (k_t * e_d).to(kd.dtype.element_ty), mask=m)
        tl.store(gc + cb + o_k, tl.exp(g_c), mask=m_k)
        y0 = _beta_kg(k + qk, G + gb, beta + bb, r0, 0, o_k, T, H * K, HV * K, HV, K, BC)
        y1 = _beta_kg(k + qk, G + gb, beta + bb, r0, 1, o_k, T, H * K, HV * K, HV, K, BC)
        y2 = _beta_kg(k + qk, G + gb, beta + bb, r0, 2, o_k, T, H * K, HV * K, HV, K, BC)
        y3 = _beta_kg(k + qk, G + gb, beta + bb, r0, 3, o_k, T, H * K, HV * K, HV, K, BC)
        _store_rows(w + gb, r0, 0, o_k, tl.dot(x00, y0), T, HV * K, K, BC)
        _store_rows(w + gb, r0, 1, o_k, tl.dot(x10, y0) + tl.dot(x11, y1), T, HV * K, K, BC)
        _store_rows(w + gb, r0, 2, o_k, tl.dot(x20, y0) + tl.dot(x21, y1) + tl.dot(x22, y2),
                    T, HV * K, K, BC)
        _store_rows(w + gb, r0, 3, o_k, tl.dot(x30, y0) + tl.dot(x31, y1) + tl.dot(x32, y2)
                    + tl.dot(x33, y3), T, HV * K, K, BC)
    vb = (i_b.to(tl.int64) * T * HV + i_hv) * V
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        y0 = _beta_v(v + vb, beta + bb, r0, 0, o_v, T, HV * V, HV, V, BC)
        y1 = _beta_v(v + vb, beta + bb, r0, 1, o_v, T, HV * V, HV, V, BC)
        y2 = _beta_v(v + vb, beta + bb, r0, 2, o_v, T, HV * V, HV, V, BC)
        y3 = _beta_v(v + vb, beta + bb, r0, 3, o_v, T, HV * V, HV, V, BC)
        _store_rows(u + vb, r0, 0, o_v, tl.dot(x00, y0), T, HV * V, V, BC)
        _store_rows(u + vb, r0, 1, o_v, tl.dot(x10, y0) + tl.dot(x11, y1), T, HV * V, V, BC)
        _store_rows(u + vb, r0, 2, o_v, tl.dot(x20, y0) + tl.dot(x21, y1) + tl.dot(x22, y2),
                    T, HV * V, V, BC)
        _store_rows(u + vb, r0, 3, o_v, tl.dot(x30, y0) + tl.dot(x31, y1) + tl.dot(x32, y2)
                    + tl.dot(x33, y3), T, HV * V, V, BC)


@triton.jit
def _scan_fwd_kernel(qg, kd, gc, w, u, Aqk, h0, o, ht, h, dlt, T, NT,
                     HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     HAS_H0: tl.constexpr, STORE_FINAL: tl.constexpr, OUTPUT: tl.constexpr,
                     SAVE: tl.constexpr):
    """Stage F3: the state through the chunks, one V-block of it per program.

    Forward (OUTPUT): per chunk ``delta = u - w S``, the output ``o``, then the state
    update; the state is never written except the final one. Backward's recompute (SAVE):
    the state entering every chunk (``h``) and ``delta``, no output. The state stays
    float32 in registers; the products take it in the operands' dtype (w's).
    """
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_s = m_k[:, None] & m_v[None, :]
    p_s = o_k[:, None] * V + o_v[None, :]
    S = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_H0:
        S += tl.load(h0 + i_bh.to(tl.int64) * K * V + p_s, mask=m_s, other=0.0)
    gb = (i_b.to(tl.int64) * T * HV + i_hv) * K
    vb = (i_b.to(tl.int64) * T * HV + i_hv) * V
    ab = (i_b.to(tl.int64) * T * HV + i_hv) * BT
    for i_n in range(NT):
        o_t = i_n * BT + tl.arange(0, BT)
        m_t = o_t < T
        mk = m_t[:, None] & m_k[None, :]
        mv = m_t[:, None] & m_v[None, :]
        s_op = S.to(w.dtype.element_ty)
        if SAVE:
            hb = ((i_b.to(tl.int64) * NT + i_n) * HV + i_hv) * K * V
            tl.store(h + hb + p_s, S.to(h.dtype.element_ty), mask=m_s)
        p_k = gb + o_t[:, None] * (HV * K) + o_k[None, :]
        p_v = vb + o_t[:, None] * (HV * V) + o_v[None, :]
        w_n = tl.load(w + p_k, mask=mk, other=0.0)
        d = tl.load(u + p_v, mask=mv, other=0.0).to(tl.float32) - tl.dot(w_n, s_op)
        d_op = d.to(w.dtype.element_ty)
        if SAVE:
            tl.store(dlt + p_v, d.to(dlt.dtype.element_ty), mask=mv)
        if OUTPUT:
            q_n = tl.load(qg + p_k, mask=mk, other=0.0)
            a = tl.load(Aqk + ab + o_t[:, None] * (HV * BT) + tl.arange(0, BT)[None, :],
                        mask=m_t[:, None], other=0.0).to(w.dtype.element_ty)
            out = tl.dot(q_n, s_op) + tl.dot(a, d_op)
            tl.store(o + p_v, out.to(o.dtype.element_ty), mask=mv)
        k_n = tl.load(kd + p_k, mask=mk, other=0.0)
        p_c = ((i_b.to(tl.int64) * NT + i_n) * HV + i_hv) * K + o_k
        g_c = tl.load(gc + p_c, mask=m_k, other=0.0)
        S = S * g_c[:, None] + tl.dot(tl.trans(k_n), d_op)
    if STORE_FINAL:
        tl.store(ht + i_bh.to(tl.int64) * K * V + p_s, S, mask=m_s)


# -- backward kernels -----------------------------------------------------------------------
@triton.jit
def _scan_bwd_kernel(qg, kd, gc, w, Aqk, do, dht, dh, dd, dh0, T, NT,
                     HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                     BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
                     HAS_DHT: tl.constexpr, HAS_H0: tl.constexpr):
    """Stage B1: the state's gradient backwards through the chunks (one V-block per
    program): stores ``dh`` (the gradient of the state leaving each chunk) and
    ``d delta = Aqk^T do + (k exp(G[C] - G)) dS``; returns the initial state's gradient."""
    i_v, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    o_k = tl.arange(0, BK)
    m_k = o_k < K
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    m_s = m_k[:, None] & m_v[None, :]
    p_s = o_k[:, None] * V + o_v[None, :]
    dS = tl.zeros([BK, BV], dtype=tl.float32)
    if HAS_DHT:
        dS += tl.load(dht + i_bh.to(tl.int64) * K * V + p_s, mask=m_s, other=0.0)
    gb = (i_b.to(tl.int64) * T * HV + i_hv) * K
    vb = (i_b.to(tl.int64) * T * HV + i_hv) * V
    ab = (i_b.to(tl.int64) * T * HV + i_hv) * BT
    for i_r in range(NT):
        i_n = NT - 1 - i_r
        o_t = i_n * BT + tl.arange(0, BT)
        m_t = o_t < T
        hb = ((i_b.to(tl.int64) * NT + i_n) * HV + i_hv) * K * V
        tl.store(dh + hb + p_s, dS.to(dh.dtype.element_ty), mask=m_s)
        ds_op = dS.to(w.dtype.element_ty)
        mk = m_t[:, None] & m_k[None, :]
        mv = m_t[:, None] & m_v[None, :]
        p_k = gb + o_t[:, None] * (HV * K) + o_k[None, :]
        p_v = vb + o_t[:, None] * (HV * V) + o_v[None, :]
        do_n = tl.load(do + p_v, mask=mv, other=0.0).to(w.dtype.element_ty)
        a = tl.load(Aqk + ab + o_t[:, None] * (HV * BT) + tl.arange(0, BT)[None, :],
                    mask=m_t[:, None], other=0.0).to(w.dtype.element_ty)
        k_n = tl.load(kd + p_k, mask=mk, other=0.0)
        dd_n = tl.dot(tl.trans(a), do_n) + tl.dot(k_n, ds_op)
        tl.store(dd + p_v, dd_n.to(dd.dtype.element_ty), mask=mv)
        q_n = tl.load(qg + p_k, mask=mk, other=0.0)
        w_n = tl.load(w + p_k, mask=mk, other=0.0)
        p_c = ((i_b.to(tl.int64) * NT + i_n) * HV + i_hv) * K + o_k
        g_c = tl.load(gc + p_c, mask=m_k, other=0.0)
        dS = (tl.dot(tl.trans(q_n), do_n) + dS * g_c[:, None]
              - tl.dot(tl.trans(w_n), dd_n.to(w.dtype.element_ty)))
    if HAS_H0:
        tl.store(dh0 + i_bh.to(tl.int64) * K * V + p_s, dS, mask=m_s)


@triton.jit
def _dv_bwd_kernel(v, beta, X, dlt, dd, do, dv, dAqk, dX, dbeta, T,
                   HV: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr):
    """Stage B2a: through the readout and u = X diag(beta) v, per chunk, looping over V:
    ``dAqk = tril(do delta^T)``, ``dv = beta X^T d delta``, u's parts of dX and dbeta."""
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    o_t = i_n * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_c = tl.arange(0, BT)
    vb = (i_b.to(tl.int64) * T * HV + i_hv) * V
    pa = (i_b.to(tl.int64) * T * HV + i_hv) * BT + o_t[:, None] * (HV * BT) + o_c[None, :]
    pb = i_b.to(tl.int64) * T * HV + o_t * HV + i_hv
    b = tl.load(beta + pb, mask=m_t, other=0.0)
    Xm = tl.load(X + pa, mask=m_t[:, None], other=0.0)
    d_a = tl.zeros([BT, BT], dtype=tl.float32)
    d_x = tl.zeros([BT, BT], dtype=tl.float32)
    d_b = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        mv = m_t[:, None] & (o_v < V)[None, :]
        do_n = _rows(do + vb, o_t, o_v, HV * V, mv)
        d_n = _rows(dlt + vb, o_t, o_v, HV * V, mv)
        dd_n = _rows(dd + vb, o_t, o_v, HV * V, mv)
        v_n = _rows(v + vb, o_t, o_v, HV * V, mv)
        d_a += tl.dot(do_n, tl.trans(d_n))
        d_x += tl.dot(dd_n, tl.trans(v_n * b[:, None]))
        xt_du = tl.dot(tl.trans(Xm), dd_n)
        p_v = vb + o_t[:, None] * (HV * V) + o_v[None, :]
        tl.store(dv + p_v, (b[:, None] * xt_du).to(dv.dtype.element_ty), mask=mv)
        d_b += tl.sum(v_n * xt_du, 1)
    d_a = tl.where((o_c[:, None] >= o_c[None, :]) & m_t[:, None], d_a, 0.0)
    tl.store(dAqk + pa, d_a, mask=m_t[:, None])
    tl.store(dX + pa, d_x, mask=m_t[:, None])
    tl.store(dbeta + pb, d_b, mask=m_t)


@triton.jit
def _dk_bwd_kernel(q, k, G, beta, X, h, dh, dlt, dd, do, dq, dk, dG, dXp, dbp, scale, T, NT,
                   H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr,
                   BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr):
    """Stage B2b: per chunk and K-block, looping over V: the gradients through the
    readout's ``q exp(G) S``, through ``w = X diag(beta) (k exp(G))`` and through the
    state update; the row-wise parts of dq, dk, dG; this K-block's parts of dX and dbeta
    (summed over K-blocks in B2c, so the result does not depend on scheduling)."""
    i_n, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    o_t = i_n * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_c = tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m_k = o_k < K
    mk = m_t[:, None] & m_k[None, :]
    last = tl.minimum(T, i_n * BT + BT) - 1
    qk = (i_b.to(tl.int64) * T * H + i_h) * K
    gb = (i_b.to(tl.int64) * T * HV + i_hv) * K
    vb = (i_b.to(tl.int64) * T * HV + i_hv) * V
    hb = ((i_b.to(tl.int64) * NT + i_n) * HV + i_hv) * K * V
    pa = (i_b.to(tl.int64) * T * HV + i_hv) * BT + o_t[:, None] * (HV * BT) + o_c[None, :]
    b = tl.load(beta + i_b.to(tl.int64) * T * HV + o_t * HV + i_hv, mask=m_t, other=0.0)
    d_qg = tl.zeros([BT, BK], dtype=tl.float32)
    d_kd = tl.zeros([BT, BK], dtype=tl.float32)
    d_w = tl.zeros([BT, BK], dtype=tl.float32)
    d_gc = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        mv = m_t[:, None] & m_v[None, :]
        ms = m_k[:, None] & m_v[None, :]
        # the products take the stored operands in their own dtype (q's: bf16 on the
        # tensor cores), accumulating in float32
        s0 = _raw(h + hb, o_k, o_v, V, ms)
        ds = _raw(dh + hb, o_k, o_v, V, ms)
        do_n = _raw(do + vb, o_t, o_v, HV * V, mv).to(s0.dtype)
        d_qg += tl.dot(do_n, tl.trans(s0))
        d_kd += tl.dot(_raw(dlt + vb, o_t, o_v, HV * V, mv), tl.trans(ds))
        d_w -= tl.dot(_raw(dd + vb, o_t, o_v, HV * V, mv), tl.trans(s0))
        d_gc += tl.sum(s0.to(tl.float32) * ds.to(tl.float32), 1)
    q_n = _rows(q + qk, o_t, o_k, H * K, mk)
    k_n = _rows(k + qk, o_t, o_k, H * K, mk)
    g_n = _rows(G + gb, o_t, o_k, HV * K, mk)
    g_c = tl.load(G + gb + last * (HV * K) + o_k, mask=m_k, other=0.0)
    Xm = tl.load(X + pa, mask=m_t[:, None], other=0.0)
    eg = tl.exp(g_n)
    kg = k_n * eg
    xt_dw = tl.dot(tl.trans(Xm), d_w)
    d_kg = b[:, None] * xt_dw
    nk = tl.cdiv(K, BK)
    pp = ((i_b.to(tl.int64) * T * HV + i_hv) * nk + i_k) * BT
    tl.store(dXp + pp + o_t[:, None] * (HV * nk * BT) + o_c[None, :],
             tl.dot(d_w, tl.trans(kg * b[:, None])), mask=m_t[:, None])
    tl.store(dbp + (i_b.to(tl.int64) * T * HV + i_hv) * nk + i_k + o_t * (HV * nk),
             tl.sum(kg * xt_dw, 1), mask=m_t)
    ed = tl.exp(tl.where(mk, g_c[None, :] - g_n, float("-inf")))
    kd = k_n * ed
    d_g = d_qg * q_n * scale * eg + d_kg * kg - d_kd * kd
    d_gc = tl.sum(d_kd * kd, 0) + tl.exp(g_c) * d_gc
    d_g += tl.where((o_t == last)[:, None], d_gc[None, :], 0.0)
    pk = gb + o_t[:, None] * (HV * K) + o_k[None, :]
    tl.store(dq + pk, scale * eg * d_qg, mask=mk)
    tl.store(dk + pk, eg * d_kg + ed * d_kd, mask=mk)
    tl.store(dG + pk, d_g, mask=mk)


@triton.jit
def _dm_bwd_kernel(beta, X, L, dX, dXp, dbp, dL, dbeta, T,
                   HV: tl.constexpr, BT: tl.constexpr, NK: tl.constexpr):
    """Stage B2c: dX summed (u's part and every K-block's), then through the inverse:
    ``dM = -X^T dX X^T`` (strictly lower), ``dL = beta dM`` and dbeta's last parts."""
    i_n, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_hv = i_bh // HV, i_bh % HV
    o_t = i_n * BT + tl.arange(0, BT)
    m_t = o_t < T
    o_c = tl.arange(0, BT)
    pa = (i_b.to(tl.int64) * T * HV + i_hv) * BT + o_t[:, None] * (HV * BT) + o_c[None, :]
    pb = i_b.to(tl.int64) * T * HV + o_t * HV + i_hv
    d_x = tl.load(dX + pa, mask=m_t[:, None], other=0.0)
    d_b = tl.load(dbeta + pb, mask=m_t, other=0.0)
    for i_k in range(NK):
        pp = ((i_b.to(tl.int64) * T * HV + i_hv) * NK + i_k) * BT
        d_x += tl.load(dXp + pp + o_t[:, None] * (HV * NK * BT) + o_c[None, :],
                       mask=m_t[:, None], other=0.0)
        d_b += tl.load(dbp + (i_b.to(tl.int64) * T * HV + i_hv) * NK + i_k + o_t * (HV * NK),
                       mask=m_t, other=0.0)
    Xm = tl.load(X + pa, mask=m_t[:, None], other=0.0)
    d_m = -tl.dot(tl.trans(Xm), tl.dot(d_x, tl.trans(Xm)))
    d_m = tl.where((o_c[:, None] > o_c[None, :]) & m_t[:, None], d_m, 0.0)
    b = tl.load(beta + pb, mask=m_t, other=0.0)
    d_b += tl.sum(d_m * tl.load(L + pa, mask=m_t[:, None], other=0.0), 1)
    tl.store(dL + pa, d_m * b[:, None], mask=m_t[:, None])
    tl.store(dbeta + pb, d_b, mask=m_t)


@triton.jit
def _intra_bwd_kernel(q, k, G, dAqk, dL, dq, dk, dG, scale, T,
                      H: tl.constexpr, HV: tl.constexpr, K: tl.constexpr,
                      BT: tl.constexpr, BC: tl.constexpr, BK: tl.constexpr):
    """Stage B3: Aqk's and L's gradients through q, k and the gates, for rows
    ``[r0, r0 + BC)`` both as the later row ``i`` and as the earlier row ``j``; added to
    stage B2's dq, dk, dG (same value-head layout)."""
    i_n, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    i_h = i_hv // (HV // H)
    r0 = i_n * BT + i_c * BC
    if r0 >= T:
        return
    last = tl.minimum(T, i_n * BT + BT) - 1
    r1 = tl.minimum(r0 + BC - 1, last)
    o_i = r0 + tl.arange(0, BC)
    m_i = o_i < T
    o_j = i_n * BT + tl.arange(0, BT)
    m_j = o_j < T
    o_cb = i_c * BC + tl.arange(0, BC)
    qk = (i_b.to(tl.int64) * T * H + i_h) * K
    gb = (i_b.to(tl.int64) * T * HV + i_hv) * K
    ab = (i_b.to(tl.int64) * T * HV + i_hv) * BT
    # the block's rows of dA (as i) and its columns (as j)
    p_r = ab + o_i[:, None] * (HV * BT) + tl.arange(0, BT)[None, :]
    p_c = ab + o_j[:, None] * (HV * BT) + o_cb[None, :]
    daq_r = tl.load(dAqk + p_r, mask=m_i[:, None], other=0.0) * scale
    dal_r = tl.load(dL + p_r, mask=m_i[:, None], other=0.0)
    daq_c = tl.load(dAqk + p_c, mask=m_j[:, None], other=0.0) * scale
    dal_c = tl.load(dL + p_c, mask=m_j[:, None], other=0.0)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_k = o_k < K
        mi = m_i[:, None] & m_k[None, :]
        mj = m_j[:, None] & m_k[None, :]
        q_i = _rows(q + qk, o_i, o_k, H * K, mi)
        k_i = _rows(k + qk, o_i, o_k, H * K, mi)
        g_i = _rows(G + gb, o_i, o_k, HV * K, mi)
        q_a = _rows(q + qk, o_j, o_k, H * K, mj)
        k_a = _rows(k + qk, o_j, o_k, H * K, mj)
        g_a = _rows(G + gb, o_j, o_k, HV * K, mj)
        g_r0 = tl.load(G + gb + r0 * (HV * K) + o_k, mask=m_k, other=0.0)
        g_r1 = tl.load(G + gb + r1 * (HV * K) + o_k, mask=m_k, other=0.0)
        # as row i: columns before the block, through row r0
        before = (o_j < r0)[:, None] & mj
        kb = k_a * tl.exp(tl.where(before, g_r0[None, :] - g_a, float("-inf")))
        e_i = tl.exp(tl.where(mi, g_i - g_r0[None, :], float("-inf")))
        da_q = e_i * tl.dot(daq_r, kb)
        da_k = e_i * tl.dot(dal_r, kb)
        # as column j: rows after the block, through row r1
        after = (o_j > r1)[:, None] & mj
        e_a = tl.exp(tl.where(after, g_a - g_r1[None, :], float("-inf")))
        e_j = tl.exp(tl.where(mi & (o_i <= r1)[:, None], g_r1[None, :] - g_i, float("-inf")))
        db = e_j * (tl.dot(tl.trans(daq_c), q_a * e_a) + tl.dot(tl.trans(dal_c), k_a * e_a))
        # the diagonal block, one row/column at a time
        for jj in range(BC):
            j = r0 + jj
            # (a scalar mask does not broadcast in the interpreter: compare vectors)
            ok_k = m_k & ((o_k * 0 + j) < T)
            ok_i = m_i & ((o_i * 0 + j) < T)
            q_c = tl.load(q + qk + j * (H * K) + o_k, mask=ok_k, other=0.0).to(tl.float32)
            k_c = tl.load(k + qk + j * (H * K) + o_k, mask=ok_k, other=0.0).to(tl.float32)
            g_c = tl.load(G + gb + j * (HV * K) + o_k, mask=ok_k, other=0.0)
            pcol = ab + o_i * (HV * BT) + i_c * BC + jj
            cq = tl.load(dAqk + pcol, mask=ok_i, other=0.0) * scale
            cl = tl.load(dL + pcol, mask=ok_i, other=0.0)
            e = tl.exp(tl.where(mi & (o_i >= j)[:, None], g_i - g_c[None, :], float("-inf")))
            ke = k_c[None, :] * e
            da_q += cq[:, None] * ke
            da_k += cl[:, None] * ke
            prow = ab + j * (HV * BT) + o_cb
            rq = tl.load(dAqk + prow, mask=ok_i, other=0.0) * scale
            rl = tl.load(dL + prow, mask=ok_i, other=0.0)
            m2 = mi & ((o_i <= j) & ok_i)[:, None]
            e2 = tl.exp(tl.where(m2, g_c[None, :] - g_i, float("-inf")))
            db += (rq[:, None] * q_c[None, :] + rl[:, None] * k_c[None, :]) * e2
        p = gb + o_i[:, None] * (HV * K) + o_k[None, :]
        tl.store(dq + p, tl.load(dq + p, mask=mi, other=0.0) + da_q, mask=mi)
        tl.store(dk + p, tl.load(dk + p, mask=mi, other=0.0) + da_k + db, mask=mi)
        d_g = q_i * da_q + k_i * (da_k - db)
        tl.store(dG + p, tl.load(dG + p, mask=mi, other=0.0) + d_g, mask=mi)


@triton.jit
def _gate_bwd_kernel(dG, g, a_log, dt_bias, dg, da_part, lower_bound, T, NT,
                     HV: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     GATE: tl.constexpr, HAS_A: tl.constexpr, HAS_BIAS: tl.constexpr,
                     LOWER: tl.constexpr):
    """Stage B4: the chunk sums' gradient (a reverse cumulative sum), then through the
    in-op gate: ``dg`` for the raw input and one partial sum of ``dA_log`` per program."""
    i_n, i_k, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_hv = i_bh // HV, i_bh % HV
    o_t = i_n * BT + tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    m = (o_t[:, None] < T) & (o_k[None, :] < K)
    off = (i_b.to(tl.int64) * T * HV + i_hv) * K + o_t[:, None] * (HV * K) + o_k[None, :]
    x = tl.load(dG + off, mask=m, other=0.0)
    dy = tl.sum(x, 0)[None, :] - tl.cumsum(x, 0) + x
    if GATE:
        z = tl.load(g + off, mask=m, other=0.0).to(tl.float32)
        if HAS_BIAS:
            z += tl.load(dt_bias + i_hv * K + o_k, mask=o_k < K, other=0.0).to(tl.float32)[None, :]
        a = 0.0
        if HAS_A:
            a = tl.load(a_log + i_hv).to(tl.float32)
        if LOWER:
            s = z
            if HAS_A:
                s = tl.exp(a) * z
            sg = tl.sigmoid(s)
            slope = lower_bound * sg * (1.0 - sg)
            dx = dy * slope
            da = dy * slope * s
            if HAS_A:
                dx = dx * tl.exp(a)
        else:
            y = _gate_value(z, a, lower_bound, HAS_A, LOWER)
            dx = -dy * tl.exp(a) * tl.sigmoid(z)
            da = dy * y
        tl.store(dg + off, dx, mask=m)
        nk = tl.cdiv(K, BK)
        tl.store(da_part + (i_bh * NT + i_n) * nk + i_k, tl.sum(tl.sum(tl.where(m, da, 0.0), 1), 0))
    else:
        tl.store(dg + off, dy, mask=m)


# -- launchers ------------------------------------------------------------------------------
#: Tiles and launch settings per kernel. Chosen so that every kernel compiles for sm_90
#: without register spills (or nearly) at K = 128, V = 256 (``tools/compile_kda.py``
#: prints registers, spill stack and shared memory per kernel without a GPU); not yet
#: tuned by timing. ``BK`` / ``BV`` are upper bounds (smaller heads use smaller tiles);
#: the scans hold all of K, and their V-block shrinks so the state tile keeps at most
#: ``STATE`` elements (K = 256 spills at BV = 32). The interpreter ignores num_warps and
#: num_stages.
LAUNCH: dict[str, dict[str, int]] = {
    "_gate_cumsum_kernel": dict(BK=64, num_warps=4),
    "_intra_fwd_kernel": dict(BK=32, num_warps=4),
    "_solve_fwd_kernel": dict(BK=32, BV=32, num_warps=8),
    "_scan_fwd_kernel": dict(BV=32, STATE=4096, num_warps=8, num_stages=1),
    "_scan_bwd_kernel": dict(BV=32, STATE=4096, num_warps=8, num_stages=1),
    "_dv_bwd_kernel": dict(BV=32, num_warps=8),
    "_dk_bwd_kernel": dict(BK=64, BV=32, num_warps=8),
    "_dm_bwd_kernel": dict(num_warps=8),
    "_intra_bwd_kernel": dict(BK=32, num_warps=8),
    "_gate_bwd_kernel": dict(BK=64, num_warps=4),
}


def set_launch(overrides: dict[str, dict[str, int]]) -> None:
    """Change LAUNCH settings (for tuning on a GPU without editing this file), e.g.
    ``{"_scan_fwd_kernel": {"BV": 64, "num_warps": 4}}``; also read as JSON from the
    ``KERNEL_FUN_KDA_LAUNCH`` environment variable at import. Unknown kernels or keys
    raise ValueError naming the known ones."""
    for name, settings in overrides.items():
        if name not in LAUNCH:
            raise ValueError(f"no kernel {name!r} in LAUNCH; known: {sorted(LAUNCH)}")
        allowed = set(LAUNCH[name]) | {"num_warps", "num_stages"}
        bad = sorted(set(settings) - allowed)
        if bad:
            raise ValueError(f"{name} takes {sorted(allowed)}, not {bad}")
        if not all(isinstance(v, int) and v > 0 for v in settings.values()):
            raise ValueError(f"{name}: settings must be positive integers, got {settings}")
    for name, settings in overrides.items():
        LAUNCH[name].update(settings)


if os.environ.get("KERNEL_FUN_KDA_LAUNCH"):
    set_launch(json.loads(os.environ["KERNEL_FUN_KDA_LAUNCH"]))


def launch_settings(kernel, K: int, V: int, toolchain=None) -> dict[str, int]:
    """A kernel's LAUNCH settings for head sizes K and V: tiles clipped to them (at least
    16), a V-block small enough for the state tile, BK = all of K for a kernel that holds
    the whole state (it has BK but no BK setting), plus num_warps / num_stages; under a
    ``toolchain`` (:class:`kernel_fun._toolchain.Toolchain`), steered around the
    configurations its known-bad table rules out (LookupError when none is left)."""
    cfg = _clipped(kernel, K, V)
    if toolchain is not None:
        name = kernel.fn.__name__
        cfg, avoided = _toolchain.steer("chunk_kda", name, cfg, toolchain, _pow2(K))
        if avoided is not None:
            _support.log_once(("steer", name, toolchain), logging.INFO,
                              "kernel-fun chunk_kda: %s runs with %s instead of LAUNCH's "
                              "settings: %s (%s)", name, cfg, avoided["why"], avoided["source"])
    return cfg


def launch_problem(K: int, V: int, toolchain) -> str | None:
    """Why some kernel has no launch the known-bad table allows at head sizes K, V."""
    if not _toolchain.launch_entries("chunk_kda", toolchain):  # the usual case, every call
        return None
    for name in LAUNCH:
        try:
            launch_settings(globals()[name], K, V, toolchain)
        except LookupError as exc:
            return str(exc)
    return None


def _clipped(kernel, K: int, V: int) -> dict[str, int]:
    cfg = dict(LAUNCH[kernel.fn.__name__])
    state = cfg.pop("STATE", None)
    if "BK" in cfg:
        cfg["BK"] = min(cfg["BK"], _pow2(K))
    elif "BK" in kernel.arg_names:
        cfg["BK"] = _pow2(K)
    if "BV" in cfg:
        cfg["BV"] = min(cfg["BV"], _pow2(V))
        if state is not None:
            cfg["BV"] = min(cfg["BV"], max(16, state // _pow2(K)))
    return cfg


def _launch(kernel, grid, *args, K: int, V: int = 16, **consts):
    """``kernel[grid](*args, **consts)`` with its :func:`launch_settings` (K and V are
    passed on to the kernels that take them)."""
    device = next(a.device for a in args if isinstance(a, torch.Tensor))
    cfg = launch_settings(kernel, K, V, _toolchain.current(device))
    for name, value in (("K", K), ("V", V)):
        if name in kernel.arg_names:
            consts[name] = value
    grid = grid(cfg) if callable(grid) else grid
    kernel[grid](*args, **consts, **cfg)


def gate_cumsum(g, a_log, dt_bias, lower_bound, gate: bool) -> torch.Tensor:
    """Stage F0 (fp32 ``[B, T, HV, K]``)."""
    B, T, HV, K = g.shape
    out = torch.empty(B, T, HV, K, device=g.device, dtype=torch.float32)
    _launch(_gate_cumsum_kernel, lambda c: (triton.cdiv(T, BT), triton.cdiv(K, c["BK"]), B * HV),
            g, a_log if a_log is not None else g, dt_bias if dt_bias is not None else g, out,
            float(lower_bound) if lower_bound is not None else 0.0, T, K=K, HV=HV, BT=BT,
            GATE=gate, HAS_A=a_log is not None, HAS_BIAS=dt_bias is not None,
            LOWER=lower_bound is not None)
    return out


def forward(q, k, v, G, beta, scale, h0, output_final_state, keep_states=False):
    """Stages F1-F3. Returns ``(o, ht, saved)`` with saved = (Aqk, L, X, w, u, qg, kd, gc):
    the intra-chunk matrices in float32, the scans' operands in q's dtype; with
    ``keep_states`` (fla's ``disable_recompute``) also the states entering each chunk and
    delta, so that the backward need not run the scan again (B0)."""
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT = triton.cdiv(T, BT)
    f32 = dict(device=q.device, dtype=torch.float32)
    op = dict(device=q.device, dtype=q.dtype)
    Aqk = torch.empty(B, T, HV, BT, **f32)
    Lm = torch.empty(B, T, HV, BT, **f32)
    _launch(_intra_fwd_kernel, (NT, BT // BC, B * HV), q, k, G, Aqk, Lm, scale, T,
            K=K, H=H, HV=HV, BT=BT, BC=BC)
    X = torch.empty(B, T, HV, BT, **f32)
    w, qg, kd = (torch.empty(B, T, HV, K, **op) for _ in range(3))
    u = torch.empty(B, T, HV, V, **op)
    gc = torch.empty(B, NT, HV, K, **f32)
    _launch(_solve_fwd_kernel, (NT, B * HV), q, k, v, G, beta, Lm, X, w, u, qg, kd, gc, scale,
            T, NT, K=K, V=V, H=H, HV=HV, BT=BT, BC=BC)
    o = torch.empty(B, T, HV, V, **op)
    ht = torch.empty(B, HV, K, V, **f32) if output_final_state else None
    kept = ()
    if keep_states:
        kept = (torch.empty(B, NT, HV, K, V, **op), torch.empty(B, T, HV, V, **op))
    _launch(_scan_fwd_kernel, lambda c: (triton.cdiv(V, c["BV"]), B * HV),
            qg, kd, gc, w, u, Aqk, h0 if h0 is not None else gc, o,
            ht if ht is not None else gc, *(kept or (o, o)), T, NT, V=V, HV=HV, K=K, BT=BT,
            HAS_H0=h0 is not None, STORE_FINAL=ht is not None, OUTPUT=True,
            SAVE=keep_states)
    return o, ht, (Aqk, Lm, X, w, u, qg, kd, gc, *kept)


def backward(q, k, v, G, beta, scale, h0, saved, do, dht):
    """Stages B0-B3. Returns per-value-head fp32 ``dq, dk`` (``[B, T, HV, K]``), ``dv``,
    ``dG`` (the gradient of the chunk sums), ``dbeta`` and ``dh0``."""
    Aqk, Lm, X, w, u, qg, kd, gc, *kept = saved
    B, T, H, K = q.shape
    HV, V = v.shape[2], v.shape[3]
    NT = triton.cdiv(T, BT)
    f32 = dict(device=q.device, dtype=torch.float32)
    op = dict(device=q.device, dtype=q.dtype)

    def grid_v(c):
        return (triton.cdiv(V, c["BV"]), B * HV)

    if kept:
        h, dlt = kept
    else:
        h = torch.empty(B, NT, HV, K, V, **op)
        dlt = torch.empty(B, T, HV, V, **op)
        _launch(_scan_fwd_kernel, grid_v, qg, kd, gc, w, u, Aqk, h0 if h0 is not None else gc,
                gc, gc, h, dlt, T, NT, V=V, HV=HV, K=K, BT=BT,
                HAS_H0=h0 is not None, STORE_FINAL=False, OUTPUT=False, SAVE=True)
    dh = torch.empty(B, NT, HV, K, V, **op)
    dd = torch.empty(B, T, HV, V, **op)
    dh0 = torch.empty(B, HV, K, V, **f32) if h0 is not None else None
    _launch(_scan_bwd_kernel, grid_v, qg, kd, gc, w, Aqk, do, dht if dht is not None else gc,
            dh, dd, dh0 if dh0 is not None else gc, T, NT, V=V, HV=HV, K=K, BT=BT,
            HAS_DHT=dht is not None, HAS_H0=dh0 is not None)
    dv = torch.empty(B, T, HV, V, **f32)
    dAqk = torch.empty(B, T, HV, BT, **f32)
    dX = torch.empty(B, T, HV, BT, **f32)
    dbeta = torch.empty(B, T, HV, **f32)
    _launch(_dv_bwd_kernel, (NT, B * HV), v, beta, X, dlt, dd, do, dv, dAqk, dX, dbeta, T,
            K=K, V=V, HV=HV, BT=BT)
    dq, dk, dG = (torch.empty(B, T, HV, K, **f32) for _ in range(3))
    nk = triton.cdiv(K, launch_settings(_dk_bwd_kernel, K, V)["BK"])
    dXp = torch.empty(B, T, HV, nk, BT, **f32)
    dbp = torch.empty(B, T, HV, nk, **f32)
    _launch(_dk_bwd_kernel, lambda c: (NT, triton.cdiv(K, c["BK"]), B * HV), q, k, G, beta, X,
            h, dh, dlt, dd, do, dq, dk, dG, dXp, dbp, scale, T, NT, K=K, V=V, H=H, HV=HV, BT=BT)
    dL = torch.empty(B, T, HV, BT, **f32)
    _launch(_dm_bwd_kernel, (NT, B * HV), beta, X, Lm, dX, dXp, dbp, dL, dbeta, T, K=K,
            HV=HV, BT=BT, NK=nk)
    _launch(_intra_bwd_kernel, (NT, BT // BC, B * HV), q, k, G, dAqk, dL, dq, dk, dG, scale,
            T, K=K, H=H, HV=HV, BT=BT, BC=BC)
    return dq, dk, dv, dG, dbeta, dh0


def gate_backward(dG, g, a_log, dt_bias, lower_bound, gate: bool):
    """Stage B4: ``(dg, dA_log or None)``."""
    B, T, HV, K = dG.shape
    NT = triton.cdiv(T, BT)
    nk = triton.cdiv(K, launch_settings(_gate_bwd_kernel, K, 16)["BK"])
    dg = torch.empty_like(dG)
    da = torch.zeros(B * HV * NT * nk, device=dG.device, dtype=torch.float32)
    _launch(_gate_bwd_kernel, (NT, nk, B * HV),
            dG, g, a_log if a_log is not None else g, dt_bias if dt_bias is not None else g, dg,
            da, float(lower_bound) if lower_bound is not None else 0.0, T, NT, K=K, HV=HV, BT=BT,
            GATE=gate, HAS_A=a_log is not None, HAS_BIAS=dt_bias is not None,
            LOWER=lower_bound is not None)
    d_alog = da.view(B, HV, -1).sum((0, 2)) if gate and a_log is not None else None
    return dg, d_alog


# -- autograd -------------------------------------------------------------------------------
_L2_EPS = 1e-6


def _l2norm(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``x / sqrt(|x|^2 + eps)`` over the last dimension (in x's dtype), and the fp32 rstd."""
    xf = x.float()
    rstd = torch.rsqrt(xf.pow(2).sum(-1, keepdim=True) + _L2_EPS)
    return (xf * rstd).to(x.dtype), rstd


def _l2norm_bwd(y: torch.Tensor, rstd: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    yf = y.float()
    return rstd * (dy - yf * (dy * yf).sum(-1, keepdim=True))


def _on(device: torch.device):
    """The device's CUDA context (kernels launch on the inputs' GPU), or nothing on CPU."""
    return torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()


class ChunkKDA(torch.autograd.Function):
    """chunk_kda's supported box (see op.py); inputs already checked by the gate."""

    @staticmethod
    def forward(ctx, q, k, v, g, beta, A_log, dt_bias, scale, initial_state, output_final_state,
                use_qk_l2norm, use_gate, use_beta_sigmoid, allow_neg_eigval, lower_bound,
                state_v_first, keep_states=False, warm_key=None):
        with _on(q.device):
            q_in, k_in = q, k
            q_rstd = k_rstd = None
            if use_qk_l2norm:
                q, q_rstd = _l2norm(q)
                k, k_rstd = _l2norm(k)
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
            b = beta.float()
            if use_beta_sigmoid:
                b = torch.sigmoid(b) * (2.0 if allow_neg_eigval else 1.0)
            b = b.contiguous()
            g = g.contiguous()
            a_log = A_log.contiguous() if use_gate and A_log is not None else None
            bias = dt_bias.contiguous() if use_gate and dt_bias is not None else None
            lb = lower_bound if use_gate else None
            G = gate_cumsum(g, a_log, bias, lb, use_gate)
            h0 = None
            if initial_state is not None:
                h0 = initial_state.transpose(-1, -2) if state_v_first else initial_state
                h0 = h0.float().contiguous()
            o, ht, saved = forward(q, k, v, G, b, scale, h0, output_final_state, keep_states)
            if ht is not None and state_v_first:
                ht = ht.transpose(-1, -2).contiguous()
        ctx.save_for_backward(q_in, k_in, q, k, v, g, beta, b, a_log, bias, G, h0, *saved)
        ctx.q_rstd, ctx.k_rstd = q_rstd, k_rstd
        ctx.opts = (scale, use_qk_l2norm, use_gate, use_beta_sigmoid, allow_neg_eigval, lb,
                    state_v_first)
        ctx.has_h0 = initial_state is not None
        ctx.dtypes = (g.dtype, beta.dtype)
        ctx.param_dtypes = (A_log.dtype if a_log is not None else None,
                            dt_bias.dtype if bias is not None else None)
        ctx.warm_key = warm_key
        if warm_key is not None:
            _support.mark_warm(("fwd", *warm_key))
        return o, ht

    @staticmethod
    def backward(ctx, do, dht):
        (q_in, k_in, q, k, v, g, beta_raw, b, a_log, bias, G, h0, *saved) = ctx.saved_tensors
        scale, use_qk_l2norm, use_gate, use_beta_sigmoid, allow_neg, lb, v_first = ctx.opts
        B, T, H, K = q.shape
        HV = v.shape[2]
        with _on(q.device):
            do = do.contiguous()
            if dht is not None:
                dht = (dht.transpose(-1, -2) if v_first else dht).float().contiguous()
            dq, dk, dv, dG, db, dh0 = backward(q, k, v, G, b, scale, h0, saved, do, dht)
            dg, d_alog = gate_backward(dG, g, a_log, bias, lb, use_gate)
            dq = dq.view(B, T, H, HV // H, K).sum(3)
            dk = dk.view(B, T, H, HV // H, K).sum(3)
            if use_qk_l2norm:
                dq = _l2norm_bwd(q, ctx.q_rstd, dq)
                dk = _l2norm_bwd(k, ctx.k_rstd, dk)
            if use_beta_sigmoid:
                s = torch.sigmoid(beta_raw.float())
                db = db * s * (1.0 - s) * (2.0 if allow_neg else 1.0)
            d_bias = dg.sum((0, 1)).reshape(-1) if use_gate and bias is not None else None
            if dh0 is not None and v_first:
                dh0 = dh0.transpose(-1, -2).contiguous()
        if d_alog is not None:
            d_alog = d_alog.to(ctx.param_dtypes[0])
        if d_bias is not None:
            d_bias = d_bias.to(ctx.param_dtypes[1])
        if ctx.warm_key is not None:
            _support.mark_warm(("bwd", *ctx.warm_key))
        return (dq.to(q_in.dtype), dk.to(k_in.dtype), dv.to(v.dtype), dg.to(ctx.dtypes[0]),
                db.to(ctx.dtypes[1]), d_alog, d_bias, None, dh0 if ctx.has_h0 else None,
                None, None, None, None, None, None, None, None, None)
