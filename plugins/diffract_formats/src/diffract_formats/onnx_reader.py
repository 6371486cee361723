"""ONNX models: every floating-point initializer of rank >= 2, read lazily.

The ``.onnx`` file is walked as protocol buffers (``_wire``) without the ``onnx``
library: listing records, for each initializer, its name, dims, type and where its
bytes are (``raw_data`` in the file, or ``location``/``offset``/``length`` of external
data), so a model of several GB opens by reading its graph, not its weights, and each
weight is one plain file read later. Initializers stored in the typed repeated fields
(``float_data``, ``int32_data`` for 16-bit floats, ``double_data``) are decoded too.

**Orientation.** The other formats report a linear layer as ``[out, in]``; ONNX stores
what its operators consume. A rank-2 initializer is turned around when every use of it
says it is ``[in, out]``: input B of ``MatMul`` (``Y = A @ B``), input B of ``Gemm``
with ``transB=0``, input A of ``Gemm`` with ``transA=1``; it is kept as stored when used
as input B of ``Gemm`` with ``transB=1`` (PyTorch's ``nn.Linear`` export) or as input A
of ``MatMul``/``Gemm`` (``transA=0``), and when its uses disagree or nothing says
(embeddings read by ``Gather``, convolutions, which are ``[out, in, k...]`` already).
Each parameter's ``meta.orientation`` says which rule applied.
"""

from __future__ import annotations

import math
import mmap
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from diffract.errors import ModelSourceError
from diffract.plugins import CheckpointReader, TensorEntry, inside, to_slices
from diffract_formats._common import ConfigBeside, error
from diffract_formats._wire import Span, WireError, protobuf_fields, varint

__all__ = ["OnnxReader"]

#: ONNX TensorProto data types that are floating point: (name, numpy storage dtype).
FLOATS = {1: ("float32", "<f4"), 10: ("float16", "<f2"), 11: ("float64", "<f8"),
          16: ("bfloat16", "<u2")}



#: The wire type each field read here must have (protobuf: 0 varint, 2 length-delimited):
#: TensorProto's dims (either: packed or not), data_type, name, raw_data, external_data,
#: data_location; NodeProto's input, op_type, attribute; AttributeProto's name and i.
_WIRE = {"tensor": {1: (0, 2), 2: (0,), 8: (2,), 9: (2,), 13: (2,), 14: (0,)},
         "node": {1: (2,), 4: (2,), 5: (2,)}, "attribute": {1: (2,), 3: (0,)},
         "entry": {1: (2,), 2: (2,)}}
#: The most dimensions an initializer may have (numpy's own limit is 64).
MAX_RANK = 32


def _fields(buf: Any, span: Span, message: str) -> Any:
    """The fields of a message, each read field checked to have its wire type."""
    wanted = _WIRE[message]
    for number, wire, value in protobuf_fields(buf, span.start, span.stop):
        if number in wanted and wire not in wanted[number]:
            raise WireError(f"field {number} of a {message} has wire type {wire}, not "
                            f"{' or '.join(map(str, wanted[number]))}")
        yield number, wire, value


def _text(buf: Any, span: Span) -> str:
    return bytes(buf[span.start:span.stop]).decode("utf-8", "replace")


class _Initializer:
    __slots__ = ("data_type", "dims", "external", "name", "raw", "span")

    def __init__(self) -> None:
        self.name, self.dims, self.data_type = "", [], 1
        self.raw: Span | None = None
        self.external: dict[str, str] = {}
        self.span: Span | None = None


def _initializer(buf: Any, span: Span) -> _Initializer:
    out = _Initializer()
    out.span = span
    location = 0
    for number, wire, value in _fields(buf, span, "tensor"):
        if number == 1:  # dims: packed or one per field
            if wire == 2:
                pos = value.start
                while pos < value.stop:
                    dim, pos = varint(buf, pos, value.stop)
                    out.dims.append(dim)
            else:
                out.dims.append(value)
            if out.dims[-1] >= 1 << 63:  # an int64 below zero, as protobuf encodes it
                raise WireError(f"a dimension of {out.dims[-1] - (1 << 64)}")
        elif number == 2:
            out.data_type = value
        elif number == 8:
            out.name = _text(buf, value)
        elif number == 9:
            out.raw = value
        elif number == 13:
            entry = {n: _text(buf, v) for n, _, v in _fields(buf, value, "entry")
                     if n in (1, 2)}
            out.external[entry.get(1, "")] = entry.get(2, "")
        elif number == 14:
            location = value
    if location != 1:
        out.external = {}
    return out


def _uses(buf: Any, span: Span) -> tuple[str, list[str], dict[str, int]]:
    """A node's op_type, inputs and integer attributes."""
    op, inputs, attributes = "", [], {}
    for number, _, value in _fields(buf, span, "node"):
        if number == 1:
            inputs.append(_text(buf, value))
        elif number == 4:
            op = _text(buf, value)
        elif number == 5:
            name, integer = "", None
            for n, _, v in _fields(buf, value, "attribute"):
                if n == 1:
                    name = _text(buf, v)
                elif n == 3:
                    integer = v
            if integer is not None:
                attributes[name] = integer
    return op, inputs, attributes


def _turned(op: str, slot: int, attributes: dict[str, int]) -> bool | None:
    """Whether a use says the tensor is stored [in, out] (True), [out, in] (False), or
    nothing (None)."""
    if op == "MatMul":
        return slot == 1 if slot in (0, 1) else None
    if op == "Gemm":
        if slot == 1:
            return not attributes.get("transB", 0)
        if slot == 0:
            return bool(attributes.get("transA", 0))
    return None


class OnnxReader(ConfigBeside, CheckpointReader):
    """An ``.onnx`` file: see the module docstring."""

    def __init__(self, path: str) -> None:
        self._path = str(Path(path).resolve())
        self._dir = Path(os.path.abspath(path)).parent  # as given: a cache snapshot's
        self._files = [self._path]
        try:
            with open(self._path, "rb") as fh, mmap.mmap(fh.fileno(), 0,
                                                          access=mmap.ACCESS_READ) as buf:
                self._walk(buf)
        except (WireError, ValueError, OSError) as exc:  # mmap of an empty file: ValueError
            raise error(self._path, f"not a readable ONNX model: {exc}. The file is "
                                     "truncated or corrupt; export it again") from None
        except (RecursionError, MemoryError, OverflowError) as exc:
            raise error(self._path, f"not a readable ONNX model ({type(exc).__name__}); "
                                     "export it again") from None

    def _walk(self, buf: Any) -> None:
        graph = next((v for n, w, v in protobuf_fields(buf, 0, len(buf)) if n == 7 and w == 2),
                     None)
        if graph is None:
            raise WireError("it holds no graph")
        inits, votes = [], {}
        for number, wire, value in protobuf_fields(buf, graph.start, graph.stop):
            if number == 5 and wire == 2:
                inits.append(_initializer(buf, value))
            elif number == 1 and wire == 2:
                op, inputs, attributes = _uses(buf, value)
                for slot, name in enumerate(inputs):
                    votes.setdefault(name, []).append((op, slot, _turned(op, slot, attributes)))
        self._inits: dict[str, _Initializer] = {}
        self._turn: dict[str, bool] = {}
        self._rule: dict[str, str] = {}
        for init in inits:
            if init.data_type not in FLOATS or len(init.dims) < 2:
                continue
            if len(init.dims) > MAX_RANK:
                raise WireError(f"initializer {init.name!r} has {len(init.dims)} dimensions, "
                                f"more than {MAX_RANK}")
            self._inits[init.name] = init
            if init.external:
                self._external(init)
            elif init.raw is not None and len(init.raw) != self._nbytes(init):
                raise WireError(f"initializer {init.name!r} holds {len(init.raw)} bytes of "
                                f"raw data for dims {init.dims} ({self._nbytes(init)} bytes)")
            said = {turned for _, _, turned in votes.get(init.name, [])}
            uses = sorted({f"{op} input {'AB'[slot] if slot < 2 else slot}"
                           for op, slot, _ in votes.get(init.name, [])})
            turn = len(init.dims) == 2 and said == {True}
            self._turn[init.name] = turn
            self._rule[init.name] = (
                f"turned around: {', '.join(uses)} stores it [in, out]" if turn else
                "as stored: " + (", ".join(uses) if uses else "no operator says")
                + (" (disagreeing)" if len(said - {None}) > 1 else ""))

    def _external(self, init: _Initializer) -> None:
        location = init.external.get("location", "")
        try:
            target = inside(self._dir, location) if location else None
        except ModelSourceError:
            target = None
        if target is None:
            raise WireError(f"initializer {init.name!r} names external data {location!r} "
                            "outside the model's folder; Diffract reads only files beside "
                            "the model")
        if str(target) not in self._files:
            if not target.is_file():
                raise WireError(f"initializer {init.name!r} is in {location!r}, which is "
                                "missing beside the model")
            self._files.append(str(target))
        span = []
        for key in ("offset", "length"):
            text = init.external.get(key, "") or "0"
            if not (text.isascii() and text.isdigit()):
                raise WireError(f"initializer {init.name!r} has external data {key} {text!r}, "
                                "not a byte count")
            span.append(int(text))
        offset, length = span[0], span[1] or self._nbytes(init)
        size = target.stat().st_size
        if length != self._nbytes(init) or offset + length > size:
            raise WireError(f"initializer {init.name!r} declares bytes {offset} to "
                            f"{offset + length} of {location!r} ({size} bytes) for dims "
                            f"{init.dims} ({self._nbytes(init)} bytes)")
        init.external["offset"], init.external["length"] = str(offset), str(length)

    @staticmethod
    def _nbytes(init: _Initializer) -> int:
        return math.prod(init.dims) * np.dtype(FLOATS[init.data_type][1]).itemsize

    @property
    def files(self) -> list[str]:
        return list(self._files)

    def entries(self) -> Iterator[TensorEntry]:
        for name, init in self._inits.items():
            dims = tuple(init.dims)
            if self._turn[name]:
                dims = dims[::-1]
            file = self._files.index(str((self._dir / init.external["location"]).resolve())) \
                if init.external else 0
            yield TensorEntry(name, dims, FLOATS[init.data_type][0], file=file,
                              meta={"orientation": self._rule[name]})

    def _read_bytes(self, file: str, offset: int, length: int, name: str) -> bytes:
        with open(file, "rb") as fh:
            fh.seek(offset)
            data = fh.read(length)
        if len(data) != length:
            raise error(file, f"initializer {name!r} is cut short ({len(data)} of {length} "
                               "bytes): the file was truncated; export it again")
        return data

    def _stored(self, name: str) -> np.ndarray:
        """The initializer as stored: dims as in the file, 16-bit floats as their bits
        for bfloat16; a value that does not decode is a ModelSourceError naming it."""
        try:
            return self._decode(name)
        except (WireError, ValueError, OverflowError) as exc:
            raise error(self._path, f"initializer {name!r} cannot be decoded ({exc}); the "
                                     "model is corrupt, export it again") from None

    def _decode(self, name: str) -> np.ndarray:
        init = self._inits[name]
        _, storage = FLOATS[init.data_type]
        count = int(np.prod(init.dims))
        if init.external:
            file = str((self._dir / init.external["location"]).resolve())
            offset = int(init.external.get("offset", 0) or 0)
            length = int(init.external.get("length", 0) or count * np.dtype(storage).itemsize)
            data = self._read_bytes(file, offset, length, name)
        elif init.raw is not None:
            data = self._read_bytes(self._path, init.raw.start, len(init.raw), name)
        else:
            data = self._typed(init, storage, name)
        values = np.frombuffer(data, dtype=storage)
        if values.size != count:
            raise error(self._path, f"initializer {name!r} holds {values.size} values for "
                                     f"dims {init.dims}; the model is corrupt")
        return values.reshape(init.dims)

    def _typed(self, init: _Initializer, storage: str, name: str) -> bytes:
        """Values from float_data, double_data or (16-bit floats) int32_data."""
        span = init.span
        assert span is not None
        message = self._read_bytes(self._path, span.start, len(span), name)
        want = {1: 4, 11: 10}.get(init.data_type, 5)
        parts: list[bytes] = []
        for number, wire, value in protobuf_fields(message, 0, len(message)):
            if number != want:
                continue
            if want == 5:  # varints holding the 16-bit patterns
                if wire == 2:
                    pos, bits = value.start, []
                    while pos < value.stop:
                        v, pos = varint(message, pos, value.stop)
                        bits.append(v)
                else:
                    bits = [value]
                parts.append(np.asarray(bits, dtype="<u2").tobytes())
            elif wire == 2:
                parts.append(bytes(message[value.start:value.stop]))
            else:
                parts.append(int(value).to_bytes(np.dtype(storage).itemsize, "little"))
        return b"".join(parts)

    def read_numpy(self, name: str, index: Any = None) -> np.ndarray:
        values = self._stored(name)
        if self._inits[name].data_type == 16:
            values = (values.astype(np.uint32) << 16).view(np.float32)
        elif values.dtype == np.float16:
            values = values.astype(np.float32)
        if self._turn[name]:
            values = values.T
        values = values if index is None else values[to_slices(index)]
        return np.ascontiguousarray(values)

    def read(self, name: str, index: Any = None) -> Any:
        """numpy in the stored dtype; bfloat16 as a torch tensor when torch is loaded
        (else float32)."""
        if self._inits[name].data_type != 16:
            values = self._stored(name)
            values = values.T if self._turn[name] else values
            values = values if index is None else values[to_slices(index)]
            return np.ascontiguousarray(values)
        if "torch" not in sys.modules:
            return self.read_numpy(name, index)
        import torch

        bits = self._stored(name)
        bits = bits.T if self._turn[name] else bits
        bits = np.ascontiguousarray(bits if index is None else bits[to_slices(index)])
        return torch.from_numpy(bits.view(np.int16)).view(torch.bfloat16)
