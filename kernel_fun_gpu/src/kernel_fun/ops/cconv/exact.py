"""fla's whole ``causal_conv1d`` in plain PyTorch: for the calls where fla's own kernels
give a wrong answer, so that forwarding them would hand the caller fla's bug.

fla-core 0.6.0's backward drops the gradient that reaches ``x`` through
``final_state[..., 0]`` (it holds ``x[T - W]``, which no output ``y`` reads), so a call
with ``output_final_state=True`` that needs gradients is computed here. Every argument
keeps fla's meaning: ``initial_state [N, D, W]`` holds the ``W`` inputs before each
sequence (``initial_state[..., W - k]`` is ``x[-k]``), ``final_state`` is the last ``W``
entries of ``[initial_state; x]`` per sequence, the residual is added after the
activation. Sums run in float32 (fla's accumulator); outputs come back in ``x``'s dtype.
Autograd differentiates it, so every gradient is the exact one of this definition.
"""

from __future__ import annotations

import torch

__all__ = ["causal_conv1d_exact", "why_exact"]


def why_exact(output_final_state: bool | None, needs_grad: bool, weight: object) -> str | None:
    """Why this call must not go to fla's kernels (None: fla's answer is right)."""
    if output_final_state and needs_grad and weight is not None:
        return ("output_final_state=True with gradients: fla-core 0.6.0's backward drops the "
                "gradient of final_state[..., 0] (x[T-W]), so kernel-fun computes this call in "
                "plain PyTorch (float32 sums), exactly and more slowly.")
    return None


def _starts(cu_seqlens: torch.Tensor, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each packed position: its sequence's index and first position."""
    cu = cu_seqlens.to(torch.long)
    counts = cu[1:] - cu[:-1]
    seq = torch.repeat_interleave(torch.arange(len(counts), device=cu.device), counts)
    if seq.numel() != length:
        raise ValueError(f"cu_seqlens ends at {int(cu[-1])} but x holds {length} time steps "
                         "over its rows; give cu_seqlens of the packed sequence.")
    return seq, cu[:-1][seq]


def _taps(x: torch.Tensor, h0: torch.Tensor | None, seq: torch.Tensor, lo: torch.Tensor,
          positions: torch.Tensor) -> torch.Tensor:
    """``x`` at ``positions`` ([P] absolute, packed), or the initial state where a position
    lies before its sequence's start (zero without one): ``[P, D]``."""
    inside = positions >= lo
    taken = x[positions.clamp(min=0, max=x.shape[0] - 1)]
    if h0 is None:
        before = torch.zeros_like(taken)
    else:
        W = h0.shape[-1]
        before = h0[seq, :, (W + positions - lo).clamp(0, W - 1)]
    return torch.where(inside[:, None], taken, before)


def causal_conv1d_exact(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    residual: torch.Tensor | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool | None = False,
    activation: str | None = None,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's ``causal_conv1d`` (``backend="triton"``) by its definition: ``(y, final_state)``."""
    if activation not in (None, "silu", "swish"):
        raise ValueError(f"activation={activation!r}: fla takes 'silu', 'swish' or None.")
    shape = x.shape
    D, W = weight.shape
    if cu_seqlens is None:  # each row its own sequence
        B, T = shape[0], shape[1]
        cu_seqlens = torch.arange(0, (B + 1) * T, T, device=x.device)
    flat = x.reshape(-1, D).float()
    L = flat.shape[0]
    seq, lo = _starts(cu_seqlens.to(x.device), L)
    h0 = None if initial_state is None else initial_state.float()
    t = torch.arange(L, device=x.device)
    w = weight.float()
    y = torch.zeros_like(flat)
    for j in range(W):  # y[t] = sum_j w[:, j] * x[t - (W - 1) + j]
        y = y + w[:, j] * _taps(flat, h0, seq, lo, t - (W - 1) + j)
    if bias is not None:
        y = y + bias.float()
    if activation is not None:
        y = torch.nn.functional.silu(y)
    if residual is not None:
        y = y + residual.reshape(-1, D).float()
    final = None
    if output_final_state:
        cu = cu_seqlens.to(device=x.device, dtype=torch.long)
        N = len(cu) - 1
        ends = cu[1:]
        per = torch.arange(N, device=x.device)
        columns = [_taps(flat, h0, per, cu[:-1], ends - W + k) for k in range(W)]  # [N, D] each
        final = torch.stack(columns, dim=-1).to(x.dtype)  # [N, D, W]
    return y.to(x.dtype).reshape(shape), final
