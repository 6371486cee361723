"""Kimi Delta Attention in plain PyTorch, one step at a time (float32, differentiable).

The ground truth the Triton kernels are tested against, with the in-op options of
``chunk_kda`` spelled out: per (batch, value head), with ``q`` scaled by ``scale``,

    S <- S * exp(g_t)[:, None]                      (a decay per key dimension)
    S <- S + beta_t k_t (v_t - S^T k_t)^T           (the delta rule)
    o_t = S^T q_t

``S`` is ``[K, V]`` (``[V, K]`` outside when ``state_v_first``). Slow (a Python loop over
time): for tests and small checks only.
"""

from __future__ import annotations

import torch

__all__ = ["gate", "reference_chunk_kda"]

_L2_EPS = 1e-6


def gate(g: torch.Tensor, A_log: torch.Tensor | None, dt_bias: torch.Tensor | None,
         lower_bound: float | None = None) -> torch.Tensor:
    """The in-op gate (float32): ``-exp(A_log) * softplus(g + dt_bias)``, or with
    ``lower_bound``: ``lower_bound * sigmoid(exp(A_log) * (g + dt_bias))``
    (``lower_bound * sigmoid(g + dt_bias)`` when ``A_log`` is None)."""
    HV, K = g.shape[-2:]
    x = g.float()
    if dt_bias is not None:
        x = x + dt_bias.float().view(HV, K)
    if lower_bound is not None:
        if A_log is not None:
            x = A_log.float().exp().view(HV, 1) * x
        return lower_bound * torch.sigmoid(x)
    return -A_log.float().exp().view(HV, 1) * torch.nn.functional.softplus(x)


def reference_chunk_kda(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    lower_bound: float | None = None,
    state_v_first: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(o, final_state)`` as ``chunk_kda`` returns them (o in q's dtype; the state in
    float32), for ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g [B, T, HV, K]``,
    ``beta [B, T, HV]``."""
    B, T, H, K = q.shape
    HV = v.shape[2]
    group = HV // H
    scale = K ** -0.5 if scale is None else scale
    qf, kf = q.float(), k.float()
    if use_qk_l2norm_in_kernel:
        qf = qf * torch.rsqrt(qf.pow(2).sum(-1, keepdim=True) + _L2_EPS)
        kf = kf * torch.rsqrt(kf.pow(2).sum(-1, keepdim=True) + _L2_EPS)
    qf = qf.repeat_interleave(group, dim=2) * scale
    kf = kf.repeat_interleave(group, dim=2)
    gf = gate(g, A_log, dt_bias, lower_bound) if use_gate_in_kernel else g.float()
    bf = beta.float()
    if use_beta_sigmoid_in_kernel:
        bf = torch.sigmoid(bf) * (2.0 if allow_neg_eigval else 1.0)
    S = q.new_zeros(B, HV, K, v.shape[-1], dtype=torch.float32)
    if initial_state is not None:
        S = S + (initial_state.transpose(-1, -2) if state_v_first else initial_state).float()
    outs = []
    for t in range(T):
        S = S * gf[:, t].exp().unsqueeze(-1)
        k_t = kf[:, t]
        err = v[:, t].float() - torch.einsum("bhk,bhkv->bhv", k_t, S)
        S = S + torch.einsum("bhk,bhv->bhkv", k_t * bf[:, t].unsqueeze(-1), err)
        outs.append(torch.einsum("bhk,bhkv->bhv", qf[:, t], S))
    o = torch.stack(outs, dim=1).to(q.dtype)
    if not output_final_state:
        return o, None
    return o, (S.transpose(-1, -2) if state_v_first else S)
