"""The view rules of LLM-shaped models, as plain functions ``split(param, config,
options) -> [View]``.

Head geometry comes from the options (``heads``, ``kv_heads``, ``head_dim``) or the
model's ``config.json`` (``num_attention_heads`` / ``n_head``, ``num_key_value_heads``,
``head_dim`` or ``hidden_size / heads``): a multimodal model's vision or audio tower from
its ``vision_config``/``audio_config``, the rest from ``text_config`` when there is one;
``encoder_attention_heads``/``decoder_attention_heads`` by the parameter's side (BART,
Whisper). Parameters are recognised by name:

* separate projections, split by output rows: ``q_proj``/``query``/``attention.wq``/
  ``attn_q``/T5's ``SelfAttention.q`` (``heads`` blocks), ``k_proj``/``key``/``wk``/
  ``attn_k`` and ``v_proj``/``value``/``wv``/``attn_v`` (``kv_heads`` blocks: grouped-query
  attention; ``multi_query`` configurations have one); ``attn_*`` are llama.cpp's GGUF
  names, whose rope permutation stays within each head's rows; Meta's ``wq``... only
  under ``attention.`` or ``attn.`` (T5's feed-forward ``wo`` is no attention weight);
* output projections, split by input columns: ``o_proj``, ``out_proj``, ``attention.wo``,
  T5's ``SelfAttention.o``, ``attn_output``,
  ``attention.output.dense`` (BERT), ``attn.c_proj`` (GPT-2), ``self_attention.dense`` /
  ``attention.dense`` (Falcon, GPT-NeoX), ``self_attn.dense`` (Phi-2);
* fused QKV: ``attn.c_attn`` (GPT-2's Conv1D, stored ``[in, out]``: each slice is
  transposed to ``[out, in]``), ``qkv_proj``/``Wqkv``/``attn_qkv`` (q, then k, then v) and
  ``query_key_value`` (per key-value group: its query heads, then k, then v, as GPT-NeoX
  and Falcon lay it out; ``qkv_layout="blocks"`` for q|k|v);
* multi-head latent attention (DeepSeek-V2/V3, Kimi K2: a ``kv_lora_rank`` in the
  configuration): ``q_b_proj`` (or ``q_proj``) by heads of ``qk_nope_head_dim +
  qk_rope_head_dim`` rows, ``kv_b_proj`` per head into its ``part=k`` (k_nope) and
  ``part=v`` rows, ``o_proj`` by heads of ``v_head_dim`` columns; the latent
  down-projections have no heads;
* hybrid models by their ``layer_types``: a linear-attention layer by its own
  ``linear_num_heads`` of ``linear_head_dim`` (Kimi Linear's KDA; left whole without
  them: Qwen3-Next's Gated DeltaNet, MiniMax), a convolution or state-space layer (LFM2)
  left whole; Qwen3-Next's ``q_proj`` per head into ``part=q`` and ``part=gate`` rows;
* never under a state-space mixer (``mixer.``, ``mamba.``: Mamba's ``out_proj`` has no
  heads);
* ``patterns`` (``{"q": regex, "k": ..., "v": ..., "o": ..., "qkv": ...}``) for others,
  ``transposed=True`` for weights stored ``[in, out]``.

A rule raises ValueError, naming the shapes and the option to fix, for a parameter it
recognises but whose shape does not fit the geometry; the core turns that into a
ModelSourceError naming the parameter, and nothing is added.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from diffract.errors import InvalidArgumentError
from diffract.plugins import View, name_pattern

__all__ = ["HEAD_OPTIONS", "check", "conv", "experts", "geometry", "heads", "kind_of", "qkv"]

#: Name patterns of each kind of attention weight (searched in the parameter's name).
KINDS = {
    "q": r"(^|\.)(q_proj|q_b_proj|query|query_proj|(attention|attn)\.wq|attn_q|"
         r"(Self|EncDec)Attention\.q)\.weight$",
    "k": r"(^|\.)(k_proj|key|key_proj|(attention|attn)\.wk|attn_k|"
         r"(Self|EncDec)Attention\.k)\.weight$",
    "v": r"(^|\.)(v_proj|value|value_proj|(attention|attn)\.wv|attn_v|"
         r"(Self|EncDec)Attention\.v)\.weight$",
    "o": r"(^|\.)(o_proj|out_proj|(attention|attn)\.wo|attention\.output\.dense|attn\.c_proj|"
         r"self_attention\.dense|attention\.dense|self_attn\.dense|attn_output|"
         r"(Self|EncDec)Attention\.o)\.weight$",
    "qkv": r"(^|\.)(attn\.c_attn|qkv_proj|Wqkv|query_key_value|attn_qkv)\.weight$",
    # multi-head latent attention (DeepSeek-V2/V3, Kimi K2): per head, its k_nope rows
    # then its v rows
    "kv_b": r"(^|\.)kv_b_proj\.weight$",
}
#: Parents whose projections are no attention's: state-space mixers (Mamba's ``mixer``,
#: Jamba's and Zamba's ``mamba`` blocks), whose ``out_proj`` has no heads.
_NOT_ATTENTION = r"(^|\.)(mixer|mamba)\."
#: Parameters stored ``[in, out]`` (GPT-2's Conv1D), but for the model types whose
#: ``c_attn``/``c_proj`` are plain linear layers (GPT-BigCode: StarCoder, SantaCoder).
_TRANSPOSED = r"(^|\.)attn\.(c_attn|c_proj)\.weight$"
_LINEAR_C_ATTN = ("gpt_bigcode",)
#: Model types whose q_proj holds each head's query and then its output gate's rows.
_GATED_Q = ("qwen3_next",)


def _transposed(name: str, config: Mapping[str, Any], options: Mapping[str, Any]) -> bool:
    if "transposed" in options:
        return bool(options["transposed"])
    return bool(re.search(_TRANSPOSED, name)) and config.get("model_type") not in _LINEAR_C_ATTN
#: Options of the head geometry (shared by ``heads`` and ``qkv``).
HEAD_OPTIONS = ("heads", "kv_heads", "head_dim", "patterns", "transposed", "qkv_layout")
_EXPERT_COUNT = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")


def check(options: Mapping[str, Any]) -> list[str]:
    """Problems with option values (the core checks the names)."""
    problems = []
    for key in ("heads", "kv_heads", "head_dim", "experts"):
        value = options.get(key)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                                  or value < 1):
            problems.append(f"{key} must be a positive integer, got {value!r}")
    if options.get("transposed") not in (None, True, False):
        problems.append(f"transposed must be True or False, got {options['transposed']!r}")
    layout = options.get("qkv_layout")
    if layout not in (None, "blocks", "grouped"):
        problems.append(f"qkv_layout must be 'blocks' or 'grouped', got {layout!r}")
    if options.get("expert_layout") not in (None, "out_in", "in_out"):
        problems.append(f"expert_layout must be 'out_in' or 'in_out', got "
                        f"{options['expert_layout']!r}")
    if options.get("gate_up") not in (None, "halves", "interleaved"):
        problems.append(f"gate_up must be 'halves' or 'interleaved', got {options['gate_up']!r}")
    patterns = options.get("patterns", {})
    if not isinstance(patterns, Mapping) or not set(patterns) <= set(KINDS):
        problems.append(f"patterns maps kinds {sorted(KINDS)} to regular expressions, got "
                        f"{patterns!r}")
    else:
        for kind, rx in patterns.items():
            try:
                name_pattern(rx, f"patterns[{kind!r}]")
            except InvalidArgumentError as exc:
                problems.append(str(exc).rstrip("."))
    return problems


def kind_of(name: str, options: Mapping[str, Any]) -> str | None:
    """Which attention weight a parameter is (q, k, v, o, qkv), by its name."""
    given = options.get("patterns", {})
    for kind, default in KINDS.items():
        if kind in given:
            if name_pattern(given[kind]).search(name):
                return kind
        elif name_pattern(default).search(name) and not name_pattern(_NOT_ATTENTION).search(
                name):
            return kind
    return None


def _count(config: Mapping[str, Any], option: str, *keys: str) -> int | None:
    """The first of ``keys`` the configuration holds, which must be a positive integer
    (a ValueError naming the key, the file it came from and the view option to pass
    instead otherwise: ``true`` is not one head, ``12.0`` or ``"12"`` not twelve)."""
    for key in keys:
        value = config.get(key)
        if value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            where = getattr(config, "source", None) or "the model's configuration"
            raise ValueError(f"{key} is {value!r} in {where}, not a positive integer; fix it "
                             f'there or pass view_options={{"{option}": N}}')
        return value
    return None


#: Where a multimodal model's towers live (their own sub-configuration describes them).
_TOWERS = {"vision_config": r"(^|\.)(vision_tower|vision_model|visual|vision_encoder)\.",
           "audio_config": r"(^|\.)(audio_tower|audio_model|audio_encoder)\."}


def _config_of(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """The configuration that describes parameter ``name``: a multimodal model's vision
    or audio tower has its own (LLaVA, CLIP, Gemma 3, Qwen2-VL), anything else its
    language model's ``text_config`` when there is one, else the configuration itself."""
    for key, where in _TOWERS.items():
        if isinstance(config.get(key), Mapping) and re.search(where, name):
            return config[key]
    text = config.get("text_config")
    return text if isinstance(text, Mapping) else config


def _latent(config: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(qk_nope_head_dim, qk_rope_head_dim, v_head_dim) of multi-head latent attention
    (a ``kv_lora_rank`` in the parameter's configuration), else None."""
    if config.get("kv_lora_rank") is None:
        return None
    dims = [_count(config, key, key) for key in ("qk_nope_head_dim", "qk_rope_head_dim",
                                                 "v_head_dim")]
    return None if None in dims else tuple(dims)  # type: ignore[return-value]


def _layer_type(config: Mapping[str, Any], name: str) -> str:
    """The ``layer_types`` entry of the layer holding ``name`` (hybrid models: Qwen3-Next,
    Kimi Linear, MiniMax, LFM2, Gemma 3...), or '' when the parameter's configuration
    has none."""
    types = config.get("layer_types")
    found = re.search(r"(^|\.)(layers|h|blocks)\.(\d+)\.", name)
    if not isinstance(types, list) or found is None or int(found.group(3)) >= len(types):
        return ""
    return str(types[int(found.group(3))])


def _linear_geometry(config: Mapping[str, Any]) -> tuple[int, int, int] | None:
    """(heads, heads, head_dim) of a linear-attention layer with separate q, k, v and o
    projections (Kimi Linear's KDA: ``linear_num_heads`` of ``linear_head_dim``), else
    None: its projections are left whole."""
    heads = _count(config, "heads", "linear_num_heads")
    dim = _count(config, "head_dim", "linear_head_dim")
    return (heads, heads, dim) if heads and dim else None


def geometry(config: Mapping[str, Any], options: Mapping[str, Any],
             name: str) -> tuple[int, int, int]:
    """(heads, kv_heads, head_dim) from the options, else the configuration (the
    parameter's tower's, and the encoder's or decoder's head count where they differ:
    BART, Whisper)."""
    config = _config_of(config, name)  # idempotent: the rules pass it resolved already
    side = "decoder" if re.search(r"(^|\.)decoder\.", name) else "encoder"
    heads = options.get("heads") or _count(config, "heads", "num_attention_heads", "n_head",
                                           "num_heads", "n_heads", f"{side}_attention_heads")
    if not heads:
        raise ValueError(f"{name} is an attention weight, but the head count is unknown: no "
                         "config.json beside the checkpoint (nor its own metadata) gives "
                         'num_attention_heads; pass view_options={"heads": N} (and kv_heads, '
                         "head_dim)")
    # multi-query attention (Falcon-7B, GPT-BigCode): one key-value head, whatever
    # num_kv_heads says (transformers writes it equal to the heads there); Falcon's new
    # decoder architecture has num_kv_heads of them
    mqa = config.get("multi_query") and not config.get("new_decoder_architecture")
    kv = (options.get("kv_heads") or (1 if mqa else None)
          or _count(config, "kv_heads", "num_key_value_heads", "num_kv_heads", "n_head_kv")
          or heads)
    hidden = _count(config, "head_dim", "hidden_size", "n_embd", "d_model")
    dim = options.get("head_dim") or _count(config, "head_dim", "head_dim", "d_kv") or (
        hidden // heads if hidden else None)
    if heads % kv:
        raise ValueError(f"num_key_value_heads ({kv}) does not divide num_attention_heads "
                         f'({heads}); fix the configuration or pass view_options={{"kv_heads": '
                         f"N}}")
    return int(heads), int(kv), int(dim) if dim else 0


def _fits(name: str, size: int, want: int, what: str, shape: tuple[int, ...]) -> None:
    if size != want:
        raise ValueError(f"{name} {shape}: {what} is {size}, not the {want} the head geometry "
                         "gives; pass view_options heads, kv_heads and head_dim that fit")


def _dim(name: str, size: int, blocks: int, dim: int, shape: tuple[int, ...]) -> int:
    """The head size: given, or ``size / blocks`` when that divides."""
    if dim:
        return dim
    if size % blocks:
        raise ValueError(f"{name} {shape}: {size} does not divide into {blocks} heads; pass "
                         "view_options head_dim (or heads) that fit")
    return size // blocks


def _slice(axis: int, start: int, stop: int, transposed: bool) -> tuple[Any, ...]:
    """The index selecting ``[start, stop)`` along output rows (axis 0) or input columns
    (axis 1) of an ``[out, in]`` matrix, or of one stored ``[in, out]``."""
    axis = 1 - axis if transposed else axis
    return (slice(start, stop),) if axis == 0 else (slice(None), slice(start, stop))


def _fused_rows(kind_layout: str, heads: int, kv: int, dim: int) -> dict[str, list[int]]:
    """Start row of every head of each part in a fused QKV matrix."""
    if kind_layout == "blocks":
        return {"q": [h * dim for h in range(heads)],
                "k": [(heads + g) * dim for g in range(kv)],
                "v": [(heads + kv + g) * dim for g in range(kv)]}
    if kind_layout == "codegen":  # four blocks of q | v | k, each a quarter of the heads
        per, local = heads // 4, heads // 4 * dim
        return {part: [b * 3 * local + at * local + j * dim for b in range(4) for j in range(per)]
                for part, at in (("q", 0), ("v", 1), ("k", 2))}
    per = heads // kv  # grouped: per key-value group, its query heads, then k, then v
    return {"q": [(g * (per + 2) + i) * dim for g in range(kv) for i in range(per)],
            "k": [(g * (per + 2) + per) * dim for g in range(kv)],
            "v": [(g * (per + 2) + per + 1) * dim for g in range(kv)]}


def _layout(name: str, config: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    if options.get("qkv_layout"):
        return options["qkv_layout"]
    if config.get("model_type") == "codegen":
        return "codegen"  # CodeGen's qkv_proj, split for its four model-parallel shards
    if "query_key_value" in name and not (config.get("multi_query")
                                          and not config.get("new_decoder_architecture")):
        return "grouped"
    if config.get("model_type") in _LINEAR_C_ATTN and not config.get("multi_query"):
        return "grouped"  # GPT-BigCode without multi-query: q, k, v per head
    return "blocks"


def heads(param: Any, config: Mapping[str, Any], options: Mapping[str, Any]) -> list[View]:
    """Attention weights per head (see the module docstring)."""
    name, shape = param.name, tuple(param.shape)
    config = _config_of(config, name)  # its tower's, or its language model's
    kind = kind_of(name, options)
    layer = "" if options.get("patterns") else _layer_type(config, name)
    if kind is None or len(shape) != 2 or (layer and "attention" not in layer):
        return []  # a hybrid model's convolution or state-space layer has no heads
    transposed = _transposed(name, config, options)
    out_size, in_size = (shape[1], shape[0]) if transposed else shape
    if "linear" in layer:  # linear attention: its own head geometry, or none known
        found = _linear_geometry(config) if kind in ("q", "k", "v", "o") else None
        if found is None:
            return []
        (n_heads, kv, dim), latent = found, None
    else:
        n_heads, kv, dim = geometry(config, options, name)
        latent = None if options.get("head_dim") else _latent(config)
    if kind == "kv_b":
        if latent is None:
            return []
        nope, _, v_dim = latent
        per = nope + v_dim
        _fits(name, out_size, n_heads * per, "its output size", shape)
        return [View(f"part={part},head={h}",
                     _slice(0, h * per + start, h * per + start + size, transposed), transposed)
                for part, start, size in (("k", 0, nope), ("v", nope, v_dim))
                for h in range(n_heads)]
    if latent is not None:  # q heads of k_nope + k_rope rows, o heads of v_head_dim columns
        dim = latent[2] if kind == "o" else latent[0] + latent[1]
    if kind == "o":
        dim = _dim(name, in_size, n_heads, dim, shape)
        _fits(name, in_size, n_heads * dim, "its input size", shape)
        return [View(f"head={h}", _slice(1, h * dim, (h + 1) * dim, transposed), transposed)
                for h in range(n_heads)]
    if kind == "qkv":
        dim = _dim(name, out_size, n_heads + 2 * kv, dim, shape)
        _fits(name, out_size, (n_heads + 2 * kv) * dim, "its output size", shape)
        starts = _fused_rows(_layout(name, config, options), n_heads, kv, dim)
        return [View(f"part={part},head={h}", _slice(0, s, s + dim, transposed), transposed)
                for part, rows in starts.items() for h, s in enumerate(rows)]
    count = n_heads if kind == "q" else kv
    if kind == "q" and config.get("model_type") in _GATED_Q and dim \
            and out_size == 2 * n_heads * dim:  # per head: its q rows, then its gate's
        return [View(f"part={part},head={h}", _slice(0, (2 * h + i) * dim, (2 * h + i + 1) * dim,
                                                     transposed), transposed)
                for i, part in enumerate(("q", "gate")) for h in range(n_heads)]
    dim = _dim(name, out_size, count, dim, shape)
    _fits(name, out_size, count * dim, "its output size", shape)
    return [View(f"head={h}", _slice(0, h * dim, (h + 1) * dim, transposed), transposed)
            for h in range(count)]


def qkv(param: Any, config: Mapping[str, Any], options: Mapping[str, Any]) -> list[View]:
    """A fused QKV matrix in its q, k, v parts; ``gate_up_proj`` in gate and up."""
    name, shape = param.name, tuple(param.shape)
    if len(shape) != 2:
        return []
    transposed = _transposed(name, config, options)
    out_size = shape[1] if transposed else shape[0]
    if re.search(r"(^|\.)gate_up_proj\.weight$", name):
        if out_size % 2:
            raise ValueError(f"{name} {shape}: {out_size} rows do not split into gate and up")
        half = out_size // 2
        return [View("part=gate", _slice(0, 0, half, transposed), transposed),
                View("part=up", _slice(0, half, out_size, transposed), transposed)]
    config = _config_of(config, name)
    layer = "" if options.get("patterns") else _layer_type(config, name)
    if kind_of(name, options) != "qkv" or (layer and ("linear" in layer
                                                      or "attention" not in layer)):
        return []
    if options.get("heads") or config.get("num_attention_heads") or config.get("n_head"):
        n_heads, kv, dim = geometry(config, options, name)
        dim = _dim(name, out_size, n_heads + 2 * kv, dim, shape)
    else:  # no geometry: equal thirds (multi-head attention)
        n_heads = kv = dim = 1
        if out_size % 3:
            raise ValueError(f"{name} {shape}: {out_size} does not split into three equal "
                             "parts; pass view_options heads and kv_heads")
        dim = out_size // 3
    _fits(name, out_size, (n_heads + 2 * kv) * dim, "its output size", shape)
    if (layout := _layout(name, config, options)) != "blocks" and n_heads > 1:
        raise ValueError(f"{name}: in the {layout} layout the rows of q are not contiguous; "
                         "use the heads rule (it splits per head), or qkv_layout='blocks' if "
                         "this matrix is q|k|v")
    q, k = n_heads * dim, kv * dim
    return [View("part=q", _slice(0, 0, q, transposed), transposed),
            View("part=k", _slice(0, q, q + k, transposed), transposed),
            View("part=v", _slice(0, q + k, q + 2 * k, transposed), transposed)]


def _expert_named(name: str) -> bool:
    """Whether a name says experts (llama.cpp's packed ``ffn_*_exps`` too)."""
    return re.search(r"expert|_exps\b", name, re.IGNORECASE) is not None


#: Model types whose packed experts are stored ``[E, in, out]`` (transformers' Llama 4
#: and GPT-OSS); those with interleaved gate and up columns (GPT-OSS: ``gate_up[..., ::2]``
#: is the gate, ``[..., 1::2]`` the up projection).
_IN_OUT_EXPERTS = ("llama4", "llama4_text", "gpt_oss")
_INTERLEAVED_GATE_UP = ("gpt_oss",)


def _expert_layout(config: Mapping[str, Any], options: Mapping[str, Any]) -> str:
    """``out_in`` (``[E, out, in]``: Mixtral, Qwen3-MoE, DeepSeek in transformers 5) or
    ``in_out``: the option, else by the model type (the shapes cannot tell: a
    ``down_proj`` has the hidden size first in one layout, last in the other)."""
    if options.get("expert_layout"):
        return str(options["expert_layout"])
    return "in_out" if config.get("model_type") in _IN_OUT_EXPERTS else "out_in"


def experts(param: Any, config: Mapping[str, Any], options: Mapping[str, Any]) -> list[View]:
    """A 3-D tensor ``[E, out, in]`` (``expert_layout="in_out"``: ``[E, in, out]``) in its
    E matrices: one whose name says expert, or any 3-D tensor of a model whose
    configuration (or ``experts=``) declares experts; other 3-D tensors (convolutions)
    are left to the ``conv`` rule. A packed ``gate_up_proj`` (transformers 5's MoE
    layers) gives each expert's gate and up projections apart (``expert=3,part=gate``):
    the first and second half of its output rows, or GPT-OSS's interleaved columns
    (``gate_up="interleaved"``)."""
    shape = tuple(param.shape)
    declared = options.get("experts") or next(
        (_count(config, "experts", k) for k in _EXPERT_COUNT if config.get(k)), None)
    if len(shape) != 3 or not (_expert_named(param.name) or declared is not None):
        return []
    if declared is not None and shape[0] != declared:
        raise ValueError(f"{param.name} {shape}: its first dimension is {shape[0]}, not the "
                         f"{declared} experts the configuration declares; pass view_options "
                         "experts (or check that the tensor is [E, out, in])")
    transposed = _expert_layout(config, options) == "in_out"
    if not re.search(r"(^|\.)gate_up_proj(\.weight)?$", param.name):
        return [View(f"expert={e}", (e,), transposed) for e in range(shape[0])]
    out_size = shape[2] if transposed else shape[1]
    if out_size % 2:
        raise ValueError(f"{param.name} {shape}: an output size of {out_size} does not split "
                         "into gate and up; pass view_options expert_layout (out_in, in_out)")
    interleaved = options.get("gate_up", "interleaved" if config.get("model_type") in
                              _INTERLEAVED_GATE_UP else "halves") == "interleaved"
    half = out_size // 2
    parts = {"gate": (0, out_size, 2) if interleaved else (0, half),
             "up": (1, out_size, 2) if interleaved else (half, out_size)}
    views = []
    for e in range(shape[0]):
        for part, rows in parts.items():
            index = (e, slice(None), rows) if transposed else (e, rows)
            views.append(View(f"expert={e},part={part}", index, transposed))
    return views


def conv(param: Any, config: Mapping[str, Any], options: Mapping[str, Any]) -> list[View]:
    """A convolution ``[out, in, kh, kw]`` per spatial position (``[out, in]`` each, as
    WeightWatcher analyses convolutions); ``[out, in, k]`` of a conv-typed parameter too."""
    shape = tuple(param.shape)
    if len(shape) == 4:
        return [View(f"pos={i},{j}", (slice(None), slice(None), i, j))
                for i in range(shape[2]) for j in range(shape[3])]
    if len(shape) == 3 and param.ptype == "conv" and not _expert_named(param.name):
        return [View(f"pos={i}", (slice(None), slice(None), i)) for i in range(shape[2])]
    return []
