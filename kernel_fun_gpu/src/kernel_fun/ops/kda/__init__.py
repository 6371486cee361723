"""``chunk_kda``: kernel-fun's drop-in for fla's Kimi Delta Attention (see
:mod:`kernel_fun.ops.kda.op`, and DESIGN.md beside it for the kernels' stages).

``op`` (the public function, its gate and warm-up), ``_triton`` (the kernels and their
autograd Function), ``reference`` (plain PyTorch), ``binding`` (fla's backend hook).
Names resolve on first use, so importing the package imports neither torch nor triton.
"""

from __future__ import annotations

from kernel_fun.ops import lazy_attributes

__all__ = ["chunk_kda", "fla_probe", "is_supported", "reference_chunk_kda", "warmup"]

_WHERE = {"chunk_kda": "op", "fla_probe": "op", "is_supported": "op", "warmup": "op",
          "FLA_PARAMETERS": "op", "reference_chunk_kda": "reference"}

__getattr__ = lazy_attributes(__name__, _WHERE)
