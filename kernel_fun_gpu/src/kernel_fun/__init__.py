"""kernel-fun: Triton drop-ins for flash-linear-attention ops.

Importing this package is cheap: neither triton nor fla is imported until an op runs.

    from kernel_fun.cconv import causal_conv1d      # same contract as fla's
    from kernel_fun.kda import chunk_kda            # same contract as fla's
    import kernel_fun
    with kernel_fun.install():                       # adopt it inside fla
        ...
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

__all__ = ["__version__", "install"]


def install(mode: str = "auto") -> Any:
    """Adopt kernel-fun's ops inside fla; see :func:`kernel_fun.adopt.install`."""
    from kernel_fun.adopt import install as _install

    return _install(mode=mode)
