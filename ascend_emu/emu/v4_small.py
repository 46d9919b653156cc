"""DeepSeek-V4's small ops on the CPU (NumPy): the arithmetic behind :mod:`ascend_emu.ops.v4_small`.

- ``rms_norm_dynamic_quant``: :func:`ascend_emu.emu.kernels.rms_norm` in the
  :data:`~ascend_emu.emu.kernels.MLA_PROLOG_RMS` order, ``+ beta``, ``* smooth`` (fp32), then
  :func:`ascend_emu.quant.quantize_per_token_multiplier` (scale ``amax * fp32(1/127)``).
- ``inplace_partial_rotary_mul``: ``x * r1 + rotated(x) * r2`` on the slice in fp32 (two
  products, one add: the rope family's ``_rotated``), one RNE rounding.
- ``compressor_metadata``: index arithmetic in int64.

Backends trust the contract: nothing is validated again.
"""

from __future__ import annotations

import numpy as np

from ..ops.v4_small import (SLOT_FORMAT_FLAT, CompressorMetadataArgs, CompressorMetadataOutputs, PartialRotaryArgs,
                            PartialRotaryOutputs, RmsNormDynamicQuantArgs, RmsNormDynamicQuantOutputs)
from ..quant import INT8_MAX, quantize_per_token_multiplier
from ..layouts import slot_of_block_row
from .kernels import MLA_PROLOG_RMS
from .kernels import rms_norm as _rms_norm
from .rope import _rotated as rotated


def _f32(a) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def rms_norm_dynamic_quant(args: RmsNormDynamicQuantArgs) -> RmsNormDynamicQuantOutputs:
    """The backend method (:class:`ascend_emu.ops._backend.Backend`)."""
    x = args.x
    h = x.shape[-1]
    rows = _f32(x).reshape(-1, h)
    y = _rms_norm(rows, _f32(args.gamma), args.epsilon, MLA_PROLOG_RMS)
    if args.beta is not None:
        y = y + _f32(args.beta)
    if args.smooth_scale is not None:
        y = y * _f32(args.smooth_scale)
    q, scale = quantize_per_token_multiplier(y, INT8_MAX, scale_form="amax_times_inverse")
    return RmsNormDynamicQuantOutputs(q.reshape(x.shape), scale.astype(np.float32).reshape(x.shape[:-1]))


def inplace_partial_rotary_mul(args: PartialRotaryArgs) -> PartialRotaryOutputs:
    """The backend method: writes ``args.x[..., lo:hi]`` in place."""
    x = args.x
    part = _f32(x[..., args.lo:args.hi])
    sin = -_f32(args.r2) if args.negate_sin else _f32(args.r2)
    y = part * _f32(args.r1) + rotated(part, "interleave") * sin
    x[..., args.lo:args.hi] = y.astype(x.dtype)
    return PartialRotaryOutputs(x)


def compressor_metadata(args: CompressorMetadataArgs) -> CompressorMetadataOutputs:
    """The backend method: fresh outputs, or the ``_out`` arrays written."""
    n, bs, ratio = args.rows, args.block_size, args.ratio
    lens = np.diff(args.cu_seqlens)
    start = args.start_pos
    counts = np.where((start >= 0) & (lens > 0), (start + lens) // ratio - start // ratio, 0)
    prefix = np.concatenate(([0], np.cumsum(counts)))
    row = np.arange(n, dtype=np.int64)
    valid = row < prefix[-1]
    req = np.searchsorted(prefix[1:], row, side="right")
    req = np.where(valid, req, 0)
    safe_start = np.where(valid, start[req] if start.size else 0, 0)
    cpos = np.where(valid, safe_start // ratio + row - prefix[req], 0)
    col = cpos // bs
    rope_row = cpos * ratio
    width = args.block_table.shape[1]
    valid &= (col < width) & (rope_row < args.rope_cos.shape[0])
    block = np.full(n, -1, np.int64)
    if valid.any():
        block[valid] = args.block_table[req[valid], col[valid]]
    valid &= block >= 0
    d = args.rope_cos.shape[1]
    dtype = args.rope_cos.dtype
    cos = np.ones((n, d), dtype)
    sin = np.zeros((n, d), dtype)
    cos[valid] = args.rope_cos[rope_row[valid]]
    sin[valid] = args.rope_sin[rope_row[valid]]
    offset = cpos % bs
    if args.slot_format == SLOT_FORMAT_FLAT:
        slot = np.where(valid, slot_of_block_row(block, offset, bs), -1).astype(np.int32)
    else:
        slot = np.stack([np.where(valid, block, -1), np.where(valid, offset, bs - 1)], axis=1).astype(np.int32)
    cos, sin = cos.reshape(n, 1, 1, d), sin.reshape(n, 1, 1, d)
    if args.out is None:
        return CompressorMetadataOutputs(cos, sin, slot)
    cos_out, sin_out, slot_out = args.out
    cos_out[...] = cos
    sin_out[...] = sin
    slot_out[...] = slot
    return CompressorMetadataOutputs(cos_out, sin_out, slot_out)
