"""Stored values to rows and back: numbers in columns, arrays inline or in files.

A value is encoded as a ``kind`` and one payload:

* ``b``/``i``: a bool or an integer in the integer column;
* ``f``: a float in the real column (``n`` for NaN, which SQLite cannot keep);
* ``s``: a string, UTF-8 in the blob column;
* ``a``: a numpy array as ``.npy`` bytes in the blob column (up to :data:`INLINE_BYTES`);
* ``A``: a numpy array in an ``.npy`` file the row names, read back memory-mapped;
* ``t``/``T``: a tuple, as an ``.npz`` archive (inline or in a file) of its items, with
  their kinds, nested tuples flattened by path.

Nothing is pickled: arrays of a numeric or boolean dtype only (the store contract), and
loading never allows pickles.
"""

from __future__ import annotations

import io
import math
import os
import re
import zlib
from typing import Any

import numpy as np

__all__ = ["INLINE_BYTES", "Encoded", "decode", "encode"]

#: Arrays up to this size are kept in the database row; larger ones in their own file.
INLINE_BYTES = 64 << 10


class Encoded:
    """One encoded value: kind, integer, real, inline bytes, or what goes to a file
    (``file_array``, written straight as ``.npy`` without an extra copy, or
    ``file_bytes``)."""

    __slots__ = ("kind", "inum", "num", "blob", "file_bytes", "file_array", "nbytes")

    def __init__(self, kind: str, *, inum: int | None = None, num: float | None = None,
                 blob: bytes | None = None, file_bytes: bytes | None = None,
                 file_array: np.ndarray | None = None, nbytes: int = 8) -> None:
        self.kind, self.inum, self.num, self.blob = kind, inum, num, blob
        self.file_bytes, self.file_array, self.nbytes = file_bytes, file_array, nbytes

    @property
    def to_file(self) -> bool:
        return self.file_bytes is not None or self.file_array is not None

    def write(self, fh: Any) -> int:
        """Write the file payload to an open binary file; returns its CRC32 (computed on
        the array's memory as it is written, with no extra copy)."""
        if self.file_array is None:
            fh.write(self.file_bytes)
            return zlib.crc32(self.file_bytes)
        array = np.ascontiguousarray(self.file_array)
        header = io.BytesIO()
        np.lib.format.write_array_header_2_0(
            header, np.lib.format.header_data_from_array_1_0(array))
        fh.write(header.getvalue())
        crc = zlib.crc32(header.getvalue())
        if array.size:
            crc = zlib.crc32(memoryview(array.reshape(-1)).cast("B"), crc)
            array.tofile(fh)
        return crc


def _npy(array: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, np.asarray(array), allow_pickle=False)
    return buf.getvalue()


def _flatten(value: tuple, prefix: str, out: dict[str, np.ndarray], kinds: list[str]) -> None:
    for i, item in enumerate(value):
        key = f"{prefix}{i}"
        if isinstance(item, tuple):
            kinds.append(f"{key}:t:{len(item)}")
            _flatten(item, key + "/", out, kinds)
            continue
        if isinstance(item, (bool, np.bool_)):
            kind = "b"
        elif isinstance(item, (int, np.integer)):
            kind = "i"
        elif isinstance(item, (float, np.floating)):
            kind = "f"
        else:
            kind = "a"
        kinds.append(f"{key}:{kind}")
        out[key] = np.asarray(item)


def encode(value: Any) -> Encoded:
    """Encode a storable value (see :func:`diffract.plugins.storable_problem`)."""
    if isinstance(value, (bool, np.bool_)):
        return Encoded("b", inum=int(bool(value)))
    if isinstance(value, (int, np.integer)):
        number = int(value)
        if -(1 << 63) <= number < (1 << 63):
            return Encoded("i", inum=number)
        return Encoded("f", num=float(number))
    if isinstance(value, (float, np.floating)):
        number = float(value)
        return Encoded("n") if math.isnan(number) else Encoded("f", num=number)
    if isinstance(value, str):
        data = value.encode("utf-8")
        return Encoded("s", blob=data, nbytes=len(data))
    if isinstance(value, np.ndarray):
        if value.nbytes + 128 <= INLINE_BYTES:
            return Encoded("a", blob=_npy(value), nbytes=value.nbytes)
        return Encoded("A", file_array=value, nbytes=value.nbytes)
    if isinstance(value, tuple):
        arrays: dict[str, np.ndarray] = {}
        kinds: list[str] = []
        _flatten(value, "", arrays, kinds)
        buf = io.BytesIO()
        np.savez(buf, __kinds__=np.array(kinds + [f":len:{len(value)}"]), **arrays)
        data = buf.getvalue()
        nbytes = sum(a.nbytes for a in arrays.values()) + 8
        if len(data) <= INLINE_BYTES:
            return Encoded("t", blob=data, nbytes=nbytes)
        return Encoded("T", file_bytes=data, nbytes=nbytes)
    raise TypeError(f"cannot store a value of type {type(value).__name__}")  # pragma: no cover


def _unflatten(archive: Any) -> tuple:
    kinds = [str(k) for k in archive["__kinds__"]]
    top = int(kinds[-1].split(":len:")[1])
    entries = {}
    lengths: dict[str, int] = {}
    for spec in kinds[:-1]:
        key, kind, *rest = spec.split(":")
        if kind == "t":
            lengths[key] = int(rest[0])
            continue
        arr = archive[key]
        if kind == "b":
            entries[key] = bool(arr)
        elif kind == "i":
            entries[key] = int(arr)
        elif kind == "f":
            entries[key] = float(arr)
        else:
            entries[key] = arr

    def build(prefix: str, n: int) -> tuple:
        items = []
        for i in range(n):
            key = f"{prefix}{i}"
            items.append(build(key + "/", lengths[key]) if key in lengths else entries[key])
        return tuple(items)

    return build("", top)


_CRC_NAME = re.compile(r"-([0-9a-f]{8})\.np[yz]$")


def _verified(path: str) -> np.ndarray:
    """The file's bytes (``uint8``, in memory the caller owns), checked against the CRC32
    its name carries (files written before checksums have none and are read as they
    are)."""
    size = os.path.getsize(path)
    data = np.empty(size, dtype=np.uint8)  # not zero-filled, unlike a bytearray
    with open(path, "rb") as fh:
        got = fh.readinto(data)
    if got != size:
        raise ValueError(f"{os.path.basename(path)} changed while it was read")
    found = _CRC_NAME.search(path)
    if found is not None and zlib.crc32(data) != int(found.group(1), 16):
        raise ValueError(f"{os.path.basename(path)} fails its checksum (its bytes changed "
                         "after it was stored)")
    return data


def _from_npy(data: np.ndarray) -> np.ndarray:
    """The array of ``.npy`` bytes, without copying them."""
    head = io.BytesIO(data[:1 << 16].tobytes())
    major, _ = np.lib.format.read_magic(head)
    read_header = (np.lib.format.read_array_header_1_0 if major == 1
                   else np.lib.format.read_array_header_2_0)
    shape, fortran, dtype = read_header(head)
    if dtype.hasobject:
        raise ValueError("an object array, which a store never writes")
    count = int(np.prod(shape, dtype=np.int64))
    values = np.frombuffer(data, dtype=dtype, count=count, offset=head.tell())
    return values.reshape(shape, order="F" if fortran else "C")


def decode(kind: str, inum: int | None, num: float | None, blob: bytes | None,
           path: str | None) -> Any:
    """The value of a row; ``path`` is the file of an ``A``/``T`` row (read whole, never
    memory-mapped)."""
    if kind == "b":
        return bool(inum)
    if kind == "i":
        return int(inum)  # type: ignore[arg-type]
    if kind == "f":
        return float(num)  # type: ignore[arg-type]
    if kind == "n":
        return math.nan
    if kind == "s":
        return bytes(blob).decode("utf-8")  # type: ignore[arg-type]
    if kind == "a":
        return np.lib.format.read_array(io.BytesIO(blob), allow_pickle=False)
    if kind == "A":  # read into memory the caller owns: a map of a file that is later
        return _from_npy(_verified(path))  # truncated would kill the reader (SIGBUS)
    if kind == "t":
        with np.load(io.BytesIO(blob), allow_pickle=False) as archive:
            return _unflatten(archive)
    if kind == "T":
        with np.load(io.BytesIO(_verified(path).tobytes()), allow_pickle=False) as archive:
            return _unflatten(archive)
    raise ValueError(f"unknown stored kind {kind!r}")  # pragma: no cover
