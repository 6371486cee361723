"""Hook implementations: the safetensors, torch, npz and huggingface model formats.

This module is what the entry point loads: it imports no reader (and no torch) until a
file of that kind is opened.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from diffract.plugins import ModelFormat, hookimpl


def _open(kind: str) -> Any:
    def open_(path: str) -> Any:
        from diffract_formats import readers

        return getattr(readers, kind)(path)

    open_.__qualname__ = f"open_{kind}"
    return open_


def _hf_layout(path: str) -> bool:
    from diffract_formats.readers import hf_layout

    return hf_layout(path)


@hookimpl
def diffract_model_formats() -> Iterator[ModelFormat]:
    yield ModelFormat("safetensors", _open("SafetensorsReader"), suffixes=(".safetensors",),
                      description="safetensors files, read with plain file reads (no memory "
                                  "map); a slice reads only its bytes.")
    yield ModelFormat("torch", _open("TorchReader"), suffixes=(".pt", ".pth", ".bin"),
                      description="torch state-dict files, torch.load(weights_only=True), "
                                  "memory-mapped when zip (needs torch).")
    yield ModelFormat("npz", _open("NpzReader"), suffixes=(".npz",),
                      description="numpy .npz files (allow_pickle=False).")
    yield ModelFormat("huggingface", _open("HuggingFaceReader"), layout=_hf_layout,
                      description="a Hugging Face-style checkpoint directory holding "
                                  "model.safetensors.index.json and its shards, "
                                  "model.safetensors, pytorch_model.bin.index.json and its "
                                  "shards, or pytorch_model.bin (config.json for view rules)")
