"""causal_conv1d inside fla's backend mechanism: what kernel-fun registers against
``causal_conv1d_fwd`` and ``causal_conv1d_bwd``, with verifiers that are the same gate as
:func:`kernel_fun.ops.cconv.is_supported` followed by the self-check (fla's own autograd
Function stays in place; calls a verifier rejects run fla's kernels)."""

from __future__ import annotations

from typing import Any

__all__ = ["backend_targets"]


def _fwd(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False,
         activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
         chunk_size=64, layout_fallback=False):
    from kernel_fun import _support
    from kernel_fun.ops.cconv import _triton as k

    w = weight.contiguous()
    y = k.forward(x, w)
    _support.mark_warm(("fwd", *_support.shape_key(x, w)))
    return y, None


def _fwd_verifier(x, weight, bias=None, residual=None, initial_state=None,
                  output_final_state=False, activation=None, cu_seqlens=None,
                  cu_seqlens_cpu=None, chunk_indices=None, chunk_size=64, layout_fallback=False):
    return _gate(x, weight, bias, residual, initial_state, output_final_state, activation,
                 cu_seqlens, cu_seqlens_cpu, chunk_indices, need_grad=None)


def _gate(x, weight, bias, residual, initial_state, output_final_state, activation,
          cu_seqlens, cu_seqlens_cpu, chunk_indices, need_grad):
    """The op's gate, then its self-check (the backward's kind: with gradients)."""
    from kernel_fun.ops.cconv.op import is_supported, self_check

    ok, reason = is_supported(x, weight, bias, residual, initial_state, output_final_state,
                              activation, "triton", cu_seqlens, cu_seqlens_cpu, chunk_indices)
    failed = self_check(x, weight, need_grad) if ok else None
    return (False, failed) if failed is not None else (ok, reason)


def _bwd(x, dy, dht, weight=None, bias=None, residual=None, initial_state=None,
         activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
         chunk_size=64, layout_fallback=False):
    from kernel_fun import _support
    from kernel_fun.ops.cconv import _triton as k

    w = weight.contiguous()
    dx, dw = k.backward(x, w, dy)
    _support.mark_warm(("bwd", *_support.shape_key(x, w)))
    return dx, dw.to(weight), None, None, None


def _bwd_verifier(x, dy, dht, weight=None, bias=None, residual=None, initial_state=None,
                  activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                  chunk_size=64, layout_fallback=False):
    if dht is not None:
        return False, "a final-state gradient is given: kernel-fun does not implement it."
    return _gate(x, weight, bias, residual, initial_state, False, activation, cu_seqlens,
                 cu_seqlens_cpu, chunk_indices, need_grad=True)


def backend_targets() -> list[tuple[Any, Any, Any]] | None:
    """``[(fla function, ours, verifier)]`` for fla's dispatching forward and backward, or
    None when the installed fla has no such functions."""
    try:
        from fla.modules.causal_conv1d import ops
    except ImportError:
        return None
    fwd, bwd = getattr(ops, "causal_conv1d_fwd", None), getattr(ops, "causal_conv1d_bwd", None)
    if fwd is None or bwd is None:
        return None
    return [(fwd, _fwd, _fwd_verifier), (bwd, _bwd, _bwd_verifier)]
