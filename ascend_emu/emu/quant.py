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


def _smoothed(args: DynamicQuantArgs) -> np.ndarray:
    """fp32 ``x * smooth`` of x's shape (smooth along the last axis, by group, or per channel
    along axis -2)."""
    x = args.x
    h = x.shape[-1]
    v = to_f32(x)
    if args.smooth_scales is None:
        return v
    smooth = to_f32(args.smooth_scales)
    if args.mode == "perchannel":
        return v * smooth[:, None]
    v = v.reshape(-1, h)
    if args.group_index is None:
        v = v * smooth
    else:  # row r takes the first group whose end exceeds r
        group = np.searchsorted(args.group_index.astype(np.int64), np.arange(v.shape[0]), side="right")
        v = v * smooth[group]
    return v.reshape(x.shape)


def _asymmetric(v: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row (last axis) of fp32 ``v``: ``scale = (max - min) / (qmax - qmin)``, ``offset =
    qmax - max / scale``, ``y = clip(rint(v / scale + offset), qmin, qmax)``, each step one fp32
    rounding; a constant row gives scale 0, offset 0, y 0 (:func:`ascend_emu.ops.dynamic_quant.
    npu_dynamic_quant_asymmetric`)."""
    qmin = -qmax - 1
    hi = v.max(axis=-1, keepdims=True)
    lo = v.min(axis=-1, keepdims=True)
    scale = ((hi - lo) / np.float32(qmax - qmin)).astype(np.float32)
    flat = scale == 0
    safe = np.where(flat, np.float32(1), scale)
    offset = (np.float32(qmax) - hi / safe).astype(np.float32)
    y = np.rint(v / safe + offset)
    y = np.where(flat, np.float32(0), np.clip(y, qmin, qmax)).astype(np.int8)
    offset = np.where(flat, np.float32(0), offset).astype(np.float32)
    return y, scale[..., 0], offset[..., 0]


def _per_channel_symmetric(v: np.ndarray, qmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Per row (last axis) of fp32 ``v``: ``scale = max|v| * fp32(1 / qmax)``, ``y = rint(v /
    scale)`` (a zero row: scale 0, y 0), as op-plugin's per-channel golden computes it."""
    amax = np.abs(v).max(axis=-1, keepdims=True)
    scale = (amax * np.float32(1.0 / qmax)).astype(np.float32)
    zero = scale == 0
    y = np.rint(v / np.where(zero, np.float32(1), scale))
    y = np.where(zero, np.float32(0), np.clip(y, -qmax, qmax)).astype(np.int8)
    return y, scale[..., 0]


def quant(args: DynamicQuantArgs) -> DynamicQuantOutputs:
    """The family's backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.dynamic_quant.DynamicQuantArgs`.

    Returns:
        :class:`~ascend_emu.ops.dynamic_quant.DynamicQuantOutputs`: y int8 ``x.shape`` (int4:
        int32 ``[..., H / 8]``), scale (and the asymmetric offset) fp32 ``x.shape[:-1]``
        (per channel ``x.shape[:-2] + (H,)``).
    """
    v = _smoothed(args)
    per_channel = args.mode == "perchannel"
    if per_channel:  # reduce over axis -2: quantize the transposed columns as rows
        v = np.swapaxes(v, -1, -2)
    qmax = INT4_MAX if args.dst == "int4" else INT8_MAX
    offset = None
    if args.asymmetric:
        q, scale, offset = _asymmetric(v, qmax)
    elif per_channel:  # the golden's form: scale = amax * fp32(1 / qmax), y = rint(v / scale)
        q, scale = _per_channel_symmetric(v, qmax)
    else:
        form = "amax_times_inverse" if args.group_index is None else "inverse_of_multiplier"
        q, scale = quantize_per_token_multiplier(v.reshape(-1, v.shape[-1]), qmax, scale_form=form)
        q, scale = q.reshape(v.shape), scale.reshape(v.shape[:-1])
    if per_channel:
        q = np.swapaxes(q, -1, -2)
    q = np.ascontiguousarray(q)
    y = pack_int4_to_int32(q) if args.dst == "int4" else q
    return DynamicQuantOutputs(y, np.ascontiguousarray(scale), None if offset is None else np.ascontiguousarray(offset))
