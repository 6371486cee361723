"""Quantized checkpoints, read as their formats dequantize them: never analysed raw.

A checkpoint's ``config.json`` names its scheme (``quantization_config.quant_method``);
each quantized weight is read, lazily as any tensor, from the tensors that store it (the
values, their scales, zero points and indexes, which are not listed as parameters) and
handed over as the float32 matrix the format defines:

* ``fp8`` (DeepSeek-V3, Kimi K2, Qwen3-FP8): ``W = fp8(weight) * weight_scale_inv`` per
  block of ``weight_block_size`` (rows x columns, the last blocks partial), or one scale
  per tensor without a block size (transformers' ``finegrained_fp8``).
* ``mxfp4`` (gpt-oss's experts): ``<name>_blocks`` packs two FP4 (e2m1) values a byte,
  low nibble first, 32 a block; ``<name>_scales`` holds each block's shared exponent
  ``2^(s - 127)``; the ``[..., rows, G * 32]`` result is turned ``[E, G * 32, rows]`` as
  transformers' ``convert_moe_packed_tensors`` does.
* ``gptq``: ``qweight`` ``[in * b / 32, out]`` (b-bit values, lowest bits first, along the
  input), ``qzeros`` ``[groups, out * b / 32]`` likewise along the output (stored minus one
  in the original ``gptq`` checkpoint format, as stored in ``gptq_v2``), ``scales``
  ``[groups, out]``, ``g_idx`` ``[in]`` (act-order; else ``i // group_size``):
  ``W[o, i] = scales[g, o] * (q[i, o] - zero[g, o])``, ``g = g_idx[i]``.
* ``awq`` (GEMM layout): ``qweight`` ``[in, out / 8]`` and ``qzeros`` ``[groups, out / 8]``
  packed 4-bit along the output in AWQ's order (eight values of an int32 are the outputs
  0, 2, 4, 6, 1, 3, 5, 7), ``scales`` ``[groups, out]``:
  ``W[o, i] = scales[i // g, o] * (q[i, o] - zero[i // g, o])``.
* ``compressed-tensors`` (``float-quantized``, ``int-quantized``, ``naive-quantized``,
  ``pack-quantized``): ``weight`` (or ``weight_packed``: int32 words holding 1- to 8-bit
  values densely, each stored plus ``2^(b - 1)``) with ``weight_scale`` per tensor,
  output channel, input group or block and ``weight_zero_point`` where asymmetric
  (packed along the rows in ``pack-quantized``'s group and channel strategies):
  ``W = (q - zero) * scale``; see :mod:`diffract_formats._compressed`.
* ``bitsandbytes``: 8-bit (LLM.int8), ``W = weight * SCB[row] / 127``; 4-bit NF4/FP4,
  two codes a byte (high nibble first) looked up in the stored code book and scaled by
  their block's absmax, itself decoded from 8-bit codes under double quantization.

Anything else that looks quantized is refused with the reason, naming the scheme and
the tensor: an unknown ``quant_method``, a missing scale, scales whose shape the block
size does not give, packed data whose size does not match its declared shape,
quantization tensors without a ``quantization_config``. A float8 tensor with no scale
and no configuration is read as its values (the summary says so). Each dequantized
parameter records how it was stored in ``meta.quant`` (``float8_e4m3fn block 128x128``,
``int4 gptq g128``...), as a GGUF file's do; its dtype is what is read, float32.
Dequantization happens per tensor, on read: no dequantized copy of the model is held.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from diffract.errors import ModelSourceError
from diffract.plugins import CheckpointReader, TensorEntry, to_slices
from diffract_formats._common import error
from diffract_formats._compressed import plan as _compressed
from diffract_formats._quantbase import (
    Layout,
    Quantized,
    Read,
    _check,
    _refuse,
    _scale_dtype,
    unpack_bits,
)

__all__ = ["QuantizedReader", "wrap"]


#: FP4 (e2m1) values of the 16 nibbles (OCP MX: sign, 2 exponent bits, 1 mantissa bit).
FP4_E2M1 = np.array([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0,
                     -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0], dtype=np.float32)
#: AWQ's packing order: the eight 4-bit values of an int32, lowest first, are the
#: outputs 0, 2, 4, 6, 1, 3, 5, 7 of their group of eight.
AWQ_ORDER = np.array([0, 2, 4, 6, 1, 3, 5, 7])
#: Suffixes of tensors that only a quantized checkpoint holds: refused without a config.
AUX_SUFFIXES = (".weight_scale_inv", ".weight_scale", ".weight_zero_point", ".weight_packed",
                ".qweight", ".qzeros", ".g_idx", ".weight_g_idx", "_blocks", ".SCB",
                ".weight.absmax", ".weight.quant_map")


def ue8m0(bits: np.ndarray, where: str) -> np.ndarray:
    """UE8M0 scales (an exponent byte each: ``2 ** (byte - 127)``) as float32; the byte
    255, the format's NaN, is refused naming the tensor."""
    bits = np.asarray(bits).astype(np.uint8, copy=False)
    _check(not (bits == 255).any(), where, "fp8", f"{int((bits == 255).sum())} UE8M0 "
           "scale(s) of 255, the format's NaN")
    return np.ldexp(np.float32(1.0), bits.astype(np.int32) - 127).astype(np.float32)


# -- schemes ------------------------------------------------------------------------------
def _fp8(layout: Layout, q: Mapping[str, Any], where: str, read: Read
         ) -> dict[str, Quantized]:
    block = q.get("weight_block_size")
    _check(block is None or (isinstance(block, list) and len(block) == 2 and all(
        isinstance(b, int) and b > 0 for b in block)), where, "fp8",
        f"weight_block_size {block!r} is not two positive integers")
    out = {}
    for name, (dtype, shape) in layout.items():
        if not dtype.startswith("F8_E") or dtype == "F8_E8M0" or not name.endswith(".weight"):
            continue
        scale = f"{name}_scale_inv" if f"{name}_scale_inv" in layout else f"{name}_scale"
        _check(scale in layout, name, "fp8", "its weight_scale_inv (the block scales) is "
                                             "missing")
        got = layout[scale][1]
        exponent = _scale_dtype(layout, scale, "fp8", ue8m0=True) == "F8_E8M0"
        if block is None:
            want: tuple[int, ...] = ()
            _check(math.prod(got) == 1, scale, "fp8", f"a per-tensor scale of shape {got}")
        else:
            _check(len(shape) >= 2, name, "fp8", f"a block-scaled weight of shape {shape}")
            want = (*shape[:-2], -(-shape[-2] // block[0]), -(-shape[-1] // block[1]))
            _check(tuple(got) == want, scale, "fp8", f"scales of shape {tuple(got)}, where "
                   f"blocks of {block[0]}x{block[1]} over {shape} give {want}")
        kind = "float8_e4m3fn" if dtype == "F8_E4M3" else "float8_e5m2"
        label = f"{kind} block {block[0]}x{block[1]}" if block else f"{kind} per tensor"
        label += " ue8m0 scales" if exponent else ""
        out[name] = Quantized(shape, label, (name, scale),
                              _fp8_dequantize(name, scale, block, exponent))
    return out


def _fp8_dequantize(name: str, scale: str, block: list[int] | None,
                    exponent: bool) -> Callable[[Read], Any]:
    def dequantize(read: Read) -> np.ndarray:
        values = read(name).astype(np.float32, copy=False)  # one float32 copy, scaled in place
        scales = ue8m0(read(scale), scale) if exponent else read(scale).astype(np.float32)
        if block is None:
            values *= scales.reshape(())
            return values
        rows, cols = values.shape[-2:]
        columns = np.arange(cols) // block[1]  # each column's block: no block-wide copy
        for i in range(scales.shape[-2]):  # a band of block rows at a time
            band = values[..., i * block[0]:min(rows, (i + 1) * block[0]), :]
            band *= scales[..., i, :][..., columns][..., None, :]
        return values
    return dequantize


def _mxfp4(layout: Layout, q: Mapping[str, Any], where: str, read: Read
           ) -> dict[str, Quantized]:
    out = {}
    for name, (dtype, shape) in layout.items():
        if not name.endswith("_blocks"):
            continue
        base, scales = name[: -len("_blocks")], name[: -len("_blocks")] + "_scales"
        _check(scales in layout, name, "mxfp4", "its _scales tensor is missing")
        _check(dtype == "U8" and len(shape) >= 3 and shape[-1] == 16, name, "mxfp4",
               f"blocks of {dtype} {shape}, not uint8 [..., G, 16]")
        _check(tuple(layout[scales][1]) == shape[:-1], scales, "mxfp4",
               f"scales of shape {layout[scales][1]} for blocks of {shape}")
        rows = shape[:-2]
        dequantized = (rows[0], shape[-2] * 32, *rows[1:]) if len(rows) > 1 else (
            shape[-2] * 32, rows[0])
        out[base] = Quantized(dequantized, "mxfp4 e2m1 block 32", (name, scales),
                              _mxfp4_dequantize(name, scales))
    return out


def _mxfp4_dequantize(blocks: str, scales: str) -> Callable[[Read], Any]:
    def dequantize(read: Read) -> np.ndarray:
        packed, exps = read(blocks), read(scales).astype(np.int32) - 127
        values = np.empty((*packed.shape[:-1], 32), dtype=np.float32)
        values[..., 0::2] = FP4_E2M1[packed & 0x0F]
        values[..., 1::2] = FP4_E2M1[packed >> 4]
        values = np.ldexp(values, exps[..., None]).reshape(*packed.shape[:-2], -1)
        return np.ascontiguousarray(np.swapaxes(values, -1, -2 if values.ndim > 2 else 0))
    return dequantize


def _bits(q: Mapping[str, Any], scheme: str, where: str) -> int:
    bits = q.get("bits", q.get("w_bit", 4))
    _check(bits in (2, 4, 8), where, scheme, f"{bits!r}-bit values (2, 4 and 8 are read)")
    return int(bits)


def _group(size: Any, scheme: str, where: str) -> int:
    _check(isinstance(size, int) and not isinstance(size, bool) and (size > 0 or size == -1),
           where, scheme, f"group_size {size!r} (a positive number of inputs, or -1)")
    return int(size)


def _gptq(layout: Layout, q: Mapping[str, Any], where: str, read: Read
          ) -> dict[str, Quantized]:
    bits = _bits(q, "gptq", where)
    fmt = q.get("checkpoint_format", "gptq")
    _check(fmt in ("gptq", "gptq_v2"), where, "gptq", f"checkpoint_format {fmt!r}")
    group = _group(q.get("group_size", 128), "gptq", where)
    out = {}
    for name, (_, shape) in layout.items():
        if not name.endswith(".qweight"):
            continue
        base = name[: -len(".qweight")]
        parts = {k: f"{base}.{k}" for k in ("qzeros", "scales")}
        for part in parts.values():
            _check(part in layout and len(layout[part][1]) == 2, name, "gptq",
                   f"{part} is missing or not a matrix")
        _check(len(shape) == 2, name, "gptq", f"a qweight of shape {shape}")
        groups, out_size = layout[parts["scales"]][1]
        in_size = shape[0] * 32 // bits
        _check(shape[1] == out_size and tuple(layout[parts["qzeros"]][1]) == (
            groups, out_size * bits // 32), name, "gptq",
            f"qweight {shape}, qzeros {layout[parts['qzeros']][1]} and scales "
            f"{(groups, out_size)} do not fit {bits}-bit values")
        _scale_dtype(layout, parts["scales"], "gptq")
        _check(layout[name][0] == "I32" and layout[parts["qzeros"]][0] == "I32", name, "gptq",
               f"qweight {layout[name][0]} and qzeros {layout[parts['qzeros']][0]}, not the "
               "int32 words they pack")
        index = f"{base}.g_idx" if f"{base}.g_idx" in layout else None
        _check(index is None or tuple(layout[index][1]) == (in_size,), name, "gptq",
               f"g_idx of shape {layout[index][1] if index else ()} for {in_size} inputs")
        _check(index is not None or group == -1 or groups == -(-in_size // group), name,
               "gptq", f"{groups} groups of scales for {in_size} inputs in groups of {group}")
        label = f"int{bits} gptq g{group}" + (" act-order" if index else "")
        out[f"{base}.weight"] = Quantized(
            (out_size, in_size), label, (name, parts["qzeros"], parts["scales"],
                                         *([index] if index else [])),
            _gptq_dequantize(base, bits, group if group != -1 else in_size, index,
                             fmt == "gptq"))
    return out


def _gptq_dequantize(base: str, bits: int, group: int, index: str | None,
                     minus_one: bool) -> Callable[[Read], Any]:
    def dequantize(read: Read) -> np.ndarray:
        w = unpack_bits(read(f"{base}.qweight"), bits, 0).astype(np.float32)  # [in, out]
        zeros = unpack_bits(read(f"{base}.qzeros"), bits, 1).astype(np.float32)  # [G, out]
        scales = read(f"{base}.scales").astype(np.float32)
        g = read(index).astype(np.int64) if index else np.arange(w.shape[0]) // group
        _check(g.size == 0 or 0 <= int(g.min()) and int(g.max()) < scales.shape[0],
               index or base, "gptq", f"group indices from {int(g.min())} to {int(g.max())} "
               f"for {scales.shape[0]} groups")
        w -= zeros[g] + np.float32(minus_one)
        w *= scales[g]
        return np.ascontiguousarray(w.T)
    return dequantize


def _awq(layout: Layout, q: Mapping[str, Any], where: str, read: Read
         ) -> dict[str, Quantized]:
    bits = _bits(q, "awq", where)
    version = str(q.get("version", "gemm")).lower()
    _check(bits == 4 and version == "gemm", where, "awq",
           f"version {version!r} with {bits}-bit values (4-bit GEMM is read)")
    group = _group(q.get("group_size", q.get("q_group_size", 128)), "awq", where)
    _check(group != -1, where, "awq", "group_size -1")
    out = {}
    for name, (_, shape) in layout.items():
        if not name.endswith(".qweight"):
            continue
        base = name[: -len(".qweight")]
        zeros, scales = f"{base}.qzeros", f"{base}.scales"
        for part in (zeros, scales):
            _check(part in layout, name, "awq", f"{part} is missing")
        _scale_dtype(layout, scales, "awq")
        _check(len(shape) == 2, name, "awq", f"a qweight of shape {shape}")
        in_size, out_size = shape[0], shape[1] * 8
        groups = -(-in_size // group)
        _check(tuple(layout[scales][1]) == (groups, out_size) and tuple(layout[zeros][1]) == (
            groups, shape[1]), name, "awq", f"qweight {shape}, qzeros {layout[zeros][1]} and "
            f"scales {layout[scales][1]} do not fit {in_size}x{out_size} in groups of {group}")
        out[f"{base}.weight"] = Quantized((out_size, in_size), f"int4 awq g{group}",
                                          (name, zeros, scales),
                                          _awq_dequantize(base, group))
    return out


def _awq_order(values: np.ndarray) -> np.ndarray:
    """Values unpacked in storage order, put in output order (see AWQ_ORDER)."""
    rows, cols = values.shape
    order = np.empty(8, dtype=np.int64)
    order[AWQ_ORDER] = np.arange(8)
    return values.reshape(rows, cols // 8, 8)[:, :, order].reshape(rows, cols)


def _awq_dequantize(base: str, group: int) -> Callable[[Read], Any]:
    def dequantize(read: Read) -> np.ndarray:
        w = _awq_order(unpack_bits(read(f"{base}.qweight"), 4, 1)).astype(np.float32)
        zeros = _awq_order(unpack_bits(read(f"{base}.qzeros"), 4, 1)).astype(np.float32)
        scales = read(f"{base}.scales").astype(np.float32)
        g = np.arange(w.shape[0]) // group  # w: [in, out]
        w -= zeros[g]
        w *= scales[g]
        return np.ascontiguousarray(w.T)
    return dequantize


def _bitsandbytes(layout: Layout, q: Mapping[str, Any], where: str, read: Read
                  ) -> dict[str, Quantized]:
    out = {}
    for name in layout:
        if name.endswith(".SCB"):  # LLM.int8: int8 rows and their absmax
            weight = name[: -len(".SCB")] + ".weight"
            _check(weight in layout and layout[weight][0] == "I8", name, "bitsandbytes",
                   f"{weight} is not an int8 tensor")
            out[weight] = Quantized(layout[weight][1], "int8 bitsandbytes LLM.int8",
                                    (weight, name), _int8_dequantize(weight, name))
        for kind in ("nf4", "fp4"):
            if name.endswith(f".quant_state.bitsandbytes__{kind}"):
                weight = name[: -len(f".quant_state.bitsandbytes__{kind}")]
                out[weight] = _four_bit(layout, weight, name, kind, read)
    return out


def _four_bit(layout: Layout, weight: str, state: str, kind: str, read: Read) -> Quantized:
    """A bitsandbytes 4-bit weight: its codes (two a byte, high nibble first), the code
    book (``quant_map``) and one absmax per block, themselves 8-bit codes of a second
    code book with one absmax per block of blocks and an offset under double
    quantization (``nested_*``)."""
    import json

    try:
        meta = json.loads(bytes(read(state).astype(np.uint8)).decode("utf-8"))
        shape = tuple(int(d) for d in meta["shape"])
        block = int(meta["blocksize"])
    except (ValueError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise _refuse(state, "bitsandbytes", f"an unreadable quant state ({exc})") from None
    parts = [weight, f"{weight}.absmax", f"{weight}.quant_map", state]
    nested = f"{weight}.nested_absmax" in layout
    if nested:
        parts += [f"{weight}.nested_absmax", f"{weight}.nested_quant_map"]
    for part in parts:
        _check(part in layout, weight, "bitsandbytes", f"{part} is missing")
    n = math.prod(shape)
    blocks = -(-n // max(block, 1))
    _check(block > 0 and math.prod(layout[weight][1]) * 2 >= n and math.prod(
        layout[f"{weight}.absmax"][1]) == blocks and math.prod(
        layout[f"{weight}.quant_map"][1]) == 16, weight, "bitsandbytes",
        f"codes {layout[weight][1]}, absmax {layout[f'{weight}.absmax'][1]} and a code book "
        f"of {math.prod(layout[f'{weight}.quant_map'][1])} do not hold {shape} in blocks of "
        f"{block}")

    def dequantize(read: Read) -> np.ndarray:
        packed = read(weight).astype(np.uint8).reshape(-1)
        codes = np.empty(packed.size * 2, dtype=np.uint8)
        codes[0::2], codes[1::2] = packed >> 4, packed & 0x0F
        absmax = read(f"{weight}.absmax")
        if nested:
            per = meta.get("nested_blocksize")
            _check(isinstance(per, int) and per > 0, state, "bitsandbytes",
                   f"nested_blocksize {per!r}")
            outer = read(f"{weight}.nested_absmax").astype(np.float32)
            _check(outer.size * per >= absmax.size, state, "bitsandbytes",
                   f"{outer.size} nested absmax in blocks of {per} for {absmax.size} blocks")
            outer = outer[np.arange(absmax.size) // per]  # no block-sized repeat
            absmax = read(f"{weight}.nested_quant_map").astype(np.float32)[absmax] * outer \
                + np.float32(meta["nested_offset"])
        book = read(f"{weight}.quant_map").astype(np.float32)
        values = book[codes[:n]] * np.repeat(absmax.astype(np.float32), block)[:n]
        return values.reshape(shape)

    return Quantized(shape, f"{kind} bitsandbytes block {block}" + (
        " double-quantized" if nested else ""), tuple(parts), dequantize)


def _int8_dequantize(weight: str, scb: str) -> Callable[[Read], Any]:
    def dequantize(read: Read) -> np.ndarray:
        return read(weight).astype(np.float32) * (read(scb).astype(np.float32)[:, None] / 127)
    return dequantize


SCHEMES: dict[str, Callable[[Layout, Mapping[str, Any], str, Read],
                             dict[str, Quantized]]] = {
    "fp8": _fp8, "mxfp4": _mxfp4, "gptq": _gptq, "awq": _awq,
    "compressed-tensors": _compressed, "bitsandbytes": _bitsandbytes,
}


def plan(layout: Layout, config: Mapping[str, Any], where: str, read: Read
         ) -> dict[str, Quantized]:
    """The quantized parameters of a checkpoint (``layout``: every tensor's dtype and
    shape; ``read`` reads a small one, a packed weight's declared shape), by its
    ``quantization_config``; {} for a checkpoint that is not quantized.
    A ModelSourceError for what cannot be read right (see the module docstring)."""
    q = config.get("quantization_config") if isinstance(config, Mapping) else None
    if q is None:
        aux = sorted(n for n in layout if n.endswith(AUX_SUFFIXES))
        if aux:
            raise error(where, f"tensors such as {aux[:3]} store a quantized weight, but no "
                               "config.json beside them has a quantization_config to say "
                               "how: refused (a quantized tensor is never analysed raw); "
                               "put the checkpoint's config.json beside it")
        return {}
    method = q.get("quant_method") if isinstance(q, Mapping) else None
    if method not in SCHEMES:
        raise error(where, f"quant_method {method!r} is not read (known: "
                           f"{', '.join(SCHEMES)}): refused (a quantized tensor is never "
                           "analysed raw)")
    try:
        found = SCHEMES[method](layout, q, where, read)
    except ModelSourceError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError, OverflowError,
            MemoryError) as exc:  # a malformed configuration the checks did not foresee
        raise _refuse(where, method, f"a quantization_config it cannot follow "
                                     f"({type(exc).__name__}: {str(exc)[:120]})") from None
    used = {p for got in found.values() for p in got.parts} | set(found)
    stray = sorted(n for n, (dtype, _) in layout.items() if n not in used and (
        n.endswith(AUX_SUFFIXES) or dtype.startswith("F8_")))
    if stray:
        raise _refuse(where, method, f"{len(stray)} tensor(s) such as {stray[:3]} belong to "
                                     "no quantized weight it reads (a scale without its "
                                     "weight, an fp8 tensor not named *.weight)")
    return found


class QuantizedReader(CheckpointReader):
    """A reader whose quantized weights are read dequantized (see the module
    docstring); every other tensor as the inner reader reads it."""

    def __init__(self, inner: CheckpointReader, quantized: Mapping[str, Quantized],
                 raw: Callable[[str], np.ndarray], file_of: Callable[[str], str]) -> None:
        self._inner, self._quantized, self._raw = inner, dict(quantized), raw
        self._hidden = {p for q in quantized.values() for p in q.parts}
        self._file_of = file_of

    @property
    def files(self) -> list[str]:
        return list(self._inner.files)

    def entries(self) -> Iterator[TensorEntry]:
        for entry in self._inner.entries():
            if entry.name not in self._hidden and entry.name not in self._quantized:
                yield entry
        files = [str(f) for f in self.files]
        for name, q in self._quantized.items():
            at = self._file_of(q.parts[0])
            yield TensorEntry(name, q.shape, "float32",
                              file=files.index(at) if at in files else 0,
                              meta={"quant": q.label})

    def _dequantized(self, name: str, index: Any) -> np.ndarray:
        q = self._quantized[name]
        try:
            values = q.dequantize(self._raw)
        except ModelSourceError:
            raise
        except (TypeError, ValueError, IndexError, OverflowError, MemoryError) as exc:
            raise error(self._file_of(q.parts[0]), f"tensor {name!r} ({q.label}) cannot be "
                        f"dequantized ({type(exc).__name__}: {str(exc)[:120]}): "
                        "refused") from None
        if tuple(values.shape) != self._quantized[name].shape:
            raise error(self._file_of(self._quantized[name].parts[0]),
                        f"tensor {name!r} dequantizes to {values.shape}, not its declared "
                        f"{self._quantized[name].shape}: refused")
        return values if index is None else np.ascontiguousarray(values[to_slices(index)])

    def read(self, name: str, index: Any = None) -> Any:
        if name in self._quantized:
            return self._dequantized(name, index)
        return self._inner.read(name, index)

    def read_numpy(self, name: str, index: Any = None) -> np.ndarray:
        if name in self._quantized:
            return self._dequantized(name, index)
        return self._inner.read_numpy(name, index)

    def config(self) -> Mapping[str, Any]:
        return self._inner.config()


def wrap(reader: CheckpointReader, files: Mapping[str, Any], where: str) -> CheckpointReader:
    """``reader`` as is, or a :class:`QuantizedReader` over it when its checkpoint is
    quantized. ``files`` maps each tensor's name to the SafetensorsFile holding it."""
    layout = {name: f.layout[name][:2] for name, f in files.items()}
    config = reader.config() if any(
        n.endswith(AUX_SUFFIXES) or layout[n][0].startswith(("F8", "I", "U"))
        for n in layout) else {}
    def read(name: str) -> np.ndarray:
        return files[name].raw(name)

    quantized = plan(layout, config, where, read)
    if not quantized:
        return reader
    return QuantizedReader(reader, quantized, read, lambda name: str(files[name].path))
