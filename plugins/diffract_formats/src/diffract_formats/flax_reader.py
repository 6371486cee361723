"""Flax checkpoints: the msgpack files of ``flax.serialization.to_bytes`` (Hugging Face's
``flax_model.msgpack`` too), read without JAX, Flax or the msgpack library.

The file is walked as msgpack (``_wire``): nested maps whose leaves are arrays, each an
extension (code 1) holding ``(shape, dtype name, bytes)``; listing records where each
array's bytes are, reading is one plain file read. Arrays Flax split into chunks
(``__msgpack_chunked_array__``) are joined. When the top level has ``params`` (a training
state with ``opt_state``, ``step``...), only ``params`` is read. Names are the keys joined
with dots (``params.Dense_0.kernel``).

**Orientation.** A ``kernel`` is ``[in, out]`` (Dense) or ``[k..., in, out]`` (Conv) in
Flax; it is reported as ``[out, in]`` / ``[out, in, k...]`` like PyTorch's weights
(``meta.orientation``). Embeddings (``embedding``, ``[vocab, dim]``) and the rest are as
stored.
"""

from __future__ import annotations

import math
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from diffract.plugins import CheckpointReader, TensorEntry
from diffract_formats._common import ConfigBeside, error, kernel_entry, turn_kernel
from diffract_formats._safetensors import _FP8 as _FP8_TABLES
from diffract_formats._wire import Span, WireError, msgpack_value

__all__ = ["FlaxReader"]

_NDARRAY = 1
_CHUNKED = "__msgpack_chunked_array__"
#: FP8 dtypes as jax names them -> their float32 values, by bit pattern (safetensors').
_FP8 = {"float8_e4m3fn": _FP8_TABLES["F8_E4M3"], "float8_e5m2": _FP8_TABLES["F8_E5M2"]}
#: The numpy dtype names accepted (numeric ones; others are refused by name).
_NUMPY = {np.dtype(c).name for c in "efdbhilqBHILQ?"}



class _Array:
    __slots__ = ("dtype", "shape", "spans")

    def __init__(self, shape: tuple[int, ...], dtype: str, spans: list[Span]) -> None:
        self.shape, self.dtype, self.spans = shape, dtype, spans


def _shape(value: Any, where: str) -> tuple[int, ...]:
    """A shape: a list of non-negative integers, or the ``{"0": n0, "1": n1}`` map
    ``flax.serialization`` writes for a chunked array's shape; anything else (floats,
    strings, booleans) is refused."""
    if isinstance(value, dict) and all(isinstance(k, str) and k.isdigit() for k in value):
        value = [value[k] for k in sorted(value, key=int)]
    if not isinstance(value, list) or not all(
            isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value):
        raise WireError(f"{where} has shape {value!r}, not a list of non-negative integers")
    return tuple(value)


def _array(buf: Any, ext: Span, where: str) -> _Array:
    """An ndarray extension's header: (shape, dtype name, bytes)."""
    (value, _) = msgpack_value(buf, ext.start, ext.stop)
    if not (isinstance(value, list) and len(value) == 3 and isinstance(value[2], Span)):
        raise WireError(f"{where}: an array extension that is not (shape, dtype, bytes)")
    shape, dtype, data = value
    if not isinstance(dtype, str) or (dtype not in _FP8 and dtype != "bfloat16" and not (
            dtype in _NUMPY and np.dtype(dtype).kind in "fiub")):
        raise WireError(f"{where} has dtype {dtype!r}, not one Diffract reads")
    return _Array(_shape(shape, where), dtype, [data])


def _leaves(buf: Any, node: Any, prefix: str, out: dict[str, _Array]) -> None:
    if isinstance(node, tuple) and node[:2] == ("ext", _NDARRAY):
        out[prefix] = _array(buf, node[2], f"array {prefix!r}")
    elif isinstance(node, dict) and node.get(_CHUNKED):
        chunks = node.get("chunks", {})
        if not (isinstance(chunks, dict) and chunks and all(
                isinstance(k, str) and k.isdigit() and isinstance(v, tuple) and v[:2] == (
                    "ext", _NDARRAY) for k, v in chunks.items())):
            raise WireError(f"chunked array {prefix!r} has no chunks numbered 0, 1, ...")
        parts = [_array(buf, chunks[k][2], f"array {prefix!r}")
                 for k in sorted(chunks, key=int)]  # numeric order: "10" after "9"
        if len({p.dtype for p in parts}) > 1:
            raise WireError(f"chunked array {prefix!r} mixes dtypes")
        shape = _shape(node.get("shape", []), f"array {prefix!r}")
        out[prefix] = _Array(shape, parts[0].dtype, [s for p in parts for s in p.spans])
    elif isinstance(node, dict):
        for key, value in node.items():
            _leaves(buf, value, f"{prefix}.{key}" if prefix else str(key), out)


def _storage(dtype: str) -> np.dtype:
    if dtype in _FP8:
        return np.dtype("u1")
    return np.dtype("<u2") if dtype == "bfloat16" else np.dtype(dtype).newbyteorder("<")


class FlaxReader(ConfigBeside, CheckpointReader):
    """A Flax msgpack checkpoint: see the module docstring."""

    def __init__(self, path: str) -> None:
        self._path = str(Path(path).resolve())
        try:
            with open(self._path, "rb") as fh, mmap.mmap(fh.fileno(), 0,
                                                          access=mmap.ACCESS_READ) as buf:
                tree, end = msgpack_value(buf, 0, len(buf))
                if end != len(buf):
                    raise WireError(f"{len(buf) - end} bytes follow the checkpoint")
                if not isinstance(tree, dict):
                    raise WireError("the top level is not a map of arrays")
                if isinstance(tree.get("params"), dict):
                    tree = {"params": tree["params"]}
                self._arrays: dict[str, _Array] = {}
                _leaves(buf, tree, "", self._arrays)
        except (WireError, ValueError, OSError, RecursionError) as exc:
            raise error(self._path, f"not a readable Flax msgpack checkpoint: {exc}. The "
                                     "file is truncated or corrupt; save it again") from None

    @property
    def files(self) -> list[str]:
        return [self._path]

    def _turn(self, name: str) -> str:
        array = self._arrays[name]
        if name.rsplit(".", 1)[-1] == "kernel" and len(array.shape) >= 2:
            return "dense" if len(array.shape) == 2 else "conv"
        return ""

    def entries(self) -> Iterator[TensorEntry]:
        for name, array in self._arrays.items():
            shape, rule = kernel_entry(array.shape, self._turn(name), "Flax")
            dtype = array.dtype if array.dtype in ("bfloat16", *_FP8) else np.dtype(
                array.dtype).name
            yield TensorEntry(name, shape, dtype, meta={"orientation": rule})

    def _stored(self, name: str) -> np.ndarray:
        array = self._arrays[name]
        parts = []
        with open(self._path, "rb") as fh:
            for span in array.spans:
                fh.seek(span.start)
                data = fh.read(len(span))
                if len(data) != len(span):
                    raise error(self._path, f"array {name!r} is cut short: the file was "
                                             "truncated; save it again")
                parts.append(data)
        try:
            values = np.frombuffer(b"".join(parts), dtype=_storage(array.dtype))
        except ValueError:  # a byte count that is no whole number of values
            values = np.zeros(0)
        if values.size != math.prod(array.shape):
            raise error(self._path, f"array {name!r} holds {values.size} values for shape "
                                     f"{array.shape}; the checkpoint is corrupt")
        values = values.reshape(array.shape)
        if array.dtype == "bfloat16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        elif array.dtype in _FP8:  # as safetensors' FP8: the float32 values
            values = _FP8[array.dtype][values]
        return values

    def read(self, name: str, index: Any = None) -> np.ndarray:
        """numpy in the stored dtype (bfloat16 and FP8 as float32)."""
        return turn_kernel(self._stored(name), self._turn(name), index)
