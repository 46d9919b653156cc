"""The ``quant`` family on the CPU: ``npu_dynamic_quant`` (contract: :mod:`ascend_emu.ops.dynamic_quant`).

fp32 widening of x and the smooth scales (exact), one fp32 multiply, then the per-token quant
fact :func:`ascend_emu.quant.quantize_per_token_multiplier` with the scale form of the kernel
the call takes (:data:`ascend_emu.quant.TOKEN_SCALE_FORMS`: ``group_index`` -> the MoE kernel's
``1 / m``, otherwise ``amax * fp32(1 / DTYPE_MAX)``); int4 packed by
:func:`ascend_emu.quant.pack_int4_to_int32`. NumPy: no rounding but the final ones.
"""

from __future__ import annotations

import numpy as np

from ..ops.dynamic_quant import DynamicQuantArgs, DynamicQuantOutputs
from ..quant import INT4_MAX, INT8_MAX, pack_int4_to_int32, quantize_per_token_multiplier, to_f32


def quant(args: DynamicQuantArgs) -> DynamicQuantOutputs:
    """The family's backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.dynamic_quant.DynamicQuantArgs`.

    Returns:
        :class:`~ascend_emu.ops.dynamic_quant.DynamicQuantOutputs`: y int8 ``x.shape`` (int4:
        int32 ``[..., H / 8]``), scale fp32 ``x.shape[:-1]``.
    """
    x = args.x
    h = x.shape[-1]
    v = to_f32(x).reshape(-1, h)
    if args.smooth_scales is not None:
        smooth = to_f32(args.smooth_scales)
        if args.group_index is None:
            v = v * smooth
        else:  # row r takes the first group whose end exceeds r
            group = np.searchsorted(args.group_index.astype(np.int64), np.arange(v.shape[0]), side="right")
            v = v * smooth[group]
    form = "amax_times_inverse" if args.group_index is None else "inverse_of_multiplier"
    q, scale = quantize_per_token_multiplier(v, INT4_MAX if args.dst == "int4" else INT8_MAX, scale_form=form)
    q = q.reshape(x.shape)
    y = pack_int4_to_int32(q) if args.dst == "int4" else q
    return DynamicQuantOutputs(y, scale.reshape(x.shape[:-1]))
