"""Hook implementations: the ``heads``, ``qkv``, ``experts`` and ``conv`` view rules."""

from __future__ import annotations

from collections.abc import Iterator

from diffract.plugins import ViewRule, hookimpl
from diffract_views import rules


@hookimpl
def diffract_param_views() -> Iterator[ViewRule]:
    yield ViewRule("heads", rules.heads,
                   "attention weights per head: q/k/v by output rows (k, v by their own head "
                   "count), output projections by input columns, fused QKV per part and head",
                   check=rules.check, options=rules.HEAD_OPTIONS)
    yield ViewRule("qkv", rules.qkv,
                   "a fused QKV matrix in its q, k, v parts; gate_up_proj in gate and up",
                   check=rules.check, options=rules.HEAD_OPTIONS)
    yield ViewRule("experts", rules.experts,
                   "a 3-D MoE tensor [E, out, in] in its E matrices; a packed gate_up_proj "
                   "per expert in gate and up",
                   check=rules.check, options=("experts", "expert_layout", "gate_up"))
    yield ViewRule("conv", rules.conv,
                   "a convolution [out, in, kh, kw] per spatial position",
                   check=rules.check)
