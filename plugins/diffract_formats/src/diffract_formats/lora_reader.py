"""PEFT LoRA adapters read as the updates they make: ``scale * B @ A`` of each adapted
module, computed when a parameter is read, never stored.

An adapter is a state dict (in memory: ``models.add(sd, id, format="peft-lora")``), an
``adapter_model.safetensors`` / ``.bin`` file, or the adapter's directory, whose
``adapter_config.json`` gives ``scale = lora_alpha / r`` (``lora_alpha / sqrt(r)`` with
rsLoRA; 1 without a config, or the ``scale`` option). Each pair
``<module>.lora_A.weight`` ``[r, in, k...]`` and ``<module>.lora_B.weight``
``[out, r, 1...]`` becomes one parameter ``<module>.weight`` ``[out, in, k...]``, named
without PEFT's ``base_model.model.`` prefix. The config is one of the reader's files, so
a store that reopens the adapter refuses it when the scale may have changed. As for a
Hugging Face directory, the weights and the config must lie in the adapter's folder
(links into a hub cache's ``blobs/`` do); ``allow_outside=True`` lifts that.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import EmptyModelError
from diffract.plugins import CheckpointReader, TensorEntry, inside, read_json_file, to_slices
from diffract_formats._common import error

__all__ = ["ADAPTER_FILES", "LoraReader", "lora_layout"]

_KEY = re.compile(r"^(?P<module>.+)\.lora_(?P<which>[AB])(?:\.[^.]+)?\.weight$")
_PEFT_PREFIX = "base_model.model."
#: The weights of a PEFT adapter directory, in the order looked for.
ADAPTER_FILES = ("adapter_model.safetensors", "adapter_model.bin")
_CONFIG = "adapter_config.json"


def lora_layout(path: str) -> bool:
    """A PEFT adapter directory: its config and its weights."""
    folder = Path(path)
    return (folder / _CONFIG).is_file() and any((folder / f).is_file() for f in ADAPTER_FILES)


class _InMemory(CheckpointReader):
    """A state dict's tensors (torch or numpy) as a reader."""

    def __init__(self, tensors: Mapping[str, Any]) -> None:
        self._tensors = {str(k): v for k, v in tensors.items()}
        bad = sorted(k for k, v in self._tensors.items()
                     if not (hasattr(v, "shape") and hasattr(v, "dtype")))
        if bad:
            raise error("the state dict", f"entries {bad[:10]} are neither torch tensors nor "
                                          "numpy arrays")

    @property
    def files(self) -> list[str]:
        return []

    def entries(self) -> Iterator[TensorEntry]:
        for name, value in self._tensors.items():
            yield TensorEntry(name, tuple(value.shape), str(value.dtype).removeprefix("torch."))

    def read(self, name: str, index: Any = None) -> Any:
        value = self._tensors[name]
        return value if index is None else value[to_slices(index)]


def _weights(path: Path) -> CheckpointReader:
    from diffract_formats.readers import SafetensorsReader, TorchReader

    if path.suffix.lower() == ".safetensors":
        return SafetensorsReader(str(path))
    return TorchReader(str(path), None)


def _scale(config: Path | None, scale: Any) -> float:
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float)) \
                or not math.isfinite(scale):
            raise error("format_options", f"scale must be a finite number, got {scale!r}")
        return float(scale)
    if config is None:
        return 1.0
    try:
        data = read_json_file(config)
        alpha, r = float(data["lora_alpha"]), float(data["r"])
        if not (math.isfinite(alpha) and math.isfinite(r) and r > 0):
            raise ValueError(f"lora_alpha {alpha} and r {r}: r must be positive, both finite")
        scale = alpha / math.sqrt(r) if data.get("use_rslora") else alpha / r
        if not math.isfinite(scale):
            raise ValueError(f"lora_alpha {alpha} over r {r} is {scale}, not a finite scale")
    except (ValueError, KeyError, TypeError, OverflowError) as exc:  # OverflowError: an
        # integer of hundreds of digits, which no float holds
        raise error(config, f"no usable lora_alpha and r ({exc}); pass the scale "
                            "explicitly (format_options={'scale': ...})") from None
    return scale


class LoraReader(CheckpointReader):
    """The updates of one adapter (see the module docstring)."""

    def __init__(self, adapter: Any, scale: float | None = None,
                 allow_outside: bool = False) -> None:
        config = None
        if isinstance(adapter, Mapping):
            self._inner: CheckpointReader = _InMemory(adapter)
            where = "the state dict"
        elif not isinstance(adapter, (str, os.PathLike)):
            raise error(type(adapter).__name__, "a PEFT adapter is read from its state dict, "
                                                "its adapter_model file or its directory")
        else:
            from diffract_formats.readers import OUTSIDE_HINT

            path = Path(adapter)
            if not path.exists():  # said as models.add says it, not as torch.load's failure
                raise error(path, "the file does not exist (a PEFT adapter: its directory, "
                                  "or its adapter_model.safetensors or .bin)")
            if path.is_dir():
                found = [path / f for f in ADAPTER_FILES if (path / f).is_file()]
                if not found:
                    raise error(path, "holds no adapter_model.safetensors or adapter_model.bin "
                                      "(a PEFT adapter directory)")
                path = found[0]
                if not allow_outside:
                    inside(path.parent, path.name, OUTSIDE_HINT)
            config = path.parent / _CONFIG if (path.parent / _CONFIG).is_file() else None
            if config is not None and not allow_outside:
                inside(path.parent, _CONFIG, OUTSIDE_HINT)
            self._inner, where = _weights(path), str(path)
        self.scale = _scale(config, scale)
        self._files = [*self._inner.files, *([str(config)] if config is not None else [])]
        self._pairs, self._entries = self._pair(where)

    def _pair(self, where: str) -> tuple[dict[str, tuple[str, str]], list[TensorEntry]]:
        found: dict[str, dict[str, TensorEntry]] = {}
        for entry in self._inner.entries():
            match = _KEY.match(entry.name)
            if match is not None:
                module = match["module"].removeprefix(_PEFT_PREFIX)
                found.setdefault(module, {})[match["which"]] = entry
        incomplete = sorted(m for m, p in found.items() if len(p) != 2)
        if incomplete:
            raise error(where, f"LoRA module(s) {incomplete[:5]} lack their A or B matrix")
        if not found:
            raise EmptyModelError(
                f"{where}: no LoRA pairs (parameters named '<module>.lora_A.weight' and "
                "'<module>.lora_B.weight'). Pass a PEFT adapter: its state dict, its "
                "adapter_model file or its directory.", model_id=None)
        pairs, entries = {}, []
        for module, pair in sorted(found.items()):
            a, b = pair["A"], pair["B"]
            if len(a.shape) < 2 or len(b.shape) < 2 or b.shape[1] != a.shape[0]:
                raise error(where, f"{module}: lora_B {b.shape} does not multiply lora_A "
                                   f"{a.shape} (B [out, r, ...] times A [r, in, ...])")
            rank = a.shape[0]
            name = f"{module}.weight"
            pairs[name] = (a.name, b.name)
            dtype = "float64" if "float64" in (a.dtype, b.dtype) else "float32"  # as read
            entries.append(TensorEntry(name, (b.shape[0], *a.shape[1:]), dtype, meta=(
                ("lora_rank", int(rank)), ("lora_scale", self.scale))))
        return pairs, entries

    @property
    def files(self) -> list[str]:
        return self._files

    def entries(self) -> list[TensorEntry]:
        return list(self._entries)

    def read(self, name: str, index: Any = None) -> np.ndarray:
        a_name, b_name = self._pairs[name]
        a, b = self._inner.read_numpy(a_name), self._inner.read_numpy(b_name)
        dtype = np.promote_types(np.promote_types(a.dtype, b.dtype), np.float32)
        a2 = a.reshape(a.shape[0], math.prod(a.shape[1:])).astype(dtype, copy=False)
        b2 = b.reshape(b.shape[0], math.prod(b.shape[1:])).astype(dtype, copy=False)
        update = (self.scale * (b2 @ a2)).reshape(b.shape[0], *a.shape[1:])
        return update if index is None else update[to_slices(index)]
