"""Reference row scatters (npu_scatter_nd_update_v2 / _sk, custom.scatter_nd_update_asc): plain
loops over index rows and bytes, written from vllm-ascend's golden ``scatter_nd_update_golden``
(``tests/e2e/.../test_scatter_nd_update_sk.py``: ``out[indices[i, 0]] = update[i]`` row by
row), the recipes' doc ``custom-npu_scatter_nd_update_asc.md`` (negative indices skipped) and the
index policy of docs/v4.md (rows starting with -1 skipped, later rows overwrite earlier ones),
independently of ``ascend_emu``; imports only numpy.

Works on bytes: ``var`` is copied to a C-contiguous byte table ``[rows, row_bytes]`` and each
kept update row's bytes are copied one by one into it.
"""

from __future__ import annotations

import numpy as np


def _row_of(index_row, dims):
    """Flat row number of one index row, or None when the row is skipped (first value -1)."""
    values = [int(v) for v in index_row]
    if values[0] == -1:
        return None
    flat = 0
    for v, d in zip(values, dims, strict=True):
        assert 0 <= v < d, (values, dims)  # the reference takes valid rows only
        flat = flat * d + v
    return flat


def scatter_nd_update(var, indices, update):
    """New ``var`` (a C-contiguous copy of var's shape and dtype) after the scatter."""
    var = np.ascontiguousarray(var)
    k = indices.shape[1]
    dims = var.shape[:k]
    rows = 1
    for d in dims:
        rows *= d
    table = var.copy().reshape(rows, -1).view(np.uint8)  # [rows, row_bytes]
    src = np.ascontiguousarray(update).reshape(indices.shape[0], -1).view(np.uint8)  # [n, row_bytes]
    for i in range(indices.shape[0]):
        r = _row_of(indices[i], dims)
        if r is None:
            continue
        for b in range(table.shape[1]):
            table[r, b] = src[i, b]
    return table.view(var.dtype).reshape(var.shape)
