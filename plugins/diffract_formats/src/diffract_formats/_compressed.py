"""compressed-tensors checkpoints (``quant_method: compressed-tensors``), read as the
library decompresses them (see :mod:`diffract_formats.quantized` for the other schemes).

Formats ``int-quantized``/``naive-quantized`` (an int8 ``weight``), ``float-quantized``
(a float8 ``weight``) and ``pack-quantized`` (``weight_packed``: int32 words holding the
``b``-bit values densely, ``b`` from 1 to 8, lowest bits first, a value crossing into
the next word where ``32 / b`` is not whole, each stored plus ``2^(b - 1)``;
``weight_shape`` gives the matrix). ``W = (q - zero) * scale`` with ``weight_scale`` and
``weight_zero_point`` (asymmetric schemes) by the config group's strategy: ``tensor``
(one), ``channel`` (``[out, 1]``), ``group`` (``[out, in / group_size]``, the group of an
input ``weight_g_idx`` where stored) or ``block`` (``[ceil(out / r), ceil(in / c)]`` for
``block_structure [r, c]``). In ``pack-quantized``, a group or channel strategy's zero
points are packed too: along the output rows (``[ceil(out * b / 32), groups]``), plus
``2^(b - 1)`` as the values. A tensor's strategy is the config group whose scale shape it
has; a scale or zero point no config group gives is refused naming the tensor.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import attrs
import numpy as np

from diffract_formats._quantbase import (
    Layout,
    Quantized,
    Read,
    _check,
    _scale_dtype,
    unpack_bits,
)

SCHEME = "compressed-tensors"
FORMATS = ("float-quantized", "int-quantized", "naive-quantized", "pack-quantized")


@attrs.frozen
class _Args:
    """One config group's weight arguments."""

    bits: int
    strategy: str
    symmetric: bool
    group: int | None
    block: tuple[int, int] | None


def _args(group: Mapping[str, Any], where: str) -> _Args:
    w = group.get("weights") or {}
    _check(isinstance(w, Mapping), where, SCHEME, f"weights {w!r} is not a table")
    size, block = w.get("group_size"), w.get("block_structure")
    bits = w.get("num_bits", 8)  # the library's defaults: a group size makes it "group"
    strategy = w.get("strategy") or ("group" if size not in (None, -1) else "tensor")
    _check(isinstance(bits, int) and not isinstance(bits, bool) and 1 <= bits <= 8, where,
           SCHEME, f"num_bits {bits!r} (1 to 8 are written)")
    known = ("tensor", "channel", "group", "block")
    _check(strategy in known, where, SCHEME, f"weight strategy {strategy!r} ({', '.join(known)}"
           " are read)")
    if strategy == "group":
        _check(isinstance(size, int) and not isinstance(size, bool) and size > 0, where,
               SCHEME, f"group_size {size!r} for the group strategy")
    if strategy == "block":
        _check(isinstance(block, (list, tuple)) and len(block) == 2 and all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in block),
            where, SCHEME, f"block_structure {block!r} (two positive sizes: [rows, columns])")
    return _Args(bits, strategy, w.get("symmetric", True) is not False,
                 size if strategy == "group" else None,
                 tuple(block) if strategy == "block" else None)


def _grid(args: _Args, rows: int, cols: int) -> tuple[int, ...]:
    """The shape of the scale that ``args`` gives a [rows, cols] matrix."""
    if args.strategy == "tensor":
        return (1,)
    if args.strategy == "channel":
        return (rows, 1)
    if args.strategy == "group":
        return (rows, cols // args.group) if cols % args.group == 0 else (-1,)
    r, c = args.block
    return (-(-rows // r), -(-cols // c))


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def plan(layout: Layout, q: Mapping[str, Any], where: str, read: Read
         ) -> dict[str, Quantized]:
    fmt = q.get("format", "")
    _check(fmt in FORMATS, where, SCHEME, f"format {fmt!r} ({', '.join(FORMATS)} are read)")
    groups = q.get("config_groups") or {}
    _check(isinstance(groups, Mapping), where, SCHEME, "config_groups is not a table")
    schemes = [_args(g, where) for g in groups.values()
               if isinstance(g, Mapping) and g.get("weights")]
    out = {}
    for name, (dtype, shape) in layout.items():
        packed = name.endswith(".weight_packed")
        if not (packed or (name.endswith(".weight") and f"{name}_scale" in layout)):
            continue
        base = name[: -len("_packed")] if packed else name
        scale, zero, g_idx = f"{base}_scale", f"{base}_zero_point", f"{base}_g_idx"
        _check(scale in layout, name, SCHEME, f"{scale} is missing")
        _scale_dtype(layout, scale, SCHEME)
        widths = {s.bits for s in schemes}
        width = next(iter(widths)) if packed and len(widths) == 1 else 8
        if packed:
            _check(f"{base}_shape" in layout and len(widths) == 1, name, SCHEME,
                   "a packed weight needs its weight_shape and one bit width in the "
                   "config's groups")
            declared = tuple(int(v) for v in read(f"{base}_shape").reshape(-1))
            _check(len(declared) == 2 and len(shape) == 2 and shape[0] == declared[0] and
                   shape[1] == -(-declared[1] * width // 32), name, SCHEME,
                   f"packed data of shape {shape} for a declared {declared} of {width}-bit "
                   "values")
            shape = declared
        _check(len(shape) == 2, name, SCHEME, f"a weight of shape {shape} (matrices are read)")
        rows, cols = shape
        found = tuple(layout[scale][1])
        args = next((s for s in schemes if found == _grid(s, rows, cols)), None) or next(
            (s for s in schemes if _squeezed(found) == _squeezed(_grid(s, rows, cols))), None)
        _check(args is not None, scale, SCHEME, f"a scale of shape {found} for a "
               f"[{rows}, {cols}] weight, which no config group's strategy gives ("
               + ", ".join(f"{s.strategy} {_grid(s, rows, cols)}" for s in schemes) + ")")
        has_zero = zero in layout
        _check(has_zero or args.symmetric, name, SCHEME, f"an asymmetric scheme without "
               f"{zero}")
        packed_zero = has_zero and fmt == "pack-quantized" and args.strategy in (
            "channel", "group")
        if has_zero:
            _check_zero(layout, zero, packed_zero, args, rows, cols)
        if g_idx in layout:
            _check(args.strategy == "group" and layout[g_idx][1] == (cols,) and
                   layout[g_idx][0] in ("I32", "I64"), g_idx, SCHEME,
                   f"group indices {layout[g_idx]} for a {args.strategy} scale of [{rows}, "
                   f"{cols}]")
        kind = f"int{width}" if packed or dtype.startswith("I") else "float8"
        parts = (name, scale, *([zero] if has_zero else []), *(
            [g_idx] if g_idx in layout else []), *([f"{base}_shape"] if packed else []))
        out[base] = Quantized(shape, f"{kind} {SCHEME} {fmt} {args.strategy}", parts,
                              _dequantize(name, scale, zero if has_zero else None,
                                          g_idx if g_idx in layout else None, packed_zero,
                                          width if packed else 0, args, shape))
    return out


def _check_zero(layout: Layout, zero: str, packed: bool, args: _Args, rows: int,
                cols: int) -> None:
    dtype, shape = layout[zero]
    grid = _grid(args, rows, cols)
    if packed:
        want = (-(-rows * args.bits // 32), grid[1])
        _check(dtype == "I32" and tuple(shape) == want, zero, SCHEME,
               f"packed zero points {dtype} {tuple(shape)} for [{rows}, {grid[1]}] "
               f"{args.bits}-bit values (int32 words {want}, packed along the rows)")
    else:
        _check(dtype.startswith(("I", "U", "F", "BF")) and math.prod(shape) ==
               math.prod(grid), zero, SCHEME, f"zero points {dtype} {tuple(shape)} for a "
               f"scale of {grid}")


def dense(words: np.ndarray, bits: int, count: int) -> np.ndarray:
    """The first ``count`` unsigned ``bits``-bit values packed densely along the last
    axis of int32 ``words`` (value ``k`` at bits ``k*bits`` to ``k*bits + bits - 1`` of
    the stream, a word's lowest bit first), as uint8."""
    words = np.ascontiguousarray(words).astype("<u4", copy=False)
    if 32 % bits == 0:
        return unpack_bits(words.view(np.int32), bits, words.ndim - 1)[..., :count]
    lead = words.shape[:-1]
    flat = words.reshape(-1, words.shape[-1])
    out = np.empty((flat.shape[0], count), dtype=np.uint8)
    weights = (1 << np.arange(bits, dtype=np.uint16)).astype(np.uint16)
    step = max(1, (1 << 24) // max(1, flat.shape[1] * 32))  # rows at a time: ~16 MB of bits
    for lo in range(0, flat.shape[0], step):
        stream = np.unpackbits(flat[lo:lo + step].view(np.uint8), axis=1, bitorder="little")
        chunk = stream[:, : count * bits].reshape(-1, count, bits).astype(np.uint16)
        out[lo:lo + step] = (chunk @ weights).astype(np.uint8)
    return out.reshape(*lead, count)


def _grid_values(values: np.ndarray, args: _Args, rows: int, cols: int,
                 g_idx: np.ndarray | None) -> np.ndarray:
    """Per-tensor, per-channel, per-group or per-block ``values`` over a [rows, cols]
    matrix (a scalar or an array broadcasting to it)."""
    values = values.astype(np.float32)
    if args.strategy == "tensor":
        return values.reshape(())
    if args.strategy == "channel":
        return values.reshape(rows, 1)
    grid = values.reshape(_grid(args, rows, cols))
    if args.strategy == "group":
        return grid[:, np.arange(cols) // args.group if g_idx is None else g_idx]
    r, c = args.block
    return grid[np.arange(rows) // r][:, np.arange(cols) // c]


def _dequantize(name: str, scale: str, zero: str | None, g_idx: str | None,
                packed_zero: bool, bits: int, args: _Args, shape: tuple[int, ...]
                ) -> Callable[[Read], Any]:
    rows, cols = shape

    def dequantize(read: Read) -> np.ndarray:
        if bits:
            values = dense(read(name), bits, cols).astype(np.float32)
            values -= np.float32(1 << (bits - 1))
            _check(values.shape == (rows, cols), name, SCHEME,
                   f"packed data for {values.shape}, declared {(rows, cols)}")
        else:
            values = read(name).astype(np.float32)
        index = None
        if g_idx is not None:
            index = read(g_idx).astype(np.int64).reshape(-1)
            groups = cols // args.group
            _check(index.size == 0 or 0 <= int(index.min()) and int(index.max()) < groups,
                   g_idx, SCHEME, f"group indices outside the {groups} groups")
        if zero is not None:
            z = read(zero)
            if packed_zero:  # along the rows: unpack the transposed words
                z = dense(z.T, args.bits, rows).T.astype(np.float32) - (1 << (args.bits - 1))
            values = values - _grid_values(z, args, rows, cols, index)
        return values * _grid_values(read(scale), args, rows, cols, index)
    return dequantize
