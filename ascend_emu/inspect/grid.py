"""The fractal grid of an NZ cache block or an NZ weight: which (row, C0 chunk) cell holds which
logical elements.

Sources: docs/sources.md#paged_nz. Paged NZ block: ``[D/C0, BlockSize, C0]``, cell ``(j, r)`` = the
32 bytes holding dims ``[j*C0, (j+1)*C0)`` of row ``r``. Matrix FRACTAL_NZ (``npu_format_cast(w,
29)``): storage ``[..., N/C0, M_pad, C0]`` (``M_pad`` = M rounded up to 16), cell ``(j, m)`` =
columns ``[j*C0, (j+1)*C0)`` of row ``m``; rows ``m >= M`` and columns ``n >= N`` are zero padding.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import IndexRangeError, ShapeError, arg_error
from ..layouts import NZ_BLOCK_ROWS, c0_for, nz_shape
from .cache import Cache, CacheSpec


@dataclass(frozen=True)
class Grid:
    """Result of :func:`grid` / :func:`weight_grid`. Arrays are ``[chunks, rows]``.

    Attributes:
        kind: ``"cache block"`` or ``"weight"``.
        title: what the grid shows.
        c0: elements per cell (C0).
        itemsize: bytes per element.
        offset: byte offset of each cell from the start of the cache / weight storage.
        logical_row: the slot (cache) or ND row m (weight) the cell holds; -1 for padding.
        first_col: first logical dim / column of the cell (``chunk * C0``).
        valid_cols: columns of the cell that hold data (C0, fewer at a ragged N edge, 0 padding).
        fractal_rows: rows per fractal (16).
    """

    kind: str
    title: str
    c0: int
    itemsize: int
    offset: np.ndarray
    logical_row: np.ndarray
    first_col: np.ndarray
    valid_cols: np.ndarray
    fractal_rows: int = NZ_BLOCK_ROWS

    @property
    def shape(self) -> tuple[int, int]:
        """(chunks, rows)."""
        return tuple(self.offset.shape)

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        return {"kind": self.kind, "title": self.title, "c0": self.c0, "itemsize": self.itemsize,
                "chunks": self.shape[0], "rows": self.shape[1], "fractal_rows": self.fractal_rows,
                "offset": self.offset.tolist(), "logical_row": self.logical_row.tolist(),
                "first_col": self.first_col.tolist(), "valid_cols": self.valid_cols.tolist()}


def grid(cache: Cache | CacheSpec, block: int = 0) -> Grid:
    """Fractal grid of one block of an NZ paged cache.

    Args:
        cache: a PA_NZ / PA_BLK_NZ cache or its spec.
        block: block id in ``[0, BlockNum)``.

    Returns:
        A :class:`Grid` of ``[D/C0, BlockSize]`` cells; ``logical_row`` holds slots.

    Raises:
        ShapeError: not an NZ-mode cache.
        IndexRangeError: block out of range.
    """
    spec = cache.spec if isinstance(cache, Cache) else cache
    lay = spec.layout
    if not lay.nz:
        raise arg_error(ShapeError, "cache", "an NZ-mode cache (PA_NZ / PA_BLK_NZ) for a fractal grid",
                        f"cache_mode {lay.mode}")
    block = int(block)
    if not 0 <= block < lay.num_blocks:
        raise arg_error(IndexRangeError, "block", f"a block in [0, {lay.num_blocks})", block)
    chunks, rows = lay.dim // lay.c0, lay.block_size
    j = np.arange(chunks)[:, None]  # [chunks, 1]
    r = np.arange(rows)[None, :]  # [1, rows]
    offset = (block * rows * lay.dim + j * rows * lay.c0 + r * lay.c0) * lay.itemsize  # [chunks, rows]
    slot = np.broadcast_to(block * rows + r, (chunks, rows)).copy()
    first = np.broadcast_to(j * lay.c0, (chunks, rows)).copy()
    return Grid(kind="cache block", title=f"{lay.mode} block {block}: [D/C0={chunks}, BlockSize={rows}, "
                f"C0={lay.c0}] {spec.dtype.name}", c0=lay.c0, itemsize=lay.itemsize, offset=offset,
                logical_row=slot, first_col=first, valid_cols=np.full((chunks, rows), lay.c0))


def weight_grid(shape: Sequence[int], dtype, batch: int = 0) -> Grid:
    """Fractal grid of a FRACTAL_NZ weight (``npu_format_cast(w, 29)``) of ND ``shape``.

    Args:
        shape: logical ND shape ``[..., M, N]`` (2-D or more).
        dtype: bf16 / fp16 / fp32 / int32 / int8 (C0 = :func:`ascend_emu.layouts.c0_for`).
        batch: flat index of the leading batch matrix shown (0 for a 2-D weight).

    Returns:
        A :class:`Grid` of ``[ceil(N/C0), M_pad]`` cells; ``logical_row`` holds m (-1 padding).

    Raises:
        DTypeError: a dtype without FRACTAL_NZ.
        ShapeError: fewer than 2 dims.
        IndexRangeError: batch out of range.
    """
    shape = tuple(int(s) for s in shape)
    if len(shape) < 2:
        raise arg_error(ShapeError, "shape", "an ND shape [..., M, N] with at least 2 dims", shape)
    st = nz_shape(shape, dtype)
    c0 = c0_for(dtype)
    itemsize = np.dtype(dtype).itemsize
    nbatch = int(np.prod(shape[:-2], dtype=np.int64))
    if not 0 <= int(batch) < nbatch:
        raise arg_error(IndexRangeError, "batch", f"a batch matrix in [0, {nbatch})", batch)
    m, n = shape[-2:]
    chunks, rows = st[-4], st[-3] * st[-2]
    j = np.arange(chunks)[:, None]  # [chunks, 1]
    r = np.arange(rows)[None, :]  # [1, rows]
    offset = ((int(batch) * chunks * rows + j * rows + r) * c0 * itemsize).astype(np.int64)  # [chunks, rows]
    valid = np.where(r < m, np.minimum(c0, n - j * c0), 0)  # [chunks, rows]
    row = np.where(valid > 0, r, -1)
    return Grid(kind="weight", title=f"FRACTAL_NZ weight {list(shape)} {np.dtype(dtype).name}: storage "
                f"{list(st)}, C0={c0}", c0=c0, itemsize=itemsize, offset=offset, logical_row=row,
                first_col=np.broadcast_to(j * c0, (chunks, rows)).copy(), valid_cols=valid)
