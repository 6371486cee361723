"""Hook implementations: the safetensors, torch, npz, gguf, onnx, keras, flax, dcp
(torch.distributed.checkpoint), huggingface, deepspeed (ZeRO) and peft-lora (a LoRA
adapter's updates) model formats.

This module is what the entry point loads: it imports no reader (and no torch) until a
file of that kind is opened.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from diffract.plugins import ModelFormat, hookimpl


def _safetensors(path: str) -> Any:
    from diffract_formats.quantized import wrap
    from diffract_formats.readers import SafetensorsReader

    reader = SafetensorsReader(path)
    return wrap(reader, reader.tensor_files(), path)


def _torch(path: str, key: str | None = None) -> Any:
    from diffract_formats.readers import TorchReader

    return TorchReader(path, key)


def _npz(path: str) -> Any:
    from diffract_formats.readers import NpzReader

    return NpzReader(path)


def _huggingface(path: str, allow_outside: bool = False) -> Any:
    from diffract_formats.quantized import wrap
    from diffract_formats.readers import HuggingFaceReader

    reader = HuggingFaceReader(path, allow_outside)
    return wrap(reader, reader.tensor_files(), path)


def _gguf(path: str) -> Any:
    from diffract_formats.gguf_reader import GGUFFileReader

    return GGUFFileReader(path)


def _onnx(path: str) -> Any:
    from diffract_formats.onnx_reader import OnnxReader

    return OnnxReader(path)


def _keras(path: str) -> Any:
    from diffract_formats.keras_reader import KerasReader

    return KerasReader(path)


def _flax(path: str) -> Any:
    from diffract_formats.flax_reader import FlaxReader

    return FlaxReader(path)


def _dcp(path: str, prefix: str | None = None) -> Any:
    from diffract_formats.dcp_reader import DcpReader

    return DcpReader(path, prefix)


def _dcp_layout(path: str) -> bool:
    from diffract_formats.dcp_reader import dcp_layout

    return dcp_layout(path)


def _deepspeed(path: str) -> Any:
    from diffract_formats.deepspeed_reader import DeepSpeedReader

    return DeepSpeedReader(path)


def _zero_layout(path: str) -> bool:
    from diffract_formats.deepspeed_reader import zero_layout

    return zero_layout(path)


def _lora(adapter: Any, scale: float | None = None, allow_outside: bool = False) -> Any:
    from diffract_formats.lora_reader import LoraReader

    return LoraReader(adapter, scale, allow_outside)


def _lora_layout(path: str) -> bool:
    from diffract_formats.lora_reader import lora_layout

    return lora_layout(path)


def _hf_locate(name: str) -> str | None:
    from diffract_formats.hub_cache import locate

    return locate(name)


def _hf_layout(path: str) -> bool:
    from diffract_formats.readers import hf_layout

    return hf_layout(path)


@hookimpl
def diffract_model_formats() -> Iterator[ModelFormat]:
    yield ModelFormat("safetensors", _safetensors, suffixes=(".safetensors",),
                      description="safetensors files, read with plain file reads (no memory "
                                  "map); a slice reads only its bytes.")
    yield ModelFormat("torch", _torch, suffixes=(".pt", ".pth", ".bin"),
                      description="torch state-dict files and training checkpoints holding "
                                  "one (option key), torch.load(weights_only=True); "
                                  "zip files listed without their data, a tensor read "
                                  "with plain file reads (needs torch).")
    yield ModelFormat("npz", _npz, suffixes=(".npz",),
                      description="numpy .npz files (allow_pickle=False).")
    yield ModelFormat("gguf", _gguf, suffixes=(".gguf",), magic=(b"GGUF",),
                      description="llama.cpp's GGUF files: F32/F16 as stored, BF16 and "
                                  "quantised types (Q8_0, Q4_K...) dequantised to float32 by "
                                  "the gguf library, the type kept as meta.quant "
                                  "(diffractml-formats[gguf]).")
    yield ModelFormat("onnx", _onnx, suffixes=(".onnx",),
                      description="ONNX models: floating-point initializers of rank >= 2, "
                                  "external data beside the model, [in, out] MatMul/Gemm "
                                  "weights turned to [out, in] (no library needed).")
    yield ModelFormat("keras", _keras, suffixes=(".keras", ".h5", ".hdf5"),
                      magic=(b"\x89HDF\r\n\x1a\n",),
                      description="Keras .keras archives and HDF5 weight files (Keras 2 and "
                                  "3 layouts) without TensorFlow; kernels [in, out] turned "
                                  "to [out, in] (diffractml-formats[keras]: h5py).")
    yield ModelFormat("flax", _flax, suffixes=(".msgpack",),
                      description="Flax msgpack checkpoints (flax.serialization.to_bytes), "
                                  "without JAX; kernels [in, out] turned to [out, in] (no "
                                  "library needed).")
    yield ModelFormat("huggingface", _huggingface, layout=_hf_layout, locate=_hf_locate,
                      description="a Hugging Face-style checkpoint directory holding "
                                  "model.safetensors.index.json and its shards, "
                                  "model.safetensors, pytorch_model.bin.index.json and its "
                                  "shards, or pytorch_model.bin (config.json for view "
                                  "rules); a model id (org/name[@revision]) from the local "
                                  "Hugging Face cache, offline")
    yield ModelFormat("dcp", _dcp, layout=_dcp_layout,
                      description="torch.distributed.checkpoint folders (.metadata and "
                                  ".distcp shards: torchtitan, OLMo-core, FSDP), the "
                                  "metadata unpickled with DCP's own classes only, each "
                                  "chunk read by byte range with torch.load(weights_only="
                                  "True); option prefix (needs torch)")
    yield ModelFormat("deepspeed", _deepspeed, layout=_zero_layout,
                      description="DeepSpeed ZeRO checkpoints (global_step*/, or the folder "
                                  "whose 'latest' names one): the fp32 master weights joined "
                                  "from the ranks' partitions as zero_to_fp32 does, stages "
                                  "1-3, without DeepSpeed; foreign pickled classes inert "
                                  "(needs torch)")
    yield ModelFormat("peft-lora", _lora, layout=_lora_layout, objects=True,
                      description="a PEFT LoRA adapter (its directory with "
                                  "adapter_config.json, its adapter_model file, or its state "
                                  "dict in memory) read as the updates scale * B @ A of the "
                                  "adapted modules, computed on read; options scale "
                                  "(default lora_alpha / r from the config), allow_outside")
