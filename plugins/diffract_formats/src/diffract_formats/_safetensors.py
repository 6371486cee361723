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

__all__ = ["FLOAT_DTYPES", "ITEMSIZE", "LocalFiles", "SafetensorsError", "SafetensorsFile"]

#: safetensors dtype -> (name, bytes per element) for the floating-point dtypes read.
FLOAT_DTYPES = {"F16": ("float16", 2), "BF16": ("bfloat16", 2), "F32": ("float32", 4),
                "F64": ("float64", 8), "F8_E4M3": ("float8_e4m3fn", 1),
                "F8_E5M2": ("float8_e5m2", 1)}
#: Bits per element of every dtype the format defines (sub-byte types pack elements).
BITS = {"BOOL": 8, "U8": 8, "I8": 8, "F8_E4M3": 8, "F8_E5M2": 8, "F8_E8M0": 8, "I16": 16,
        "U16": 16, "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "I64": 64,
        "U64": 64, "F64": 64, "C64": 64, "F4": 4, "F6_E2M3": 6, "F6_E3M2": 6}
ITEMSIZE = {k: v // 8 for k, v in BITS.items() if v % 8 == 0}
#: Dtypes the format defines that are not read as weights (named when skipped).
SKIPPED = {"C64": "complex", "F8_E8M0": "a scale format (exponent only)",
           "F4": "4-bit", "F6_E2M3": "6-bit", "F6_E3M2": "6-bit"}
#: The largest header accepted (the reference library's limit is 100 MB).
MAX_HEADER = 100_000_000
_BLOCK = 1 << 22  # elements converted at a time (16 MiB of float32)


class LocalFiles:
    """Plain files, as the readers see them: a file's size and a binary handle on it."""

    size = staticmethod(os.path.getsize)

    @staticmethod
    def open(path: str) -> Any:
        return open(path, "rb")  # noqa: SIM115 - the caller closes it


class SafetensorsError(ValueError):
    """The file is not a well-formed safetensors file (the message says how)."""


def _fp8_table(exponent_bits: int, finite_only: bool) -> np.ndarray:
    """float32 values of the 256 bit patterns of an 8-bit float (1 sign bit, then
    ``exponent_bits``, then the mantissa)."""
    mantissa_bits = 7 - exponent_bits
    bias = (1 << (exponent_bits - 1)) - 1
    out = np.empty(256, dtype=np.float32)
    for bits in range(256):
        sign = -1.0 if bits & 0x80 else 1.0
        exp = (bits >> mantissa_bits) & ((1 << exponent_bits) - 1)
        man = bits & ((1 << mantissa_bits) - 1)
        top = (1 << exponent_bits) - 1
        if finite_only and exp == top and man == (1 << mantissa_bits) - 1:
            value = math.nan  # E4M3FN: only all-ones is NaN, no infinities
        elif not finite_only and exp == top:
            value = math.inf if man == 0 else math.nan
        elif exp == 0:
            value = man / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            value = (1 + man / (1 << mantissa_bits)) * 2.0 ** (exp - bias)
        out[bits] = sign * value
    return out


_FP8 = {"F8_E4M3": _fp8_table(4, True), "F8_E5M2": _fp8_table(5, False)}


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsError(f"the header names {key!r} twice")
        out[key] = value
    return out


def _refuse_constant(name: str) -> None:
    raise SafetensorsError(f"the header holds {name}, which JSON numbers cannot be")


def _count(value: Any, what: str, name: str) -> int:
    """A non-negative JSON integer (not a bool, a float or a string)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise SafetensorsError(f"entry {name!r}: {what} {value!r} is not a non-negative "
                               "integer")
    return value


def _header(fh: Any, size: int) -> tuple[dict[str, Any], int]:
    start = fh.read(8)
    if len(start) < 8:
        raise SafetensorsError(f"the file is {size} bytes: too short for a header")
    length = int.from_bytes(start, "little")
    if length > MAX_HEADER:
        raise SafetensorsError(f"the header declares {length} bytes, over the "
                               f"{MAX_HEADER // 1_000_000} MB a safetensors header may have")
    if length > size - 8:
        raise SafetensorsError(f"the header declares {length} bytes but the file holds "
                               f"{size - 8} after the length")
    raw = fh.read(length)
    try:
        text = raw.decode("utf-8")
        header = json.loads(text, object_pairs_hook=_no_duplicates,
                            parse_constant=_refuse_constant)
    except UnicodeDecodeError:
        raise SafetensorsError("the header is not UTF-8") from None
    except RecursionError:
        raise SafetensorsError("the header's JSON is nested too deeply") from None
    except SafetensorsError:
        raise
    except ValueError as exc:
        raise SafetensorsError(f"the header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise SafetensorsError("the header is not a JSON object")
    meta = header.get("__metadata__", {})
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                             for k, v in meta.items()):
        raise SafetensorsError("__metadata__ must map strings to strings")
    return header, length


class SafetensorsFile:
    """One safetensors file: its entries, and tensors read on request. The header is
    held to the format's rules (what the reference library refuses is refused here,
    with the reason): at most 100 MB, UTF-8 JSON without duplicate keys, every entry a
    known dtype, a shape of non-negative integers and offsets that cover the data exactly
    (no overlap, no gap, nothing after the last tensor)."""

    def __init__(self, path: str | os.PathLike[str], files: Any = None) -> None:
        self.path = os.fspath(path)
        #: where the bytes are: plain files, or an object store (``size``, ``open``)
        self.files = files or LocalFiles
        size = self.files.size(self.path)
        with self.files.open(self.path) as fh:
            header, length = _header(fh, size)
        self.data_start = 8 + length
        data_size = size - self.data_start
        self.entries: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        #: every tensor, whatever its dtype (quantized checkpoints read integer ones)
        self.layout: dict[str, tuple[str, tuple[int, ...], int, int]] = {}
        self.skipped: dict[str, str] = {}
        spans = []
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            if not isinstance(entry, dict) or set(entry) != {"dtype", "shape", "data_offsets"}:
                raise SafetensorsError(f"entry {name!r} must have exactly dtype, shape and "
                                       "data_offsets")
            dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
            if not isinstance(dtype, str) or dtype not in BITS:
                raise SafetensorsError(f"entry {name!r}: dtype {dtype!r} is not a "
                                       "safetensors dtype")
            if not isinstance(shape, list) or not isinstance(offsets, list) or len(offsets) != 2:
                raise SafetensorsError(f"entry {name!r}: shape must be a list and "
                                       "data_offsets a list of two integers")
            shape = tuple(_count(d, "dimension", name) for d in shape)
            begin, end = (_count(x, "offset", name) for x in offsets)
            bits = math.prod(shape) * BITS[dtype]
            if bits % 8 or end - begin != bits // 8 or begin > end:
                raise SafetensorsError(f"entry {name!r} ({dtype} {list(shape)}) does not match "
                                       f"its data_offsets [{begin}, {end}]")
            if end > data_size:
                raise SafetensorsError(f"entry {name!r} ends at byte {end} of the data, but the "
                                       f"file holds {data_size} (truncated?)")
            spans.append((begin, end, name))
            self.layout[name] = (dtype, shape, begin, end)
            if dtype in SKIPPED:
                self.skipped[name] = f"{dtype} ({SKIPPED[dtype]})"
            else:
                self.entries[name] = (dtype, shape, begin, end)
        position = 0
        for begin, end, name in sorted(spans):
            if begin != position:
                what = "overlaps the tensor before it" if begin < position else \
                    f"leaves a gap of {begin - position} bytes before it"
                raise SafetensorsError(f"entry {name!r} (bytes [{begin}, {end}]) {what}")
            position = end
        if position != data_size:
            raise SafetensorsError(f"the tensors cover {position} bytes of data but the file "
                                   f"holds {data_size}: {data_size - position} bytes after "
                                   "the last tensor")

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

    def raw(self, name: str) -> np.ndarray:
        """Any byte-aligned tensor as numpy: integers as their type, floats as
        :meth:`rows` gives them (half types and 8-bit floats as float32), an 8-bit
        exponent scale (F8_E8M0) as its uint8 bit patterns."""
        dtype, shape, begin, _ = self.layout[name]
        if dtype in FLOAT_DTYPES:
            return self.rows(name, 0, shape[0] if shape else 1)
        kinds = {"U8": np.uint8, "F8_E8M0": np.uint8, "I8": np.int8, "BOOL": np.uint8,
                 "I16": np.int16, "U16": np.uint16, "I32": np.int32, "U32": np.uint32,
                 "I64": np.int64, "U64": np.uint64}
        if dtype not in kinds:
            raise SafetensorsError(f"tensor {name!r} is {dtype}, which is not read as numbers")
        with self.files.open(self.path) as fh:
            return self._read(name, np.dtype(kinds[dtype]), begin, math.prod(shape),
                              fh).reshape(shape)

    def rows(self, name: str, start: int, stop: int, *, convert: bool = True) -> np.ndarray:
        """Rows ``start:stop`` of the leading axis (the whole tensor for a scalar).

        With ``convert``, half types come as float32 (converted block by block, so the
        conversion needs one float32 copy, not two); without it, float16 stays float16
        and bfloat16 comes as its raw 16-bit patterns (``int16``: numpy has no bf16).
        8-bit floats always come as float32.
        """
        dtype, shape, begin, _ = self.entries[name]
        per_row = math.prod(shape[1:]) if shape else 1
        item = ITEMSIZE[dtype]
        offset, count = begin + start * per_row * item, (stop - start) * per_row
        out_shape = (stop - start, *shape[1:]) if shape else ()
        with self.files.open(self.path) as fh:
            if dtype in _FP8:  # as torch reads them: float32 values
                bits = self._read(name, np.dtype(np.uint8), offset, count, fh)
                return _FP8[dtype][bits].reshape(out_shape)
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
