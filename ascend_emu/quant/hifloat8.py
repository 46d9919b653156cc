"""HiFloat8 (HiF8), the Ascend 950's tapered-precision 8-bit float: decode and encode.

Sources: Luo et al., "Ascend HiFloat8 Format for Deep Learning", arXiv 2409.16626 (§2, the
bit layout and special values); CANN ops-math ``math/cast/op_kernel/arch35/cast_struct.h`` (the
arch35 Cast policy table: ``float -> hifloat8`` and ``half -> hifloat8`` cast with
``CAST_ROUND_MODE_ROUND``, ``bfloat16 -> hifloat8`` is a two-step cast through ``float``
(``CAST_ROUND_MODE_NONE`` then ``CAST_ROUND_MODE_ROUND``), ``hifloat8 -> float`` / ``half`` are
exact widenings).

Bit layout of a code ``s ddd... eee... mmm``: bit 7 is the sign; a prefix ("dot") code selects how
many exponent bits ``w`` and mantissa bits ``m`` follow in the remaining bits:

========  ===  ===  ===============  =========================================
dot       w    m    exponent E       codes (sign 0)
========  ===  ===  ===============  =========================================
``11``    4    1    +-8 .. +-15      0x60 - 0x7F
``10``    3    2    +-4 .. +-7       0x40 - 0x5F
``01``    2    3    +-2, +-3         0x20 - 0x3F
``001``   1    3    +-1              0x10 - 0x1F
``0001``  0    3    0                0x08 - 0x0F
``0000``  -    -    denormal         0x01 - 0x07: 2**(M - 23), M = 1 .. 7
========  ===  ===  ===============  =========================================

The ``w`` exponent bits are sign-magnitude: the first is the sign of E, the other ``w - 1`` the
low bits of ``|E|``, whose leading bit ``2**(w-1)`` is implicit. A normal code is
``(-1)**s * 2**E * (1 + mant / 2**m)``. ``0x00`` is the only zero, ``0x80`` the only NaN, and
``0x6F`` / ``0xEF`` (E = +15 with mantissa 1, which would be ``1.5 * 2**15``) are +-Inf. The
largest finite magnitude is ``2**15``, the smallest ``2**-22``; there are 126 positive finite
codes over 38 binades (2**-22 .. 2**15).

Encoding (:func:`to_hif8`): round to the nearest HiF8 value, ties away from zero, where a tie is
the exact midpoint of two neighbouring values (the spacing changes at the binades where ``m``
changes, so the midpoints are not those of a fixed-width mantissa); magnitudes at or above
``1.25 * 2**15`` (the midpoint between ``2**15`` and the Inf code's ``1.5 * 2**15``) become +-Inf,
as the 950 does in its INF_NAN overflow mode; +-Inf stay +-Inf; NaN becomes ``0x80``; anything
that rounds to zero, of either sign, becomes ``0x00`` (there is no -0). ``CAST_ROUND_MODE_ROUND``
is the cast the ops-math kernels use; the paper also describes a "hybrid" rounding for other
producers of HiF8 data, and no source shows which rounding every 950 kernel (attention, matmul
epilogues) applies, so the rounding is kept in one place, :data:`HIF8_ROUNDING`, and unverified
against hardware output.
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, arg_error
from .rounding import real_to_f32

#: The only NaN code, and the +-Inf codes.
HIF8_NAN = 0x80
HIF8_POS_INF = 0x6F
HIF8_NEG_INF = 0xEF
#: Largest finite magnitude and smallest positive value.
HIF8_MAX = 2.0 ** 15
HIF8_MIN_POSITIVE = 2.0 ** -22
#: Magnitudes at or above this encode as +-Inf (midpoint of 2**15 and the Inf code's 1.5 * 2**15).
HIF8_INF_THRESHOLD = 1.25 * 2.0 ** 15
#: Rounding of every encode: to nearest, ties away from zero (ops-math ``CAST_ROUND_MODE_ROUND``).
HIF8_ROUNDING = "half_away"

#: (prefix bits, prefix length, exponent width w, mantissa width m) of the normal classes.
_DOT_CLASSES = ((0b11, 2, 4, 1), (0b10, 2, 3, 2), (0b01, 2, 2, 3), (0b001, 3, 1, 3), (0b0001, 4, 0, 3))


def _positive_table() -> tuple[np.ndarray, np.ndarray]:
    """(magnitudes, codes) of every non-negative HiF8 code except NaN, the Inf code included
    with its layout value ``1.5 * 2**15``; sorted by magnitude (float64, exact)."""
    values, codes = [0.0], [0x00]
    for m_exp in range(1, 8):  # denormals
        values.append(2.0 ** (m_exp - 23))
        codes.append(m_exp)
    for prefix, plen, w, m in _DOT_CLASSES:
        for e_field in range(1 << w):
            if w == 0:
                e = 0
            else:
                e_neg = e_field >> (w - 1)
                e_mag = (1 << (w - 1)) + (e_field & ((1 << (w - 1)) - 1))
                e = -e_mag if e_neg else e_mag
            for mant in range(1 << m):
                codes.append((prefix << (7 - plen)) | (e_field << m) | mant)
                values.append(2.0 ** e * (1.0 + mant / (1 << m)))
    order = np.argsort(values, kind="stable")
    return np.asarray(values, np.float64)[order], np.asarray(codes, np.uint8)[order]


_MAGS, _CODES = _positive_table()
#: Midpoints between neighbouring magnitudes: the rounding boundaries of :func:`to_hif8`.
_MIDPOINTS = (_MAGS[:-1] + _MAGS[1:]) / 2  # exact: neighbours are within a factor 2 (float64)

#: fp32 value of every code, indexed by the code (0x80 NaN, 0x6F / 0xEF +-Inf).
HIF8_VALUES = np.empty(256, np.float32)
HIF8_VALUES[_CODES] = _MAGS
HIF8_VALUES[_CODES | 0x80] = -_MAGS
HIF8_VALUES[HIF8_POS_INF], HIF8_VALUES[HIF8_NEG_INF] = np.inf, -np.inf
HIF8_VALUES[HIF8_NAN] = np.nan
HIF8_VALUES.flags.writeable = False


def hif8_to_f32(codes) -> np.ndarray:
    """Decode HiF8 codes to fp32 (exact: every HiF8 value is an fp32, and an fp16, value).

    Source: arXiv 2409.16626 §2; ops-math ``cast_struct.h`` (``hifloat8 -> float`` is a direct
    cast with no rounding).

    Args:
        codes: HiF8 codes as ``uint8`` (torch_npu carries ``hifloat8`` tensors as ``torch.uint8``),
            any shape.

    Returns:
        New fp32 array of ``codes``' shape; ``0x80`` gives NaN, ``0x6F`` / ``0xEF`` +-Inf.

    Raises:
        DTypeError: ``codes`` is not ``uint8`` (int8 or a float array is not reinterpreted).
    """
    codes = np.asarray(codes)
    if codes.dtype != np.uint8:
        raise arg_error(DTypeError, "codes", "HiF8 codes as uint8", codes.dtype)
    return HIF8_VALUES[codes]



#: How each rounding treats a magnitude on a midpoint: ``searchsorted`` side ("right": the
#: larger neighbour, away from zero). Another mode (the paper's hybrid rounding) goes here.
_TIE_SIDE = {"half_away": "right"}


def _round_to_index(mag: np.ndarray) -> np.ndarray:
    """Index into the magnitude table of the rounding of ``mag`` (float64, >= 0, no NaN) under
    :data:`HIF8_ROUNDING`: the one place the rounding is applied."""
    return np.searchsorted(_MIDPOINTS, mag, side=_TIE_SIDE[HIF8_ROUNDING])


def to_hif8(x) -> np.ndarray:
    """Encode values as HiF8 codes: nearest, ties away from zero; Inf at or above 1.25 * 2**15.

    fp16 and bf16 values are widened to fp32 first (exact), as ops-math's ``half -> hifloat8``
    and ``bfloat16 -> float -> hifloat8`` casts compute; float64 is first rounded to fp32.

    Source: arXiv 2409.16626 §2 (layout); ops-math ``math/cast/op_kernel/arch35/cast_struct.h``
    (``CAST_ROUND_MODE_ROUND``); the 950's INF_NAN overflow mode (docs/formats.md). The rounding is
    unverified against 950 output: see the module docstring and :data:`HIF8_ROUNDING`.

    Args:
        x: fp32, fp16 or bf16 (``ml_dtypes.bfloat16``) values, any shape.

    Returns:
        New ``uint8`` array of HiF8 codes, ``x``'s shape: NaN -> ``0x80``; +-Inf and magnitudes
        >= :data:`HIF8_INF_THRESHOLD` -> ``0x6F`` / ``0xEF``; values that round to zero (and -0)
        -> ``0x00``.

    Raises:
        DTypeError: ``x`` is not a real array (complex, object, strings).
    """
    x32 = real_to_f32(x, "x")
    with np.errstate(invalid="ignore"):  # signalling NaN payloads
        x64 = x32.astype(np.float64)
    nan = np.isnan(x64)
    mag = np.where(nan, 0.0, np.abs(x64))
    codes = _CODES[_round_to_index(mag)]
    negative = np.signbit(x64) & (codes != 0x00)
    codes = np.where(negative, codes | np.uint8(0x80), codes)
    return np.where(nan, np.uint8(HIF8_NAN), codes).astype(np.uint8, copy=False)
