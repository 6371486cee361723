"""Tensors as the core reads them: detached and dense, or a clear error; as numpy, half
types widened to float32 (numpy has no bfloat16)."""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from diffract.errors import ModelSourceError

__all__ = ["readable", "to_numpy"]


def readable(t: Any) -> Any:
    """``t`` detached, or a clear error when it holds no readable dense data."""
    if t.is_meta:
        raise ModelSourceError(
            "the parameter is on the meta device and has no data; load real weights into "
            "the model (load_state_dict, to_empty + init) before analysing it",
            model_id=None)
    if t.layout is not sys.modules["torch"].strided:
        raise ModelSourceError(
            f"the parameter is a {t.layout} tensor; add the dense weights instead "
            "(tensor.to_dense())",
            model_id=None)
    return t.detach()


def to_numpy(t: Any) -> np.ndarray:
    """A torch tensor or numpy array as numpy; half types as float32."""
    if isinstance(t, np.ndarray):
        return t.astype(np.float32) if t.dtype.itemsize < 4 else t
    t = readable(t)
    if t.dtype.is_floating_point and t.element_size() < 4:
        t = t.float()
    return t.cpu().numpy()
