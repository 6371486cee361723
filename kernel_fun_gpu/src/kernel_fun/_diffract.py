"""kernel-fun's plugin for Diffract: its ops through the ``diffract_ops`` hook.

Loaded only by Diffract's plugin manager; importing it imports neither triton nor fla.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from diffract.plugins import OpSpec, hookimpl


def _fla_causal_conv1d(*args: Any, **kwargs: Any) -> Any:
    """fla's causal_conv1d (the reference), imported on first call."""
    from kernel_fun.adopt import original

    return original("causal_conv1d")(*args, **kwargs)


def _ours(*args: Any, **kwargs: Any) -> Any:
    from kernel_fun.cconv import causal_conv1d

    return causal_conv1d(*args, **kwargs)


def _supported(*args: Any, **kwargs: Any) -> tuple[bool, str]:
    from kernel_fun.cconv import is_supported

    return is_supported(*args, **kwargs)


@hookimpl
def diffract_ops() -> Iterator[OpSpec]:
    yield OpSpec(
        name="causal_conv1d",
        implementation=_ours,
        is_supported=_supported,
        reference=_fla_causal_conv1d,
        priority=10,
    )
