"""``causal_conv1d``: kernel-fun's drop-in for fla's (see :mod:`kernel_fun.ops.cconv.op`).

``op`` (the public function, its gate and warm-up), ``_triton`` (the kernels and their
autograd Function), ``reference`` (plain PyTorch), ``binding`` (fla's backend hooks).
Names resolve on first use, so importing the package imports neither torch nor triton.
"""

from __future__ import annotations

from kernel_fun.ops import lazy_attributes

__all__ = ["causal_conv1d", "fla_probe", "is_supported", "reference_causal_conv1d", "warmup"]

_WHERE = {"causal_conv1d": "op", "fla_probe": "op", "is_supported": "op", "warmup": "op",
          "FLA_PARAMETERS": "op", "reference_causal_conv1d": "reference"}

__getattr__ = lazy_attributes(__name__, _WHERE)
