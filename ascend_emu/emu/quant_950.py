"""The Ascend 950 cast / quant family on the CPU: ``npu_dtype_cast`` and ``npu_dynamic_mx_quant``.

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
from ..ops.quant_950 import Quant950Args, Quant950Outputs
from ..quant import FP8_DTYPES, fp8_to_f32, hif8_to_f32, mx_quantize, to_fp8, to_hif8


def _decode(x: np.ndarray, src: str) -> np.ndarray:
    """fp32 values of a hifloat8 / FP8 input (uint8 bytes viewed as the FP8 type)."""
    if src == "hifloat8":
        return hif8_to_f32(x)
    if x.dtype == np.uint8:
        x = x.view(FP8_DTYPES[src])
    return fp8_to_f32(x)


def quant_950(args: Quant950Args) -> Quant950Outputs:
    """The family's backend method (:class:`ascend_emu.ops._backend.Backend`)."""
    if args.op == "npu_dynamic_mx_quant":
        y, scale = mx_quantize(args.x, args.dst, axis=args.axis, block_size=args.block_size,
                               scale_alg=args.scale_alg)
        return Quant950Outputs(y, scale)
    if args.dst == "hifloat8":
        return Quant950Outputs(to_hif8(args.x))
    if args.dst in FP8_DTYPES:
        return Quant950Outputs(to_fp8(args.x, args.dst))
    with np.errstate(over="ignore", invalid="ignore"):
        return Quant950Outputs(_decode(args.x, args.src).astype(DTYPES[args.dst]))
