"""DeepSeek-V4's row scatters on the CPU: ``npu_scatter_nd_update_v2`` / ``_sk`` and
``scatter_nd_update_asc`` (:mod:`ascend_emu.ops.scatter_nd_update`).

Pure data movement, byte-exact: one compiled pass (:func:`copy_rows`) copies whole rows into
``var`` as passed (a strided ``var`` is written in place: its elements are viewed, never copied),
both sides viewed as unsigned integers of the element's size, so the bytes are copied as they
are. The rows are copied in index order, so of duplicate rows the last one stays (the contract
warned). Indices are validated by the contract.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ..ops.scatter_nd_update import ScatterNdArgs, ScatterNdOutputs


def _bits(a: np.ndarray) -> np.ndarray:
    """``a`` viewed as unsigned integers of its itemsize (any strides: same-size view)."""
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


@njit(cache=True)
def copy_rows(dst, src, slots):  # pragma: no cover - compiled
    """``dst[slots[i] // B, slots[i] % B] = src[i]`` for each ``i`` in order (``B = dst.shape[1]``),
    rows with slot -1 skipped: of duplicate slots the last row is what stays. ``dst``: var's
    elements as unsigned integers ``[d0, B, W]`` (any leading strides, rows contiguous),
    ``src``: ``[n, W]``; the slots are validated by the contract."""
    b = dst.shape[1]
    for i in range(slots.shape[0]):
        s = slots[i]
        if s >= 0:
            blk = s // b
            row = dst[blk, s - blk * b]
            r = src[i]
            for c in range(r.shape[0]):
                row[c] = r[c]


def scatter_nd_update(args: ScatterNdArgs) -> ScatterNdOutputs:
    """The family's backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.scatter_nd_update.ScatterNdArgs`.

    Returns:
        :class:`~ascend_emu.ops.scatter_nd_update.ScatterNdOutputs`: var, written in place.
    """
    var, k, slots = args.var, len(args.index_dims), args.slots
    width = math.prod(var.shape[k:])
    out = _bits(var).view()
    out.shape = (*args.index_dims, width) if k == 2 else (args.index_dims[0], 1, width)  # a view or an error
    copy_rows(out, _bits(np.asarray(args.update)).reshape(args.update.shape[0], width), slots)
    return ScatterNdOutputs(var)
