"""DeepSeek-V4's row scatters on the CPU: ``npu_scatter_nd_update_v2`` / ``_sk`` and
``scatter_nd_update_asc`` (:mod:`ascend_emu.ops.scatter_nd_update`).

Pure data movement in NumPy, byte-exact: one fancy-indexed assignment of whole rows into ``var``
as passed (a strided ``var`` is written in place), both sides viewed as unsigned integers of the
element's size, so the bytes are copied as they are (and faster than through ml_dtypes' bf16).
Of duplicate rows only the last is written (the contract warned), so the result does not depend
on NumPy's assignment order. Indices are validated by the contract.
"""

from __future__ import annotations

import numpy as np

from ..ops.scatter_nd_update import ScatterNdArgs, ScatterNdOutputs
from .paged_cache import _last_writes


def _bits(a: np.ndarray) -> np.ndarray:
    """``a`` viewed as unsigned integers of its itemsize (any strides: same-size view)."""
    return a.view(np.dtype(f"u{a.dtype.itemsize}"))


#: Runs of consecutive written rows copied one slice at a time (no gathered copy of update);
#: more runs than this (padding rows scattered through the call) take one gather instead.
MAX_RUNS = 64


def scatter_nd_update(args: ScatterNdArgs) -> ScatterNdOutputs:
    """The family's backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.scatter_nd_update.ScatterNdArgs`.

    Returns:
        :class:`~ascend_emu.ops.scatter_nd_update.ScatterNdOutputs`: var, written in place.
    """
    var, k, slots = args.var, len(args.index_dims), args.slots
    src = _bits(np.asarray(args.update)).reshape(args.update.shape[0], *var.shape[k:])  # [n, ...row]
    if args.duplicates:
        rows = _last_writes(slots)  # [t] the rows that write: live, the last of each slot
    elif (slots >= 0).all():
        rows = None  # every row writes, each its own slot
    else:
        rows = np.flatnonzero(slots >= 0)  # [t]
    out = _bits(var)
    d0, d1 = args.index_dims[0], args.index_dims[-1]
    if k == 2 and out.flags.c_contiguous:  # the two dims merge: one flat index (a view, no copy)
        out = out.reshape(d0 * d1, *out.shape[2:])
        k = 1
    elif k == 2 and (d0 == 1 or out.strides[0] == d1 * out.strides[1]):
        out = np.lib.stride_tricks.as_strided(out, (d0 * d1, *out.shape[2:]), out.strides[1:])
        k = 1

    def put(dst: np.ndarray, rows_src: np.ndarray) -> None:
        out[(dst,) if k == 1 else np.divmod(dst, d1)] = rows_src

    if rows is None:
        put(slots, src)
    elif rows.size:
        breaks = np.flatnonzero(np.diff(rows) != 1) + 1  # starts of runs of consecutive rows
        if breaks.size < MAX_RUNS:  # slices of update: no gathered copy
            for a, b in zip(np.concatenate(([0], breaks)), np.concatenate((breaks, [rows.size])), strict=True):
                lo, hi = int(rows[a]), int(rows[b - 1]) + 1
                put(slots[lo:hi], src[lo:hi])
        else:
            put(slots[rows], src[rows])
    return ScatterNdOutputs(var)
