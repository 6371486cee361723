"""GGUF files (llama.cpp's format), read with the ``gguf`` library
(``pip install diffractml-formats[gguf]``).

Opening parses the header only (``gguf.GGUFReader``: the key-value metadata and the
tensor infos); the memory map it makes is dropped at once. A tensor is read with plain
file reads of its bytes, then F32/F16/F64 are used as they are and every other type (BF16
and the quantised ones: Q8_0, Q4_0, Q4_K, Q5_K, Q6_K...) goes through the library's own
``gguf.quants.dequantize`` to float32, one tensor at a time. GGUF lists dimensions
fastest-first (``ne``); the reader reports them the other way round, so a linear layer
is ``[out, in]`` as in every other format. Each parameter keeps its storage type as
``meta.quant`` (``F16``, ``Q4_K``...): quantisation changes the spectrum.
"""

from __future__ import annotations

import math
import mmap
import os
import struct
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import ModelSourceError, install_hint
from diffract.plugins import CheckpointReader, TensorEntry, to_slices
from diffract_formats._common import Config, error, library

__all__ = ["GGUFFileReader"]

_DIRECT = {"F32": np.float32, "F16": np.float16, "F64": np.float64}
#: GGUF metadata keys (after the architecture's prefix) that view rules read as config.
_CONFIG = {"attention.head_count": "num_attention_heads",
           "attention.head_count_kv": "num_key_value_heads",
           "embedding_length": "hidden_size", "block_count": "num_hidden_layers",
           "expert_count": "num_local_experts", "attention.key_length": "head_dim"}



def _library(path: str) -> Any:
    return library("gguf", path, "reading a GGUF file needs the gguf library: "
                                 + install_hint("diffractml-formats", "gguf"))


class GGUFFileReader(CheckpointReader):
    """A ``.gguf`` file: see the module docstring."""

    def __init__(self, path: str) -> None:
        self._path = str(Path(path).resolve())
        gguf = _library(path)
        self._gguf = gguf
        try:
            _precheck(self._path)
            reader = gguf.GGUFReader(self._path)
            size = os.path.getsize(self._path)
            self._tensors: dict[str, tuple[Any, tuple[int, ...], int, int]] = {}
            for t in reader.tensors:
                shape = tuple(int(d) for d in reversed(t.shape.tolist()))
                if t.data_offset + int(t.n_bytes) > size:
                    raise ValueError(f"tensor {t.name!r} ends at byte "
                                     f"{t.data_offset + int(t.n_bytes)} of a {size}-byte file")
                _check_size(gguf, t.name, t.tensor_type, shape, int(t.n_bytes))
                self._tensors[t.name] = (t.tensor_type, shape, int(t.data_offset),
                                         int(t.n_bytes))
            self._config = self._read_config(reader)
            del reader  # its memory map: reads go through plain file reads
        except ModelSourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - the library's errors, named with the file
            raise error(self._path, f"not a readable GGUF file: {type(exc).__name__}: "
                                     f"{str(exc)[:200]}. The file is truncated or corrupt; "
                                     "download or convert it again") from None

    @staticmethod
    def _read_config(reader: Any) -> dict[str, Any]:
        """The geometry view rules need, from the metadata (``llama.attention.head_count``
        becomes ``num_attention_heads``...)."""
        fields = reader.fields
        arch_field = fields.get("general.architecture")
        if arch_field is None:
            return {}
        arch = bytes(arch_field.parts[arch_field.data[0]]).decode("utf-8", "replace")
        config: dict[str, Any] = {"model_type": arch}
        for key, name in _CONFIG.items():
            field = fields.get(f"{arch}.{key}")
            if field is not None and field.data:
                value = field.parts[field.data[0]]
                if np.size(value) == 1:
                    config[name] = int(np.asarray(value).reshape(-1)[0])
        return config

    @property
    def files(self) -> list[str]:
        return [self._path]

    def entries(self) -> Iterator[TensorEntry]:
        for name, (kind, shape, _, _) in self._tensors.items():
            direct = _DIRECT.get(kind.name)
            dtype = np.dtype(direct).name if direct is not None else (
                "float32" if kind.name in _dequantised(self._gguf) else "int")
            yield TensorEntry(name, shape, dtype, meta={"quant": kind.name})

    def _bytes(self, name: str) -> bytes:
        _, _, offset, length = self._tensors[name]
        with open(self._path, "rb") as fh:
            fh.seek(offset)
            data = fh.read(length)
        if len(data) != length:
            raise error(self._path, f"tensor {name!r} is cut short ({len(data)} of {length} "
                                     "bytes): the file was truncated; download it again")
        return data

    def _decode(self, name: str, index: Any) -> np.ndarray:
        kind, shape, _, _ = self._tensors[name]
        data = self._bytes(name)
        direct = _DIRECT.get(kind.name)
        if direct is not None:
            values = np.frombuffer(data, dtype=direct).reshape(shape)
        else:
            raw = np.frombuffer(data, dtype=np.uint8)
            rows = raw.reshape(*shape[:-1], -1) if len(shape) > 1 else raw
            try:
                values = self._gguf.quants.dequantize(rows, kind).reshape(shape)
            except Exception as exc:  # noqa: BLE001 - named with the tensor and type
                raise error(self._path, f"tensor {name!r} of type {kind.name} cannot be "
                                         f"dequantised by gguf {_version()}: "
                                         f"{type(exc).__name__}: {exc}") from None
        values = np.asarray(values)
        return values.copy() if index is None else values[to_slices(index)].copy()

    def read(self, name: str, index: Any = None) -> np.ndarray:
        """The tensor as float32 (or F16/F64 as stored); what cannot be decoded is a
        ModelSourceError naming it."""
        try:
            return self._decode(name, index)
        except ModelSourceError:
            raise
        except (ValueError, TypeError, IndexError) as exc:
            raise error(self._path, f"tensor {name!r} cannot be decoded "
                                     f"({type(exc).__name__}: {str(exc)[:200]}); the file is "
                                     "corrupt, download or convert it again") from None

    def read_numpy(self, name: str, index: Any = None) -> np.ndarray:
        values = self.read(name, index)
        return values.astype(np.float32) if values.dtype == np.float16 else values

    def config(self) -> Mapping[str, Any]:
        return Config(self._config, f"{self._path}'s metadata")


#: Bytes of each GGUF metadata value type (8: string, 9: array, of variable size).
_SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _precheck(path: str) -> None:
    """Walk the header (metadata and tensor infos) with every count checked against the
    bytes left, before the gguf library reads it: the library loops over a declared array
    length even past the file's end, so a 2 KB file declaring 2^60 items grew a process
    to 23 GB. Raises ValueError naming what lies."""
    with open(path, "rb") as fh:  # mapped: only the header's pages are read (the gguf
        if os.path.getsize(path) < 24:  # library maps the whole file next anyway)
            raise ValueError("no GGUF header")
        with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _walk_header(data)


def _walk_header(data: Any) -> None:
    if data[:4] != b"GGUF":
        raise ValueError("no GGUF header")
    order = "<" if int.from_bytes(data[4:8], "little") & 0xFFFF else ">"  # as the library
    pos = 8

    def take(fmt: str) -> int:
        nonlocal pos
        size = struct.calcsize(fmt)
        if pos + size > len(data):
            raise ValueError(f"the header ends at byte {len(data)} inside a value")
        (value,) = struct.unpack_from(order + fmt, data, pos)
        pos += size
        return value

    def need(count: int, each: int, what: str) -> None:
        if count * each > len(data) - pos:
            raise ValueError(f"{what} declares {count} items of {each} bytes, more than the "
                             f"{len(data) - pos} bytes left")

    def skip(count: int, each: int, what: str) -> None:
        nonlocal pos
        need(count, each, what)
        pos += count * each

    def value(kind: int, depth: int = 0) -> None:
        if kind in _SCALAR:
            skip(1, _SCALAR[kind], "a value")
        elif kind == 8:
            skip(take("Q"), 1, "a string")
        elif kind == 9 and depth < 4:
            item, count = take("I"), take("Q")
            if item in _SCALAR:
                skip(count, _SCALAR[item], "an array")
                return
            need(count, 8, "an array")  # each string or array has an 8-byte length
            for _ in range(count):
                value(item, depth + 1)
        else:
            raise ValueError(f"metadata value type {kind} is not GGUF's")

    tensors, fields = take("Q"), take("Q")
    need(fields, 12, "the metadata")  # a key length and a type, at least
    for _ in range(fields):
        skip(take("Q"), 1, "a metadata key")
        value(take("I"))
    need(tensors, 24, "the tensor list")  # a name length, n_dims, type and offset
    for _ in range(tensors):
        skip(take("Q"), 1, "a tensor name")
        dims = take("I")
        if dims > 8:
            raise ValueError(f"a tensor of {dims} dimensions")
        skip(dims, 8, "a tensor's dimensions")
        skip(1, 12, "a tensor's type and offset")


def _check_size(gguf: Any, name: str, kind: Any, shape: tuple[int, ...], n_bytes: int) -> None:
    """Refuse a tensor whose byte count is not what its type and shape take (ValueError)."""
    block, type_size = gguf.GGML_QUANT_SIZES.get(kind, (1, 0))
    elements = math.prod(shape)
    if not type_size or elements % block or (shape and shape[-1] % block):
        raise ValueError(f"tensor {name!r} of type {kind.name} has shape {shape}, which its "
                         f"blocks of {block} do not divide")
    if elements // block * type_size != n_bytes:
        raise ValueError(f"tensor {name!r} takes {n_bytes} bytes where {kind.name} "
                         f"{shape} takes {elements // block * type_size}")


def _dequantised(gguf: Any) -> set[str]:
    """The types the installed library dequantises (floats; the integer types are not
    weights)."""
    kinds = {k.name for k in gguf.GGMLQuantizationType}
    return {k for k in kinds if not k.startswith("I") or k.startswith("IQ")}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:  # pragma: no cover
        return "?"
