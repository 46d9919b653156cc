"""MX block scaling (MXFP8): E8M0 scales shared by blocks of 32 along an axis, as the Ascend 950
quantizes and stores them.

Sources: OCP Microscaling Formats (MX) Specification v1.0 (§5: a block of k elements shares one
E8M0 scale, bias 127, ``0xFF`` NaN, no zero or sign; §6.3: the conversion); CANN ops-nn
``quant/dynamic_mx_quant/docs/aclnnDynamicMxQuant_en.md`` / ``aclnnDynamicMxQuantV3.md`` (the
``scaleAlg`` 0 and 1 formulas, ``blocksize`` a multiple of 32 up to 1024, the fp8 round mode
``rint``, the scale layout: "the value of shape on the axis is ... divided by blocksize and rounded
up, and then even padding is performed. The padding value is 0", "when axis is not the last axis,
the mxscaleOut output needs to interleave every two rows") and ``quant/dynamic_mx_quant/README.md``
(``mxscale.shape[axis] = (ceil(L / blocksize) + 1) / 2``, ``mxscale.shape[-1] = 2``).

For a block of values ``V`` (fp32; fp16 / bf16 widened exactly) with ``amax = max |V|`` (a short
last block is padded with zeros, which do not change ``amax``), the scale byte is

- ``scale_alg`` 0 (OCP): ``biased_exp(amax) - emax`` (``emax`` 8 for E4M3FN, 15 for E5M2), and 0
  where that is <= 0 (``amax`` zero, subnormal or below ``2**(emax - 126)``): the scale
  ``2**floor(log2 amax) / 2**emax``;
- ``scale_alg`` 1: ``S = fl32(amax * fl32(1 / max))`` (``max`` 448 / 57344); the byte is the
  biased exponent of ``S``, plus one where ``S`` is normal, its mantissa is non-zero and the
  exponent is below 254; where ``S`` is subnormal the byte is 1 if its mantissa is above one
  half (``S > 2**-127``), else 0 (the doc's three cases). So ``2**(byte - 127) >= S``: the scaled
  block fits the element range. ``ml_dtypes``' E8M0 cast rounds to nearest and is not used.

A block holding a NaN or an Inf gets the NaN scale ``0xFF`` (``amax`` has the all-ones exponent;
OCP §6.3) and NaN elements (choice: no source shows the bytes a 950 writes there).

Elements: ``fl32(V * fl32(2**(127 - byte)))`` (the doc's ``R = 1 / fp32(S_ue8m0)``, a power of two,
so the product is exact unless it underflows), cast RNE with saturation to +-max (OCP §6.3 lets
an implementation saturate; ``scale_alg`` 0 can put ``amax`` up to just below ``2**(emax + 1)``,
above 448 for E4M3FN). Dequantisation is ``element * 2**(byte - 127)``.

Scale storage: the bytes of the ``ceil(L / block_size)`` blocks along ``axis``, padded with one 0
byte to an even count, stored as pairs: shape ``x.shape`` with ``axis`` replaced by
``ceil(ceil(L / block_size) / 2)`` and a trailing 2; block ``j``'s byte is at index ``j // 2`` of
that axis and ``j % 2`` of the last.
"""

from __future__ import annotations

import numpy as np

from ..errors import DTypeError, ModeError, ShapeError, arg_error, describe
from .fp8 import FP8_DTYPES, FP8_EMAX, FP8_MAX, fp8_name, to_fp8
from .rounding import real_to_f32

#: Elements per block of the OCP MX formats; Ascend allows multiples of it up to MX_MAX_BLOCK_SIZE.
MX_BLOCK_SIZE = 32
MX_MAX_BLOCK_SIZE = 1024
#: E8M0: value ``2**(byte - E8M0_BIAS)``; ``E8M0_NAN`` is NaN.
E8M0_BIAS = 127
E8M0_NAN = 0xFF
#: The ``scale_alg`` values of aclnnDynamicMxQuant for FP8 elements.
SCALE_ALGS = (0, 1)

_F32_EXP_MASK = np.uint32(0xFF)
_F32_MANT_MASK = np.uint32(0x7FFFFF)
_F32_HALF_MANT = np.uint32(0x400000)


def _check_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise arg_error(ModeError, name, "an int", describe(value))
    return int(value)


def _norm_axis(axis, ndim: int) -> int:
    axis = _check_int("axis", axis)
    if not -ndim <= axis < ndim:
        raise arg_error(ShapeError, "axis", f"an axis in [{-ndim}, {ndim - 1}] of the {ndim}-D input", axis)
    return axis % ndim


def _check_block_size(block_size) -> int:
    block_size = _check_int("block_size", block_size)
    if block_size <= 0 or block_size % MX_BLOCK_SIZE or block_size > MX_MAX_BLOCK_SIZE:
        raise arg_error(ModeError, "block_size", f"a multiple of {MX_BLOCK_SIZE} in [{MX_BLOCK_SIZE}, "
                        f"{MX_MAX_BLOCK_SIZE}]", block_size)
    return block_size


def mx_scale_shape(shape, axis: int = -1, block_size: int = MX_BLOCK_SIZE) -> tuple[int, ...]:
    """Shape of the uint8 scale pairs of an MX-quantized array of ``shape``.

    Source: ops-nn ``quant/dynamic_mx_quant/README.md`` (mxscale shape constraints).

    Args:
        shape: the data's shape (at least 1-D).
        axis: the blocked axis, negative counts from the end.
        block_size: elements per block, a multiple of 32 in [32, 1024].

    Returns:
        ``shape`` with ``shape[axis]`` replaced by ``ceil(ceil(shape[axis] / block_size) / 2)``,
        plus a trailing 2.

    Raises:
        ShapeError: ``axis`` out of range. ModeError: bad ``block_size``.
    """
    shape = tuple(int(d) for d in shape)
    ax = _norm_axis(axis, len(shape))
    bs = _check_block_size(block_size)
    blocks = -(-shape[ax] // bs)
    return shape[:ax] + (-(-blocks // 2),) + shape[ax + 1:] + (2,)


def e8m0_to_f32(scales) -> np.ndarray:
    """E8M0 scale bytes to their fp32 values ``2**(byte - 127)`` (``0xFF`` NaN; byte 0 is
    ``2**-127``, an fp32 subnormal, exact).

    Args:
        scales: uint8 bytes, any shape.

    Returns:
        New fp32 array of that shape.

    Raises:
        DTypeError: ``scales`` is not uint8.
    """
    scales = np.asarray(scales)
    if scales.dtype != np.uint8:
        raise arg_error(DTypeError, "scales", "E8M0 bytes as uint8", scales.dtype)
    with np.errstate(over="ignore"):  # 0xFF (2**128) is replaced by NaN below
        out = np.ldexp(1.0, scales.astype(np.int64) - E8M0_BIAS).astype(np.float32)
    out[scales == E8M0_NAN] = np.nan
    return out


def mx_scale_bytes(amax, dtype, scale_alg: int = 0) -> np.ndarray:
    """E8M0 scale byte of blocks with the given ``amax`` (see the module docstring).

    Source: ops-nn ``aclnnDynamicMxQuant_en.md`` (scenario 1: ``scaleAlg`` 0; scenario 2:
    ``scaleAlg`` 1); OCP MX v1.0 §6.3.

    Args:
        amax: the blocks' ``max |V|``, fp32 (>= 0 or NaN), any shape.
        dtype: the element type, ``"float8_e4m3fn"`` / ``"float8_e5m2"`` (or dtype / code).
        scale_alg: 0 or 1.

    Returns:
        New uint8 array of ``amax``'s shape.

    Raises:
        ModeError: unknown ``dtype`` or ``scale_alg``.
    """
    name = fp8_name(dtype)
    scale_alg = _check_int("scale_alg", scale_alg)
    if scale_alg not in SCALE_ALGS:
        raise arg_error(ModeError, "scale_alg", f"one of {SCALE_ALGS} for FP8 elements", scale_alg)
    amax = np.abs(np.asarray(amax, dtype=np.float32))
    if scale_alg == 0:
        exp = ((amax.view(np.uint32) >> np.uint32(23)) & _F32_EXP_MASK).astype(np.int64)
        byte = np.maximum(exp - FP8_EMAX[name], 0)
    else:
        with np.errstate(over="ignore", invalid="ignore"):
            s = amax * (np.float32(1.0) / np.float32(FP8_MAX[name]))
        bits = s.view(np.uint32)
        exp = ((bits >> np.uint32(23)) & _F32_EXP_MASK).astype(np.int64)
        mant = bits & _F32_MANT_MASK
        up_normal = (exp > 0) & (exp < 254) & (mant > 0)
        up_subnormal = (exp == 0) & (mant > _F32_HALF_MANT)
        byte = exp + (up_normal | up_subnormal)
    nonfinite = ((amax.view(np.uint32) >> np.uint32(23)) & _F32_EXP_MASK) == _F32_EXP_MASK
    return np.where(nonfinite, E8M0_NAN, byte).astype(np.uint8)


def mx_quantize(x, dtype="float8_e4m3fn", *, axis: int = -1, block_size: int = MX_BLOCK_SIZE,
                scale_alg: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """MX-quantize ``x`` along ``axis``: FP8 elements and E8M0 scale pairs.

    Source: ops-nn ``quant/dynamic_mx_quant/docs/aclnnDynamicMxQuant_en.md`` (formulas, layout)
    and README (scale shape); OCP MX v1.0. The emulated rounding is ``rint`` (the only fp8 round
    mode the doc allows).

    Args:
        x: bf16, fp16 or fp32 values, at least 1-D (the op takes bf16 / fp16; fp32 is read as is).
        dtype: ``"float8_e4m3fn"`` / ``"float8_e5m2"`` (or its ml_dtypes dtype, or torch_npu code
            292 / 291).
        axis: the blocked axis.
        block_size: elements per block, a multiple of 32 in [32, 1024].
        scale_alg: 0 (OCP) or 1 (the amax / max scale rounded up), module docstring.

    Returns:
        ``(y, scales)``: ``y`` the ml_dtypes FP8 elements, ``x``'s shape; ``scales`` uint8 of
        :func:`mx_scale_shape` (view them as ``ml_dtypes.float8_e8m0fnu`` / torch
        ``float8_e8m0fnu`` if wanted), an odd block count padded with byte 0.

    Raises:
        DTypeError: ``x`` is not a real array. ShapeError: 0-D ``x`` or ``axis`` out of range.
        ModeError: bad ``dtype``, ``block_size`` or ``scale_alg``.
    """
    name = fp8_name(dtype)
    x32 = real_to_f32(x, "x")
    if x32.ndim == 0:
        raise arg_error(ShapeError, "x", "an array of at least 1 dimension", describe(x32))
    ax = _norm_axis(axis, x32.ndim)
    bs = _check_block_size(block_size)
    scale_alg = _check_int("scale_alg", scale_alg)
    if scale_alg not in SCALE_ALGS:
        raise arg_error(ModeError, "scale_alg", f"one of {SCALE_ALGS} for FP8 elements", scale_alg)

    moved = np.moveaxis(x32, ax, -1)
    length = moved.shape[-1]
    blocks = -(-length // bs)
    padded = np.zeros(moved.shape[:-1] + (blocks * bs,), np.float32)
    padded[..., :length] = moved
    grouped = padded.reshape(moved.shape[:-1] + (blocks, bs))
    amax = np.max(np.abs(grouped), axis=-1) if blocks else np.zeros(grouped.shape[:-1], np.float32)
    byte = mx_scale_bytes(amax, name, scale_alg)

    recip = np.ldexp(1.0, E8M0_BIAS - byte.astype(np.int64)).astype(np.float32)  # exact: 2**-127 .. 2**127
    with np.errstate(over="ignore", invalid="ignore"):
        scaled = grouped * recip[..., None]  # fp32 multiply, as the kernel
    scaled[byte == E8M0_NAN] = np.nan
    y = to_fp8(scaled.reshape(padded.shape)[..., :length], name, saturate=True)
    y = np.ascontiguousarray(np.moveaxis(y, -1, ax))

    pairs = -(-blocks // 2)
    stored = np.zeros(byte.shape[:-1] + (pairs * 2,), np.uint8)
    stored[..., :blocks] = byte
    stored = stored.reshape(byte.shape[:-1] + (pairs, 2))
    return y, np.ascontiguousarray(np.moveaxis(stored, -2, ax))


def mx_dequantize(y, scales, *, axis: int = -1, block_size: int = MX_BLOCK_SIZE) -> np.ndarray:
    """Dequantize MX data: ``element * 2**(byte - 127)`` per block (``0xFF`` gives NaN).

    Source: OCP MX v1.0 §6 (the value of an MX element is ``X * P_i``).

    Args:
        y: ml_dtypes ``float8_e4m3fn`` / ``float8_e5m2`` elements, at least 1-D.
        scales: uint8 scale pairs of shape ``mx_scale_shape(y.shape, axis, block_size)``.
        axis: the blocked axis.
        block_size: elements per block, a multiple of 32 in [32, 1024].

    Returns:
        New fp32 array of ``y``'s shape (the exact product rounded once to fp32: it overflows to
        +-Inf only beyond the fp32 range).

    Raises:
        DTypeError: ``y`` not FP8 or ``scales`` not uint8. ShapeError: 0-D ``y``, ``axis`` out of
        range or ``scales`` of another shape. ModeError: bad ``block_size``.
    """
    y = np.asarray(y)
    if y.dtype not in FP8_DTYPES.values():
        raise arg_error(DTypeError, "y", "an ml_dtypes float8_e4m3fn / float8_e5m2 array", y.dtype)
    if y.ndim == 0:
        raise arg_error(ShapeError, "y", "an array of at least 1 dimension", describe(y))
    scales = np.asarray(scales)
    if scales.dtype != np.uint8:
        raise arg_error(DTypeError, "scales", "E8M0 bytes as uint8", scales.dtype)
    want = mx_scale_shape(y.shape, axis, block_size)
    if scales.shape != want:
        raise arg_error(ShapeError, "scales", f"shape {list(want)} (the scale pairs of y {list(y.shape)}, axis "
                        f"{axis}, block_size {block_size})", str(list(scales.shape)))
    ax = _norm_axis(axis, y.ndim)
    bs = int(block_size)
    flat = np.moveaxis(scales, ax, -2)
    flat = flat.reshape(flat.shape[:-2] + (-1,))  # block j at j
    idx = np.arange(y.shape[ax]) // bs
    per_elem = np.moveaxis(flat[..., idx], -1, ax)
    factor = np.ldexp(1.0, per_elem.astype(np.int64) - E8M0_BIAS)
    factor[per_elem == E8M0_NAN] = np.nan
    with np.errstate(over="ignore"):
        return (y.astype(np.float64) * factor).astype(np.float32)
