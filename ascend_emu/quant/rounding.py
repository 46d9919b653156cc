"""Rounding and casts as the Ascend vector unit performs them.

Source: docs/sources.md#quant_rounding (CastFP32ToINT8, CAST_RINT / CAST_ROUND, MlaPreprocess RmsNormQuant)
and docs/numerics.md#rounding.

- fp32 -> bf16: round to nearest, ties to even (RNE); NaN becomes the quiet NaN ``sign | 0x7FC0``,
  exactly as ``ml_dtypes`` does, so byte comparisons with ml_dtypes / torch results are stable.
- bf16 -> fp32: exact (``bits << 16``).
- fp32 -> fp16: IEEE RNE (``CAST_NONE`` / ``CAST_RINT``), or ties away from zero (``CAST_ROUND``).
- fp32 -> int8: ``CAST_RINT`` is half-to-even, ``CAST_ROUND`` half-away-from-zero; both saturate
  to [-128, 127].

The scalar functions with a ``_bits`` suffix are Numba ``njit`` functions usable inside kernels,
where bf16 travels as ``uint16``. The array functions are the NumPy-level API.
"""

from __future__ import annotations

from typing import Literal

import ml_dtypes
import numpy as np
from numba import njit

from ..errors import DTypeError, arg_error

BF16 = np.dtype(ml_dtypes.bfloat16)
INT8_MIN = -128
INT8_MAX = 127
#: fp16 has 10 explicit mantissa bits and a minimum normal exponent of -14.
_F16_MANT_BITS = 10
_F16_MIN_EXP = -14

Rounding = Literal["half_even", "half_away"]


# ---------------------------------------------------------------------- scalar, Numba
@njit(cache=True, inline="always")
def f32_bits_to_bf16_bits(u):
    """bf16 bits (uint16) of the fp32 value with bits ``u`` (uint32), RNE, canonical NaN."""
    u = np.uint32(u)
    if (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((u >> np.uint32(16)) & np.uint32(0x8000) | np.uint32(0x7FC0))
    lsb = (u >> np.uint32(16)) & np.uint32(1)
    return np.uint16((u + np.uint32(0x7FFF) + lsb) >> np.uint32(16))


@njit(cache=True, inline="always")
def f32_to_bf16_bits(x):
    """bf16 bits (uint16) of fp32 ``x``, RNE."""
    return f32_bits_to_bf16_bits(np.float32(x).view(np.uint32))


@njit(cache=True, inline="always")
def bf16_bits_to_f32(h):
    """fp32 value of bf16 bits ``h`` (exact)."""
    return np.uint32(np.uint32(h) << np.uint32(16)).view(np.float32)


@njit(cache=True, inline="always")
def f16_bits_to_f32(h):
    """fp32 value of fp16 bits ``h`` (uint16), exact (subnormals, inf and NaN payload kept).

    Numba has no CPU float16 type, so kernels carry fp16 as ``uint16`` like bf16.
    """
    h = np.uint32(h)
    sign = (h & np.uint32(0x8000)) << np.uint32(16)
    exp = (h >> np.uint32(10)) & np.uint32(0x1F)
    mant = h & np.uint32(0x3FF)
    if exp == np.uint32(0x1F):
        return np.uint32(sign | np.uint32(0x7F800000) | (mant << np.uint32(13))).view(np.float32)
    if exp == np.uint32(0):
        mag = np.float32(mant) * np.float32(2.0 ** -24)  # exact: <= 10 bits times a power of two
        return -mag if sign else mag
    return np.uint32(sign | ((exp + np.uint32(112)) << np.uint32(23)) | (mant << np.uint32(13))).view(np.float32)


@njit(cache=True, inline="always")
def f32_bits_to_f16_bits(u):
    """fp16 bits (uint16) of the fp32 value with bits ``u`` (uint32): IEEE RNE (``CAST_NONE`` /
    ``CAST_RINT``), overflow to +-inf, subnormals rounded, NaN quieted (``sign | 0x7E00 | payload``),
    bit-identical to NumPy's ``astype(np.float16)`` except for signalling-NaN payloads."""
    u = np.uint32(u)
    sign = (u >> np.uint32(16)) & np.uint32(0x8000)
    exp = np.int64((u >> np.uint32(23)) & np.uint32(0xFF))
    mant = u & np.uint32(0x7FFFFF)
    if exp == 0xFF:
        if mant:
            return np.uint16(sign | np.uint32(0x7E00) | (mant >> np.uint32(13)))
        return np.uint16(sign | np.uint32(0x7C00))
    e = exp - 112  # fp16 biased exponent
    if e >= 31:
        return np.uint16(sign | np.uint32(0x7C00))
    if e <= 0:
        if e < -10:
            return np.uint16(sign)  # below half the smallest subnormal
        m = mant | np.uint32(0x800000)
        shift = np.uint32(14 - e)
        res = m >> shift
        rem = m & ((np.uint32(1) << shift) - np.uint32(1))
        half = np.uint32(1) << (shift - np.uint32(1))
        if rem > half or (rem == half and (res & np.uint32(1))):
            res += np.uint32(1)
        return np.uint16(sign | res)
    res = (np.uint32(e) << np.uint32(10)) | (mant >> np.uint32(13))
    rem = mant & np.uint32(0x1FFF)
    if rem > np.uint32(0x1000) or (rem == np.uint32(0x1000) and (res & np.uint32(1))):
        res += np.uint32(1)  # a carry into the exponent gives the next binade or inf, as IEEE
    return np.uint16(sign | res)


@njit(cache=True, inline="always")
def f32_round_f16(x):
    """fp32 ``x`` rounded to fp16 (RNE, subnormals, overflow to inf, NaN kept), as an fp32 value:
    the value of :func:`f32_bits_to_f16_bits`, branch-free (selects only) so loops over it
    vectorize (tested against NumPy's ``astype(float16)``). Below 2**-14 (fp16 subnormals) the sum
    ``|x| + 0.75`` rounds to a multiple of 2**-24; above, the fp32 significand is rounded at bit 13."""
    x32 = np.float32(x)
    a = np.float32(abs(x32))
    sub = np.float32(np.float32(a + np.float32(0.75)) - np.float32(0.75))
    u = a.view(np.uint32)
    rounded = np.uint32((u + np.uint32(0xFFF) + ((u >> np.uint32(13)) & np.uint32(1))) & np.uint32(0xFFFFE000))
    nrm = rounded.view(np.float32)
    y = sub if a < np.float32(2.0 ** -14) else nrm
    y = np.float32(np.inf) if y > np.float32(65504.0) else y
    y = a if a != a else y
    return np.float32(np.copysign(y, x32))


@njit(cache=True)
def _f32_array_to_bf16_bits(src, dst):
    """src: flat uint32 fp32 bits ``[n]``; dst: flat uint16 ``[n]`` (1-D only: one compilation)."""
    for i in range(src.size):
        dst[i] = f32_bits_to_bf16_bits(src[i])


# ---------------------------------------------------------------------- arrays, NumPy
def to_bf16(x) -> np.ndarray:
    """Round fp32 values to bf16, RNE, NaN -> ``sign | 0x7FC0`` (bit-identical to ml_dtypes).

    Source: docs/numerics.md#rounding (bf16 outputs use CAST_RINT).

    Args:
        x: array-like of any real dtype; float64 is first rounded to fp32 (as a kernel holding
            fp32 would), integers are converted to fp32 first.

    Returns:
        New ``ml_dtypes.bfloat16`` array of ``x``'s shape.
    """
    x32 = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty(x32.shape, dtype=np.uint16)
    _f32_array_to_bf16_bits(x32.reshape(-1).view(np.uint32), out.reshape(-1))
    return out.view(BF16)


def bf16_to_f32(x) -> np.ndarray:
    """Widen bf16 to fp32, exactly (``bits << 16``; NaN payloads kept).

    Args:
        x: ``ml_dtypes.bfloat16`` values, or their bits as ``uint16`` / ``int16`` (the int16 view
            of a torch bf16 tensor), any shape.

    Returns:
        New fp32 array of ``x``'s shape.

    Raises:
        DTypeError: any other dtype (a float32 array is *not* reinterpreted as bits).
    """
    x = np.asarray(x)
    if x.dtype not in (BF16, np.dtype(np.uint16), np.dtype(np.int16)):
        raise arg_error(DTypeError, "x", "bfloat16, or its bits as uint16 / int16", x.dtype)
    bits = x.view(np.uint16)
    return (bits.astype(np.uint32) << 16).view(np.float32)


def to_f32(x) -> np.ndarray:
    """fp32 copy of a bf16 / fp16 / fp32 / integer array.

    Exact for bf16, fp16, fp32 and integers of magnitude below 2**24 (int8, int16); wider
    integers and float64 round to nearest.

    Returns:
        New fp32 array of ``x``'s shape.
    """
    x = np.asarray(x)
    if x.dtype == BF16:
        return bf16_to_f32(x)
    return x.astype(np.float32)


def real_to_f32(x, name: str = "x") -> np.ndarray:
    """fp32 copy of a real array, as the 950's casts to an 8-bit format read their source: bf16 /
    fp16 widened exactly, float64 and integers rounded to fp32.

    Args:
        x: array-like of a real dtype (bf16, fp16, fp32, float64, integers, bool), any shape.
        name: the argument's name in the error message.

    Returns:
        New fp32 array of ``x``'s shape.

    Raises:
        DTypeError: complex, object or string data.
    """
    x = np.asarray(x)
    if x.dtype == BF16:
        return bf16_to_f32(x)
    if x.dtype.kind not in "fiub":
        raise arg_error(DTypeError, name, "a real array (fp32, fp16, bf16)", x.dtype)
    return x.astype(np.float32)


def round_half_even(x) -> np.ndarray:
    """Round to integral values, ties to even (``CAST_RINT``, docs/sources.md#quant_rounding).

    Args:
        x: float array, any shape.

    Returns:
        Array of ``x``'s float dtype and shape; inf / NaN pass through.
    """
    return np.rint(x)


def round_half_away(x) -> np.ndarray:
    """Round to integral values, ties away from zero (``CAST_ROUND``, docs/sources.md#quant_rounding).

    Exact for every float dtype: ``x - trunc(x)`` is exact, and only its comparison with 0.5
    decides (no ``x + 0.5`` rounding trap).

    Args:
        x: float array, any shape.

    Returns:
        Array of ``x``'s float dtype and shape; inf / NaN pass through, the sign of zero is kept.
    """
    x = np.asarray(x)
    t = np.trunc(x)
    with np.errstate(invalid="ignore"):  # inf - inf
        up = np.abs(x - t) >= 0.5
    return np.where(up, t + np.sign(x), t).astype(x.dtype, copy=False)


def saturate_int8(x) -> np.ndarray:
    """Clip integral float values to [-128, 127] and cast to int8.

    Values must already be integral (round first). NaN becomes 0: the hardware result for NaN
    is not documented (choice kept here). +-inf saturate.

    Returns:
        int8 array of ``x``'s shape.
    """
    x = np.nan_to_num(np.asarray(x, dtype=np.float64), nan=0.0)
    return np.clip(x, INT8_MIN, INT8_MAX).astype(np.int8)


def f32_to_int8(x, rounding: Rounding = "half_even") -> np.ndarray:
    """fp32 -> int8 with the given rounding, saturating to [-128, 127].

    ``half_even`` is the mla_prolog ``CastFP32ToINT8`` / kv_rmsnorm ``RoundFloat2Int8`` chain
    (CAST_RINT; the later fp16 / int8 casts see integers); ``half_away`` is CAST_ROUND
    (docs/sources.md#quant_rounding).

    Args:
        x: values, converted to fp32 first; any shape.
        rounding: ``"half_even"`` or ``"half_away"``.

    Returns:
        int8 array of ``x``'s shape (NaN -> 0, see :func:`saturate_int8`).

    Raises:
        ValueError: unknown rounding.
    """
    x = np.asarray(x, dtype=np.float32)
    if rounding == "half_even":
        return saturate_int8(round_half_even(x))
    if rounding == "half_away":
        return saturate_int8(round_half_away(x))
    raise ValueError(f"rounding: expected 'half_even' or 'half_away', got {rounding!r}")


def f32_to_f16(x, rounding: Rounding = "half_even") -> np.ndarray:
    """fp32 -> fp16 (docs/sources.md#quant_rounding).

    ``half_even`` is IEEE RNE (``CAST_NONE`` / ``CAST_RINT``); ``half_away`` is ``CAST_ROUND``
    (nearest, ties away from zero), also in the subnormal range (fp16 ulp 2**-24). Values that
    round past 65504 give +-inf in both (65520 and above for ``half_away``); the hardware's
    overflow behaviour is not documented. NaN and inf pass through.

    Args:
        x: values, converted to fp32 first; any shape.
        rounding: ``"half_even"`` or ``"half_away"``.

    Returns:
        float16 array of ``x``'s shape.

    Raises:
        ValueError: unknown rounding.
    """
    x = np.asarray(x, dtype=np.float32)
    if rounding == "half_even":
        with np.errstate(over="ignore"):
            return x.astype(np.float16)
    if rounding != "half_away":
        raise ValueError(f"rounding: expected 'half_even' or 'half_away', got {rounding!r}")
    x64 = x.astype(np.float64)
    finite = np.isfinite(x64) & (x64 != 0)
    _, e = np.frexp(np.where(finite, x64, 1.0))  # x = m * 2**e, 0.5 <= |m| < 1
    ulp_exp = np.maximum(e - 1, _F16_MIN_EXP) - _F16_MANT_BITS
    q = x64 / np.exp2(ulp_exp)  # exact: power-of-two scaling
    r = round_half_away(q) * np.exp2(ulp_exp)
    with np.errstate(over="ignore"):
        return np.where(finite, r, x64).astype(np.float16)


def f32_to_int8_via_f16(x, *, f16_rounding: Rounding, int8_rounding: Rounding) -> np.ndarray:
    """fp32 -> fp16 -> int8 (docs/sources.md#quant_rounding): the two-step casts of the A2/A3 q_nope
    dynamic quant (``half_away`` twice) and of MlaPreprocess RmsNormQuant (``half_even`` then
    ``half_even``, clamped to [-128, 127] in fp16 first).

    The double rounding can differ by 1 from a direct fp32 -> int8 round: when ``x`` lies within
    half an fp16 ulp of a tie ``k + 0.5``, the fp16 step lands exactly on the tie and the int8
    step then breaks it (e.g. 64.51 -> 64.5 -> 64 with half_even, but rint(64.51) = 65). The spec
    mentions |x| > 64; the same happens at every magnitude from 0.5 up (0.5001 -> 0.5 -> 0).

    Args:
        x: values, converted to fp32 first; any shape.
        f16_rounding: rounding of the fp32 -> fp16 step.
        int8_rounding: rounding of the fp16 -> int8 step.

    Returns:
        int8 array of ``x``'s shape.

    Raises:
        ValueError: unknown rounding.
    """
    h = f32_to_f16(x, f16_rounding).astype(np.float32)  # exact widening
    h = np.clip(h, INT8_MIN, INT8_MAX)
    return f32_to_int8(h, int8_rounding)


def ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """How many representable values apart two same-dtype float arrays are, element-wise.

    The bits of each element (sign-magnitude) are mapped to integers in value order, so the
    distance is their difference; +0 and -0 are 0 apart. Any float dtype: bf16, fp16, fp32, fp64.

    Args:
        a, b: arrays of one float dtype and one shape.

    Returns:
        int64 array of that shape; meaningless where either side is NaN (callers mask NaNs).
    """
    width = a.dtype.itemsize * 8
    sign = np.int64(1) << (width - 1)

    def ordered(x):
        u = np.ascontiguousarray(x).view(f"u{x.dtype.itemsize}").astype(np.int64)
        return np.where(u & sign, -(u & (sign - 1)), u)

    return np.abs(ordered(a) - ordered(b))


# ---------------------------------------------------------------------- HF32 (the cube's fp32 mode)
#: Mantissa bits HF32 keeps (fp32 keeps 23): HF32 is fp32 with the low
#: :data:`HF32_DROPPED_BITS` mantissa bits cleared.
HF32_MANTISSA_BITS = 10
#: fp32 mantissa bits HF32 drops.
HF32_DROPPED_BITS = 23 - HF32_MANTISSA_BITS
#: The fp32 bit mask HF32's truncation keeps (sign, exponent, top 10 mantissa bits).
HF32_KEEP_MASK = np.uint32((0xFFFFFFFF << HF32_DROPPED_BITS) & 0xFFFFFFFF)


def hf32_truncate(x) -> np.ndarray:
    """fp32 values as the cube unit reads them in HF32 round-toward-zero mode
    (``SetHF32Mode(1)`` with ``SetHF32TransMode(1)``): the low 13 mantissa bits cleared, i.e.
    truncated toward zero to a 10-bit mantissa (docs/ops.md "mHC").

    Zeros, infinities and values that already fit (every bf16 / fp16 value) are unchanged; a
    NaN whose payload lies only in the cleared bits becomes an infinity of its sign, as the bit
    mask makes it. The product of two HF32 values (11-bit significands) is exact in fp32.

    Args:
        x: array-like of real values; converted to fp32 first (float64 rounds to nearest).

    Returns:
        New fp32 array of ``x``'s shape.

    Source: vllm-project/vllm-ascend ``tests/e2e/nightly/single_node/ops/singlecard_ops/
    test_npu_hc_pre.py`` (the official CPU golden: 10 HF32 mantissa bits, masked).
    """
    x32 = np.array(x, dtype=np.float32, order="C", copy=True)
    bits = x32.view(np.uint32)
    bits &= HF32_KEEP_MASK
    return x32
