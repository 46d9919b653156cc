"""Reference HiFloat8, FP8 and MX codecs (numpy + stdlib only), written from the format definitions,
never from ascend_emu code.

- HiF8 (Luo et al., arXiv 2409.16626 §2): :func:`hif8_decode` reads one code bit field by bit
  field; :func:`hif8_encode` rounds the mantissa of ``|v|`` to the width its binade has (the
  "normalise, round the significand, renormalise" way), and :func:`hif8_encode_exact` picks the
  nearest value by exact fractions (used on the tie points).
- FP8 (OCP OFP8 rev 1.0): :func:`fp8_decode` by bit fields, :func:`fp8_encode` by rounding the
  significand to 3 / 2 bits, ties to even.
- MX (OCP MX v1.0; ops-nn aclnnDynamicMxQuant doc): :func:`mx_quantize` block by block with Python
  loops and explicit index arithmetic for the scale pairs.
"""

from __future__ import annotations

import functools
import math
import struct
from fractions import Fraction

import numpy as np

# ---------------------------------------------------------------------- HiF8
HIF8_NAN_CODE = 0x80
HIF8_INF_CODES = (0x6F, 0xEF)


def hif8_decode(code: int) -> float:
    """Value of one HiF8 code (float; NaN for 0x80, +-inf for 0x6F / 0xEF)."""
    code = int(code)
    sign = -1.0 if code & 0x80 else 1.0
    bits = [(code >> i) & 1 for i in range(6, -1, -1)]  # b6 .. b0
    if code == 0x80:
        return math.nan
    if code in HIF8_INF_CODES:
        return sign * math.inf
    if bits[0] == 1 and bits[1] == 1:
        w, rest = 4, bits[2:]
    elif bits[0] == 1 and bits[1] == 0:
        w, rest = 3, bits[2:]
    elif bits[0] == 0 and bits[1] == 1:
        w, rest = 2, bits[2:]
    elif bits[:3] == [0, 0, 1]:
        w, rest = 1, bits[3:]
    elif bits[:4] == [0, 0, 0, 1]:
        w, rest = 0, bits[4:]
    else:  # 0000 + 3 bits: denormal 2**(M - 23), M = 0 is zero
        m_val = bits[4] * 4 + bits[5] * 2 + bits[6]
        return 0.0 if m_val == 0 else sign * 2.0 ** (m_val - 23)
    exp_bits, mant_bits = rest[:w], rest[w:]
    if w == 0:
        e = 0
    else:
        magnitude = 2 ** (w - 1)
        for k, b in enumerate(exp_bits[1:]):
            magnitude += b << (w - 2 - k)
        e = -magnitude if exp_bits[0] else magnitude
    m = len(mant_bits)
    mant = sum(b << (m - 1 - k) for k, b in enumerate(mant_bits))
    return sign * 2.0 ** e * (1 + mant / 2 ** m)


HIF8_TABLE = np.array([hif8_decode(c) for c in range(256)], dtype=np.float64)
#: value -> code for every finite value (0.0 -> 0x00; codes are unique per value).
_HIF8_CODE_OF = {float(v): c for c, v in enumerate(HIF8_TABLE) if np.isfinite(v) and c != 0x80}
_HIF8_CODE_OF[0.0] = 0x00


def hif8_encode(values) -> np.ndarray:
    """HiF8 codes of fp32 values (vectorised over float64): nearest, ties away from zero, >= the
    Inf threshold (a rounded magnitude above 2**15) -> Inf, NaN -> 0x80, zero of either sign -> 0."""
    with np.errstate(invalid="ignore"):
        v = np.asarray(values, dtype=np.float32).astype(np.float64).reshape(-1)
    out = np.zeros(v.shape, np.uint8)
    for i in range(0, v.size, 1 << 16):
        out[i:i + (1 << 16)] = _encode_chunk(v[i:i + (1 << 16)])
    return out.reshape(np.shape(values))


def _encode_chunk(v: np.ndarray) -> np.ndarray:
    mag = np.abs(v)
    finite = np.isfinite(mag) & (mag > 0)
    _, e2 = np.frexp(np.where(finite, mag, 1.0))
    e = e2 - 1  # mag in [2**e, 2**(e+1))
    m = np.select([e < -15, np.abs(e) >= 8, np.abs(e) >= 4], [0, 1, 2], default=3)  # mantissa bits of the binade
    step = np.ldexp(1.0, e - m)
    q = mag / step  # exact
    n = np.floor(q + 0.5)  # ties away (q >= 1, q + 0.5 exact)
    rounded = n * step
    rounded = np.where(e < -22, np.where(mag >= 2.0 ** -23, 2.0 ** -22, 0.0), rounded)
    codes = np.zeros(v.shape, np.uint8)
    for i in np.flatnonzero(finite):
        r = float(rounded[i])
        if r > 2.0 ** 15:
            c = 0x6F
        else:
            c = _HIF8_CODE_OF[r]
        if v[i] < 0 and c != 0:
            c |= 0x80
        codes[i] = c
    codes[np.isinf(v) & (v > 0)] = 0x6F
    codes[np.isinf(v) & (v < 0)] = 0xEF
    codes[np.isnan(v)] = HIF8_NAN_CODE
    return codes


_HIF8_SORTED = sorted((Fraction(float(x)), c) for c, x in enumerate(HIF8_TABLE) if np.isfinite(x) and x >= 0)


def hif8_encode_exact(x: float) -> int:
    """HiF8 code of one float by exact nearest search over the finite values (ties away from zero);
    magnitudes >= 1.25 * 2**15 -> Inf (the midpoint towards the Inf code's 1.5 * 2**15)."""
    if math.isnan(x):
        return HIF8_NAN_CODE
    if math.isinf(x) or abs(x) >= 1.25 * 2 ** 15:
        return 0x6F if x > 0 else 0xEF
    mag = Fraction(abs(x))
    best_code, best_dist, best_val = None, None, None
    for val, c in _HIF8_SORTED:
        d = abs(val - mag)
        if best_dist is None or d < best_dist or (d == best_dist and val > best_val):
            best_code, best_dist, best_val = c, d, val
    if x < 0 and best_code != 0:
        best_code |= 0x80
    return best_code


# ---------------------------------------------------------------------- FP8 (OFP8)
#: name -> (exponent bits, mantissa bits, bias, has_inf)
FP8_FORMATS = {"float8_e4m3fn": (4, 3, 7, False), "float8_e5m2": (5, 2, 15, True)}


def fp8_decode(code: int, name: str) -> float:
    """Value of one FP8 code from its bit fields (OFP8 rev 1.0)."""
    ebits, mbits, bias, has_inf = FP8_FORMATS[name]
    sign = -1.0 if code & 0x80 else 1.0
    exp = (code >> mbits) & ((1 << ebits) - 1)
    mant = code & ((1 << mbits) - 1)
    if has_inf and exp == (1 << ebits) - 1:
        return sign * math.inf if mant == 0 else math.nan
    if not has_inf and exp == (1 << ebits) - 1 and mant == (1 << mbits) - 1:
        return math.nan
    if exp == 0:
        return sign * mant * 2.0 ** (1 - bias - mbits)
    return sign * (1 + mant / 2 ** mbits) * 2.0 ** (exp - bias)


@functools.lru_cache(maxsize=None)
def fp8_table(name: str) -> np.ndarray:
    """Value of every code (read-only)."""
    t = np.array([fp8_decode(c, name) for c in range(256)], dtype=np.float64)
    t.flags.writeable = False
    return t


@functools.lru_cache(maxsize=None)
def fp8_max(name: str) -> float:
    t = fp8_table(name)
    return float(np.nanmax(np.where(np.isinf(t), np.nan, t)))


@functools.lru_cache(maxsize=None)
def _fp8_code_of(name: str) -> dict:
    table = fp8_table(name)
    return {(abs(float(table[c])), bool(c & 0x80)): c for c in range(256) if np.isfinite(table[c]) and table[c] != 0}


def fp8_encode(values, name: str, saturate: bool) -> np.ndarray:
    """FP8 codes (uint8) of fp32 values: significand rounded to nearest, ties to even; overflow
    saturates to +-max (``saturate``) or gives NaN (E4M3FN) / +-Inf (E5M2); NaN -> a NaN code."""
    ebits, mbits, bias, has_inf = FP8_FORMATS[name]
    code_of = _fp8_code_of(name)
    vmax = fp8_max(name)
    with np.errstate(invalid="ignore"):  # signalling NaN payloads
        v = np.asarray(values, dtype=np.float32).astype(np.float64).reshape(-1)
    mag = np.abs(v)
    emin = 1 - bias
    finite = np.isfinite(mag) & (mag > 0)
    _, e2 = np.frexp(np.where(finite, mag, 1.0))
    e = np.maximum(e2 - 1, emin)
    step = np.ldexp(1.0, e - mbits)
    rounded = np.rint(mag / step) * step  # np.rint: ties to even, exact here
    out = np.zeros(v.shape, np.uint8)
    nan_code = 0x7F if not has_inf else 0x7E
    for i in range(v.size):
        x = v[i]
        neg = bool(np.signbit(x))
        if math.isnan(x):
            out[i] = nan_code
            continue
        r = float(rounded[i]) if finite[i] else (math.inf if math.isinf(x) else 0.0)
        if r > vmax:
            if saturate:
                r = vmax
            elif has_inf:
                out[i] = 0xFC if neg else 0x7C
                continue
            else:
                out[i] = 0xFF if neg else 0x7F
                continue
        out[i] = code_of[(r, neg)] if r != 0 else (0x80 if neg else 0x00)
    return out.reshape(np.shape(values))


# ---------------------------------------------------------------------- MX
EMAX = {"float8_e4m3fn": 8, "float8_e5m2": 15}


def _f32_fields(x: float) -> tuple[int, int]:
    bits = struct.unpack("<I", struct.pack("<f", x))[0]
    return (bits >> 23) & 0xFF, bits & 0x7FFFFF


def mx_scale_byte(amax: float, name: str, scale_alg: int) -> int:
    """E8M0 byte of one block (ops-nn aclnnDynamicMxQuant doc, scenarios 1 and 2)."""
    if math.isnan(amax) or math.isinf(amax):
        return 0xFF
    if scale_alg == 0:
        exp, _ = _f32_fields(amax)
        return max(exp - EMAX[name], 0)
    recip = np.float32(1.0) / np.float32(fp8_max(name))
    s = float(np.float32(amax) * recip)
    exp, mant = _f32_fields(s)
    if exp == 0:
        return 1 if mant > (1 << 22) else 0
    if exp < 254 and mant > 0:
        return exp + 1
    return exp


def mx_quantize(x32: np.ndarray, name: str, axis: int, block_size: int, scale_alg: int):
    """(element codes uint8 of x's shape, scale bytes uint8 pairs) by explicit loops."""
    x32 = np.asarray(x32, dtype=np.float32)
    ax = axis % x32.ndim
    length = x32.shape[ax]
    nblocks = -(-length // block_size)
    pairs = (nblocks + 1) // 2
    sshape = list(x32.shape)
    sshape[ax] = pairs
    scales = np.zeros(sshape + [2], np.uint8)
    codes = np.zeros(x32.shape, np.uint8)
    other = [d for i, d in enumerate(x32.shape) if i != ax]
    for outer in np.ndindex(*other):
        for j in range(nblocks):
            idx = [list(outer[:ax]) + [k] + list(outer[ax:]) for k in range(j * block_size,
                                                                              min(length, (j + 1) * block_size))]
            vals = [float(x32[tuple(i)]) for i in idx]
            amax = 0.0
            for v in vals:
                if math.isnan(v) or math.isnan(amax):
                    amax = math.nan
                else:
                    amax = max(amax, abs(v))
            byte = mx_scale_byte(amax, name, scale_alg)
            sidx = tuple(list(outer[:ax]) + [j // 2] + list(outer[ax:]) + [j % 2])
            scales[sidx] = byte
            for i, v in zip(idx, vals, strict=True):
                if byte == 0xFF:
                    codes[tuple(i)] = fp8_encode(np.float32(np.nan), name, True)
                else:
                    scaled = np.float32(v) * np.float32(2.0 ** (127 - byte))
                    codes[tuple(i)] = fp8_encode(scaled, name, True)
    return codes, scales


def mx_dequantize(codes: np.ndarray, scales: np.ndarray, name: str, axis: int, block_size: int) -> np.ndarray:
    """fp32 values ``element * 2**(byte - 127)`` by explicit loops."""
    table = fp8_table(name)
    ax = axis % codes.ndim
    out = np.zeros(codes.shape, np.float32)
    for i in np.ndindex(*codes.shape):
        j = i[ax] // block_size
        sidx = tuple(list(i[:ax]) + [j // 2] + list(i[ax + 1:]) + [j % 2])
        byte = int(scales[sidx])
        out[i] = math.nan if byte == 0xFF else np.float32(table[codes[i]] * 2.0 ** (byte - 127))
    return out
