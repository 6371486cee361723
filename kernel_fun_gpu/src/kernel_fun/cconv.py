"""``from kernel_fun.cconv import causal_conv1d`` (the op lives in :mod:`kernel_fun.ops.cconv`)."""

from __future__ import annotations

from kernel_fun.ops.cconv.op import FLA_PARAMETERS, causal_conv1d, fla_probe, is_supported, warmup
from kernel_fun.ops.cconv.reference import reference_causal_conv1d

__all__ = ["FLA_PARAMETERS", "causal_conv1d", "fla_probe", "is_supported",
           "reference_causal_conv1d", "warmup"]
