"""Models whose weights are computed from others: :func:`delta_model`, ``W - W_base``
for every parameter of a model that its base (a model already in the session) has with
the same shape; the others are left out and named. What changed in fine-tuning,
analysed like any model. Computed on read (nothing is materialised at add time); a
durable profile copies the differences when the model is added, as for any in-memory
model. (A LoRA adapter's updates are a model format of diffractml-formats, ``peft-lora``.)"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from diffract.core.models import OpenedModel
from diffract.core.sources import ModelSource
from diffract.core.storage.base import ParamInfo
from diffract.errors import EmptyModelError

__all__ = ["delta_model"]


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
