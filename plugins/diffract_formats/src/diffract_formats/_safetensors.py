"""Reading safetensors files with plain file reads (no memory map, no extra package).

Why not the ``safetensors`` package: it memory-maps the file, so every page a read
touches stays in the process's resident set (a 4 GiB checkpoint read once makes a
4 GiB process), and a file truncated after it was opened kills the process with a bus
error. Here the header is parsed and checked against the file's size when the file is
opened, and each tensor is read with ``readinto`` into its own buffer: memory is what
the tensor needs, and a short read is an error. Half-precision tensors are converted to
float32 block by block, so the conversion needs one float32 copy, not two.
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

import numpy as np

__all__ = ["FLOAT_DTYPES", "ITEMSIZE", "SafetensorsError", "SafetensorsFile"]

#: safetensors dtype -> (name, bytes per element) for the floating-point dtypes read.
FLOAT_DTYPES = {"F16": ("float16", 2), "BF16": ("bfloat16", 2), "F32": ("float32", 4),
                "F64": ("float64", 8)}
ITEMSIZE = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E4M3": 1, "F8_E5M2": 1, "I16": 2, "U16": 2,
             "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
_BLOCK = 1 << 22  # elements converted at a time (16 MiB of float32)


class SafetensorsError(ValueError):
    """The file is not a well-formed safetensors file (the message says how)."""


class SafetensorsFile:
    """One safetensors file: its entries, and tensors read on request."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.fspath(path)
        size = os.path.getsize(self.path)
        with open(self.path, "rb") as fh:
            start = fh.read(8)
            if len(start) < 8:
                raise SafetensorsError(f"the file is {size} bytes: too short for a header")
            length = int.from_bytes(start, "little")
            if length > size - 8:
                raise SafetensorsError(f"the header declares {length} bytes but the file "
                                       f"holds {size - 8} after the length")
            try:
                header = json.loads(fh.read(length))
            except ValueError as exc:
                raise SafetensorsError(f"the header is not JSON ({exc})") from None
        if not isinstance(header, dict):
            raise SafetensorsError("the header is not a JSON object")
        self.data_start = 8 + length
        data_size = size - self.data_start
        self.entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape = entry["dtype"], tuple(int(d) for d in entry["shape"])
                begin, end = (int(x) for x in entry["data_offsets"])
            except (KeyError, TypeError, ValueError):
                raise SafetensorsError(
                    f"entry {name!r} lacks dtype, shape or data_offsets") from None
            expected = math.prod(shape) * ITEMSIZE.get(dtype, 0)
            if dtype not in ITEMSIZE or end - begin != expected or not 0 <= begin <= end:
                raise SafetensorsError(f"entry {name!r} ({dtype} {list(shape)}) does not match "
                                       f"its data_offsets [{begin}, {end}]")
            if end > data_size:
                raise SafetensorsError(f"entry {name!r} ends at byte {end} of the data, but the "
                                       f"file holds {data_size} (truncated?)")
            self.entries[name] = (dtype, shape, begin, end)

    def floats(self) -> list[tuple[str, tuple[int, ...], str]]:
        """(name, shape, dtype name) of the floating-point tensors, in file order."""
        ordered = sorted(self.entries.items(), key=lambda kv: kv[1][2])
        return [(name, shape, FLOAT_DTYPES[dtype][0])
                for name, (dtype, shape, _, _) in ordered if dtype in FLOAT_DTYPES]

    def _read(self, name: str, dtype: np.dtype, offset: int, count: int, fh: Any) -> np.ndarray:
        buf = np.empty(count, dtype=dtype)
        fh.seek(self.data_start + offset)
        got = fh.readinto(memoryview(buf).cast("B"))
        if got != buf.nbytes:
            raise SafetensorsError(f"tensor {name!r}: read {got} of {buf.nbytes} bytes: the "
                                   "file is shorter than its header says")
        return buf

    def rows(self, name: str, start: int, stop: int, *, convert: bool = True) -> np.ndarray:
        """Rows ``start:stop`` of the leading axis (the whole tensor for a scalar).

        With ``convert``, half types come as float32 (converted block by block, so the
        conversion needs one float32 copy, not two); without it, float16 stays float16
        and bfloat16 comes as its raw 16-bit patterns (``int16``: numpy has no bf16).
        """
        dtype, shape, begin, _ = self.entries[name]
        per_row = math.prod(shape[1:]) if shape else 1
        item = ITEMSIZE[dtype]
        offset, count = begin + start * per_row * item, (stop - start) * per_row
        out_shape = (stop - start, *shape[1:]) if shape else ()
        with open(self.path, "rb") as fh:
            if dtype in ("F32", "F64") or (dtype == "F16" and not convert):
                kind = {"F32": np.float32, "F64": np.float64, "F16": np.float16}[dtype]
                return self._read(name, np.dtype(kind), offset, count, fh).reshape(out_shape)
            if not convert:
                return self._read(name, np.dtype(np.int16), offset, count, fh).reshape(out_shape)
            out = np.empty(count, dtype=np.float32)
            for i in range(0, count, _BLOCK):
                n = min(_BLOCK, count - i)
                bits = self._read(name, np.dtype(np.uint16), offset + 2 * i, n, fh)
                if dtype == "BF16":
                    out[i:i + n] = (bits.astype(np.uint32) << 16).view(np.float32)
                else:
                    out[i:i + n] = bits.view(np.float16)
        return out.reshape(out_shape)
