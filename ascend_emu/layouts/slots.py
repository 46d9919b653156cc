"""Index -> slot maps of the paged / block KV caches: which global row (**slot**, ``block *
BlockSize + row``) each token of a writer's index tensor, or each kv position of a reader's
block table, lands in; every value validated before any kernel sees it.

Sources: docs/sources.md#cache_index (npu_mla_prolog_v3 cache_index meanings),
docs/sources.md#npu_kv_rmsnorm_rope_cache (index meanings), docs/sources.md#npu_kv_quant_sparse_flash_attention (block_table). The cache geometry
(slot -> byte offsets, block reads) is :class:`ascend_emu.layouts.paged.CacheLayout`, which
documents the meaning of each index per cache mode.

- ``-1`` (:data:`SKIP_INDEX`) means "skip this token" (or, for PA_BLK, this page) everywhere it
  is accepted; other negative values, which the kernels would also skip, are rejected (stricter
  than the hardware).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from numba import njit

from ..errors import DTypeError, IndexRangeError, ShapeError, arg_error

#: The index value that means "do not write this token".
SKIP_INDEX = -1


def _first_bad(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(mask)), mask.shape))


def _at(name: str, coord: tuple[int, ...]) -> str:
    return f"{name}[{', '.join(map(str, coord))}]" if coord else name


def _check_integer(values: np.ndarray, name: str) -> None:
    if values.dtype.kind not in "iu":
        raise arg_error(DTypeError, name, "an integer index tensor", values.dtype)


def check_index_range(values: np.ndarray, lo: int, hi: int, *, name: str, what: str,
                      allow_skip: bool = True) -> None:
    """Raise unless every value is in ``[lo, hi)`` (or ``-1`` when ``allow_skip``).

    Other negative values are errors too, even where the kernel would skip them (stricter than
    the hardware, docs/numerics.md#stricter_than_hardware).

    Args:
        values: integer array of any shape (an empty array passes).
        lo, hi: the valid half-open range.
        name: argument name for the message.
        what: what a value means, e.g. ``"slot"`` or ``"block id"``.
        allow_skip: accept :data:`SKIP_INDEX` (-1).

    Raises:
        DTypeError: ``values`` is not an integer array.
        IndexRangeError: a value is out of range; the message names the first offending
            coordinate and value (e.g. ``cache_index[3, 1] = 9000``) and the count of bad values.
    """
    values = np.asarray(values)
    _check_integer(values, name)
    if values.size == 0:
        return
    ok = (values >= lo) & (values < hi)
    if allow_skip:
        ok |= values == SKIP_INDEX
    if not ok.all():
        bad = np.logical_not(ok)
        coord = _first_bad(bad)
        skip = f"{SKIP_INDEX} (skip) or " if allow_skip else ""
        raise IndexRangeError(
            f"{_at(name, coord)} = {int(values[coord])}: expected {skip}{what} in [{lo}, {hi}); "
            f"{int(bad.sum())} value(s) out of range")


def slots_from_cache_index(cache_index: np.ndarray, num_rows: int, *, name: str = "cache_index",
                           allow_skip: bool = True) -> np.ndarray:
    """PA_BSND / PA_NZ (and MlaPreprocess ``slotmapping``): the index *is* the global slot.

    Source: docs/sources.md#cache_index (PA_BSND / PA_NZ), docs/sources.md#npu_mla_preprocess (slotMapping), docs/sources.md#npu_kv_rmsnorm_rope_cache (PA / PA_NZ).

    Args:
        cache_index: integer ``[T]`` or ``[B, S]``; values in ``[0, num_rows)`` or -1 (skip).
        num_rows: BlockNum * BlockSize.
        name: argument name for errors.
        allow_skip: accept -1.

    Returns:
        int64 ``[T]`` slots, token-major (``[B, S]`` flattened), -1 kept for skipped tokens.

    Raises:
        DTypeError: not an integer tensor.
        IndexRangeError: a value out of range (the message names its coordinates).
    """
    idx = np.asarray(cache_index)
    if idx.dtype in _FAST_TABLE_DTYPES:  # one compiled pass; a bad value goes the NumPy way for its message
        ok, slots = _index_slots(idx.reshape(-1), int(num_rows), allow_skip)
        if ok:
            return slots
    check_index_range(idx, 0, num_rows, name=name, what="slot", allow_skip=allow_skip)
    return idx.reshape(-1).astype(np.int64)


@njit(cache=True)
def _index_slots(idx, num_rows, allow_skip):
    """One pass of :func:`slots_from_cache_index` for an int32 / int64 ``[T]`` index: ``(True, int64
    copy)`` when every value is in ``[0, num_rows)`` (or -1 with ``allow_skip``), else ``(False,
    empty)`` at the first bad value (the caller then raises with :func:`check_index_range`)."""
    out = np.empty(idx.shape[0], np.int64)  # [T]
    for i in range(idx.shape[0]):
        v = np.int64(idx[i])
        if (v < 0 or v >= num_rows) and not (allow_skip and v == SKIP_INDEX):
            return False, np.empty(0, np.int64)
        out[i] = v
    return True, out


@njit(cache=True)
def _index_rows(cols, d0, d1):  # pragma: no cover - compiled
    """The regular case of :func:`slots_from_index_rows` in one pass over an int32 / int64
    ``[n, K]`` index (K 1: ``d1`` unused; K 2: (block, offset) rows): ``(True, int64 [n] flat
    slots, -1 for a skipped row)``, or ``(False, empty)`` at the first value the policy rejects
    (the caller then raises with the NumPy path's message)."""
    n, k = cols.shape
    out = np.empty(n, np.int64)  # [n]
    for i in range(n):
        b = np.int64(cols[i, 0])
        if k == 1:
            if 0 <= b < d0:
                out[i] = b
            elif b == SKIP_INDEX:
                out[i] = SKIP_INDEX
            else:
                return False, out[:0]
        else:
            o = np.int64(cols[i, 1])
            o_ok = 0 <= o < d1
            if 0 <= b < d0 and o_ok:
                out[i] = b * d1 + o
            elif b == SKIP_INDEX and (o_ok or o == SKIP_INDEX):
                out[i] = SKIP_INDEX
            else:
                return False, out[:0]
    return True, out


def slots_from_index_rows(index: np.ndarray, dims: Sequence[int], *, name: str) -> np.ndarray:
    """The DeepSeek-V4 writers' index rows (``npu_scatter_nd_update_v2`` / ``_sk``,
    ``scatter_nd_update_asc``, the epilog writers' ``slot_mapping``) as flat rows of the table
    they address, every value validated: the one reading of the index policy of docs/v4.md
    (section "Index policy of the V4 writers"). Duplicates are not looked at here (see
    :func:`ascend_emu.ops._check.writer_slots`).

    The table has ``dims`` as its leading dims: ``(num_rows,)`` for a flat slot (``[n]`` or
    ``[n, 1]``), ``(num_blocks, block_size)`` for ``[n, 2]`` (block, offset) rows. A row whose
    first column is :data:`SKIP_INDEX` (-1) is skipped when each other column is -1 or in its
    range (vllm-ascend pads with ``[-1, block_size - 1]``, tests with ``[-1, -1]``); every other
    value outside ``[0, dims[k])`` is rejected, including a -1 in a later column of a live row
    (the kernels disagree on it: ScatterNdUpdateV2 folds it into the previous block's last row,
    ScatterNdUpdateAsc skips the row) and ``[-1, x]`` with ``x`` past its range (which
    ScatterNdUpdateV2 would write).

    Args:
        index: integer ``[n]`` (one column), ``[n, 1]`` or ``[n, 2]``; the column count must be
            ``len(dims)``.
        dims: the sizes the columns address, 1 or 2 ints, each >= 1.
        name: argument name for errors.

    Returns:
        int64 ``[n]``: ``index[i, 0] * dims[1] + index[i, 1]`` (2 columns) or ``index[i]``;
        -1 for a skipped row.

    Raises:
        DTypeError: not an integer tensor.
        ShapeError: not ``[n]`` / ``[n, len(dims)]``.
        IndexRangeError: a value out of range; the message names ``name[i, k]``, the value, the
            range and the count of bad rows.
    """
    idx = np.asarray(index)
    _check_integer(idx, name)
    dims = tuple(int(d) for d in dims)
    k = len(dims)
    if k not in (1, 2) or min(dims) < 1:
        raise arg_error(ShapeError, f"{name} (the table it addresses)", "1 or 2 dims, each >= 1", list(dims))
    cols = idx.reshape(-1, 1) if idx.ndim == 1 and k == 1 else idx
    if cols.ndim != 2 or cols.shape[1] != k:
        want = "[n] or [n, 1] (flat slots)" if k == 1 else "[n, 2] ((block, offset) rows)"
        raise arg_error(ShapeError, name, f"a {want} index tensor", f"shape {list(idx.shape)}")
    if cols.dtype in (np.int32, np.int64) and cols.shape[0]:
        ok, flat = _index_rows(cols, dims[0], dims[-1])  # the regular call in one compiled pass
        if ok:
            return flat
    v = cols.astype(np.int64)  # [n, K]
    hi = np.asarray(dims, dtype=np.int64)[None, :]  # [1, K]
    inside = (v >= 0) & (v < hi)  # [n, K]
    skip = v[:, 0] == SKIP_INDEX  # [n]
    if k == 2:
        skip &= inside[:, 1] | (v[:, 1] == SKIP_INDEX)
    bad = ~(inside.all(axis=1) | skip)  # [n]
    if bad.any():
        i = int(np.argmax(bad))
        what = ("a slot",) if k == 1 else ("a block id", "an offset in its block")
        if v[i, 0] == SKIP_INDEX:  # a skipped row with a bad offset
            j, expected = 1, f"{SKIP_INDEX} or {what[1]} in [0, {dims[1]}) (the row's block is {SKIP_INDEX}: skipped)"
        else:
            j = int(np.argmax(~inside[i]))
            skip_ok = f"{SKIP_INDEX} (skip the row) or " if j == 0 else ""
            expected = f"{skip_ok}{what[j]} in [0, {dims[j]})"
        coord = (i, j) if idx.ndim == 2 else (i,)
        raise IndexRangeError(f"{_at(name, coord)} = {int(v[i, j])}: expected {expected}; "
                              f"{int(bad.sum())} row(s) out of range")
    flat = v[:, 0] if k == 1 else v[:, 0] * dims[1] + v[:, 1]
    return np.where(skip, SKIP_INDEX, flat).astype(np.int64, copy=False)


def slots_from_pages(pages: np.ndarray, seq_lens: Sequence[int], block_size: int, num_blocks: int, *,
                     page_offsets: bool, name: str) -> np.ndarray:
    """PA_BLK_BSND / PA_BLK_NZ: every batch's tokens fill its listed blocks from row 0.

    Source: docs/sources.md#cache_index (npu_mla_prolog_v3: block ids), docs/sources.md#npu_kv_rmsnorm_rope_cache
    (npu_kv_rmsnorm_rope_cache: page start offsets).

    Token ``p`` (0-based within batch ``b``) goes to page ``pages[off_b + p // block_size]``,
    row ``p % block_size``, where ``off_b = sum(ceil(seq_lens[i] / block_size) for i < b)``.

    Args:
        pages: integer ``[sum(ceil(S_b / block_size))]`` (merged) or ``[B, ceil(S / block_size)]``
            (non-merged, equal S), read in row-major order. With ``page_offsets=False``
            (npu_mla_prolog_v3 ``cache_index``) values are block ids in ``[0, num_blocks)``; with
            ``page_offsets=True`` (npu_kv_rmsnorm_rope_cache ``index``) they are token offsets of
            page starts, ``block_id * block_size``, in ``[0, num_blocks * block_size)``. -1 skips
            the whole page.
        seq_lens: tokens per batch ``[B]`` (lengths, not prefix sums), each >= 0.
        block_size: rows per block, >= 1.
        num_blocks: blocks in the cache.
        page_offsets: which of the two index meanings ``pages`` has.
        name: argument name for errors.

    Returns:
        int64 ``[sum(seq_lens)]`` slots ``block_id * block_size + row``, batch-major; -1 for the
        tokens of skipped pages.

    Raises:
        DTypeError: ``pages`` not an integer tensor.
        ShapeError: ``pages`` has the wrong number of entries, a negative ``seq_lens`` value, or
            ``block_size < 1``.
        IndexRangeError: a page out of range, or (page offsets) not a multiple of block_size;
            the message names the coordinates in ``pages``.
    """
    pages_nd = np.asarray(pages)
    _check_integer(pages_nd, name)
    if int(block_size) < 1:
        raise arg_error(ShapeError, "block_size", "an integer >= 1", block_size)
    seq_lens = np.asarray(seq_lens, dtype=np.int64).reshape(-1)
    if (seq_lens < 0).any():
        i = int(np.argmax(seq_lens < 0))
        raise arg_error(ShapeError, f"seq_lens[{i}]", "a token count >= 0", int(seq_lens[i]))
    per_batch = -(-seq_lens // block_size)  # [B]
    if pages_nd.size != int(per_batch.sum()):
        raise arg_error(ShapeError, name,
                        f"{int(per_batch.sum())} page entries (sum of ceil(S_b/{block_size}) over "
                        f"seq_lens {seq_lens.tolist()})", f"{pages_nd.size} (shape {list(pages_nd.shape)})")
    if page_offsets:
        check_index_range(pages_nd, 0, num_blocks * block_size, name=name, what="page start offset")
        misaligned = (pages_nd >= 0) & (pages_nd % block_size != 0)
        if misaligned.any():
            coord = _first_bad(misaligned)
            raise IndexRangeError(f"{_at(name, coord)} = {int(pages_nd[coord])}: expected a page start "
                                  f"offset, a multiple of block_size={block_size} (block_id * block_size), "
                                  f"or -1")
    else:
        check_index_range(pages_nd, 0, num_blocks, name=name, what="block id")
    flat = pages_nd.reshape(-1).astype(np.int64)  # [P]
    block_ids = np.where(flat >= 0, flat // block_size, SKIP_INDEX) if page_offsets else flat
    total = int(seq_lens.sum())
    batch = np.repeat(np.arange(seq_lens.size), seq_lens)  # [T]
    starts = np.concatenate(([0], np.cumsum(seq_lens)[:-1])).astype(np.int64)  # [B]
    page_starts = np.concatenate(([0], np.cumsum(per_batch)[:-1])).astype(np.int64)  # [B]
    pos = np.arange(total, dtype=np.int64) - starts[batch]  # [T] position within batch
    blk = block_ids[page_starts[batch] + pos // block_size]  # [T]
    return np.where(blk >= 0, blk * block_size + pos % block_size, SKIP_INDEX).astype(np.int64)


def slots_from_block_table(block_table: np.ndarray, kv_lens: Sequence[int], block_size: int, num_blocks: int, *,
                           name: str = "block_table") -> np.ndarray:
    """PA_BSND reads (sparse attention, lightning indexer): kv token ``p`` of batch ``b`` lives in
    block ``block_table[b, p // block_size]``, row ``p % block_size``.

    Source: docs/sources.md#npu_kv_quant_sparse_flash_attention (``block_table`` int32 ``[B, >= ceil(max_s2 / block_size)]``);
    vLLM's paged attention uses the same map.

    Only the entries that cover a batch's ``kv_lens[b]`` tokens are read and checked; the rest of
    a row (padding, often 0 or -1) is ignored, as the kernels ignore it.

    Args:
        block_table: integer ``[B, max_blocks]``.
        kv_lens: kv tokens per batch ``[B]`` (lengths, not prefix sums), each >= 0.
        block_size: rows per block, >= 1.
        num_blocks: blocks in the cache.
        name: argument name for errors.

    Returns:
        int64 ``[B, max(kv_lens)]`` slots ``block * block_size + row``; -1 at positions past
        ``kv_lens[b]``.

    Raises:
        DTypeError: ``block_table`` not an integer tensor.
        ShapeError: not 2-D, fewer rows than ``kv_lens`` has batches, too few columns for the
            longest sequence, a negative length, or ``block_size < 1``.
        IndexRangeError: a needed entry outside ``[0, num_blocks)``; the message names its
            coordinates ``block_table[b, j]`` and value.
    """
    table = np.asarray(block_table)
    if table.ndim == 2 and table.dtype in _FAST_TABLE_DTYPES and isinstance(block_size, (int, np.integer)):
        lens = np.asarray(kv_lens, dtype=np.int64).reshape(-1)  # [B]
        ok, slots = _block_table_slots(table, lens, int(block_size), int(num_blocks))
        if ok:
            return slots
    return _block_table_slots_checked(table, kv_lens, block_size, num_blocks, name)


def blocks_from_block_table(block_table: np.ndarray, kv_lens: Sequence[int], block_size: int, num_blocks: int, *,
                            name: str = "block_table") -> np.ndarray:
    """The blocks a block-table reader reads: the entries of ``block_table`` that cover each
    batch's ``kv_lens[b]`` rows, checked (the map of :func:`slots_from_block_table`, one entry per
    block instead of one per row).

    Args:
        block_table: integer ``[B, max_blocks]``.
        kv_lens: rows per batch ``[B]`` (lengths, not prefix sums), each >= 0.
        block_size: rows per block, >= 1.
        num_blocks: blocks in the cache.
        name: argument name for errors.

    Returns:
        int64 ``[B, max(ceil(kv_lens / block_size))]``: block ids in ``[0, num_blocks)``, -1 past
        the blocks batch ``b`` needs.

    Raises:
        As :func:`slots_from_block_table` (the same checks and messages).
    """
    table = np.asarray(block_table)
    lens = np.asarray(kv_lens, dtype=np.int64).reshape(-1)  # [B]
    bs = int(block_size) if isinstance(block_size, (int, np.integer)) else 0
    ok = table.ndim == 2 and table.dtype.kind in "iu" and bs >= 1 and not (lens < 0).any() \
        and table.shape[0] == lens.size
    if ok:
        need = -(-lens // bs)  # [B]
        max_need = int(need.max()) if lens.size else 0
        ok = table.shape[1] >= max_need
    if ok:
        used = np.arange(max_need)[None, :] < need[:, None]  # [B, max_need]
        blocks = table[:, :max_need].astype(np.int64)
        ok = not (used & ((blocks < 0) | (blocks >= num_blocks))).any()
    if not ok:
        _block_table_slots_checked(table, kv_lens, block_size, num_blocks, name)  # raises, naming the entry
        raise arg_error(ShapeError, name, "a valid block table", f"shape {list(table.shape)}")
    return np.where(used, blocks, SKIP_INDEX)


#: block_table dtypes the one-pass kernel takes (every value compares exactly with int64); others
#: go through :func:`_block_table_slots_checked`.
_FAST_TABLE_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


@njit(cache=True)
def _block_table_slots(table, kv_lens, block_size, num_blocks):
    """One pass of :func:`slots_from_block_table` for a 2-D int32 / int64 table: every check it
    makes, each needed entry checked before it is used.

    Returns:
        ``(True, slots)`` when every check passes; ``(False, empty)`` at the first failure (the
        caller then runs :func:`_block_table_slots_checked` for the error and its message).
    """
    fail = np.empty((0, 0), np.int64)
    b = kv_lens.shape[0]
    if block_size < 1:
        return False, fail
    max_len = 0
    for i in range(b):
        if kv_lens[i] < 0:
            return False, fail
        max_len = max(max_len, kv_lens[i])
    if table.shape[0] != b or table.shape[1] < (max_len + block_size - 1) // block_size:
        return False, fail
    slots = np.empty((b, max_len), np.int64)  # [B, S2]
    for i in range(b):
        n = kv_lens[i]
        for j in range((n + block_size - 1) // block_size):
            blk = np.int64(table[i, j])
            if blk < 0 or blk >= num_blocks:
                return False, fail
            p0 = j * block_size
            for r in range(min(block_size, n - p0)):
                slots[i, p0 + r] = blk * block_size + r
        for p in range(n, max_len):
            slots[i, p] = SKIP_INDEX
    return True, slots


def _block_table_slots_checked(table: np.ndarray, kv_lens, block_size, num_blocks: int, name: str) -> np.ndarray:
    """:func:`slots_from_block_table` with NumPy: the errors and their messages (the first
    offending entry, the count of bad ones), and tables :func:`_block_table_slots` does not take."""
    _check_integer(table, name)
    if int(block_size) < 1:
        raise arg_error(ShapeError, "block_size", "an integer >= 1", block_size)
    kv_lens = np.asarray(kv_lens, dtype=np.int64).reshape(-1)  # [B]
    if (kv_lens < 0).any():
        i = int(np.argmax(kv_lens < 0))
        raise arg_error(ShapeError, f"kv_lens[{i}]", "a token count >= 0", int(kv_lens[i]))
    b = kv_lens.size
    need = -(-kv_lens // block_size)  # [B] blocks each batch reads
    max_need = int(need.max()) if b else 0
    if table.ndim != 2 or table.shape[0] != b or table.shape[1] < max_need:
        raise arg_error(ShapeError, name, f"a 2-D [B={b}, >= {max_need}] table (ceil(max kv length / "
                        f"block_size={block_size}) columns)", f"shape {list(table.shape)}")
    used = np.arange(table.shape[1])[None, :] < need[:, None]  # [B, max_blocks]
    bad = used & ((table < 0) | (table >= num_blocks))
    if bad.any():
        coord = _first_bad(bad)
        raise IndexRangeError(f"{_at(name, coord)} = {int(table[coord])}: expected a block id in "
                              f"[0, {num_blocks}) (the entry covers kv tokens [{coord[1] * block_size}, "
                              f"{min((coord[1] + 1) * block_size, int(kv_lens[coord[0]]))}) of batch {coord[0]}); "
                              f"{int(bad.sum())} needed entries out of range")
    max_len = int(kv_lens.max()) if b else 0
    pos = np.arange(max_len, dtype=np.int64)  # [S2]
    blocks = table[:, :max(max_need, 0)].astype(np.int64)[:, pos // block_size] if max_len else \
        np.zeros((b, 0), np.int64)  # [B, S2]
    slots = blocks * block_size + pos % block_size  # [B, S2]
    return np.where(pos[None, :] < kv_lens[:, None], slots, SKIP_INDEX)


def slot_of_block_row(block, row, block_size: int):
    """The flat slot of row ``row`` of block ``block``: ``block * block_size + row`` (the one place
    outside :class:`~.paged.CacheLayout` this is computed, for callers holding (block, row) pairs
    without a cache, e.g. ``compressor_metadata``'s flat ``slot_mapping`` output).

    Args:
        block, row: ints or int64 arrays of one shape; not checked here (the caller checks them
            against its block table and block size first).
        block_size: rows per block, >= 1.

    Returns:
        An int64 array (or int) of ``block``'s shape.
    """
    return np.asarray(block, dtype=np.int64) * int(block_size) + np.asarray(row, dtype=np.int64)


def slots_from_positions(index: np.ndarray, cache_length: int, *, name: str = "index") -> np.ndarray:
    """Norm mode of npu_kv_rmsnorm_rope_cache: ``index[b, s]`` is a position inside batch b.

    Source: docs/sources.md#npu_kv_rmsnorm_rope_cache (``cache[b, 0, index[b, s]]``; -1 skips).

    Args:
        index: integer ``[B, S]``; values in ``[0, cache_length)`` or -1 (skip).
        cache_length: rows per batch in the ``[B, 1, cache_length, D]`` cache.
        name: argument name for errors.

    Returns:
        int64 ``[B*S]`` slots ``b * cache_length + index[b, s]`` (-1 kept).

    Raises:
        DTypeError: not an integer tensor.
        ShapeError: ``index`` is not 2-D.
        IndexRangeError: a value out of range (the message names its coordinates).
    """
    idx = np.asarray(index)
    if idx.ndim != 2:
        raise arg_error(ShapeError, name, "a 2-D [B, S] tensor", f"shape {list(idx.shape)}")
    check_index_range(idx, 0, cache_length, name=name, what="position")
    idx = idx.astype(np.int64)
    b = np.arange(idx.shape[0], dtype=np.int64)[:, None]  # [B, 1]
    return np.where(idx >= 0, b * cache_length + idx, SKIP_INDEX).reshape(-1)


#: Live slots up to which :func:`has_duplicate_slots` compares pairwise; beyond, it marks a table
#: of ``max(slots) + 1`` flags when that is at most this many times the live slots, else sorts.
_PAIRWISE_SLOTS = 32
_MARK_RATIO = 64


@njit(cache=True)
def has_duplicate_slots(slots):  # pragma: no cover - compiled
    """Whether two non-negative entries of int64 ``slots`` are equal (negative ones: skips). The
    one duplicate search of the writers' compiled passes (:func:`duplicate_slots`, the V4 epilog
    writers' slot pass)."""
    live = slots[slots >= 0]
    n = live.shape[0]
    if n <= _PAIRWISE_SLOTS:
        for a in range(1, n):
            for b in range(a):
                if live[a] == live[b]:
                    return True
        return False
    top = live.max()
    if top < _MARK_RATIO * n:
        seen = np.zeros(top + 1, np.bool_)
        for a in range(n):
            if seen[live[a]]:
                return True
            seen[live[a]] = True
        return False
    ordered = np.sort(live)
    for a in range(1, n):
        if ordered[a] == ordered[a - 1]:
            return True
    return False


def duplicate_slots(slots: np.ndarray) -> dict[int, list[int]]:
    """Slots written by more than one token.

    Args:
        slots: integer slots of any shape, read flattened; negative values (skips) are ignored.

    Returns:
        ``{slot: [token, token, ...]}`` in increasing slot order, tokens (flat indices) in
        increasing order; empty when every slot is written at most once.
    """
    slots = np.asarray(slots).reshape(-1)
    if slots.dtype == np.int64 and not has_duplicate_slots(slots):  # the usual call: one compiled pass
        return {}
    live = np.flatnonzero(slots >= 0)  # [L] token ids
    if live.size < 2:
        return {}
    order = live[np.argsort(slots[live], kind="stable")]  # tokens sorted by slot, then token
    sorted_slots = slots[order]
    starts = np.flatnonzero(np.concatenate(([True], sorted_slots[1:] != sorted_slots[:-1])))
    counts = np.diff(np.append(starts, sorted_slots.size))
    multi = counts > 1  # only repeated slots reach the Python loop
    return {int(sorted_slots[s]): order[s:s + c].tolist() for s, c in zip(starts[multi], counts[multi], strict=True)}
