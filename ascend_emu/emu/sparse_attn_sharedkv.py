"""``npu_sparse_attn_sharedkv`` on the CPU: window + compressed (+ sink) attention, K as V.

Per query token (the contract, :mod:`ascend_emu.ops.sparse_attn_sharedkv`, derived each token's
request, position and the cache rows it reads):

1. the rows: the window's original rows (positions ``max(0, p - 127) .. p``, in position order),
   then the compressed rows (HCA: ``0 .. (p + 1) // 128 - 1``; CSA: the indices as given, ``-1``
   dropped), each read through its request's block table, widened exactly to fp32;
2. tiles: the window rows are tile 0; the compressed rows follow in tiles of :data:`TILE_ROWS`
   (the NPU's split comes from the metadata plan and is not reproduced). A tile with fewer rows
   (the window before position 127, the last compressed tile) is padded to :data:`TILE_ROWS`
   with rows whose score is ``-inf`` (``P = 0``) and whose K is 0, as a masked tile;
3. ``S = (q @ K^T) * fp32(softmax_scale)`` over all of the token's rows at once: fp32 operands
   (exact products), summed by the project's fp32 product (:func:`ascend_emu.emu.matmul.matmul_f32`:
   BLAS's order, each element a dot of 512 products; for bf16 q and K the fp32-output bf16
   engine :func:`ascend_emu.emu.matmul.matmul_bf16_f32`, the same exact products summed in fp32
   in oneDNN's order where its rule runs it: the spans it checks are the chunk's gathered rows'
   and, for ``P @ K``, the chunk's rounded P, so a chunk with a subnormal P, a score more than
   about 87 below its running max, runs its ``P @ K`` products on sgemm), then one fp32 multiply;
4. online softmax in fp32, tile by tile: ``m' = max(m, rowmax S)``, ``a = exp(m - m')``,
   ``P = exp(S - m')``, ``l = l * a + rowsum P`` (NumPy's pairwise fp32 sum over the tile's 128
   places, padded ones adding 0), ``acc = acc * a + round(P) @ K`` (the same engine as ``S``), where ``round(P)`` is P
   rounded (RNE) to the cache dtype before the second product (the reading of the reference
   model's kernel, which copies P to the half-precision buffer before its P @ V; the README
   does not say), while ``l`` sums the unrounded P;
5. the sink: ``l += exp(sink - m)`` after the last tile (the denominator only; A2 / A3), or,
   with ``args.sink_init`` (the Ascend 950 kernel, ``kv_quant_sparse_attn_sharedkv``: "maxUb
   initialised from sinks, sumUb to 1.0"), ``m = sink`` and ``l = 1`` before the first tile;
6. ``out = acc / l``, rounded once (RNE) to q's dtype.

A token's result depends on its own rows only (its tiles and their padding are its own), not on
the other tokens of the call. The tokens run together: a chunk of them (:data:`CHUNK_BYTES` of
gathered fp32 rows) gathers its rows in one compiled pass, runs one batched product for every
token's ``S``, then each tile's softmax step and ``P @ K`` product for all the chunk's tokens that
have the tile (tokens sorted by their tile count, so those are a leading run).

The Ascend 950 op reaches this with its 640-byte rows (``args.encoded``): each row read is
decoded, as it is gathered, to the bf16 values its vector unit feeds the cube
(:mod:`ascend_emu.ops.kv_quant_sparse_attn_sharedkv`, :func:`ascend_emu.quant.v4.decode_kv_rows_bf16_into`),
held as fp32.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ..ops.sparse_attn_sharedkv import SharedKvArgs, SharedKvOutputs
from ..quant import BF16, to_bf16, to_f32
from ..quant.v4 import decode_kv_rows_bf16_into
from .kernels import narrow_row, widen_row
from .matmul import matmul_bf16_f32, matmul_f32, one_blas_thread, span

#: Rows per online-softmax tile: the window (at most 128 rows) is tile 0, the compressed rows
#: follow 128 at a time.
TILE_ROWS = 128
#: Bound on the fp32 rows one chunk of tokens gathers (bytes); the chunk's other arrays are
#: smaller (``S``: ``N1 / 512`` of it; ``acc``: ``N1 / rows`` of it), so a call's working set
#: stays within a few times this whatever T.
CHUNK_BYTES = 16 << 20


@njit(cache=True, nogil=True)
def _gather_bits(rows, slots, is_bf16, out, col0):
    """``out[t, col0 + j] = fp32(rows[slots[t, j]])`` (bf16 / fp16 bits, exact), zeros where
    ``slots[t, j] < 0`` (a padded place). rows uint16 ``[R, D]``; slots int64 ``[a, J]`` (each
    < R: checked by the caller); out fp32 ``[a, >= col0 + J, D]``."""
    for t in range(slots.shape[0]):
        for j in range(slots.shape[1]):
            s = slots[t, j]
            if s < 0:
                out[t, col0 + j, :] = 0.0
            else:
                widen_row(rows[s], out[t, col0 + j], is_bf16)


@njit(cache=True, nogil=True)
def _round_rows(x, is_bf16, bits):
    """Each row of fp32 ``x`` ``[n, W]`` rounded RNE to bf16 / fp16 and widened back, in place
    (``bits``: a uint16 ``[W]`` scratch)."""
    for i in range(x.shape[0]):
        narrow_row(x[i], bits, is_bf16)
        widen_row(bits, x[i], is_bf16)


@njit(cache=True, nogil=True)
def _rescale_add(acc, alpha, pv):
    """``acc = acc * alpha[..., None] + pv`` in place, two fp32 roundings (no fused multiply-add):
    acc fp32 ``[k, N, D]`` (a leading slice of a C-contiguous array), alpha ``[k, N]`` (any
    strides), pv fp32 ``[k, N, D]``."""
    for t in range(acc.shape[0]):
        for h in range(acc.shape[1]):
            a = alpha[t, h]
            row, add = acc[t, h], pv[t, h]
            for i in range(row.shape[0]):
                row[i] = np.float32(row[i] * a) + add[i]


def _gather(rows: np.ndarray, slots: np.ndarray, out: np.ndarray, col0: int, encoded: bool) -> None:
    """Rows ``slots`` ``[a, J]`` of a cache view (bf16 / fp16 ``[R, D]``, or with
    ``encoded`` the 950's ``[R, 640]`` rows, decoded as they are read) into fp32
    ``out[:, col0:col0 + J]``, padded places (-1) zero."""
    if encoded:
        decode_kv_rows_bf16_into(rows.view(np.uint8), slots, out, col0, out.shape[2])  # checks the slots
        return
    if slots.size and int(slots.max()) >= rows.shape[0]:  # the contract's slots are in range
        raise AssertionError(f"sparse_attn_sharedkv: row {int(slots.max())} of {rows.shape[0]}")
    _gather_bits(rows.view(np.uint16), slots, rows.dtype == BF16, out, col0)


def sparse_attn_sharedkv(args: SharedKvArgs) -> SharedKvOutputs:
    """The emu backend's ``sparse_attn_sharedkv`` (module doc). Returns ``out`` ``[T, N1, 512]``.

    The products (``[N1, 512] @ [512, rows]`` and ``[N1, 128] @ [128, 512]`` per token) run on
    one OpenBLAS thread (:func:`~ascend_emu.emu.matmul.one_blas_thread`: the same bits;
    OpenBLAS's threads cost more than such a product, about 100 times more on a loaded 2-core
    machine)."""
    with one_blas_thread():
        return _attend(args)


def _token_rows(args: SharedKvArgs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each token's rows: int64 ``[T, 128]`` window slots (position order, -1 padded), int64
    ``[T, C]`` compressed slots (in index order, ``-1`` entries dropped, -1 padded; C a multiple
    of :data:`TILE_ROWS`, 0 for SWA) and int64 ``[T]`` tile counts."""
    b, p = args.token_batch, args.token_pos
    t = p.shape[0]
    if args.win_left + args.win_right + 1 > TILE_ROWS:
        raise AssertionError("sparse_attn_sharedkv: the window is one tile")
    lo = np.maximum(p - args.win_left, 0)
    pos = lo[:, None] + np.arange(TILE_ROWS)  # [T, 128]
    valid = pos <= (p + args.win_right)[:, None]
    cols = np.clip(pos - args.ori_base[b][:, None], 0, args.ori_slots.shape[1] - 1)
    win = np.where(valid, args.ori_slots[b[:, None], cols], -1)
    if args.cmp_rows is None:
        return win, np.empty((t, 0), np.int64), np.ones(t, np.int64)
    if args.cmp_indices is None:
        count = (p + 1) // args.cmp_ratio
        cpos = np.arange(int(count.max(initial=0)))[None, :]
    else:
        cpos = args.cmp_indices
        skip = cpos == -1
        if (skip[:, :-1] > skip[:, 1:]).any():  # a valid entry after a -1: valid entries first, in order
            cpos = np.take_along_axis(cpos, np.argsort(skip, axis=1, kind="stable"), axis=1)
        count = cpos.shape[1] - skip.sum(axis=1)
        cpos = cpos[:, :int(count.max(initial=0))]
    width = -(-int(count.max(initial=0)) // TILE_ROWS) * TILE_ROWS
    cmp = np.full((t, width), -1, np.int64)
    if width:  # slots of the valid places (every one a visible row: the contract checked them)
        valid = np.arange(cpos.shape[1])[None, :] < count[:, None]
        cols = np.clip(cpos, 0, args.cmp_slots.shape[1] - 1)
        cmp[:, :cpos.shape[1]] = np.where(valid, args.cmp_slots[b[:, None], cols], -1)
    return win, cmp, 1 + -(-count // TILE_ROWS)


def _attend(args: SharedKvArgs) -> SharedKvOutputs:
    q = args.q
    t, n, d = q.shape
    dtype = q.dtype
    is_bf16 = dtype == BF16
    out = np.empty((t, n, d), dtype)
    scale = np.float32(args.softmax_scale)
    sinks = None if args.sinks is None else args.sinks.astype(np.float32)
    win, cmp, tiles = _token_rows(args)
    order = np.argsort(-tiles, kind="stable")  # most tiles first: a tile's tokens are a leading run
    bits = np.empty(TILE_ROWS, np.uint16)
    c0 = 0
    while c0 < t:
        width = int(tiles[order[c0]]) * TILE_ROWS
        c1 = min(t, c0 + max(1, CHUNK_BYTES // (width * d * 4)))
        toks = order[c0:c1]
        res = _attend_chunk(q[toks], win[toks], cmp[toks, :width - TILE_ROWS], tiles[toks], args, scale, sinks,
                            is_bf16, bits)
        out[toks] = to_bf16(res) if is_bf16 else res.astype(dtype)
        c0 = c1
    return SharedKvOutputs(out)


def _attend_chunk(q, win, cmp, tiles, args: SharedKvArgs, scale, sinks, is_bf16: bool, bits) -> np.ndarray:
    """fp32 ``acc / l`` ``[a, N1, D]`` of a chunk of tokens sorted by descending tile count."""
    a, n, d = q.shape
    width = TILE_ROWS + cmp.shape[1]
    k32 = np.empty((a, width, d), np.float32)  # [a, rows, D]
    _gather(args.ori_rows, win, k32, 0, args.encoded)
    if cmp.shape[1]:
        _gather(args.cmp_rows, cmp, k32, TILE_ROWS, args.encoded)
    q32 = to_f32(q)  # [a, N, D] exact
    if is_bf16:  # bf16 x bf16 products, fp32 results: the fp32-output bf16 engine where it runs
        k_span = span(k32)
        s = matmul_bf16_f32(q32, k32.transpose(0, 2, 1), b_span=k_span)  # [a, N, rows]
    else:
        s = matmul_f32(q32, k32.transpose(0, 2, 1))
    s *= scale
    pad = np.concatenate([win, cmp], axis=1) < 0  # [a, rows]
    np.copyto(s, np.float32(-np.inf), where=pad[:, None, :])
    nt = int(tiles[0])
    tile_max = s.reshape(a, n, nt, TILE_ROWS).max(axis=3)  # [a, N, tiles]
    if args.sink_init:
        m0 = np.repeat(sinks[None, :], a, axis=0)
        l_sum = np.ones((a, n), np.float32)
    else:
        m0 = np.full((a, n), -np.inf, np.float32)
        l_sum = np.zeros((a, n), np.float32)
    run = np.maximum.accumulate(np.concatenate([m0[:, :, None], tile_max], axis=2), axis=2)  # [a, N, 1 + tiles]
    with np.errstate(invalid="ignore"):
        alpha = np.exp(run[:, :, :-1] - run[:, :, 1:])  # [a, N, tiles]: exp(-inf) = 0 before the first tile
    pexp = np.exp(s.reshape(a, n, nt, TILE_ROWS) - run[:, :, 1:, None])  # [a, N, tiles, 128]
    row_sum = pexp.sum(axis=3, dtype=np.float32)  # [a, N, tiles]: each tile's pairwise sum
    _round_rows(pexp.reshape(-1, TILE_ROWS), is_bf16, bits)
    p_span = span(pexp) if is_bf16 else None  # bounds every tile's: one pass
    acc = np.zeros((a, n, d), np.float32)
    for j in range(nt):
        k = int(np.count_nonzero(tiles > j))  # the leading run of tokens with tile j
        l_sum[:k] = l_sum[:k] * alpha[:k, :, j] + row_sum[:k, :, j]
        tile = k32[:k, j * TILE_ROWS:(j + 1) * TILE_ROWS]
        if is_bf16:
            pv = matmul_bf16_f32(pexp[:k, :, j], tile, a_span=p_span, b_span=k_span)  # [k, N, D]
        else:
            pv = matmul_f32(pexp[:k, :, j], tile)
        _rescale_add(acc[:k], alpha[:k, :, j], pv)
    m = run[np.arange(a), :, tiles]  # [a, N]: each token's max after its last tile
    if sinks is not None and not args.sink_init:
        l_sum = l_sum + np.exp(sinks[None, :] - m)
    return acc / l_sum[:, :, None]
