"""emu backend of ``npu_lightning_indexer``: per batch and key head, a Numba gather of the visible
key rows, one fp32 GEMM, then a Numba pass per query token for the weighted head sum and top-k.

Numerics (docs/sources.md#npu_lightning_indexer; the A2/A3 kernel ``lightning_indexer_service_vector.h`` /
``lightning_indexer_vector.h``; the official golden widens everything to fp32):

1. query, key and weights (bf16 / fp16) are widened exactly to fp32; fp32 weights are used as
   they are.
2. ``dot[p, h] = q[h] . k[p]``: fp32 inputs, fp32 accumulation (BLAS sgemm, like the kernel's
   cube matmul whose fp32 result goes to the vector units unrounded). The summation order inside
   the 128-term dot is BLAS's; the cube's is not public, so this step may differ from the hardware
   in the last fp32 bits. With bf16 query and key the product goes through the fp32-output bf16
   engine :func:`~ascend_emu.emu.matmul.matmul_bf16_f32` (oneDNN's bf16 dot products, fp32
   accumulation, where its fixed per-host rule allows it; else sgemm): the same exact products,
   another fp32 order.
3. ``relu(dot) * w[h]`` in fp32 (the kernel applies ReLU to the fp32 matmul result and
   multiplies by the fp32-cast weight). ReLU keeps NaN.
4. Sum over the G = N1 heads (at most 64; DeepSeek-V3.2: 64) in the kernel's order
   (:data:`HEAD_GROUP`): head ``h`` goes to lane ``h % 16``, lanes accumulate the groups in head
   order (``lane = p[i] + p[16 + i] + ...``), then a halving tree ``lanes[0:8] += lanes[8:16]``, ``[0:4] += [4:8]``, ``[0:2] += [2:4]``,
   ``score = lane0 + lane1`` (``DoScale`` / ``DoReduce``). fp32 throughout.
5. Top-k by partial selection on the fp32 scores (no rounding before the sort, as the kernel):
   the k-th largest score is found with ``np.partition``, the positions above it and the first
   ones equal to it (lowest positions) are kept, then sorted by score descending, stable, so equal
   scores keep the lower position first. NaN scores rank as ``-inf``.
6. With ``return_value`` the selected fp32 scores are rounded once (RNE) to the query dtype.

Work layout: a batch's key rows are gathered once (only the ``max(limit)`` rows its tokens can
see, through the contract's validated ``slots``) and shared by all its query tokens; the GEMM
runs outside Numba because OpenBLAS must not be called from inside Numba's OpenMP region (it
warns "Detect OpenMP Loop ... may hang"). Each query token then owns one output row in the
parallel scoring kernel, so the bytes do not depend on the thread count. Long prefills are cut
into chunks of query tokens (:data:`CHUNK_BYTES`).
"""

from __future__ import annotations

import functools

import numba
import numpy as np
from numba import njit, prange

from ..ops.lightning_indexer import (EMPTY_VALUE_SHAPE, PAD_VALUE, SKIPPED_ROW_VALUE, LightningIndexerArgs,
                                     LightningIndexerOutputs)
from ..quant import BF16
from ..quant.rounding import f32_bits_to_bf16_bits, f32_bits_to_f16_bits
from .kernels import bits16, widen_row
from .matmul import bf16_engine_may_run, matmul_bf16_f32, matmul_f32, span

#: Below these sizes one thread is faster than waking the pool, and a BLAS call right after a
#: parallel region competes with its spinning workers on a small machine: key rows gathered,
#: and head-times-key products scored per chunk (one decode token at kv 4096 is 2**18).
PARALLEL_MIN_ROWS = 1 << 14
PARALLEL_MIN_SCORES = 1 << 19
#: Heads per vector-unit group in the kernel's weighted head reduction (``groupInner_``).
HEAD_GROUP = 16


@njit(cache=True, inline="always")
def _narrow(x, is_bf16):
    """bf16 / fp16 bits of fp32 ``x``, RNE."""
    u = np.float32(x).view(np.uint32)
    return f32_bits_to_bf16_bits(u) if is_bf16 else f32_bits_to_f16_bits(u)


@njit(cache=True, inline="always")
def _relu_times(d, w):
    """``relu(d) * w`` in fp32; NaN passes through."""
    return (np.float32(0.0) if d < np.float32(0.0) else d) * w


@njit(cache=True, inline="always")
def _pow2_floor(r):
    """The kernel's ``FindNearestPower2``: r itself for r <= 2, else the largest power of two <= r."""
    if r <= 2:
        return r
    p = 1
    while p * 2 <= r:
        p *= 2
    return p


@njit(cache=True)
def _weighted_head_sums(dots, w, score):
    """``score[p] = sum_h w[h] * relu(dots[h, p])`` in fp32, the kernel's order (module doc,
    step 4), for ``p < score.shape[0]``. dots fp32 ``[G, >= L]``, w fp32 ``[G]``.

    Every loop runs over p, so the additions of one p happen in exactly the kernel's order while
    different p are computed side by side (SIMD).
    """
    g = w.shape[0]
    n = score.shape[0]
    r = min(HEAD_GROUP, g)
    lanes = np.empty((r, n), np.float32)  # [16, L]
    for i in range(r):
        for p in range(n):
            lanes[i, p] = _relu_times(dots[i, p], w[i])
    for base in range(r, g, r):
        for i in range(min(r, g - base)):
            for p in range(n):
                lanes[i, p] = lanes[i, p] + _relu_times(dots[base + i, p], w[base + i])
    if r == 1:
        for p in range(n):  # (a loop: a slice assignment compiles its shape-error message, ~2 s)
            score[p] = lanes[0, p]
        return
    half = _pow2_floor(r)
    for i in range(r - half):  # lanes past the largest power of two fold in first
        for p in range(n):
            lanes[i, p] = lanes[i, p] + lanes[half + i, p]
    while half > 2:
        half //= 2
        for i in range(half):
            for p in range(n):
                lanes[i, p] = lanes[i, p] + lanes[half + i, p]
    for p in range(n):
        score[p] = lanes[0, p] + lanes[1, p]


@njit(cache=True)
def _order_statistic(values, j):
    """The ``j``-th smallest of ``values`` (fp32 ``[n]``, no NaN; 0-based): ``np.sort(values)[j]``
    as a value (``np.partition``'s, without compiling its kth checks, which sort: seconds of
    compiling). Hoare's quickselect (Wirth's) on a copy with median-of-three pivots."""
    a = values.copy()
    lo, hi = 0, a.shape[0] - 1
    while lo < hi:
        x, y, z = a[lo], a[(lo + hi) // 2], a[hi]
        pivot = max(min(x, y), min(max(x, y), z))
        i, m = lo, hi
        while i <= m:  # then a[lo:m + 1] <= pivot, a[i:hi + 1] >= pivot, a[m + 1:i] == pivot
            while a[i] < pivot:
                i += 1
            while a[m] > pivot:
                m -= 1
            if i <= m:
                a[i], a[m] = a[m], a[i]
                i += 1
                m -= 1
        if j <= m:
            hi = m
        elif j >= i:
            lo = i
        else:
            return a[j]
    return a[j]


@njit(cache=True)
def _top_k(score, k):
    """Positions of the ``min(k, L)`` largest ``score`` values, by score descending, equal scores
    lower position first; NaN ranks as -inf. int64 ``[min(k, L)]``."""
    n = score.shape[0]
    rank = score.copy()  # [L]
    for p in range(n):
        if rank[p] != rank[p]:
            rank[p] = -np.inf
    if n > k:
        thr = _order_statistic(rank, n - k)  # the k-th largest
        above = 0
        for p in range(n):
            if rank[p] > thr:
                above += 1
        equal_left = k - above
        sel = np.empty(k, np.int64)  # [k] ascending positions
        j = 0
        for p in range(n):
            if rank[p] > thr:
                sel[j] = p
                j += 1
            elif rank[p] == thr and equal_left > 0:
                sel[j] = p
                j += 1
                equal_left -= 1
    else:
        sel = np.arange(n)
    neg = np.empty(sel.shape[0], np.float32)
    for j in range(sel.shape[0]):
        neg[j] = -rank[sel[j]]
    order = np.argsort(neg, kind="mergesort")  # stable: ties keep ascending positions
    return sel[order]


@njit(cache=True)
def _gather_keys_range(lo, hi, k_bits, slots_b, kh, is_bf16, out):
    """``out[p] = fp32(k_bits[slots_b[p], kh])`` for ``lo <= p < hi`` (slots validated)."""
    for p in range(lo, hi):
        widen_row(k_bits[slots_b[p], kh], out[p], is_bf16)


@njit(cache=True, parallel=True)
def _gather_keys_parallel(parts, k_bits, slots_b, kh, is_bf16, out):
    """:func:`_gather_keys_range` over all rows of ``out``, split into ``parts`` threads' ranges."""
    n = out.shape[0]
    for i in prange(parts):
        _gather_keys_range(i * n // parts, (i + 1) * n // parts, k_bits, slots_b, kh, is_bf16, out)


@njit(cache=True)
def _score_top_k_range(lo, hi, dots, w, limit, is_bf16, want_values, pad_bits, skip_bits, idx_out, val_out):
    """Weighted head sum and top-k of query tokens ``lo <= c < hi`` of a chunk of one batch and
    key head.

    dots fp32 ``[C * G, L]`` (``dots[c * G + h, p] = q[c, h] . k[p]``); w fp32 ``[C, G]``; limit
    int64 ``[C]`` (each <= L, or < 0 for a skipped row); idx_out int32 ``[C, K]``; val_out uint16
    ``[C, K]`` (unused without want_values).
    """
    g = w.shape[1]
    k = idx_out.shape[1]
    for c in range(lo, hi):
        lim = limit[c]
        if lim <= 0:
            fill = skip_bits if lim < 0 else pad_bits
            for j in range(k):
                idx_out[c, j] = -1
                if want_values:
                    val_out[c, j] = fill
            continue
        score = np.empty(lim, np.float32)  # [L]
        _weighted_head_sums(dots[c * g:(c + 1) * g], w[c], score)
        sel = _top_k(score, k)
        m = sel.shape[0]
        for j in range(m):
            idx_out[c, j] = sel[j]
            if want_values:
                val_out[c, j] = _narrow(score[sel[j]], is_bf16)
        for j in range(m, k):
            idx_out[c, j] = -1
            if want_values:
                val_out[c, j] = pad_bits


@njit(cache=True, parallel=True)
def _score_top_k_parallel(dots, w, limit, is_bf16, want_values, pad_bits, skip_bits, idx_out, val_out):
    """:func:`_score_top_k_range` with one query token per parallel iteration."""
    for c in prange(w.shape[0]):
        _score_top_k_range(c, c + 1, dots, w, limit, is_bf16, want_values, pad_bits, skip_bits, idx_out, val_out)


@functools.lru_cache(maxsize=16)
def _bits(value: float, dtype: np.dtype) -> np.uint16:
    """bf16 / fp16 bits of ``value`` (memoised: two constants per dtype)."""
    return np.array(value, dtype=dtype).view(np.uint16)[()]


def lightning_indexer(args: LightningIndexerArgs) -> LightningIndexerOutputs:
    """Backend of :func:`ascend_emu.ops.npu_lightning_indexer`.

    Returns:
        ``(sparse_indices, sparse_values)`` as that function documents.
    """
    dtype = args.dtype
    is_bf16 = dtype == BF16
    n1, dim = args.query.shape[-2:]
    n2 = args.key.shape[-2]
    query = args.query.reshape(-1, n1, dim)  # [T, N1, D]
    t_rows = query.shape[0]
    g = n1 // n2
    k = args.sparse_count
    idx = np.empty((t_rows, n2, k), np.int32)  # [T, N2, K]
    vals = np.empty((t_rows, n2, k) if args.return_value else (0, 0, 0), np.uint16)  # [T, N2, K] bits
    pad, skip = _bits(PAD_VALUE, dtype), _bits(SKIPPED_ROW_VALUE, dtype)
    k_bits = bits16(args.key).reshape(-1, n2, dim)  # [R, N2, D] (read-only keys copied: one kernel signature)
    q32 = query.astype(np.float32)  # [T, N1, D]
    w32 = args.weights.reshape(t_rows, n1).astype(np.float32)  # [T, N1]
    engine, q_span = is_bf16 and bf16_engine_may_run(t_rows * g), None  # rows: at most T * G
    for b, rows in _batch_rows(args.token_batch):
        lim = args.limit[rows]  # [n_tok]
        width = max(int(lim.max()), 0)
        for kh in range(n2):
            keys = np.empty((width, dim), np.float32)  # [L, D]
            k_span = None
            if width >= PARALLEL_MIN_ROWS:
                _gather_keys_parallel(numba.get_num_threads(), k_bits, args.slots[b], kh, is_bf16, keys)
            else:
                _gather_keys_range(0, width, k_bits, args.slots[b], kh, is_bf16, keys)
            for c0 in range(0, rows.size, _chunk(width, g)):
                sub = rows[c0:c0 + _chunk(width, g)]
                q = q32[sub, kh * g:(kh + 1) * g].reshape(-1, dim)  # [C * G, D]
                if engine and width:  # bf16 x bf16, fp32 result: the fp32-output bf16 engine where it runs
                    q_span = span(q32) if q_span is None else q_span  # bounds every chunk's
                    k_span = span(keys) if k_span is None else k_span
                    dots = matmul_bf16_f32(q, keys.T, a_span=q_span, b_span=k_span)  # [C * G, L]
                else:
                    dots = matmul_f32(q, keys.T)  # [C * G, L] fp32 BLAS
                w = np.ascontiguousarray(w32[sub, kh * g:(kh + 1) * g])  # [C, G]
                out_i = np.empty((sub.size, k), np.int32)
                out_v = np.empty((sub.size, k) if args.return_value else (0, 0), np.uint16)
                operands = (dots, w, lim[c0:c0 + sub.size], is_bf16, args.return_value, pad, skip, out_i, out_v)
                if sub.size > 1 and int(np.maximum(lim[c0:c0 + sub.size], 0).sum()) * g >= PARALLEL_MIN_SCORES:
                    _score_top_k_parallel(*operands)
                else:
                    _score_top_k_range(0, sub.size, *operands)
                idx[sub, kh] = out_i
                if args.return_value:
                    vals[sub, kh] = out_v
    values = vals.view(dtype).reshape(args.out_shape) if args.return_value else np.empty(EMPTY_VALUE_SHAPE, dtype)
    return LightningIndexerOutputs(idx.reshape(args.out_shape), values)


#: Bytes of one chunk's fp32 score matrix ``[C * G, L]`` (bounds memory for long prefills).
CHUNK_BYTES = 32 << 20


def _chunk(width: int, g: int) -> int:
    """Query tokens per GEMM so that ``[C * G, L]`` fp32 stays within CHUNK_BYTES."""
    return max(1, CHUNK_BYTES // max(1, width * g * 4))


def _batch_rows(token_batch: np.ndarray):
    """(batch, its query token rows) for every batch with rows, in batch order."""
    if token_batch.size and token_batch[0] == token_batch[-1] and (token_batch.size < 3 or
                                                                   (token_batch == token_batch[0]).all()):
        yield int(token_batch[0]), np.arange(token_batch.size)  # one batch (decode with B = 1)
        return
    order = np.argsort(token_batch, kind="stable")
    bounds = np.flatnonzero(np.diff(token_batch[order])) + 1
    for rows in np.split(order, bounds):
        if rows.size:
            yield int(token_batch[rows[0]]), rows
