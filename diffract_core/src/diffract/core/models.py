"""Reading models: a torch module, a state dict, or a checkpoint file -> ParamInfo + loader.

Weights are never copied at ``add`` time: the loader reads one parameter when a chunk
needs it and returns a numpy array (float32 for half and bfloat16 tensors, the stored
dtype otherwise). Only floating-point tensors are weights; integer and boolean buffers
(``num_batches_tracked``) are left out. torch is imported only when the source is a
torch object or a torch checkpoint file; checkpoints load with ``weights_only=True``.

Supported sources:

* ``torch.nn.Module`` -- its ``named_parameters()``;
* a mapping of names to torch tensors or numpy arrays (a state dict);
* a path to ``.safetensors`` (needs the ``safetensors`` package; memory-mapped),
  ``.pt``/``.pth``/``.bin`` (``torch.load(weights_only=True, mmap=True)``) or ``.npz``.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from diffract.core.storage.base import ParamInfo
from diffract.errors import EmptyModelError, ModelSourceError

__all__ = ["read_model"]

Loader = Callable[[str], np.ndarray]


def _is_torch_module(obj: Any) -> bool:
    # No torch import here: if torch is not loaded, obj cannot be a torch module.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def _readable(t: Any) -> Any:
    """``t`` detached, or a clear error when it holds no readable dense data."""
    if t.is_meta:
        raise ModelSourceError(
            "the parameter is on the meta device and has no data; load real weights into "
            "the model (load_state_dict, to_empty + init) before analysing it",
            model_id=None,
        )
    if t.layout is not sys.modules["torch"].strided:
        raise ModelSourceError(
            f"the parameter is a {t.layout} tensor; add the dense weights instead "
            "(tensor.to_dense())",
            model_id=None,
        )
    return t.detach()


def _tensor_to_numpy(t: Any) -> np.ndarray:
    t = _readable(t)
    if t.dtype.is_floating_point and t.element_size() < 4:
        t = t.float()
    return t.cpu().numpy()


def _from_tensors(model_id: str, tensors: Mapping[str, Any]) -> tuple[list[ParamInfo], Loader, Any]:
    import torch

    infos = []
    kept: dict[str, Any] = {}
    for name, t in tensors.items():
        if not t.dtype.is_floating_point:
            continue
        infos.append(ParamInfo(model_id, name, tuple(t.shape), str(t.dtype).removeprefix("torch.")))
        kept[name] = t

    def load(name: str) -> np.ndarray:
        with torch.no_grad():
            return _tensor_to_numpy(kept[name])

    def raw(name: str) -> Any:
        return _readable(kept[name])

    return infos, load, raw


def _from_arrays(
    model_id: str, arrays: Mapping[str, np.ndarray]
) -> tuple[list[ParamInfo], Loader, Any]:
    kept = {n: a for n, a in arrays.items() if np.issubdtype(a.dtype, np.floating)}
    infos = [ParamInfo(model_id, n, tuple(a.shape), str(a.dtype)) for n, a in kept.items()]

    def load(name: str) -> np.ndarray:
        a = np.asarray(kept[name])
        return a.astype(np.float32) if a.dtype.itemsize < 4 else a

    return infos, load, load


def _from_mapping(model_id: str, mapping: Mapping[str, Any]) -> tuple[list[ParamInfo], Loader, Any]:
    torch_mod = sys.modules.get("torch")
    bad = sorted(
        str(k)
        for k, v in mapping.items()
        if not isinstance(v, np.ndarray)
        and not (torch_mod is not None and isinstance(v, torch_mod.Tensor))
    )
    if bad:
        nested = [k for k in bad if isinstance(mapping[k], Mapping)]
        hint = (
            f" It looks like a training checkpoint: pass its state dict, e.g. "
            f"checkpoint[{nested[0]!r}]."
            if nested
            else ""
        )
        raise ModelSourceError(
            f"Model {model_id!r}: entries {bad[:10]} are neither torch tensors nor numpy arrays."
            f"{hint} Pass a mapping of parameter names to tensors.",
            model_id=model_id,
        )
    if any(isinstance(v, np.ndarray) for v in mapping.values()):
        if torch_mod is not None and any(isinstance(v, torch_mod.Tensor) for v in mapping.values()):
            arrays = {
                k: (_tensor_to_numpy(v) if not isinstance(v, np.ndarray) else v)
                for k, v in mapping.items()
            }
            return _from_arrays(model_id, arrays)
        return _from_arrays(model_id, mapping)
    return _from_tensors(model_id, mapping)


def _from_path(model_id: str, path: Path) -> tuple[list[ParamInfo], Loader, Any]:
    if not path.exists():
        raise ModelSourceError(
            f"Model {model_id!r}: file {str(path)!r} does not exist.", model_id=model_id
        )
    suffix = path.suffix.lower()
    if suffix == ".safetensors":
        try:
            from safetensors import safe_open
        except ImportError:
            raise ModelSourceError(
                f"Model {model_id!r}: reading {path.name} needs the safetensors package: "
                "pip install safetensors.",
                model_id=model_id,
            ) from None
        import torch  # noqa: F401 - safetensors' torch framework

        handle = safe_open(str(path), framework="pt")
        tensors = {k: handle.get_slice(k) for k in handle.keys()}
        infos = []
        for name, sl in tensors.items():
            dtype = sl.get_dtype().lower()
            if dtype.startswith(("f", "bf")):
                norm = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64"}
                shape = tuple(sl.get_shape())
                infos.append(ParamInfo(model_id, name, shape, norm.get(dtype, dtype)))

        def load(name: str) -> np.ndarray:
            return _tensor_to_numpy(handle.get_tensor(name))

        return infos, load, handle.get_tensor
    if suffix in (".pt", ".pth", ".bin"):
        import torch

        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True, mmap=True)
        except Exception as exc:  # noqa: BLE001 - reported with the fix
            # torch's message suggests weights_only=False; keep only the cause.
            cause = str(exc).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
            raise ModelSourceError(
                f"Model {model_id!r}: cannot read {path.name} with torch.load(weights_only=True)"
                f": {cause} Diffract never unpickles arbitrary objects: save a plain state "
                "dict of tensors (model.state_dict()) and add that.",
                model_id=model_id,
            ) from None
        if not isinstance(state, Mapping):
            raise ModelSourceError(
                f"Model {model_id!r}: {path.name} holds a {type(state).__name__}, not a "
                "state dict.",
                model_id=model_id,
            )
        return _from_mapping(model_id, state)
    if suffix == ".npz":
        with np.load(path) as npz:
            return _from_arrays(model_id, {k: npz[k] for k in npz.files})
    raise ModelSourceError(
        f"Model {model_id!r}: unsupported file type {suffix!r}. Use .safetensors, .pt, .pth, "
        ".bin or .npz, or pass a torch module or a state dict.",
        model_id=model_id,
    )


def read_model(source: Any, model_id: str) -> tuple[list[ParamInfo], Loader, Any]:
    """Parameters, the numpy loader and the raw loader for ``source`` (module docstring).

    The raw loader returns the parameter as the source holds it: a detached torch tensor
    on its own device and in its own dtype, or a numpy array (the ``tensor`` field).
    """
    if isinstance(source, (str, os.PathLike)):
        infos, load, raw = _from_path(model_id, Path(source))
    elif _is_torch_module(source):
        infos, load, raw = _from_tensors(model_id, dict(source.named_parameters()))
    elif isinstance(source, Mapping):
        infos, load, raw = _from_mapping(model_id, source)
    else:
        raise ModelSourceError(
            f"Model {model_id!r}: cannot read a {type(source).__module__}."
            f"{type(source).__qualname__}. Pass a torch.nn.Module, a state dict (names to "
            "tensors or arrays), or a checkpoint path.",
            model_id=model_id,
        )
    if not infos:
        raise EmptyModelError(
            f"Model {model_id!r} has no floating-point parameters, so there is nothing to "
            "analyse. Check that you passed the model (or its state dict), not an empty "
            "container.",
            model_id=model_id,
        )
    return infos, load, raw
