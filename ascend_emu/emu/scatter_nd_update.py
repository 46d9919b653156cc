"""DeepSeek-V4's row scatters on the CPU: ``npu_scatter_nd_update_v2`` / ``_sk`` and
``scatter_nd_update_asc`` (:mod:`ascend_emu.ops.scatter_nd_update`).

Pure data movement in NumPy, byte-exact: one fancy-indexed assignment of whole rows (a
same-dtype copy, bytes as they are) into ``var`` as passed, so a strided ``var`` is written in
place. Of duplicate rows only the last is written (the contract warned), so the result does not
depend on NumPy's assignment order. Indices are validated by the contract.
"""

from __future__ import annotations

import numpy as np

from ..ops.scatter_nd_update import ScatterNdArgs, ScatterNdOutputs
from .paged_cache import _last_writes


def scatter_nd_update(args: ScatterNdArgs) -> ScatterNdOutputs:
    """The family's backend method (:class:`ascend_emu.ops._backend.Backend`).

    Args:
        args: :class:`ascend_emu.ops.scatter_nd_update.ScatterNdArgs`.

    Returns:
        :class:`~ascend_emu.ops.scatter_nd_update.ScatterNdOutputs`: var, written in place.
    """
    var, k = args.var, len(args.index_dims)
    rows = _last_writes(args.slots)  # [t] index rows that write
    if rows.size:
        src = np.asarray(args.update).reshape(args.update.shape[0], *var.shape[k:])[rows]  # [t, ...row]
        dst = args.slots[rows]  # [t] flat positions
        where = (dst,) if k == 1 else np.divmod(dst, args.index_dims[1])
        var[tuple(where)] = src
    return ScatterNdOutputs(var)
