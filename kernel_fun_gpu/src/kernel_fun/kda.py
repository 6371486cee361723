"""``from kernel_fun.kda import chunk_kda`` (the op lives in :mod:`kernel_fun.ops.kda`)."""

from __future__ import annotations

from kernel_fun.ops.kda.op import FLA_PARAMETERS, chunk_kda, fla_probe, is_supported, warmup
from kernel_fun.ops.kda.reference import reference_chunk_kda

__all__ = ["FLA_PARAMETERS", "chunk_kda", "fla_probe", "is_supported", "reference_chunk_kda",
           "warmup"]
