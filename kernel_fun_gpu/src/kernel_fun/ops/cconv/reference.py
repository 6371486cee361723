"""The plain-PyTorch reference of kernel-fun's causal_conv1d (what the tests compare with,
beside fla's own op)."""

from __future__ import annotations

import torch

__all__ = ["TOLERANCE", "reference_causal_conv1d"]

#: fla's tolerances for a Triton op against its plain reference (RMS ratio), by dtype: what
#: the self-checks (the op's and each autotuner configuration's) allow.
TOLERANCE = {torch.float32: 1e-4, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def reference_causal_conv1d(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Plain PyTorch ``silu(causal depthwise conv1d)`` in float32 (for tests): ``[B, T, D]``."""
    B, T, D = x.shape
    W = weight.shape[1]
    z = torch.nn.functional.conv1d(
        x.float().transpose(1, 2), weight.float().unsqueeze(1), padding=W - 1, groups=D
    )[..., :T]
    return torch.nn.functional.silu(z).transpose(1, 2)
