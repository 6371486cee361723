"""What the quantized schemes share: a quantized parameter, the refusal, scale dtypes
and bit unpacking (:mod:`diffract_formats.quantized` and
:mod:`diffract_formats._compressed` build on them)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import attrs
import numpy as np

from diffract_formats._common import error

Layout = Mapping[str, tuple[str, tuple[int, ...]]]  # name -> (safetensors dtype, shape)
Read = Callable[[str], np.ndarray]


@attrs.frozen
class Quantized:
    """One quantized parameter: its dequantized shape, how it was stored (``label``, the
    parameter's ``meta.quant``), the tensors it is read from (the first holds its values)
    and the function that dequantizes them."""

    shape: tuple[int, ...]
    label: str
    parts: tuple[str, ...]
    dequantize: Callable[[Read], np.ndarray] = attrs.field(eq=False, repr=False)


def _refuse(where: str, scheme: str, problem: str) -> Exception:
    return error(where, f"quantization {scheme!r}: {problem}; refused (a quantized tensor is "
                        "never analysed raw)")


def _check(cond: bool, where: str, scheme: str, problem: str) -> None:
    if not cond:
        raise _refuse(where, scheme, problem)


#: What a scale may be stored as: a float, or (FP8) UE8M0, an exponent byte.
SCALE_DTYPES = ("F32", "F16", "BF16", "F64")


def _scale_dtype(layout: Layout, name: str, scheme: str, ue8m0: bool = False) -> str:
    dtype = layout[name][0]
    _check(dtype in SCALE_DTYPES or ue8m0 and dtype == "F8_E8M0", name, scheme,
           f"a scale stored as {dtype}: scales are floats" + (" or UE8M0 (F8_E8M0)"
                                                              if ue8m0 else ""))
    return dtype


# -- unpacking ----------------------------------------------------------------------------
def unpack_bits(packed: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """Unsigned ``bits``-bit values packed into int32 along ``axis``, lowest bits first:
    each int32 becomes ``32 / bits`` values in order, as uint8 (one byte a value: no
    64-bit intermediate the size of the weight)."""
    per = 32 // bits
    words = np.moveaxis(np.ascontiguousarray(packed).view(np.uint32), axis, -1)
    values = np.empty((*words.shape[:-1], words.shape[-1] * per), dtype=np.uint8)
    for k in range(per):
        values[..., k::per] = (words >> np.uint32(k * bits)) & np.uint32((1 << bits) - 1)
    return np.moveaxis(values, -1, axis)
