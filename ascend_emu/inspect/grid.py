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
        row0, chunk0: the first row and C0 chunk the arrays hold (a window of the grid).
        extent: ``(chunks, rows)`` of the whole grid (the arrays may hold a window of it).
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
    row0: int = 0
    chunk0: int = 0
    extent: tuple[int, int] | None = None

    @property
    def shape(self) -> tuple[int, int]:
        """(chunks, rows) of the arrays (the window)."""
        return tuple(self.offset.shape)

    @property
    def whole(self) -> bool:
        """The arrays hold the whole grid."""
        return self.extent is None or tuple(self.extent) == self.shape

    def to_dict(self) -> dict:
        """Plain data (JSON-ready)."""
        extent = self.shape if self.extent is None else self.extent
        return {"kind": self.kind, "title": self.title, "c0": self.c0, "itemsize": self.itemsize,
                "chunks": self.shape[0], "rows": self.shape[1], "fractal_rows": self.fractal_rows,
                "window": {"rows": [self.row0, self.row0 + self.shape[1]],
                           "chunks": [self.chunk0, self.chunk0 + self.shape[0]],
                           "of_chunks": int(extent[0]), "of_rows": int(extent[1])},
                "offset": self.offset.tolist(), "logical_row": self.logical_row.tolist(),
                "first_col": self.first_col.tolist(), "valid_cols": self.valid_cols.tolist()}


#: Most cells one grid call builds (a window of a larger grid: ``rows`` / ``chunks``).
MAX_GRID_CELLS = 1 << 22


def _window(span, total: int, name: str) -> tuple[int, int]:
    """``(start, stop)`` of ``span`` (None: all of ``[0, total)``) checked against ``total``."""
    if span is None:
        return 0, total
    start, stop = (int(v) for v in span)
    if not 0 <= start < stop <= total:
        raise arg_error(IndexRangeError, name, f"a range start:stop with 0 <= start < stop <= {total}",
                        f"{start}:{stop}")
    return start, stop


def _windows(rows, chunks, n_rows: int, n_chunks: int) -> tuple[int, int, int, int]:
    r0, r1 = _window(rows, n_rows, "rows")
    c0, c1 = _window(chunks, n_chunks, "chunks")
    if (r1 - r0) * (c1 - c0) > MAX_GRID_CELLS:
        raise arg_error(ShapeError, "rows/chunks", f"a window of at most {MAX_GRID_CELLS} cells (pick rows / "
                        "chunks ranges)", f"{r1 - r0} rows x {c1 - c0} C0 chunks")
    return r0, r1, c0, c1


def grid(cache: Cache | CacheSpec, block: int = 0, *, rows: tuple[int, int] | None = None,
         chunks: tuple[int, int] | None = None) -> Grid:
    """Fractal grid of one block of an NZ paged cache.

    Args:
        cache: a PA_NZ / PA_BLK_NZ cache or its spec.
        block: block id in ``[0, BlockNum)``.
        rows, chunks: ``(start, stop)`` window of rows / C0 chunks (default: all).

    Returns:
        A :class:`Grid` of ``[D/C0, BlockSize]`` cells (the window's); ``logical_row`` holds slots.

    Raises:
        ShapeError: not an NZ-mode cache; a window over :data:`MAX_GRID_CELLS` cells.
        IndexRangeError: block or window out of range.
    """
    spec = cache.spec if isinstance(cache, Cache) else cache
    lay = spec.layout
    if not lay.nz:
        raise arg_error(ShapeError, "cache", "an NZ-mode cache (PA_NZ / PA_BLK_NZ) for a fractal grid",
                        f"cache_mode {lay.mode}")
    block = int(block)
    if not 0 <= block < lay.num_blocks:
        raise arg_error(IndexRangeError, "block", f"a block in [0, {lay.num_blocks})", block)
    n_chunks, n_rows = lay.dim // lay.c0, lay.block_size
    r0, r1, c0, c1 = _windows(rows, chunks, n_rows, n_chunks)
    shape = (c1 - c0, r1 - r0)
    j = np.arange(c0, c1)[:, None]  # [chunks, 1]
    r = np.arange(r0, r1)[None, :]  # [1, rows]
    offset = (block * n_rows * lay.dim + j * n_rows * lay.c0 + r * lay.c0) * lay.itemsize  # [chunks, rows]
    slot = np.broadcast_to(block * n_rows + r, shape).copy()
    first = np.broadcast_to(j * lay.c0, shape).copy()
    return Grid(kind="cache block", title=f"{lay.mode} block {block}: [D/C0={n_chunks}, BlockSize={n_rows}, "
                f"C0={lay.c0}] {spec.dtype.name}", c0=lay.c0, itemsize=lay.itemsize, offset=offset,
                logical_row=slot, first_col=first, valid_cols=np.full(shape, lay.c0), row0=r0, chunk0=c0,
                extent=(n_chunks, n_rows))


def weight_grid(shape: Sequence[int], dtype, batch: int = 0, *, rows: tuple[int, int] | None = None,
                chunks: tuple[int, int] | None = None) -> Grid:
    """Fractal grid of a FRACTAL_NZ weight (``npu_format_cast(w, 29)``) of ND ``shape``.

    Args:
        shape: logical ND shape ``[..., M, N]`` (2-D or more).
        dtype: bf16 / fp16 / fp32 / int32 / int8 (C0 = :func:`ascend_emu.layouts.c0_for`).
        batch: flat index of the leading batch matrix shown (0 for a 2-D weight).
        rows, chunks: ``(start, stop)`` window of rows m / C0 chunks (default: all).

    Returns:
        A :class:`Grid` of ``[ceil(N/C0), M_pad]`` cells (the window's); ``logical_row`` holds m
        (-1 padding).

    Raises:
        DTypeError: a dtype without FRACTAL_NZ.
        ShapeError: fewer than 2 dims; a window over :data:`MAX_GRID_CELLS` cells.
        IndexRangeError: batch or window out of range.
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
    n_chunks, n_rows = st[-4], st[-3] * st[-2]
    r0, r1, k0, k1 = _windows(rows, chunks, n_rows, n_chunks)
    j = np.arange(k0, k1, dtype=np.int64)[:, None]  # [chunks, 1]
    r = np.arange(r0, r1, dtype=np.int64)[None, :]  # [1, rows]
    offset = ((int(batch) * n_chunks * n_rows + j * n_rows + r) * c0 * itemsize).astype(np.int64)  # [chunks, rows]
    valid = np.where(r < m, np.minimum(c0, n - j * c0), 0)  # [chunks, rows]
    row = np.where(valid > 0, r, -1)
    return Grid(kind="weight", title=f"FRACTAL_NZ weight {list(shape)} {np.dtype(dtype).name}: storage "
                f"{list(st)}, C0={c0}", c0=c0, itemsize=itemsize, offset=offset, logical_row=row,
                first_col=np.broadcast_to(j * c0, (k1 - k0, r1 - r0)).copy(), valid_cols=valid, row0=r0,
                chunk0=k0, extent=(n_chunks, n_rows))


def grid_extent(cache: Cache | CacheSpec | None = None, *, weight_shape: Sequence[int] | None = None,
                dtype=None) -> tuple[int, int]:
    """``(chunks, rows)`` of the whole grid of an NZ cache's block or of a FRACTAL_NZ weight of ND
    ``weight_shape`` and ``dtype``, without building it (to choose a window)."""
    if weight_shape is not None:
        st = nz_shape(tuple(int(s) for s in weight_shape), dtype)
        return int(st[-4]), int(st[-3] * st[-2])
    lay = (cache.spec if isinstance(cache, Cache) else cache).layout
    return lay.dim // lay.c0, lay.block_size
