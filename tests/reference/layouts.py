"""Reference layouts, written from docs/sources.md#fractal_nz, docs/sources.md#paged_nz, docs/sources.md#cache_index and docs/sources.md#npu_kv_rmsnorm_rope_cache alone (numpy only).

Slow and plain on purpose: explicit loops and the vllm-ascend ``transdata`` formula, no shared
code with ``ascend_emu.layouts``.
"""

from __future__ import annotations

import numpy as np

FRACTAL_ROWS = 16  # rows of one fractal
FRACTAL_BYTES = 32  # bytes of one fractal row


def ceil_div(a: int, b: int) -> int:
    return (a + b - 1) // b


# ---------------------------------------------------------------------- matrix FRACTAL_NZ (docs/sources.md#fractal_nz)
def matrix_c0(itemsize: int) -> int:
    """torch_npu C0: 32 bytes over min(itemsize, 2) (fp32 / int32 are sized as 2-byte types)."""
    return FRACTAL_BYTES // min(itemsize, 2)


def as_matrix(shape: tuple[int, ...]) -> tuple[int, ...]:
    """0-D -> [1, 1]; 1-D [L] -> [L, 1]; otherwise unchanged."""
    if len(shape) == 0:
        return (1, 1)
    if len(shape) == 1:
        return (shape[0], 1)
    return tuple(shape)


def nz_storage_shape(shape: tuple[int, ...], itemsize: int) -> tuple[int, ...]:
    c0 = matrix_c0(itemsize)
    *batch, m, n = as_matrix(tuple(shape))
    return (*batch, ceil_div(n, c0), ceil_div(m, FRACTAL_ROWS), FRACTAL_ROWS, c0)


def transdata_2d(nd: np.ndarray, c0: int) -> np.ndarray:
    """vllm-ascend ``transdata(nd, block=(16, C0))`` for one [M, N] matrix -> [N/C0, M_pad, C0].

    Pads with zeros to (round_up(M, 16), round_up(N, C0)), then
    ``reshape(M/16, 16, N/C0, C0).permute(2, 0, 1, 3).reshape(N/C0, M_pad, C0)``.
    """
    m, n = nd.shape
    mp, np_ = ceil_div(m, FRACTAL_ROWS) * FRACTAL_ROWS, ceil_div(n, c0) * c0
    padded = np.zeros((mp, np_), dtype=nd.dtype)
    padded[:m, :n] = nd
    blocks = padded.reshape(mp // FRACTAL_ROWS, FRACTAL_ROWS, np_ // c0, c0).transpose(2, 0, 1, 3)
    return blocks.reshape(np_ // c0, mp, c0)


def nd_to_nz_transdata(x: np.ndarray) -> np.ndarray:
    """Storage [..., N/C0, M/16, 16, C0] built batch by batch with :func:`transdata_2d`."""
    c0 = matrix_c0(x.dtype.itemsize)
    mat = x.reshape(as_matrix(x.shape))
    *batch, m, n = mat.shape
    out = np.zeros(nz_storage_shape(x.shape, x.dtype.itemsize), dtype=x.dtype)
    for b in np.ndindex(*batch):
        out[b] = transdata_2d(mat[b], c0).reshape(out.shape[-4:])
    return out


def nd_to_nz_loops(x: np.ndarray) -> np.ndarray:
    """Storage built element by element: (…, m, n) -> […, n//C0, m//16, m%16, n%C0]."""
    c0 = matrix_c0(x.dtype.itemsize)
    mat = x.reshape(as_matrix(x.shape))
    out = np.zeros(nz_storage_shape(x.shape, x.dtype.itemsize), dtype=x.dtype)
    for idx in np.ndindex(*mat.shape):
        *b, m, n = idx
        out[(*b, n // c0, m // FRACTAL_ROWS, m % FRACTAL_ROWS, n % c0)] = mat[idx]
    return out


def nz_to_nd_loops(storage: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    c0 = matrix_c0(storage.dtype.itemsize)
    mat_shape = as_matrix(tuple(shape))
    out = np.empty(mat_shape, dtype=storage.dtype)
    for idx in np.ndindex(*mat_shape):
        *b, m, n = idx
        out[idx] = storage[(*b, n // c0, m // FRACTAL_ROWS, m % FRACTAL_ROWS, n % c0)]
    return out.reshape(shape)


def nz_flat_offset(shape: tuple[int, ...], itemsize: int, index: tuple[int, ...]) -> int:
    """Element offset in the NZ storage of logical ``index`` (row-major over the storage shape)."""
    c0 = matrix_c0(itemsize)
    st = nz_storage_shape(shape, itemsize)
    full = tuple(index) + (0,) * (len(as_matrix(tuple(shape))) - len(index))
    *b, m, n = full
    coords = (*b, n // c0, m // FRACTAL_ROWS, m % FRACTAL_ROWS, n % c0)
    off = 0
    for c, s in zip(coords, st, strict=True):
        off = off * s + c
    return off


# ---------------------------------------------------------------------- paged caches (docs/sources.md#paged_nz, docs/sources.md#cache_index, docs/sources.md#npu_kv_rmsnorm_rope_cache)
def cache_c0(itemsize: int) -> int:
    """Paged-cache C0: 32 bytes / itemsize (bf16 16, int8 32)."""
    return FRACTAL_BYTES // itemsize


def element_offset(mode: str, shape: tuple[int, ...], itemsize: int, block: int, row: int, head: int,
                   d: int) -> int:
    """Element offset of (block, row, head, d) in a cache of declared ``shape``.

    ``block``/``row`` mean: PA modes block id / row in block; BSND b / s; TND 0 / t; Norm b / pos.
    PA_BNSD / PA_BLK_BNSD are torch_npu's head-major caches, declared ``[BlockNum, N, BlockSize, D]``:
    block ``block`` holds head 0's ``BlockSize`` rows, then head 1's, ...
    """
    if mode in ("PA_BNSD", "PA_BLK_BNSD"):
        _, nkv, bs, dim = shape
        return ((block * nkv + head) * bs + row) * dim + d
    if mode in ("PA_NZ", "PA_BLK_NZ"):
        _, bs, _, dim = shape
        c0 = cache_c0(itemsize)
        # memory [BlockNum, D/C0, BlockSize, C0]
        return block * bs * dim + (d // c0) * bs * c0 + row * c0 + d % c0
    if mode in ("PA_BSND", "PA", "PA_BLK_BSND", "BSND"):
        _, bs, nkv, dim = shape
        return ((block * bs + row) * nkv + head) * dim + d
    if mode == "TND":
        _, nkv, dim = shape
        assert block == 0
        return (row * nkv + head) * dim + d
    if mode == "Norm":
        _, one, length, dim = shape
        assert head == 0 and one == 1
        return (block * length + row) * dim + d
    raise ValueError(mode)


def declared_geometry(mode: str, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(blocks, rows per block, heads, D) of a declared cache shape."""
    if mode == "TND":
        t, nkv, dim = shape
        return 1, t, nkv, dim
    if mode == "Norm":
        b, one, length, dim = shape
        return b, length, one, dim
    if mode in ("PA_BNSD", "PA_BLK_BNSD"):
        nb, nkv, bs, dim = shape
        return nb, bs, nkv, dim
    nb, bs, nkv, dim = shape
    return nb, bs, nkv, dim


# ---------------------------------------------------------------------- index -> (block, row)
def slots_cache_index(cache_index: np.ndarray) -> list[int]:
    """PA_BSND / PA_NZ: slot = cache_index value (-1 kept)."""
    return [int(v) for v in np.asarray(cache_index).reshape(-1)]


def slots_blk(index: np.ndarray, seq_lens: list[int], bs: int, *, page_offsets: bool) -> list[int]:
    """PA_BLK: token p of batch b -> page index[off_b + p // bs], row p % bs.

    Block ids (npu_mla_prolog_v3) or page start offsets block_id * bs (npu_kv_rmsnorm_rope_cache).
    """
    flat = [int(v) for v in np.asarray(index).reshape(-1)]
    out = []
    off = 0
    for s in seq_lens:
        for p in range(s):
            entry = flat[off + p // bs]
            if entry < 0:
                out.append(-1)
                continue
            blk = entry // bs if page_offsets else entry
            out.append(blk * bs + p % bs)
        off += ceil_div(s, bs)
    return out


def slots_norm(index: np.ndarray, cache_length: int) -> list[int]:
    """Norm: slot = b * cache_length + index[b, s] (-1 kept)."""
    out = []
    for b in range(index.shape[0]):
        for s in range(index.shape[1]):
            v = int(index[b, s])
            out.append(-1 if v < 0 else b * cache_length + v)
    return out


def slots_block_table(block_table: np.ndarray, kv_lens: list[int], bs: int) -> list[list[int]]:
    """PA_BSND read map, one loop per token: token p of batch b is row p % bs of block_table[b, p // bs]."""
    return [[int(block_table[b, p // bs]) * bs + p % bs for p in range(n)] for b, n in enumerate(kv_lens)]


def kv_position_to_row(layout_kv, b, p, *, s2=None, kv_starts=None, block_table=None, block_size=None):
    """Flat key row of kv token ``p`` of batch ``b`` (N2 = 1): PA_BSND through ``block_table``, BSND
    ``b * s2 + p``, TND ``kv_starts[b] + p`` (the sparse attention ops and the indexer read keys so)."""
    if layout_kv == "PA_BSND":
        return int(block_table[b, p // block_size]) * block_size + p % block_size
    if layout_kv == "BSND":
        return b * s2 + p
    return int(kv_starts[b]) + p


def head_major_nz_offset(shape: tuple[int, ...], block: int, row: int, head: int, d: int) -> int:
    """Element offset of (block, row, head, d) in a head-major FRACTAL_NZ paged cache of shape
    ``[BlockNum, N, D/C0, BlockSize, C0]`` (fused_infer_attention_score's 5-D cache): C-order
    index of ``[block, head, d // C0, row, d % C0]``."""
    _, n, d1, bs, c0 = shape
    return (((block * n + head) * d1 + d // c0) * bs + row) * c0 + d % c0
