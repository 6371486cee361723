"""Models whose weights are computed from others: fine-tuning deltas and LoRA updates.

* :func:`delta_model`: ``W - W_base`` for every parameter of a model that its base (a
  model already in the session) has with the same shape; the others are left out and
  named. What changed in fine-tuning, analysed like any model.
* :func:`lora_model`: the effective update ``scale * B @ A`` of each LoRA pair of a PEFT
  adapter (a state dict, an ``adapter_model.safetensors`` / ``.bin`` file, or the
  adapter's directory, whose ``adapter_config.json`` gives ``scale = lora_alpha / r``, or
  ``lora_alpha / sqrt(r)`` with rsLoRA). Parameters are named after the adapted module,
  ``<module>.weight``, with PEFT's ``base_model.model.`` prefix removed. Convolution
  adapters (``A [r, in, k...]``, ``B [out, r, 1...]``) give ``[out, in, k...]``.

Both are computed on read (nothing is materialised at add time); a durable profile
copies them when the model is added, as for any in-memory model."""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from diffract.core.models import OpenedModel, read_model
from diffract.core.ptypes import infer_type
from diffract.core.sources import ModelSource, read_json_file
from diffract.core.storage.base import ParamInfo
from diffract.errors import EmptyModelError, ModelSourceError

__all__ = ["delta_model", "lora_model"]

_LORA_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")
_PEFT_PREFIX = "base_model.model."


def _wider(a: np.ndarray, b: np.ndarray) -> np.dtype:
    return np.promote_types(np.promote_types(a.dtype, b.dtype), np.float32)


def delta_model(
    opened: OpenedModel,
    base_id: str,
    base_params: list[ParamInfo],
    base_load: Callable[[str], np.ndarray],
    base_raw: Callable[[str], Any],
) -> tuple[OpenedModel, list[str]]:
    """``opened`` minus the base model's weights, parameter by parameter; returns the
    model and the names left out (absent from the base, or shaped differently)."""
    model_id = opened.infos[0].model_id
    shapes = {p.name: p.shape for p in base_params}
    kept = [i for i in opened.infos if shapes.get(i.name) == i.shape]
    left_out = [i.name for i in opened.infos if shapes.get(i.name) != i.shape]
    if not kept:
        raise EmptyModelError(
            f"Model {model_id!r} shares no parameter (same name and shape) with its base "
            f"{base_id!r}, so there is no difference to analyse. Check base_model_id, or "
            "rename parameters with parameter_overrides.",
            model_id=model_id)
    infos = [ParamInfo(model_id, i.name, i.shape, i.dtype, i.ptype,
                       tuple(sorted({**dict(i.meta), "delta_of": base_id}.items())))
             for i in kept]
    load, raw = opened.load, opened.raw

    def load_delta(name: str) -> np.ndarray:
        a, b = load(name), base_load(name)
        dtype = _wider(a, b)
        return a.astype(dtype, copy=False) - b.astype(dtype, copy=False)

    def raw_delta(name: str) -> Any:
        a, b = raw(name), base_raw(name)
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return load_delta(name)
        import torch

        dtype = torch.promote_types(torch.promote_types(a.dtype, b.dtype), torch.float32)
        return a.to(dtype) - b.to(device=a.device, dtype=dtype)

    source = ModelSource("memory", description=(
        f"{opened.source.description or opened.source.kind} minus model {base_id!r}"))
    return OpenedModel(infos, source, load_delta, raw_delta), left_out


def _adapter_scale(root: Path | None, scale: float | None, model_id: str) -> float:
    if scale is not None:
        return float(scale)
    config = root / "adapter_config.json" if root is not None else None
    if config is None or not config.exists():
        return 1.0
    try:
        data = read_json_file(config)
        alpha, r = float(data["lora_alpha"]), float(data["r"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ModelSourceError(
            f"Model {model_id!r}: {str(config)!r} has no usable lora_alpha and r ({exc}). "
            "Pass scale= explicitly.", model_id=model_id) from None
    return alpha / math.sqrt(r) if data.get("use_rslora") else alpha / r


def _adapter_source(adapter: Any, model_id: str) -> tuple[Any, Path | None]:
    """What to read the adapter's tensors from, and the directory holding its config."""
    if not isinstance(adapter, (str, Path)):
        return adapter, None
    path = Path(adapter)
    if path.is_dir():
        for name in ("adapter_model.safetensors", "adapter_model.bin"):
            if (path / name).exists():
                return path / name, path
        raise ModelSourceError(
            f"Model {model_id!r}: {str(path)!r} holds no adapter_model.safetensors or "
            "adapter_model.bin (a PEFT adapter directory).", model_id=model_id)
    return path, path.parent


def lora_model(adapter: Any, model_id: str, *, scale: float | None = None) -> OpenedModel:
    """The effective weight updates of a LoRA adapter (see the module docstring)."""
    given, root = _adapter_source(adapter, model_id)
    opened = read_model(given, model_id)
    factor = _adapter_scale(root, scale, model_id)
    pairs: dict[str, dict[str, ParamInfo]] = {}
    for info in opened.infos:
        match = _LORA_KEY.match(info.name)
        if match is not None:
            module = match["module"].removeprefix(_PEFT_PREFIX)
            pairs.setdefault(module, {})[match["which"]] = info
    incomplete = sorted(m for m, p in pairs.items() if len(p) != 2)
    if incomplete:
        raise ModelSourceError(
            f"Model {model_id!r}: LoRA module(s) {incomplete[:5]} lack their A or B matrix.",
            model_id=model_id)
    if not pairs:
        raise EmptyModelError(
            f"Model {model_id!r}: no LoRA pairs (parameters named '<module>.lora_A.weight' "
            "and '<module>.lora_B.weight'). Pass a PEFT adapter: its state dict, its "
            "adapter_model file or its directory.", model_id=model_id)
    infos, parts = [], {}
    for module, pair in sorted(pairs.items()):
        a, b = pair["A"], pair["B"]
        rank = a.shape[0]
        if b.shape[1] != rank:
            raise ModelSourceError(
                f"Model {model_id!r}: {module}: lora_B {b.shape} does not multiply lora_A "
                f"{a.shape} (ranks {b.shape[1]} and {rank}).", model_id=model_id)
        name = f"{module}.weight"
        shape = (b.shape[0], *a.shape[1:])
        parts[name] = (a.name, b.name)
        dtype = "float64" if "float64" in (a.dtype, b.dtype) else "float32"  # as loaded
        infos.append(ParamInfo(model_id, name, shape, dtype, infer_type(name, shape),
                               (("lora_rank", int(rank)), ("lora_scale", factor))))
    load = opened.load

    def load_update(name: str) -> np.ndarray:
        a_name, b_name = parts[name]
        a, b = load(a_name), load(b_name)
        dtype = _wider(a, b)
        a2 = a.reshape(a.shape[0], math.prod(a.shape[1:])).astype(dtype, copy=False)
        b2 = b.reshape(b.shape[0], math.prod(b.shape[1:])).astype(dtype, copy=False)
        return (factor * (b2 @ a2)).reshape(b.shape[0], *a.shape[1:])

    description = f"LoRA updates ({len(infos)} modules, scale {factor:g})"
    if isinstance(given, Mapping):
        description += " of a state dict"
    return OpenedModel(infos, ModelSource("memory", description=description), load_update,
                       load_update)
