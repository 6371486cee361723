"""causal_conv1d inside fla's backend mechanism: what kernel-fun registers against
``causal_conv1d_fwd`` and ``causal_conv1d_bwd``, with verifiers that are the same gate as
:func:`kernel_fun.ops.cconv.is_supported` followed by the self-check (fla's own autograd
Function stays in place; calls a verifier rejects run fla's kernels). A backward with a
final-state gradient, which fla-core 0.6.0 computes wrong, is computed by autograd over the
plain-PyTorch definition (:mod:`kernel_fun.ops.cconv.exact`)."""

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


def _exact_bwd(x, dy, dht, weight, bias, residual, initial_state, activation, cu_seqlens):
    """fla's backward, by autograd over :mod:`kernel_fun.ops.cconv.exact`: what fla-core
    0.6.0 gets wrong when a final-state gradient ``dht`` is given."""
    import torch

    from kernel_fun.ops.cconv.exact import causal_conv1d_exact

    leaves = [None if t is None else t.detach().requires_grad_()
              for t in (x, weight, bias, initial_state)]
    with torch.enable_grad():
        y, final = causal_conv1d_exact(leaves[0], leaves[1], leaves[2], None, leaves[3], True,
                                       activation, cu_seqlens)
        given = [t for t in leaves if t is not None]
        grads = iter(torch.autograd.grad((y, final), given, (dy.reshape(y.shape), dht),
                                         allow_unused=True))
    dx, dw, db, dh0 = (None if t is None else next(grads) for t in leaves)
    return dx, dw, db, dy if residual is not None else None, dh0


def _bwd(x, dy, dht, weight=None, bias=None, residual=None, initial_state=None,
         activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
         chunk_size=64, layout_fallback=False):
    from kernel_fun import _support
    from kernel_fun.ops.cconv import _triton as k

    if dht is not None:
        return _exact_bwd(x, dy, dht, weight, bias, residual, initial_state, activation,
                          cu_seqlens)

    w = weight.contiguous()
    dx, dw = k.backward(x, w, dy)
    _support.mark_warm(("bwd", *_support.shape_key(x, w)))
    return dx, dw.to(weight), None, None, None


def _bwd_verifier(x, dy, dht, weight=None, bias=None, residual=None, initial_state=None,
                  activation=None, cu_seqlens=None, cu_seqlens_cpu=None, chunk_indices=None,
                  chunk_size=64, layout_fallback=False):
    if dht is not None:  # fla-core 0.6.0 drops the part that reaches x through final_state[..., 0]
        if weight is None:
            return False, "a final-state gradient without a weight: fla's own backward runs."
        return True, ""
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
