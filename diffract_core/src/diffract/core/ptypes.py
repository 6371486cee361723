"""Parameter types: what kind of layer a parameter belongs to, and overrides at add time.

Every parameter gets a :class:`ParameterType` when its model is added: from its module
for a torch model (``nn.Linear`` and GPT-2's ``Conv1D`` are dense, or attention when
the name says so, never under a state-space ``mixer``/``mamba`` block; ``nn.Embedding``,
``nn.Conv*d``, normalisation layers), from its name and shape for a state dict or a
checkpoint file (a 3-D tensor is a convolution unless its name says experts: ``experts``,
GGUF's ``ffn_*_exps``; GGUF's ``token_embd`` is an embedding), so a
module and its saved state dict get the same types. ``models.add(..., parameter_overrides={name:
ParameterOverrides(...)})`` renames a parameter, sets its type (one of these or any
string of the user's) and attaches metadata that exports carry."""

from __future__ import annotations

import enum
import json
import re
from collections.abc import Mapping
from typing import Any

import attrs

__all__ = ["ParameterOverrides", "ParameterType", "infer_type", "module_types"]


class ParameterType(enum.StrEnum):
    """The kind of layer a parameter belongs to (a string enum: stored and compared as
    its value, so ``"dense"`` and ``ParameterType.DENSE`` are the same filter)."""

    UNKNOWN = "unknown"
    DENSE = "dense"
    ATTENTION = "attention"
    EMBEDDING = "embedding"
    CONV = "conv"
    NORM = "norm"
    BIAS = "bias"


_ATTENTION = re.compile(r"^(?!.*(^|[._])(mixer|mamba)[._])"  # no state-space mixer's projections
                        r".*((^|[._])(q|k|v|o|qkv|query|key|value|out)_?proj|(^|[._])(attn|"
                        r"(self|encdec)?attention|self_attn|c_attn|query|key|value)([._]|$))")
_EMBEDDING = re.compile(r"(^|[._])(embed\w*|token_embd|wte|wpe|tok_embeddings|word_embeddings|"
                        r"position_embeddings|lm_head|shared(?=\.|$)|relative_attention_bias)([._]|$)")
_NORM = re.compile(r"(^|[._])(\w*norm\w*|ln_?\w*|layernorm|rmsnorm)([._]|$)")


def infer_type(name: str, shape: tuple[int, ...], module: str | None = None) -> str:
    """The type of a parameter from its module class name (when known), name and shape."""
    low = name.lower()
    leaf = low.rsplit(".", 1)[-1]
    if leaf == "bias" or leaf.endswith("_bias"):
        return ParameterType.BIAS.value
    if module is not None:
        kind = module.lower()
        if "embedding" in kind:
            return ParameterType.EMBEDDING.value
        if kind.startswith("conv") and len(shape) != 2:  # GPT-2's Conv1D: a linear map
            return ParameterType.CONV.value
        if "norm" in kind:
            return ParameterType.NORM.value
        # a linear layer's type comes from its name, as for the same weight in a file
    if _EMBEDDING.search(low):
        return ParameterType.EMBEDDING.value
    if _NORM.search(low) and len(shape) == 1:
        return ParameterType.NORM.value
    if len(shape) >= 3 and not re.search(r"expert|_exps\b", low):  # packed MoE experts
        return ParameterType.CONV.value
    if len(shape) >= 2:
        return (ParameterType.ATTENTION.value if _ATTENTION.search(low)
                else ParameterType.DENSE.value)
    if len(shape) == 1:
        return ParameterType.NORM.value
    return ParameterType.UNKNOWN.value


def module_types(module: Any) -> dict[str, str]:
    """Parameter name -> class name of the module that owns it, for a torch module."""
    out = {}
    for prefix, sub in module.named_modules():
        for pname, _ in sub.named_parameters(recurse=False):
            out[f"{prefix}.{pname}" if prefix else pname] = type(sub).__name__
    return out


def _ptype(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return str(value) if isinstance(value, ParameterType) else value
    raise TypeError(f"ptype must be a ParameterType or a string, got {value!r}")


def _meta(value: Mapping[str, Any] | None) -> tuple[tuple[str, Any], ...]:
    if value is None:
        return ()
    if not isinstance(value, Mapping):
        raise TypeError(f"meta must be a mapping, got {type(value).__name__}")
    try:
        json.dumps(dict(value))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"meta must hold JSON values (strings, numbers, lists): {exc}") from None
    return tuple(sorted(dict(value).items()))


@attrs.frozen(init=False)
class ParameterOverrides:
    """Changes to one parameter's record at ``models.add``: a new ``name`` (how
    exports, filters and results call it), a ``ptype`` (a :class:`ParameterType` or any
    string) and ``meta`` (JSON values exports carry; ``other_meta`` is the original
    Diffract's spelling of the same argument)."""

    name: str | None
    ptype: str | None
    meta: tuple[tuple[str, Any], ...]

    def __init__(self, name: str | None = None, ptype: str | ParameterType | None = None,
                 meta: Mapping[str, Any] | None = None, *,
                 other_meta: Mapping[str, Any] | None = None) -> None:
        if meta is not None and other_meta is not None:
            raise TypeError("give meta or other_meta (the same thing), not both")
        self.__attrs_init__(name, _ptype(ptype), _meta(meta if meta is not None else other_meta))

    @property
    def meta_dict(self) -> dict[str, Any]:
        return dict(self.meta)
