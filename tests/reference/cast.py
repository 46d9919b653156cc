"""Reference npu_dtype_cast for the general casts and the int4 packing: per element, Python
arithmetic and bit patterns, independently of ``ascend_emu`` (imports numpy and the standard
library only).

- to fp16: ``struct.pack('<e', v)`` (IEEE binary16, round half to even) of the fp32 value;
- to bf16: the fp32 bit pattern rounded to its top 16 bits, half to even (NaN kept quiet);
- to fp32: ``struct.pack('<f', v)``;
- float to integer: ``math.trunc``, NaN -> 0 (ops-math cast README);
- to bool: ``v != 0``;
- int4: element 2j in the low nibble of byte j, 2j + 1 in the high one (two's complement).
"""

from __future__ import annotations

import math
import struct

import numpy as np


def _f32_bits(v: float) -> int:
    return struct.unpack("<I", struct.pack("<f", v))[0]


def _to_f32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def _f16_bits(v: float) -> int:
    v = _to_f32(v)
    if not math.isnan(v) and abs(v) >= 65520.0:  # binary16 overflow: past max + half an ulp rounds to Inf
        return 0xFC00 if v < 0 else 0x7C00
    return struct.unpack("<H", struct.pack("<e", v))[0]


def _bf16_bits(v: float) -> int:
    b = _f32_bits(_to_f32(v))
    if (b & 0x7F800000) == 0x7F800000 and b & 0x7FFFFF:
        return (b >> 16) | 0x40
    low = b & 0xFFFF
    top = b >> 16
    if low > 0x8000 or (low == 0x8000 and top & 1):
        top += 1
    return top & 0xFFFF


def cast(x: np.ndarray, dst: str) -> np.ndarray:
    """``x`` (a real array) cast to ``dst`` as its raw little-endian bytes view's values: returns
    a uint16 array of bit patterns for fp16 / bf16, otherwise the values in ``dst``."""
    flat = [float(v) if x.dtype.kind in "fV" or x.dtype.name == "bfloat16" else int(v) for v in x.reshape(-1)]
    if dst == "float16":
        out = [_f16_bits(v) for v in flat]
        return np.array(out, np.uint16).reshape(x.shape)
    if dst == "bfloat16":
        return np.array([_bf16_bits(v) for v in flat], np.uint16).reshape(x.shape)
    if dst == "float32":
        return np.array([_to_f32(v) for v in flat], np.float32).reshape(x.shape)
    if dst == "bool":
        return np.array([v != 0 for v in flat], np.bool_).reshape(x.shape)
    out = [0 if isinstance(v, float) and math.isnan(v) else math.trunc(v) for v in flat]
    return np.array(out, np.dtype(dst)).reshape(x.shape)


def pack_int4(x: np.ndarray) -> np.ndarray:
    """int values in [-8, 7] ``[..., 2k]`` -> uint8 ``[..., k]``."""
    rows = x.reshape(-1, x.shape[-1])
    out = np.zeros((rows.shape[0], rows.shape[1] // 2), np.uint8)
    for r in range(rows.shape[0]):
        for j in range(rows.shape[1] // 2):
            lo, hi = int(rows[r, 2 * j]), int(rows[r, 2 * j + 1])
            out[r, j] = (lo & 0xF) | ((hi & 0xF) << 4)
    return out.reshape(x.shape[:-1] + (x.shape[-1] // 2,))
