"""Reference rounding, quantization and combined-row decoding (numpy + ml_dtypes + stdlib only).

Written from docs/sources.md#quant_rounding, docs/sources.md#per_tile_rows and docs/sources.md#npu_kv_quant_sparse_flash_attention; exact arithmetic (``fractions``, ``decimal``,
Python's correctly rounded ``round``) or ml_dtypes' own casts, never ascend_emu code.
"""

from __future__ import annotations

import struct
from decimal import ROUND_HALF_EVEN, ROUND_HALF_UP, Context, Decimal
from fractions import Fraction

import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
F16_MAX = 65504.0
#: |x| >= this rounds to inf under ties-away (halfway between 65504 and 65536).
F16_AWAY_OVERFLOW = 65520.0


# ---------------------------------------------------------------------- bf16
def bf16_bits(x_f32: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) of fp32 values, by ml_dtypes' own cast."""
    return np.asarray(x_f32, dtype=np.float32).astype(BF16).view(np.uint16)


def bf16_to_f32_bits(h: np.ndarray) -> np.ndarray:
    """fp32 bits of bf16 bits, by ml_dtypes' own widening."""
    return np.asarray(h, dtype=np.uint16).view(BF16).astype(np.float32).view(np.uint32)


# ---------------------------------------------------------------------- integer rounding
def round_int(v: float, mode: str) -> int:
    """Exact round of a finite float to an integer: ``half_even`` or ``half_away``."""
    how = ROUND_HALF_EVEN if mode == "half_even" else ROUND_HALF_UP  # HALF_UP = away from zero
    exact = Context(prec=400)  # enough digits for any float64
    return int(Decimal(float(v)).quantize(Decimal(1), rounding=how, context=exact))


def to_int8(v: float, mode: str) -> int:
    """fp32 -> int8: round, then saturate to [-128, 127]; NaN -> 0, +-inf saturate."""
    v = float(v)
    if np.isnan(v):
        return 0
    if np.isinf(v):
        return 127 if v > 0 else -128
    return max(-128, min(127, round_int(v, mode)))


# ---------------------------------------------------------------------- fp16
def _f16_neighbours(v: float) -> tuple[float, float]:
    """The fp16 values just below and above finite ``v`` with |v| <= 65504 (equal when ``v``
    is an fp16 value)."""
    h = np.float16(v)  # the RNE-nearest fp16, finite for |v| <= 65504
    if float(h) == v:
        return v, v
    if float(h) < v:
        return float(h), float(np.nextafter(h, np.float16(np.inf)))
    return float(np.nextafter(h, np.float16(-np.inf))), float(h)


def to_f16(v: float, mode: str) -> float:
    """fp32 -> fp16 with ties ``half_even`` or ``half_away``, exact comparisons (Fraction)."""
    v = float(v)
    if np.isnan(v) or np.isinf(v):
        return v
    if mode == "half_away" and abs(v) >= F16_AWAY_OVERFLOW:
        return float(np.copysign(np.inf, v))
    if mode == "half_even":
        with np.errstate(over="ignore"):
            return float(np.float16(v))  # numpy's cast is IEEE RNE
    if abs(v) > F16_MAX:  # between 65504 and 65520: nearest is 65504
        return float(np.copysign(F16_MAX, v))
    lo, hi = _f16_neighbours(v)
    if lo == hi:
        return lo
    dlo, dhi = Fraction(v) - Fraction(lo), Fraction(hi) - Fraction(v)
    if dlo < dhi:
        return lo
    if dhi < dlo:
        return hi
    return hi if abs(hi) > abs(lo) else lo  # tie: away from zero


# ---------------------------------------------------------------------- quant schemes (docs/sources.md#quant_rounding)
def quantize_groups(x: np.ndarray, groups: list[np.ndarray], *, reciprocal_127: bool) -> tuple[
        np.ndarray, dict[int, np.float32]]:
    """Dynamic quant over explicit index groups with fp32 scalar arithmetic.

    ``groups`` lists flat-index arrays; each group: amax = max|x|, scale = fp32(amax / 127)
    (or fp32(amax * fp32(1/127)) with ``reciprocal_127``), q = rint(fp32(x * fp32(1/scale))),
    zero group -> scale 0, q 0. Returns (q flat int8, {group number: scale}).
    """
    flat = np.asarray(x, dtype=np.float32).reshape(-1)
    q = np.zeros(flat.size, dtype=np.int8)
    scales = {}
    for g, idx in enumerate(groups):
        amax = np.float32(0.0)
        for i in idx:
            amax = max(amax, np.float32(abs(flat[i])))
        if reciprocal_127:
            scale = np.float32(amax * (np.float32(1.0) / np.float32(127.0)))
        else:
            scale = np.float32(amax / np.float32(127.0))
        scales[g] = scale
        if scale == 0:
            continue
        inv = np.float32(np.float32(1.0) / scale)
        for i in idx:
            q[i] = to_int8(np.float32(flat[i] * inv), "half_even")
    return q, scales


# ---------------------------------------------------------------------- combined rows (docs/sources.md#per_tile_rows, docs/sources.md#npu_kv_quant_sparse_flash_attention)
NOPE, ROPE, TILES, TILE = 512, 64, 4, 128
ROW_FMT = f"<{NOPE}b{ROPE}H{TILES}f"  # 512 int8 | 64 little-endian uint16 (bf16 bits) | 4 fp32
ROW_BYTES = struct.calcsize(ROW_FMT)  # 656


def decode_row(row: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One 656-byte row -> (k_nope fp32 = int8 * fp32 scale of tile d // 128, k_rope bf16,
    scales fp32), by struct unpacking."""
    vals = struct.unpack(ROW_FMT, row)
    nope = vals[:NOPE]
    rope_bits = np.array(vals[NOPE:NOPE + ROPE], dtype=np.uint16)
    scales = np.array(vals[NOPE + ROPE:], dtype=np.float32)
    deq = np.array([np.float32(nope[d]) * scales[d // TILE] for d in range(NOPE)], dtype=np.float32)
    return deq, rope_bits.view(BF16), scales


def encode_row(nope: np.ndarray, rope_bf16: np.ndarray, scales: np.ndarray) -> bytes:
    """The inverse of :func:`decode_row` on the raw parts."""
    return struct.pack(ROW_FMT, *[int(v) for v in nope],
                       *[int(v) for v in np.asarray(rope_bf16).view(np.uint16)],
                       *[float(v) for v in np.asarray(scales, dtype=np.float32)])
