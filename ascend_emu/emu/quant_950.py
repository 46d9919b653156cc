"""The cast / Ascend 950 quant family on the CPU: ``npu_dtype_cast`` (the general cast, the 950's
hifloat8 / FP8 casts, int4 packing) and ``npu_dynamic_mx_quant``.

Every number comes from the one definition of each format in :mod:`ascend_emu.quant`
(:func:`~ascend_emu.quant.to_hif8` / :func:`~ascend_emu.quant.hif8_to_f32`,
:func:`~ascend_emu.quant.to_fp8` / :func:`~ascend_emu.quant.fp8_to_f32`,
:func:`~ascend_emu.quant.mx_quantize`); this module only routes the validated arguments to them.
The casts back to fp16 / bf16 / fp32 widen through fp32 and round once, which is exact: every
HiF8 and FP8 value is an fp16 and a bf16 value.
"""

from __future__ import annotations

import numpy as np

from ..ops._check import DTYPES
from ..ops.quant_950 import CAST_950_TYPES, Quant950Args, Quant950Outputs
from ..quant import FP8_DTYPES, fp8_to_f32, hif8_to_f32, mx_quantize, to_fp8, to_hif8


def _decode(x: np.ndarray, src: str) -> np.ndarray:
    """fp32 values of a hifloat8 / FP8 input (uint8 bytes viewed as the FP8 type)."""
    if src == "hifloat8":
        return hif8_to_f32(x)
    if x.dtype == np.uint8:
        x = x.view(FP8_DTYPES[src])
    return fp8_to_f32(x)


def _numpy_dtype(name: str) -> np.dtype:
    return DTYPES[name] if name in DTYPES else np.dtype(name)


def _general_cast(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    """A general cast as torch's CPU ``.to()`` computes it (contract:
    :func:`ascend_emu.ops.quant_950.npu_dtype_cast`): floats to integers truncate (NaN -> 0),
    fp16 / bf16 from a float64 or integer source go through fp32, to bool ``!= 0``."""
    with np.errstate(over="ignore", invalid="ignore"):  # overflow to +-Inf is the IEEE result
        return _general_cast_values(x, src, dst)


def _general_cast_values(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    target = _numpy_dtype(dst)
    if dst == "bool":
        return np.ascontiguousarray(x != 0)
    if src.startswith(("float", "bfloat")) and target.kind in "iu":
        v = np.trunc(x.astype(np.float64))
        v[np.isnan(v)] = 0
        return v.astype(target)
    if dst in ("float16", "bfloat16") and src not in ("float16", "bfloat16", "float32"):
        return x.astype(np.float32).astype(target)
    return np.array(x, dtype=target, copy=True)


def _pack_int4(x: np.ndarray) -> np.ndarray:
    """int32 values in [-8, 7] ``[..., 2k]`` -> uint8 ``[..., k]``, element 2j in the low nibble."""
    nib = (x.astype(np.int64) & 0xF).astype(np.uint8)
    return np.ascontiguousarray(nib[..., 0::2] | (nib[..., 1::2] << 4))


def quant_950(args: Quant950Args) -> Quant950Outputs:
    """The family's backend method (:class:`ascend_emu.ops._backend.Backend`)."""
    if args.op == "npu_dynamic_mx_quant":
        y, scale = mx_quantize(args.x, args.dst, axis=args.axis, block_size=args.block_size,
                               scale_alg=args.scale_alg)
        return Quant950Outputs(y, scale)
    if args.dst == "int4":
        return Quant950Outputs(_pack_int4(args.x))
    if args.src not in CAST_950_TYPES and args.dst not in CAST_950_TYPES:
        return Quant950Outputs(_general_cast(args.x, args.src, args.dst))
    if args.dst == "hifloat8":
        return Quant950Outputs(to_hif8(args.x))
    if args.dst in FP8_DTYPES:
        return Quant950Outputs(to_fp8(args.x, args.dst))
    with np.errstate(over="ignore", invalid="ignore"):
        return Quant950Outputs(_decode(args.x, args.src).astype(DTYPES[args.dst]))
