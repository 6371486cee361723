"""kernel-fun's plugin for Diffract: every op of :data:`kernel_fun.ops.RECORDS` through
the ``diffract_ops`` hook.

Loaded only by Diffract's plugin manager; importing it imports neither torch, triton nor
fla (each op's functions are imported on their first call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from diffract.plugins import OpSpec, hookimpl
from kernel_fun.ops import RECORDS, OpRecord


def _lazy(op: OpRecord, what: str) -> Callable[..., Any]:
    """A function calling ``what`` of ``op`` (ours: "public", "is_supported"; fla's:
    "reference"), imported when first called."""

    def call(*args: Any, **kwargs: Any) -> Any:
        if what == "reference":
            from kernel_fun.adopt import original

            fn = original(op.name)
        elif what == "public":
            fn = op.public()
        else:
            fn = op.load(what)
        return fn(*args, **kwargs)

    call.__name__ = f"{op.name}_{what}"
    return call


@hookimpl
def diffract_ops() -> Iterator[OpSpec]:
    for op in RECORDS:
        yield OpSpec(
            name=op.name,
            implementation=_lazy(op, "public"),
            is_supported=_lazy(op, "is_supported"),
            reference=_lazy(op, "reference"),
            priority=op.priority,
        )
