"""Just enough of two wire formats to list a checkpoint without reading its weights:
protocol buffers (ONNX) and msgpack (Flax). Both walk a buffer (a memory map of the
file) and return where each value lies, so a weight is later read with one plain file
read of its bytes.

Every function raises :class:`WireError` (a ValueError) on bytes that do not parse: a
truncated or corrupt file.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import Any

__all__ = ["Span", "WireError", "msgpack_value", "protobuf_fields", "varint"]


class WireError(ValueError):
    """Bytes that are not the format they claim to be."""


class Span:
    """Bytes ``[start, stop)`` of the buffer, not copied."""

    __slots__ = ("start", "stop")

    def __init__(self, start: int, stop: int) -> None:
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        return self.stop - self.start

    def __repr__(self) -> str:
        return f"Span({self.start}, {self.stop})"


def varint(buf: Any, pos: int, end: int) -> tuple[int, int]:
    """A base-128 varint at ``pos``: (value, position after it)."""
    value = shift = 0
    while True:
        if pos >= end:
            raise WireError("a varint runs past the end of its message")
        byte = buf[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 70:
            raise WireError("a varint longer than 10 bytes")


def protobuf_fields(buf: Any, start: int, stop: int) -> Iterator[tuple[int, int, Any]]:
    """(field number, wire type, value) of a message's fields in ``buf[start:stop]``:
    an int for varints and fixed-size fields, a :class:`Span` for length-delimited ones."""
    pos = start
    while pos < stop:
        key, pos = varint(buf, pos, stop)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = varint(buf, pos, stop)
        elif wire == 1:
            if pos + 8 > stop:
                raise WireError("a 64-bit field runs past the end of its message")
            value, pos = int.from_bytes(buf[pos:pos + 8], "little"), pos + 8
        elif wire == 2:
            length, pos = varint(buf, pos, stop)
            if pos + length > stop:
                raise WireError(f"field {number} ({length} bytes) runs past the end of its "
                                "message")
            value, pos = Span(pos, pos + length), pos + length
        elif wire == 5:
            if pos + 4 > stop:
                raise WireError("a 32-bit field runs past the end of its message")
            value, pos = int.from_bytes(buf[pos:pos + 4], "little"), pos + 4
        else:
            raise WireError(f"wire type {wire} (field {number}) is not protocol buffers "
                            "of this kind")
        yield number, wire, value


_FIXED = {0xCC: ">B", 0xCD: ">H", 0xCE: ">I", 0xCF: ">Q",
          0xD0: ">b", 0xD1: ">h", 0xD2: ">i", 0xD3: ">q", 0xCA: ">f", 0xCB: ">d"}


def _length(buf: Any, pos: int, size: int, end: int) -> tuple[int, int]:
    if pos + size > end:
        raise WireError("a msgpack length runs past the end of the data")
    return int.from_bytes(buf[pos:pos + size], "big"), pos + size


def _span(pos: int, length: int, end: int) -> tuple[Span, int]:
    if pos + length > end:
        raise WireError(f"a msgpack value of {length} bytes runs past the end of the data")
    return Span(pos, pos + length), pos + length


def msgpack_value(buf: Any, pos: int, end: int, depth: int = 0) -> tuple[Any, int]:
    """The msgpack value at ``pos``: (value, position after it). Maps are dicts, arrays
    lists, strings str; bytes are a :class:`Span`; an extension is ``("ext", code,
    Span)``."""
    if depth > 64:
        raise WireError("msgpack nesting deeper than 64")
    if pos >= end:
        raise WireError("msgpack data ends where a value should be")
    b = buf[pos]
    pos += 1
    if b <= 0x7F:
        return b, pos
    if b >= 0xE0:
        return b - 0x100, pos
    if 0x80 <= b <= 0x8F or b in (0xDE, 0xDF):
        n, pos = (b & 0x0F, pos) if b <= 0x8F else _length(buf, pos, 2 if b == 0xDE else 4, end)
        out = {}
        for _ in range(n):
            key, pos = msgpack_value(buf, pos, end, depth + 1)
            if isinstance(key, Span):
                key = bytes(buf[key.start:key.stop]).decode("utf-8", "replace")
            elif isinstance(key, (dict, list, tuple)):
                raise WireError("a msgpack map key that is a map, a list or an extension")
            out[key], pos = msgpack_value(buf, pos, end, depth + 1)
        return out, pos
    if 0x90 <= b <= 0x9F or b in (0xDC, 0xDD):
        n, pos = (b & 0x0F, pos) if b <= 0x9F else _length(buf, pos, 2 if b == 0xDC else 4, end)
        items = []
        for _ in range(n):
            item, pos = msgpack_value(buf, pos, end, depth + 1)
            items.append(item)
        return items, pos
    if 0xA0 <= b <= 0xBF or b in (0xD9, 0xDA, 0xDB):
        n, pos = (b & 0x1F, pos) if b <= 0xBF else _length(buf, pos, {0xD9: 1, 0xDA: 2,
                                                                        0xDB: 4}[b], end)
        span, pos = _span(pos, n, end)
        return bytes(buf[span.start:span.stop]).decode("utf-8", "replace"), pos
    if b in (0xC4, 0xC5, 0xC6):
        n, pos = _length(buf, pos, {0xC4: 1, 0xC5: 2, 0xC6: 4}[b], end)
        return _span(pos, n, end)
    if b in (0xC7, 0xC8, 0xC9) or 0xD4 <= b <= 0xD8:
        if b <= 0xC9:
            n, pos = _length(buf, pos, {0xC7: 1, 0xC8: 2, 0xC9: 4}[b], end)
        else:
            n = 1 << (b - 0xD4)
        code, pos = _length(buf, pos, 1, end)
        code = code - 0x100 if code > 0x7F else code
        span, pos = _span(pos, n, end)
        return ("ext", code, span), pos
    if b == 0xC0:
        return None, pos
    if b in (0xC2, 0xC3):
        return b == 0xC3, pos
    if b in _FIXED:
        size = struct.calcsize(_FIXED[b])
        if pos + size > end:
            raise WireError("a msgpack number runs past the end of the data")
        return struct.unpack(_FIXED[b], bytes(buf[pos:pos + size]))[0], pos + size
    raise WireError(f"byte 0x{b:02x} starts no msgpack value")
