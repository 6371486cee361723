"""chunk_kda inside fla's backend mechanism: fla's ``chunk_kda`` is a dispatching entry
point, so kernel-fun registers its own path against it with a verifier that is the same
gate as :func:`kernel_fun.ops.kda.is_supported` (calls it rejects run fla's)."""

from __future__ import annotations

from typing import Any

__all__ = ["backend_targets"]


def _chunk_kda(*args: Any, **kwargs: Any) -> Any:
    from kernel_fun.ops.kda.op import run

    return run(*args, **kwargs)


def _verifier(*args: Any, **kwargs: Any) -> tuple[bool, str]:
    from kernel_fun.ops.kda.op import is_supported

    return is_supported(*args, **kwargs)


def backend_targets() -> list[tuple[Any, Any, Any]] | None:
    """``[(fla's chunk_kda, ours, verifier)]``, or None when the installed fla has none."""
    try:
        from fla.ops.kda import chunk
    except ImportError:
        return None
    fn = getattr(chunk, "chunk_kda", None)
    return None if fn is None else [(fn, _chunk_kda, _verifier)]
