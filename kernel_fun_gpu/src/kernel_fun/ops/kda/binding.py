"""chunk_kda inside fla's backend mechanism: fla's ``chunk_kda`` is a dispatching entry
point, so kernel-fun registers its own path against it with a verifier that is the same
gate as :func:`kernel_fun.ops.kda.is_supported` followed by the self-check (calls either
rejects run fla's)."""

from __future__ import annotations

from typing import Any

__all__ = ["backend_targets"]


def _chunk_kda(*args: Any, **kwargs: Any) -> Any:
    from kernel_fun.ops.kda.op import run

    return run(*args, **kwargs)


def _verifier(*args: Any, **kwargs: Any) -> tuple[bool, str]:
    from kernel_fun.ops.kda.op import _SIGNATURE, is_supported, self_check

    ok, reason = is_supported(*args, **kwargs)
    if ok:  # and the self-check for this kind of call on this device
        bound = _SIGNATURE.bind(*args, **kwargs)
        bound.apply_defaults()
        named = dict(bound.arguments)
        failed = self_check(named, named.pop("kwargs"))
        if failed is not None:
            return False, failed
    return ok, reason


def backend_targets() -> list[tuple[Any, Any, Any]] | None:
    """``[(fla's chunk_kda, ours, verifier)]``, or None when the installed fla has none."""
    try:
        from fla.ops.kda import chunk
    except ImportError:
        return None
    fn = getattr(chunk, "chunk_kda", None)
    return None if fn is None else [(fn, _chunk_kda, _verifier)]
