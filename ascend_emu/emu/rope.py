"""The rope family on the CPU: ``npu_interleave_rope`` and ``npu_rotary_mul``.

fp32 compute, one RNE rounding to the input dtype (``astype``: NumPy / ml_dtypes round to nearest
even), exact to what the goldens imply. ``npu_interleave_rope`` is the MLA RoPE itself: the one
definition, :func:`ascend_emu.emu.kernels.rope` with ``deinterleave=True``, over x's
``[B, N, S, 64]`` rows taken as ``[B*S, N, 64]`` tokens (cos / sin shared by the heads).
``npu_rotary_mul`` multiplies by per-element broadcast r1 / r2 over any even D (4-D or TND
self; with ``rotate``, the rotation is ``x @ rotate``), which the 64-lane kernel does not
cover: NumPy, with the same fp32 operation order (two products, then one add or
subtract, so ``x*r1 + (-b)*r2`` rounds as the kernel's ``a*cos - b*sin``).
"""

from __future__ import annotations

import numpy as np

from ..ops.rope import RopeArgs, RopeOutputs
from .kernels import rope as _rope_kernel


def _f32(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32)


def _rotated(x: np.ndarray, mode: str) -> np.ndarray:
    """The partner of each lane, sign included: rotate_half (``[-x2, x1]``) or pairwise
    (``[-x[1], x[0], -x[3], x[2], ...]``)."""
    out = np.empty_like(x)
    if mode == "half":
        h = x.shape[-1] // 2
        out[..., :h] = -x[..., h:]
        out[..., h:] = x[..., :h]
    else:
        out[..., 0::2] = -x[..., 1::2]
        out[..., 1::2] = x[..., 0::2]
    return out


def _rotate_by(x: np.ndarray, rotate: np.ndarray) -> np.ndarray:
    """``x @ rotate`` over the last axis in fp32, each lane's products added in row order; zero
    entries contribute nothing (a BLAS matmul would leave the order open and turn an Inf lane
    times 0 into NaN). Work: one pass per non-zero entry's row, over that row's lanes."""
    out = np.zeros(x.shape, np.float32)
    for i in range(rotate.shape[0]):
        cols = np.flatnonzero(rotate[i])
        if cols.size:
            out[..., cols] += x[..., i:i + 1] * rotate[i, cols]
    return out


def rope(args: RopeArgs) -> RopeOutputs:
    """The family's backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.rope.RopeArgs`.

    Returns:
        :class:`~ascend_emu.ops.rope.RopeOutputs`: y of x's shape and dtype.
    """
    x = _f32(args.x)
    if args.mode == "interleave_rope":
        b, n, s, d = x.shape
        rows = np.ascontiguousarray(x.transpose(0, 2, 1, 3)).reshape(b * s, n, d)
        cos = np.broadcast_to(_f32(args.cos)[:, 0], (b, s, d)).reshape(b * s, d)
        sin = np.broadcast_to(_f32(args.sin)[:, 0], (b, s, d)).reshape(b * s, d)
        y = _rope_kernel(rows, cos, sin, deinterleave=True).reshape(b, s, n, d).transpose(0, 2, 1, 3)
    else:
        if args.rotate is None:
            rotated = _rotated(x, args.mode)
        else:  # x @ rotate: D fp32 products per lane, summed in index order (exact for 0 / +-1 entries)
            rotated = _rotate_by(x, _f32(args.rotate))
        y = x * _f32(args.cos) + rotated * _f32(args.sin)
    return RopeOutputs(np.ascontiguousarray(y).astype(args.x.dtype))
